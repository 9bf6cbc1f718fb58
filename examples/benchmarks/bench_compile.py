"""Does `torch.compile` pay on a CPU? One real epoch of training and one pass of greedy and beam
decoding, eager against compiled, compile time and recompilations counted.

Training: the shipped Multi30k en->fr training set, batches of 80 sentence pairs bucketed by
length (the paper's 20-batch sort), Adadelta, gradient norm clipped to 1; the compiled variant
compiles `model.loss` (`dynamic=True`, inductor). Decoding: the first `--limit` test sentences in
batches of 32, greedy and beam 5; the compiled variant compiles `model.step`. Each variant runs
in a fresh model with the same seed; wall time includes compilation. The teacher-forcing loop
is unrolled when traced, so the compiled loss gets one graph per target length.

    python examples/benchmarks/bench_compile.py                  # small preset, 2 threads
    python examples/benchmarks/bench_compile.py --steps 50       # a quick look
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from bahdanau import BeamSearch, RNNSearch, presets
from bahdanau.data import (
    BucketBatchSampler,
    DefaultTokenizer,
    Vocab,
    collate,
    encode_pairs,
    multi30k_files,
    pad_sources,
    read_parallel,
)


def train_epoch(model: RNNSearch, examples, loss_fn, steps: int | None) -> dict:
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-6)
    sampler = BucketBatchSampler(examples, batch_size=80, seed=0)
    start, first, n, lengths = time.perf_counter(), None, 0, set()
    for n, indices in enumerate(sampler, 1):
        batch = collate([examples[i] for i in indices])
        lengths.add(batch.tgt_in.shape[1])
        loss, _ = loss_fn(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
        optimizer.zero_grad(set_to_none=True)
        (loss / batch.src.shape[0]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if first is None:
            first = time.perf_counter() - start
        if n == steps:
            break
    return {"updates": n, "seconds": round(time.perf_counter() - start, 1),
            "first_update_s": round(first or 0.0, 2), "distinct_target_lengths": len(lengths)}


@torch.inference_mode()
def decode(model: RNNSearch, sources: list[list[int]], beam: int) -> dict:
    search = BeamSearch(beam_size=beam, max_len=80)
    start = time.perf_counter()
    for i in range(0, len(sources), 32):
        src, lengths = pad_sources(sources[i:i + 32], model.decoder.pad_id)
        search(model, src, lengths)
    return {"beam": beam, "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small", "rnnsearch_50"])
    parser.add_argument("--steps", type=int, default=None, help="updates (default: one epoch)")
    parser.add_argument("--limit", type=int, default=500, help="test sentences to decode")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    tokenizer = DefaultTokenizer()
    pairs = read_parallel(multi30k_files("train", "en"), multi30k_files("train", "fr"))
    src_vocab = Vocab.build([tokenizer.tokenize(s) for s, _ in pairs], max_size=10000)
    tgt_vocab = Vocab.build([tokenizer.tokenize(t) for _, t in pairs], max_size=10000)
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tokenizer, max_len=50)
    test = read_parallel(*(multi30k_files("test_2016_flickr", lang) for lang in ("en", "fr")))
    sources = [src_vocab.encode(tokenizer.tokenize(s)) for s, _ in test[:args.limit]]
    cfg = getattr(presets, args.preset)(len(src_vocab), len(tgt_vocab))

    results = {}
    for variant in ("eager", "compiled"):
        torch.manual_seed(0)
        torch._dynamo.reset()
        counters.clear()
        model = RNNSearch.from_config(cfg).train()
        loss_fn = model.loss
        if variant == "compiled":
            loss_fn = torch.compile(model.loss, dynamic=True, fullgraph=True)
        # The teacher-forcing loop is unrolled, so every target length is its own graph: lift
        # the recompilation limit to count them rather than fail.
        with torch._dynamo.config.patch(allow_rnn=True, recompile_limit=1024,
                                        accumulated_recompile_limit=4096):
            train = train_epoch(model, examples, loss_fn, args.steps)
            model.eval()
            if variant == "compiled":
                model.step = torch.compile(model.step, dynamic=True, fullgraph=True)
            searches = [decode(model, sources, beam) for beam in (1, 5)]
        results[variant] = {"train": train, "decode": searches,
                            "graphs_compiled": counters["stats"]["unique_graphs"],
                            "recompilations": sum(counters["recompiles"].values())}
        print(variant, json.dumps(results[variant]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "threads": args.threads, **results}, f, indent=1)


if __name__ == "__main__":
    main()
