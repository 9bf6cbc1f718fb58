"""Decoding throughput of greedy and beam search (sentences/s and target tokens/s).

The fixed mid-size model (E=256, H=256, D=512, A=512, maxout 256, 10k-word vocabularies) decodes
the 1,000 Multi30k test_2016_flickr English sentences, sorted by length and batched. Untrained
models produce arbitrary lengths, so besides natural stopping (at most 100 tokens) every setting
is also timed with exactly 20 tokens per sentence (min = max = 20, eos forced after them): the
work then does not depend on what the model learned, which is how peer toolkits were compared.
`--train-steps N` first trains N updates (Adam 1e-3, batch 64), as the peer benchmark does.
Two one-sentence-at-a-time loops give the batching speed-up: our BeamSearch on batches of one
sentence (beams still batched), and a tutorial-style loop that also steps each hypothesis alone.

    python examples/benchmarks/bench_search.py
    python examples/benchmarks/bench_search.py --batch-sizes 32 --beams 1 5 --train-steps 220
    python examples/benchmarks/bench_search.py --threads 1 --batch-sizes 64 --beams 1 5 \
        --naive-limit 0 --int8                 # or --amp bf16: the CPU's int8 or bf16 units

`--int8` decodes through `RNNSearch.int8_copy` (the step's big matmuls in int8), `--amp bf16`
under `torch.autocast`, as `bahdanau translate --int8` and `--amp bf16` do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from bahdanau import BeamSearch, RNNSearch, presets
from bahdanau.config import ATTENTION_IMPLS
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
from bahdanau.jobs.resolve import autocast
from bahdanau.training import train_step


def batches(ids: list[list[int]], batch_size: int, pad_id: int):
    """Sentences sorted by length, cut into padded batches."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        yield pad_sources([ids[i] for i in order[start:start + batch_size]], pad_id)


def run(model, ids, batch_size: int, search: BeamSearch, amp: str = "none"
        ) -> tuple[float, int]:
    start, tokens = time.perf_counter(), 0
    device = next(model.parameters()).device
    with autocast(amp, device):
        for src, lengths in batches(ids, batch_size, model.decoder.pad_id):
            for hyps in search(model, src.to(device), lengths.to(device)):
                tokens += len(hyps[0].tokens)
    return time.perf_counter() - start, tokens


@torch.inference_mode()
def naive_beam_search(model: RNNSearch, src: list[int], beam: int, length: int) -> list[int]:
    """Tutorial-style beam search: one sentence, one decoder call per hypothesis per step.

    Exactly `length` tokens (eos forbidden before, forced after), like the fixed-20 setting.
    """
    bos, eos = model.config.bos_id, model.config.eos_id
    state, memory = model.encode(torch.tensor([src]), torch.tensor([len(src)]))
    hyps = [([], 0.0, state)]
    for step in range(length + 1):
        candidates = []
        for tokens, score, h in hyps:
            prev = torch.tensor([tokens[-1] if tokens else bos])
            out = model.step(prev, h, memory)
            log_probs = torch.log_softmax(out.logits[0], -1)
            if step == length:
                candidates.append((tokens + [eos], score + float(log_probs[eos]), out.state))
                continue
            log_probs[eos] = float("-inf")
            values, ids = log_probs.topk(beam)
            candidates += [(tokens + [int(i)], score + float(v), out.state)
                           for v, i in zip(values, ids, strict=True)]
        hyps = sorted(candidates, key=lambda c: -c[1])[:beam]
    return hyps[0][0][:-1]


def train_briefly(model: RNNSearch, steps: int, src_vocab: Vocab, tgt_vocab: Vocab,
                  tokenizer) -> None:
    pairs = read_parallel(multi30k_files("train", "en"), multi30k_files("train", "fr"))
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tokenizer, max_len=80)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = BucketBatchSampler(examples, batch_size=64, seed=0)
    for step, indices in enumerate(sampler):
        if step == steps:
            break
        train_step(model, collate([examples[i] for i in indices]), optimizer, clip_norm=1.0)
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5, 12])
    parser.add_argument("--limit", type=int, default=1000, help="test sentences to decode")
    parser.add_argument("--naive-limit", type=int, default=100,
                        help="sentences for the one-at-a-time loop (0: skip)")
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="passes per setting; fastest kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attention-impl", default="auto", choices=ATTENTION_IMPLS,
                        help="attention path (triton: the fused kernel, CUDA)")
    parser.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"],
                        help="decode under torch.autocast, as translate --amp")
    parser.add_argument("--int8", action="store_true",
                        help="decode an int8 copy of the model, as translate --int8")
    parser.add_argument("--json", help="also write the results (one JSON object per line)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    tokenizer = DefaultTokenizer()
    train = read_parallel(multi30k_files("train", "en"), multi30k_files("train", "fr"))
    src_vocab = Vocab.build((tokenizer.tokenize(s) for s, _ in train), max_size=10000)
    tgt_vocab = Vocab.build((tokenizer.tokenize(t) for _, t in train), max_size=10000)
    cfg = presets.small(len(src_vocab), len(tgt_vocab))
    model = RNNSearch.from_config(dataclasses.replace(cfg, attention_impl=args.attention_impl))
    if args.train_steps:
        train_briefly(model, args.train_steps, src_vocab, tgt_vocab, tokenizer)
    model = model.to(args.device).eval()
    if args.int8:
        model = model.int8_copy()
    test = read_parallel(multi30k_files("test_2016_flickr", "en"),
                         multi30k_files("test_2016_flickr", "fr"))[: args.limit]
    ids = [src_vocab.encode(tokenizer.tokenize(s)) for s, _ in test]

    rows = []
    print(f"{'batch':>5} {'beam':>4} {'length':>8} {'sents/s':>9} {'tokens/s':>9} "
          f"{'mean len':>8} {'seconds':>8}")
    for batch_size in args.batch_sizes:
        for beam in args.beams:
            for mode, kwargs in (("natural", dict(max_len=100)),
                                 ("fixed20", dict(min_len=20, max_len=20))):
                search = BeamSearch(beam_size=beam, **kwargs)
                seconds, tokens = min(run(model, ids, batch_size, search, args.amp)
                                      for _ in range(args.repeats))
                row = dict(batch=batch_size, beam=beam, length=mode, amp=args.amp,
                           int8=args.int8, sents_per_s=len(ids) / seconds,
                           tgt_tokens_per_s=tokens / seconds, mean_len=tokens / len(ids),
                           seconds=seconds)
                rows.append(row)
                print(f"{batch_size:>5} {beam:>4} {mode:>8} {row['sents_per_s']:>9.1f} "
                      f"{row['tgt_tokens_per_s']:>9.0f} {row['mean_len']:>8.2f} {seconds:>8.2f}")
    if args.naive_limit:
        subset = ids[: args.naive_limit]
        for name, decode in (
            ("one sentence at a time, beams batched (BeamSearch, batch 1)",
             lambda sent: BeamSearch(beam_size=5, min_len=20, max_len=20)(
                 model, torch.tensor([sent]), torch.tensor([len(sent)]))),
            ("naive: one sentence and one hypothesis at a time",
             lambda sent: naive_beam_search(model, sent, 5, 20)),
        ):
            start = time.perf_counter()
            for sent in subset:
                decode(sent)
            seconds = time.perf_counter() - start
            row = dict(batch=1, beam=5, length="fixed20", loop=name,
                       sents_per_s=len(subset) / seconds, seconds=seconds, sentences=len(subset))
            rows.append(row)
            print(f"{name}: {row['sents_per_s']:.1f} sents/s (beam 5, 20 tokens, "
                  f"{len(subset)} sentences, {seconds:.1f} s)")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
