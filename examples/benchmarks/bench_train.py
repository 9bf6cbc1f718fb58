"""Teacher-forced training throughput of RNNsearch, in target tokens per second.

Measured the way the peer toolkits are measured on the same machine class: batches of 64
sentence pairs (length-bucketed, the paper's 20-batch sort), Adam 1e-3, gradient norm clipped to
1, the summed token loss divided by the number of sentences. Target tokens are the non-pad target
positions including eos; the window is updates WARMUP+1 .. WARMUP+MEASURE and its time covers
batch assembly, forward, backward, clipping and the optimizer step.

Data: the shipped Multi30k en->fr training set tokenized with `DefaultTokenizer`, or, with
`--data-dir`, whitespace-tokenized `train.src` / `train.tgt` files (e.g. the Moses-tokenized files
a peer benchmark prepared, so both sides read identical text).

    python examples/benchmarks/bench_train.py                       # mid-size model
    python examples/benchmarks/bench_train.py --data-dir DIR --json out.json
    python examples/benchmarks/bench_train.py --busy 1              # idle, then beside 1 busy loop
    python examples/benchmarks/bench_train.py --threads 1 --amp bf16  # under CPU autocast bf16

Threads: ``--threads auto`` (the default) is what ``bahdanau train`` does without --threads:
start with every usable core and follow the machine's load (`AdaptiveThreads`); ``--threads
N`` fixes the count. ``--busy N`` measures twice in one run, first on the machine as it is,
then beside N CPU-bound processes that it starts (and stops), and prints the share of the first
speed that the second keeps: what a laptop or a shared server does to a run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import time
from pathlib import Path

import torch

from bahdanau import RNNSearch, build_model, presets
from bahdanau.config import ATTENTION_IMPLS
from bahdanau.data import (
    BucketBatchSampler,
    DefaultTokenizer,
    Vocab,
    WhitespaceTokenizer,
    collate,
    encode_pairs,
    multi30k_files,
    read_parallel,
)
from bahdanau.jobs.resolve import autocast
from bahdanau.training.threads import AdaptiveThreads


def canary_gflops(seconds: float = 1.0) -> float:
    """fp32 GEMM speed of this machine right now (the same probe as the peer harness)."""
    a, b = torch.randn(256, 512), torch.randn(512, 4096)
    for _ in range(5):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    return 2 * 256 * 512 * 4096 * n / (time.perf_counter() - start) / 1e9


def load_pairs(data_dir: str | None) -> tuple[list[tuple[str, str]], object, str]:
    if data_dir:
        root = Path(data_dir)
        pairs = read_parallel(root / "train.src", root / "train.tgt")
        return pairs, WhitespaceTokenizer(), f"{root} (whitespace tokens)"
    pairs = read_parallel(multi30k_files("train", "en"), multi30k_files("train", "fr"))
    return pairs, DefaultTokenizer(), "shipped Multi30k train en->fr (DefaultTokenizer)"


def spin() -> None:
    """A CPU-bound process: another program taking a core."""
    while True:
        pass


def measure(args: argparse.Namespace, examples: list, vocab_sizes: tuple[int, int],
            busy: int) -> dict:
    """Train a fresh model for the warm-up and measured updates, beside `busy` spinning
    processes; its numbers."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.threads == "auto":
        tuner: AdaptiveThreads | None = AdaptiveThreads(cores or 1, log=print)
    else:
        tuner = None
        torch.set_num_threads(int(args.threads))
    torch.manual_seed(args.seed)
    cfg = getattr(presets, args.preset)(*vocab_sizes)
    model: RNNSearch = build_model(cfg.__class__(
        **{**cfg.to_dict(), "arch": args.arch, "attention_impl": args.attention_impl}))
    model.to(args.device).train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sampler = BucketBatchSampler(examples, batch_size=args.batch_size, seed=args.seed)
    precision = autocast(args.amp, torch.device(args.device))

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from sampler
            epoch += 1

    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
    for p in spinners:
        p.start()
    try:
        canary_before = canary_gflops()
        stream = batches()
        interval_tokens, interval_start, rates = 0, 0.0, []
        total_tokens = 0
        for update in range(1, args.warmup + args.measure + 1):
            if update == args.warmup + 1:
                sync()
                interval_start = time.perf_counter()
                window_start = interval_start
                faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            started = time.perf_counter()
            batch = collate([examples[i] for i in next(stream)])
            src, src_lengths, tgt_in, tgt_out = (t.to(args.device) for t in (
                batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out))
            with precision:
                loss, n_tokens = model.loss(src, src_lengths, tgt_in, tgt_out)
            optimizer.zero_grad(set_to_none=True)
            (loss / batch.src.shape[0]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if tuner is not None:
                tuner.observe(int(n_tokens), time.perf_counter() - started)
            if update > args.warmup:
                interval_tokens += int(n_tokens)
                if (update - args.warmup) % args.interval == 0:
                    sync()
                    now = time.perf_counter()
                    rates.append(interval_tokens / (now - interval_start))
                    total_tokens += interval_tokens
                    interval_tokens, interval_start = 0, now
        total_seconds = time.perf_counter() - window_start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_start
        canary_after = canary_gflops()
    finally:
        for p in spinners:
            p.terminate()
    return {
        "library": "bahdanau",
        "preset": args.preset,
        "arch": args.arch,
        "params": params,
        "src_vocab": vocab_sizes[0],
        "tgt_vocab": vocab_sizes[1],
        "train_pairs": len(examples),
        "batch_size": args.batch_size,
        "threads": args.threads if tuner is None else f"auto (ended at {tuner.threads})",
        "busy_processes": busy,
        "device": args.device,
        "attention_impl": args.attention_impl,
        "amp": args.amp,
        "updates_measured": args.measure,
        "train_tgt_tokens_measured": total_tokens,
        "train_seconds_measured": round(total_seconds, 2),
        "train_tgt_tokens_per_s": round(total_tokens / total_seconds, 1),
        "train_tgt_tokens_per_s_median_interval": round(statistics.median(rates), 1),
        "train_interval_rates": [round(r) for r in rates],
        "mean_tgt_tokens_per_update": round(total_tokens / args.measure, 1),
        "ms_per_update": round(1000 * total_seconds / args.measure, 1),
        "minor_page_faults_per_update": round(faults / args.measure),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "canary_gflops_before": round(canary_before, 1),
        "canary_gflops_after": round(canary_after, 1),
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder with whitespace-tokenized train.src/train.tgt")
    parser.add_argument("--preset", default="small", choices=["tiny", "small", "rnnsearch_50"])
    parser.add_argument("--arch", default="rnnsearch", choices=["rnnsearch", "rnnencdec"])
    parser.add_argument("--vocab", type=int, default=10000, help="words per side (+4 specials)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--measure", type=int, default=200)
    parser.add_argument("--interval", type=int, default=20, help="updates per reported interval")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", default="auto",
                        help="auto (bahdanau train's default: adapted to the load) or a count")
    parser.add_argument("--busy", type=int, default=0,
                        help="measure again beside N CPU-bound processes, and the ratio")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attention-impl", default="auto", choices=ATTENTION_IMPLS,
                        help="attention path (triton: the fused kernel, CUDA)")
    parser.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"],
                        help="the loss and its backward under torch.autocast, as train --amp")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.threads != "auto" and not (args.threads.isdigit() and int(args.threads) > 0):
        parser.error(f"--threads must be auto or a positive count, got {args.threads!r}")

    pairs, tokenizer, data_name = load_pairs(args.data_dir)
    src_tok = [tokenizer.tokenize(s) for s, _ in pairs]
    tgt_tok = [tokenizer.tokenize(t) for _, t in pairs]
    src_vocab = Vocab.build(src_tok, max_size=args.vocab)
    tgt_vocab = Vocab.build(tgt_tok, max_size=args.vocab)
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tokenizer, max_len=args.max_len)
    sizes = (len(src_vocab), len(tgt_vocab))
    result = {"data": data_name, **measure(args, examples, sizes, busy=0)}
    if args.busy:
        beside = measure(args, examples, sizes, busy=args.busy)
        result["busy"] = beside
        result["busy_share_of_idle"] = round(
            beside["train_tgt_tokens_per_s"] / result["train_tgt_tokens_per_s"], 3)
    width = max(len(k) for k in result)
    for key, value in result.items():
        if key != "busy":
            print(f"{key:<{width}}  {value}")
    if args.busy:
        print(f"beside {args.busy} busy process(es): {beside['train_tgt_tokens_per_s']:.0f} "
              f"target tokens/s ({beside['threads']} threads), "
              f"{result['busy_share_of_idle']:.0%} of {result['train_tgt_tokens_per_s']:.0f} "
              f"without them ({result['threads']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
