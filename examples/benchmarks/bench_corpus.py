"""The prepared-corpus data path at scale: `bahdanau prepare`, the loader, a training process.

Three measurements, each printed as it finishes:

1. prepare: a synthetic corpus (Zipfian words, about 15 a side; `--pairs`, default 2M) is
   written as text to `--dir` (not kept), then prepared in a child process with the default
   tokenizer (`--workers` processes). Prints the wall time, the peak RSS of the preparing
   process and of its largest worker, and the bytes per pair of the folder. With
   `--sentencepiece N`, also the time and peak RSS of training a SentencePiece unigram model
   of N pieces on at most 1M sentences a side of the same files (as `prepare --tokenizer
   unigram` does), timed on its own.
2. loader: batches/s that `bahdanau.training.BatchLoader` delivers from that folder with 0, 1 and
   2 worker processes, at the default job's batch (64 sentences), beside the default job's
   training step rate on this machine (`--step-rate`, updates/s; 1,570 updates in 500 s on
   the 2-core reference machine).
3. training process: a child process builds the default job's model, opens a prepared folder,
   sets up the run (sampler, digest) and trains `--steps` steps with `--loader-workers`.
   Prints its private (anonymous) memory beyond the model, measured from
   /proc/self/smaps_rollup, and the prepared arrays' file-backed resident pages separately
   (from /proc/self/smaps). Done for the 2M folder and for a `--big`-pair folder (default
   12M) written directly (ids straight into the arrays, no text).

    python examples/benchmarks/bench_corpus.py                       # 2M + 12M, ~10 min
    python examples/benchmarks/bench_corpus.py --pairs 200000 --big 0 --dir /fast/disk

The synthetic files and folders go to a temporary folder (under `--dir`), deleted at the end.

Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from bahdanau.data import (
    BucketBatchSampler,
    DefaultTokenizer,
    PreparedCorpus,
    Vocab,
    save_tokenizer,
)
from bahdanau.data import corpus as corpus_module
from bahdanau.data.manifest import FORMAT, VERSION, seal
from bahdanau.training import BatchLoader, BatchPlan

WORDS = 50_000          # distinct words a side in the synthetic corpus
MEAN_LENGTH = 15


def zipf_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` word ranks from a Zipf(1.1) law over WORDS words (0 = most frequent)."""
    return (rng.zipf(1.1, n) - 1) % WORDS


def sentence_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(rng.poisson(MEAN_LENGTH - 1, n) + 1, 1, 80)


def write_text_corpus(folder: Path, pairs: int, seed: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for side, letter in (("src", "s"), ("tgt", "t")):
        words = np.array([f"{letter}{i}" for i in range(WORDS)])
        path = folder / f"synthetic.{side}"
        with path.open("w", encoding="utf-8") as f:
            for start in range(0, pairs, 100_000):
                n = min(100_000, pairs - start)
                lengths = sentence_lengths(rng, n)
                tokens = words[zipf_ids(rng, int(lengths.sum()))]
                cuts = np.cumsum(lengths)[:-1]
                f.write("".join(" ".join(s) + "\n" for s in np.split(tokens, cuts)))
        paths.append(path)
    return paths[0], paths[1]


def write_prepared_directly(folder: Path, pairs: int, seed: int = 0) -> None:
    """A prepared folder of `pairs` synthetic pairs, written array by array."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    vocab = Vocab([f"w{i}" for i in range(10_000)])
    tokens = []
    for side in ("src", "tgt"):
        lengths = sentence_lengths(rng, pairs)
        offsets = np.zeros(pairs + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(folder / f"{side}.offsets.npy", offsets)
        ids = np.lib.format.open_memmap(folder / f"{side}.ids.npy", mode="w+", dtype=np.uint16,
                                        shape=(int(offsets[-1]),))
        for start in range(0, len(ids), 1 << 24):
            n = min(1 << 24, len(ids) - start)
            ids[start:start + n] = np.minimum(zipf_ids(rng, n), len(vocab) - 5) + 4
        ids.flush()
        tokens.append(int(offsets[-1]))
        vocab.save(folder / f"{side}_vocab.json")
    np.save(folder / "lines.npy", np.arange(pairs, dtype=np.int64))
    save_tokenizer(DefaultTokenizer(), folder)
    options = {"tokenizer": {"name": "default", "lowercase": False, "joiners": "prefix"},
               "vocab_size": None, "src_vocab": None, "tgt_vocab": None, "max_len": None,
               "max_ratio": None, "strict": False}
    synthetic = [{"file": f"synthetic.{side}", "bytes": 0, "sha256": "0" * 64}
                 for side in ("src", "tgt")]
    seal(folder, {"format": FORMAT, "version": VERSION, "inputs": synthetic,
                  "options": options, "shipped": None, "seconds": 0,
                  "counts": {"lines": pairs, "pairs": pairs, "empty": 0, "too_long": 0,
                             "ratio": 0},
                  "tokens": tokens, "vocab_sizes": [len(vocab), len(vocab)]})


def run_child(code: str, *args: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON line last."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


PREPARE = """
    import json, resource, sys, time
    from bahdanau.data import prepare_corpus
    start = time.perf_counter()
    corpus = prepare_corpus(sys.argv[1], sys.argv[2], sys.argv[3], workers=int(sys.argv[4]))
    print(json.dumps({
        "seconds": time.perf_counter() - start, "pairs": len(corpus),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

SENTENCEPIECE = """
    import json, resource, sys, time
    from pathlib import Path
    from bahdanau.data.corpus import TrainSentencePiece, _train_sentencepiece
    start = time.perf_counter()
    spec = TrainSentencePiece(model_type="unigram", vocab_size=int(sys.argv[3]))
    tokenizer = _train_sentencepiece(Path(sys.argv[1]), Path(sys.argv[2]), spec, print)
    print(json.dumps({"seconds": time.perf_counter() - start, "pieces": len(tokenizer.pieces),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

TRAIN = """
    import json, sys, time, torch
    from dataclasses import replace
    from bahdanau import presets
    from bahdanau.config import TrainConfig
    from bahdanau.data import PreparedCorpus
    from bahdanau.models import build_model
    from bahdanau.training import run_step, setup_run

    def memory():
        fields = {}
        for line in open("/proc/self/smaps_rollup"):
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
        mapped, path = 0.0, ""
        for line in open("/proc/self/smaps"):
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:
                path = parts[5] if len(parts) > 5 else ""
            elif parts[0] == "Rss:" and path.endswith(".npy"):
                mapped += int(parts[1]) / 1024
        return {"anonymous_mb": fields["Anonymous"], "npy_resident_mb": mapped}

    torch.set_num_threads(2)
    folder, steps, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    corpus = PreparedCorpus(folder, max_len=50)
    cfg = replace(presets.small(len(corpus.src_vocab), len(corpus.tgt_vocab)), init="glorot")
    model = build_model(cfg)
    base = memory()
    start = time.perf_counter()
    run = setup_run(model, corpus, TrainConfig(optimizer="adam", lr=1e-3, batch_size=64,
                    max_steps=steps, loader_workers=workers),
                    src_vocab=corpus.src_vocab, tgt_vocab=corpus.tgt_vocab)
    setup_s = time.perf_counter() - start
    after_setup = memory()
    start = time.perf_counter()
    for _ in range(steps):
        run_step(run)
    print(json.dumps({"pairs": len(corpus), "setup_s": setup_s,
                      "steps_per_s": steps / (time.perf_counter() - start),
                      "model": base, "after_setup": after_setup, "after_steps": memory()}))
"""


def report_training(name: str, folder: Path, args: argparse.Namespace) -> None:
    r = run_child(TRAIN, str(folder), str(args.steps), str(args.loader_workers))
    base = r["model"]["anonymous_mb"]
    print(f"training process, {name} ({r['pairs']:,} pairs of <= 50 tokens), "
          f"{args.loader_workers} loader workers: setup {r['setup_s']:.1f} s, "
          f"{r['steps_per_s']:.2f} steps/s")
    for when in ("after_setup", "after_steps"):
        m = r[when]
        print(f"  {when.replace('_', ' ')}: private memory beyond the model "
              f"{m['anonymous_mb'] - base:,.0f} MB (model and process {base:,.0f} MB); "
              f"prepared arrays resident (file-backed, shared) {m['npy_resident_mb']:,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2_000_000)
    parser.add_argument("--big", type=int, default=12_000_000,
                        help="pairs of the directly written folder (0: skip)")
    parser.add_argument("--workers", type=int, default=None, help="prepare's processes")
    parser.add_argument("--sentencepiece", type=int, default=0, metavar="PIECES",
                        help="also time training a SentencePiece model of this many pieces")
    parser.add_argument("--loader-workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-rate", type=float, default=1570 / 500,
                        help="the default job's training updates/s on this machine")
    parser.add_argument("--batches", type=int, default=300, help="batches timed per loader")
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder (default: tmp)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench_corpus."))
    try:
        run(args, scratch)
    finally:
        shutil.rmtree(scratch)


def run(args: argparse.Namespace, scratch: Path) -> None:

    start = time.perf_counter()
    src, tgt = write_text_corpus(scratch, args.pairs)
    text_mb = (src.stat().st_size + tgt.stat().st_size) / 2**20
    print(f"synthetic corpus: {args.pairs:,} pairs, {text_mb:,.0f} MB of text "
          f"({time.perf_counter() - start:.0f} s to write)")
    workers = corpus_module._workers(args.workers)
    prepared = scratch / "prepared"
    r = run_child(PREPARE, str(src), str(tgt), str(prepared), str(workers))
    size = sum(p.stat().st_size for p in prepared.iterdir())
    arrays = sum(p.stat().st_size for p in prepared.glob("*.npy"))
    print(f"prepare: {r['pairs']:,} pairs in {r['seconds']:.1f} s with {workers} workers "
          f"({r['pairs'] / r['seconds']:,.0f} pairs/s); peak RSS {r['peak_rss_mb']:,.0f} MB "
          f"(largest worker {r['worker_peak_rss_mb']:,.0f} MB); folder {size / 2**20:,.0f} MB, "
          f"{arrays / r['pairs']:.1f} bytes per pair in the arrays")
    if args.sentencepiece:
        r = run_child(SENTENCEPIECE, str(src), str(tgt), str(args.sentencepiece))
        print(f"SentencePiece unigram training, {r['pieces']:,} pieces on at most 1,000,000 "
              f"sentences a side: {r['seconds']:.1f} s, peak RSS {r['peak_rss_mb']:,.0f} MB")
    src.unlink()
    tgt.unlink()

    corpus = PreparedCorpus(prepared, max_len=50)
    sampler = BucketBatchSampler(corpus.lengths, batch_size=64, seed=1)
    for loader_workers in (0, 1, 2):
        loader = BatchLoader(corpus, BatchPlan(sampler), loader_workers, pin_memory=False)
        loader.batches(0, 0)                                 # start the workers
        start = time.perf_counter()
        for position in range(1, args.batches + 1):
            loader.batches(0, position)
        rate = args.batches / (time.perf_counter() - start)
        print(f"loader, {loader_workers} workers: {rate:,.0f} batches/s = "
              f"{rate / args.step_rate:.0f}x the default job's {args.step_rate:.2f} steps/s")
        del loader
    print(f"this process: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f}"
          " MB")

    report_training(f"{args.pairs:,}-pair prepared folder", prepared, args)
    if args.big:
        start = time.perf_counter()
        write_prepared_directly(scratch / "big", args.big)
        print(f"wrote a {args.big:,}-pair folder directly in {time.perf_counter() - start:.0f} s")
        report_training(f"{args.big:,}-pair folder", scratch / "big", args)


if __name__ == "__main__":
    main()
