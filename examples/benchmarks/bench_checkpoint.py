"""Time saving and loading a checkpoint with and without its digest.

The model is RNNsearch-50's sizes with 2,004-word vocabularies (about 32M parameters, 127 MB of
float32 weights). Two payloads: the weights alone, and what training saves (weights, Adadelta
state after one step, configs, vocabularies, RNG states), three times as large.

For each it prints the median over `--repeats` of:

    plain      the atomic write and `torch.load(weights_only=True)`, what save_checkpoint and
               load_checkpoint did before the digest
    digest     save_checkpoint + load_checkpoint: the same, plus the digest computed twice
    sha256     one digest computation alone (the walk over every tensor's bytes)

    python examples/benchmarks/bench_checkpoint.py
    python examples/benchmarks/bench_checkpoint.py --repeats 5 --dir /fast/disk

Saves fsync their file, so the times include the disk's; `--dir` picks where the files go.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bahdanau._files import atomic_write
from bahdanau.checkpoint import load_checkpoint, save_checkpoint
from bahdanau.checkpoint.files import payload_digest
from bahdanau.config import ModelConfig
from bahdanau.data import Vocab
from bahdanau.models import build_model
from bahdanau.training.state import checkpoint_payload


def payloads() -> dict[str, dict]:
    torch.manual_seed(0)
    vocab = Vocab([f"w{i}" for i in range(2000)])
    model = build_model(ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab)))
    optimizer = torch.optim.Adadelta(model.parameters())
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    weights = {"model": model.state_dict()}
    full = checkpoint_payload(model, src_vocab=vocab, tgt_vocab=vocab, optimizer=optimizer)
    return {"weights": weights, "training": full}


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "c.pt"

        def plain(payload: dict) -> None:
            atomic_write(path, lambda f: torch.save(payload, f))
            torch.load(path, map_location="cpu", weights_only=True)

        def digest(payload: dict) -> None:
            save_checkpoint(path, payload)
            load_checkpoint(path)

        print(f"{'payload':>9} {'params':>8} {'MB':>6} {'plain s':>8} {'digest s':>9} "
              f"{'overhead':>8} {'sha256 s':>8}")
        for name, payload in payloads().items():
            params = sum(t.numel() for t in payload["model"].values())
            save_checkpoint(path, payload)
            megabytes = path.stat().st_size / 1e6
            t_plain = median_time(lambda p=payload: plain(p), args.repeats)
            t_digest = median_time(lambda p=payload: digest(p), args.repeats)
            t_sha = median_time(lambda p=payload: payload_digest(p), args.repeats)
            print(f"{name:>9} {params / 1e6:>7.1f}M {megabytes:>6.0f} {t_plain:>8.3f} "
                  f"{t_digest:>9.3f} {t_digest / t_plain - 1:>8.0%} {t_sha:>8.3f}")


if __name__ == "__main__":
    main()
