"""The GPU suite: RNNsearch-50's training, attention step and decoding on one GPU, every path
side by side, in one run of at most 8 minutes; one table printed and one JSON file written.

On a GPU machine, from the repository root (torch and triton installed):

    pip install -e . --no-deps && python examples/benchmarks/gpu_suite.py \\
        --data DIR --json gpu-suite.json --profile gpu-suite-profile.txt

DIR is the Hansard sample (`examples/reproduce/hansard_sample.py` builds it); without --data
the training corpus is synthetic, with the sample's length distribution. On a CPU:

    python examples/benchmarks/gpu_suite.py --smoke      # every code path, tiny sizes, < 2 min

Sections, each row of the table one configuration (`--only` picks sections):

* check: one update of a small model per training path against the same update in float64 on
  the CPU: relative error of the loss, of the clipped gradient and of the weights' change, and
  the unit roundoff of the path's arithmetic to read them against.
* train: `bahdanau train`'s own update (`setup_run` and `run_step`) of RNNsearch-50 (30k
  vocabularies, sentences of at most 50 tokens) at batch 80 and at batches of 6,000 tokens,
  per path: precision (fp32, tf32, bf16 autocast), attention (the reference or the fused
  Triton kernel), and the update (`train_step`, the sync-free update, or its CUDA graphs). Target
  tokens per second over the second pass of the measured batches (the first pass records the
  graphs of every shape), peak memory, and at batch 80 the kernels per update and the fraction
  of the update's time the GPU is busy (torch.profiler's kernels over the unprofiled time).
* attention: one additive-attention step, eager against the fused kernel, each launched and
  replayed as a CUDA graph, at the training, engine (values 4,000 wide) and beam-search sizes of
  `bench_attention.py`, against the HBM floor (the bytes it must move at the device-copy
  bandwidth measured first); and the fused kernel's compilations over ten source lengths.
* decode: the Multi30k test sources (1,000 sentences, shipped) at batch 128, greedy and beam 5,
  with fixed 20-token outputs and at natural length (twice: the first pass shows any
  recompilation cliff), with and without captured steps; sentences per second.

Joey NMT's throughput on the same GPU is measured by the peer benchmark's own driver; this
suite records whether Joey NMT is importable.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.util
import itertools
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bahdanau import BeamSearch, build_model, presets
from bahdanau.config import TrainConfig
from bahdanau.data import (
    DefaultTokenizer,
    Example,
    Vocab,
    collate,
    multi30k_files,
    pad_sources,
    read_lines,
    read_parallel,
)
from bahdanau.search import CAPTURED_CHECK_EVERY
from bahdanau.training import TrainRun, run_step, setup_run
from bahdanau.training.precision import AMP_DTYPES
from bahdanau.training.step import make_optimizer, train_step
from bahdanau.training.update import SyncFreeUpdate

sys.path.insert(0, str(Path(__file__).parent))
import bench_attention  # noqa: E402  (the sibling script's step timing and byte counts)

# Source lengths of the Hansard sample's training pairs (DefaultTokenizer, both sides at most
# 50 tokens; 27,786 of the first 30,000 pairs): per mille of sentences of 1..50 tokens, and
# the 5th, 10th, ..., 95th percentiles of target length over source length.
SOURCE_PER_MILLE = [1, 2, 4, 13, 18, 25, 29, 33, 34, 37, 38, 37, 40, 40, 40, 41, 38, 39, 38, 35,
                    32, 33, 33, 29, 29, 25, 26, 24, 21, 21, 20, 16, 15, 15, 13, 11, 9, 8, 7, 7,
                    5, 4, 4, 3, 2, 2, 1, 1, 1, 1]
TARGET_RATIO = [0.82, 0.9, 0.95, 1.0, 1.0, 1.06, 1.09, 1.12, 1.15, 1.18, 1.21, 1.24, 1.27,
                1.31, 1.35, 1.4, 1.47, 1.56, 1.71]
SECTIONS = ("check", "attention", "decode", "train")      # the order they run in


@dataclass(frozen=True)
class TrainPath:
    """One training path."""

    name: str
    precision: str            # fp32 (TF32 off), tf32, bf16 (autocast; TF32 on)
    attention: str            # reference | triton
    update: str               # step (train_step) | sync-free | graphs

    def train_config(self, **changes: Any) -> TrainConfig:
        return TrainConfig(optimizer="adam", amp="bf16" if self.precision == "bf16" else "none",
                           tf32=self.precision != "fp32", cuda_graphs=self.update == "graphs",
                           **changes)


PATHS = [                   # the order they run in: the likely defaults first
    TrainPath("bf16 graphs", "bf16", "reference", "graphs"),
    TrainPath("bf16", "bf16", "reference", "step"),
    TrainPath("tf32 graphs", "tf32", "reference", "graphs"),
    TrainPath("tf32", "tf32", "reference", "step"),
    TrainPath("fp32", "fp32", "reference", "step"),
    TrainPath("bf16 sync-free", "bf16", "reference", "sync-free"),
    TrainPath("bf16 fused graphs", "bf16", "triton", "graphs"),
    TrainPath("bf16 fused", "bf16", "triton", "step"),
]
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "tf32": 2.0**-11, "bf16": 2.0**-8}


@dataclass
class Sizes:
    """What one run measures: the GPU's sizes, or `--smoke`'s."""

    preset: Callable[[int, int], Any]
    vocab: int
    pairs: int
    max_len: int              # tokens a side of a training pair and of a decoded source
    fixed_len: int            # the fixed output length of the decoding rows
    warmup: int
    measure: int
    batch_sizes: tuple[tuple[str, dict[str, int]], ...]
    profile_updates: int
    decode_sentences: int
    decode_batch: int
    attention_sizes: tuple[str, ...]


GPU = Sizes(presets.rnnsearch_50, 30_000, 100_000, max_len=50, fixed_len=20, warmup=5,
            measure=24,
            batch_sizes=(("batch 80", {"batch_size": 80}),
                         ("6k tokens", {"max_tokens": 6000})),
            profile_updates=3, decode_sentences=1000, decode_batch=128,
            attention_sizes=("train", "engine", "beam"))
SMOKE = Sizes(presets.tiny, 60, 200, max_len=5, fixed_len=3, warmup=1, measure=1,
              batch_sizes=(("batch 8", {"batch_size": 8}), ("32 tokens", {"max_tokens": 32})),
              profile_updates=1, decode_sentences=6, decode_batch=3,
              attention_sizes=("smoke",))
bench_attention.SIZES.setdefault("smoke", (3, 2, 7, 10, 16))


class Budget:
    """The run's time limit: a section that would not fit is skipped, and says so."""

    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.monotonic(), seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)


class Report:
    """Rows as they come: printed at once, and the JSON rewritten after each section, so a
    run cut short still leaves what it measured."""

    def __init__(self, path: str | None, environment: dict[str, Any]) -> None:
        self.path, self.data = path, {"environment": environment, "rows": []}

    def add(self, section: str, name: str, **values: Any) -> None:
        row = {"section": section, "name": name, **values}
        self.data["rows"].append(row)
        shown = "  ".join(f"{k} {_shown(v)}" for k, v in values.items())
        print(f"{section:9} {name:26} {shown}", flush=True)

    def save(self) -> None:
        if self.path:
            Path(self.path).write_text(json.dumps(self.data, indent=1) + "\n", encoding="utf-8")

    def table(self) -> None:
        print("\n" + "=" * 100)
        for row in self.data["rows"]:
            values = {k: v for k, v in row.items() if k not in ("section", "name")}
            print(f"{row['section']:9} {row['name']:26} "
                  + "  ".join(f"{k} {_shown(v)}" for k, v in values.items()))


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


@contextlib.contextmanager
def recorded(report: Report, section: str, name: str) -> Iterator[None]:
    """Run one configuration; a failure becomes its row ("error": the exception's last line)
    and the run goes on."""
    try:
        yield
    except Exception as exc:                        # noqa: BLE001  (each path reports its own)
        lines = str(exc).strip().splitlines() or [""]
        report.add(section, name, error=f"{type(exc).__name__}: {lines[-1][:300]}")
        traceback.print_exc(limit=4)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------- data
def corpus(data: str | None, sizes: Sizes, seed: int = 0) -> tuple[list[tuple[str, str]], str]:
    """Training pairs: the Hansard sample's, or synthetic ones with its lengths."""
    if data:
        root = Path(data)
        pairs = read_parallel(root / "train.en.gz", root / "train.fr.gz")[: sizes.pairs]
        return pairs, f"{root} ({len(pairs)} pairs)"
    rng = random.Random(seed)
    lengths = [min(n, sizes.max_len)
               for n in rng.choices(range(1, 51), weights=SOURCE_PER_MILLE, k=sizes.pairs)]
    words = [f"w{i}" for i in range(sizes.vocab)]
    weights = [1.0 / (i + 10) for i in range(sizes.vocab)]            # Zipf-like frequencies

    def sentence(n: int) -> str:
        return " ".join(rng.choices(words, weights=weights, k=n))

    pairs = [(sentence(n), sentence(max(1, min(sizes.max_len,
                                                  round(n * rng.choice(TARGET_RATIO))))))
             for n in lengths]
    return pairs, f"synthetic ({len(pairs)} pairs with the Hansard sample's lengths)"


def encoded(pairs: list[tuple[str, str]], sizes: Sizes) -> tuple[list[Example], Vocab, Vocab]:
    """The pairs of at most `sizes.max_len` tokens a side, encoded with vocabularies of their
    most frequent `sizes.vocab` words (what `bahdanau.data.encode_pairs` makes, tokenising each
    sentence once)."""
    tok = DefaultTokenizer()
    tokens = [(tok.tokenize(s), tok.tokenize(t)) for s, t in pairs]
    tokens = [(s, t) for s, t in tokens if 0 < len(s) <= sizes.max_len
              and 0 < len(t) <= sizes.max_len]
    src_vocab = Vocab.build((s for s, _ in tokens), max_size=sizes.vocab)
    tgt_vocab = Vocab.build((t for _, t in tokens), max_size=sizes.vocab)
    examples = [Example(i, src_vocab.encode(s), tgt_vocab.encode(t))
                for i, (s, t) in enumerate(tokens)]
    return examples, src_vocab, tgt_vocab


# ---------------------------------------------------------------------------------- check
def check_section(report: Report, device: torch.device, paths: list[TrainPath], fused: bool,
                  examples: list[Example], vocabs: tuple[Vocab, Vocab]) -> None:
    """One update per path against float64 on the CPU (the same weights and batch)."""
    batch = collate(examples[:16])
    cfg = replace(presets.small(len(vocabs[0]), len(vocabs[1])), init="glorot")
    if device.type == "cpu":
        cfg = presets.tiny(len(vocabs[0]), len(vocabs[1]))
    torch.manual_seed(0)
    reference_model = build_model(replace(cfg, attention_impl="reference")).double()
    start = copy.deepcopy(reference_model.state_dict())
    adadelta = TrainConfig(optimizer="adadelta")
    ref_opt = make_optimizer(reference_model, adadelta)
    ref = train_step(reference_model, batch, ref_opt)
    ref_grads = torch.cat([p.grad.flatten() for p in reference_model.parameters()])
    ref_change = torch.cat([(p.detach() - start[k]).flatten()
                            for k, p in reference_model.named_parameters()])
    for path in paths:
        if path.attention == "triton" and not fused:
            continue
        with recorded(report, "check", path.name):
            if path.update == "graphs" and device.type != "cuda":
                report.add("check", path.name, skipped="CUDA graphs need a GPU")
                continue
            model = build_model(replace(cfg, attention_impl=path.attention)).to(device)
            model.load_state_dict({k: v.float() for k, v in start.items()})
            # the run's first batch is all 16 examples (in another order: the same sums)
            tc = replace(path.train_config(max_steps=1, batch_size=16), optimizer="adadelta")
            run = start_run(path, model, examples[:16], tc, vocabs, device)
            stats = run_step(run)
            grads = torch.cat([p.grad.double().cpu().flatten() for p in model.parameters()])
            change = torch.cat([(p.detach().double().cpu() - start[k]).flatten()
                                for k, p in model.named_parameters()])
            report.add("check", path.name,
                       loss_rel=abs(stats.loss_sum - ref.loss_sum) / abs(ref.loss_sum),
                       grad_rel=float((grads - ref_grads).norm() / ref_grads.norm()),
                       update_rel=float((change - ref_change).norm() / ref_change.norm()),
                       unit_roundoff=UNIT_ROUNDOFF[path.precision])


# ---------------------------------------------------------------------------------- train
def train_section(report: Report, device: torch.device, paths: list[TrainPath], sizes: Sizes,
                  fused: bool, examples: list[Example], vocabs: tuple[Vocab, Vocab],
                  budget: Budget, profile_path: str | None) -> None:
    profiles: list[str] = []
    for label, batching in sizes.batch_sizes:
        for path in paths:
            if path.attention == "triton" and not fused:
                continue
            name = f"{path.name} | {label}"
            if budget.left() < 30:
                report.add("train", name, skipped="out of time")
                continue
            with recorded(report, "train", name):
                if path.update == "graphs" and device.type != "cuda":
                    report.add("train", name, skipped="CUDA graphs need a GPU")
                    continue
                row, profile = train_path(device, path, sizes, batching, examples, vocabs,
                                          profile=label == sizes.batch_sizes[0][0])
                report.add("train", name, **row)
                if profile:
                    profiles.append(f"== {name}\n{profile}")
        report.save()
    if profile_path and profiles:
        Path(profile_path).write_text("\n\n".join(profiles) + "\n", encoding="utf-8")


def start_run(path: TrainPath, model: Any, examples: list[Example], cfg: TrainConfig,
              vocabs: tuple[Vocab, Vocab], device: torch.device) -> TrainRun:
    """`setup_run` of the path; "sync-free" (no option of the job: the update the graphs
    replay, run eagerly) sets the run's update by hand."""
    run = setup_run(model, examples, cfg, src_vocab=vocabs[0], tgt_vocab=vocabs[1],
                    device=device)
    if path.update == "sync-free":
        run.update = SyncFreeUpdate(run.model, run.optimizer, clip_norm=cfg.clip_norm,
                                    label_smoothing=cfg.label_smoothing,
                                    amp_dtype=AMP_DTYPES[cfg.amp], scaler=run.scaler)
    return run


def train_path(device: torch.device, path: TrainPath, sizes: Sizes, batching: dict[str, int],
               examples: list[Example], vocabs: tuple[Vocab, Vocab], *, profile: bool
               ) -> tuple[dict[str, Any], str | None]:
    gc.collect()                                     # the last path's run and its graphs
    torch.manual_seed(0)
    cfg = replace(sizes.preset(len(vocabs[0]), len(vocabs[1])), init="glorot",
                  attention_impl=path.attention)
    model = build_model(cfg)
    tc = path.train_config(max_steps=10**6, **batching)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    run = start_run(path, model, examples, tc, vocabs, device)
    for _ in range(sizes.warmup):
        run_step(run)
    first = time.perf_counter()
    place = (run.state.epoch, run.state.position, run.state.step)
    tokens = sum(run_step(run).n_tokens for _ in range(sizes.measure))     # records graphs
    sync(device)
    first_s = time.perf_counter() - first
    run.state.epoch, run.state.position, run.state.step = place          # the same batches
    start = time.perf_counter()
    tokens = sum(run_step(run).n_tokens for _ in range(sizes.measure))
    sync(device)
    seconds = time.perf_counter() - start
    row: dict[str, Any] = {"tok_s": tokens / seconds, "ms_update": 1e3 * seconds / sizes.measure,
                           "first_pass_tok_s": tokens / first_s}
    if run.update is not None:
        row["graphs"] = run.update.captured_shapes
    if device.type == "cuda":
        row["peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    text = None
    if profile:
        run.state.epoch, run.state.position, run.state.step = place
        row.update(_profiled(run, device, sizes.profile_updates, seconds / sizes.measure))
        text = row.pop("_table")
    return row, text


def _profiled(run: Any, device: torch.device, updates: int, update_s: float) -> dict[str, Any]:
    """Kernels per update and the GPU's busy fraction of an unprofiled update's time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(updates):
            run_step(run)
        sync(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    intervals = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy_us, end = 0.0, -math.inf
    for a, b in intervals:                                  # the union of kernel intervals
        if b > end:
            busy_us += b - max(a, end)
            end = b
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    return {"kernels_per_update": len(kernels) / updates,
            "gpu_busy": busy_us / 1e6 / updates / update_s if kernels else None,
            "_table": prof.key_averages().table(sort_by=sort, row_limit=25)}


# ---------------------------------------------------------------------------------- attention
def attention_section(report: Report, device: torch.device, sizes: Sizes, fused: bool,
                      bandwidth: float | None) -> None:
    table = {"eager": bench_attention.paths(device.type)["eager"]}
    if fused:
        from bahdanau.kernels.triton_attention import additive_attention

        table["fused"] = additive_attention
    graphs = [False, True] if device.type == "cuda" else [False]   # launches, or replays
    for size in sizes.attention_sizes:
        for dtype_name in ("fp32", "bf16"):
            dtype = bench_attention.DTYPES[dtype_name]
            passes = ["fwd", "fwd+bwd"] if size != "beam" else ["fwd"]
            for pass_name in passes:
                backward = pass_name == "fwd+bwd"
                inputs = bench_attention.make_inputs(size, dtype, device.type, backward)
                moved = bench_attention.min_bytes(size, dtype, backward)
                for (name, fn), graph in itertools.product(table.items(), graphs):
                    label = f"{size} {dtype_name} {pass_name} {name}{' graph' if graph else ''}"
                    with recorded(report, "attention", label):
                        with torch.set_grad_enabled(backward):
                            seconds, _ = bench_attention.time_step(
                                fn, inputs, backward, device.type, repeats=20, graph=graph)
                        row = {"us": 1e6 * seconds, "gb_s": moved / seconds / 1e9}
                        if bandwidth:
                            row["of_hbm_floor"] = moved / bandwidth / seconds
                        report.add("attention", label, **row)
    if fused:
        with recorded(report, "attention", "compilations over 10 source lengths"):
            from bahdanau.kernels import triton_attention

            before = triton_attention.compiled_variants()
            batch, beams, _, align, width = bench_attention.SIZES[sizes.attention_sizes[0]]
            for src_len in range(3, 63, 6):
                gen = torch.Generator().manual_seed(src_len)
                q = torch.randn(batch * beams, align, generator=gen).to(device)
                k = torch.randn(batch, src_len, align, generator=gen).to(device)
                h = torch.randn(batch, src_len, width, generator=gen).to(device)
                mask = torch.ones(batch, src_len, dtype=torch.bool, device=device)
                v = torch.randn(align, generator=gen).to(device)
                triton_attention.additive_attention(q, k, h, mask, v)
            sync(device)
            report.add("attention", "compilations over 10 source lengths",
                       new_compilations=triton_attention.compiled_variants() - before)
    report.save()


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes per second of a device-to-device copy (read + write), the HBM floor's rate."""
    if device.type != "cuda":
        return None
    a = torch.empty(2**28, dtype=torch.float32, device=device)   # 1 GiB
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync(device)
    return 2 * a.numel() * 4 * 10 / (time.perf_counter() - start)


# ---------------------------------------------------------------------------------- decode
def decode_section(report: Report, device: torch.device, sizes: Sizes, fused: bool,
                   vocabs: tuple[Vocab, Vocab], budget: Budget) -> None:
    tok = DefaultTokenizer()
    lines = read_lines(multi30k_files("test_2016_flickr", "en"))[: sizes.decode_sentences]
    ids = [vocabs[0].encode(tok.tokenize(line))[: sizes.max_len] or [vocabs[0].unk_id]
           for line in lines]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))          # batches by length
    batches = []
    for first in range(0, len(order), sizes.decode_batch):
        src, lengths = pad_sources([ids[i] for i in order[first:first + sizes.decode_batch]])
        batches.append((src.to(device), lengths.to(device)))
    captured = [False, True] if device.type == "cuda" else [False]
    for attention in ["reference", "triton"] if fused else ["reference"]:
        torch.manual_seed(0)
        cfg = replace(sizes.preset(len(vocabs[0]), len(vocabs[1])), init="glorot",
                      attention_impl=attention)
        model = build_model(cfg).to(device).eval()
        for beam in (1, 5):
            for fixed in (True, False):
                for graphs in captured:
                    name = (f"{'greedy' if beam == 1 else 'beam 5'} "
                            f"{f'fixed {sizes.fixed_len}' if fixed else 'natural'}"
                            f"{' fused' if attention == 'triton' else ''}"
                            f"{' graphs' if graphs else ''}")
                    if budget.left() < 20:
                        report.add("decode", name, skipped="out of time")
                        continue
                    with recorded(report, "decode", name):
                        row = decode_rate(model, batches, len(ids), device, beam=beam,
                                          fixed=sizes.fixed_len if fixed else None,
                                          graphs=graphs)
                        report.add("decode", name, **row)
        report.save()


def decode_rate(model: Any, batches: list[tuple[torch.Tensor, torch.Tensor]], sentences: int,
                device: torch.device, *, beam: int, fixed: int | None, graphs: bool
                ) -> dict[str, Any]:
    """Sentences per second of two passes over the batches (the first records the graphs and
    compiles the kernels of each shape): `fixed` tokens each, or up to twice the source's."""
    lengths = dict(min_len=fixed, max_len=fixed) if fixed else dict(max_len_ratio=2.0)
    search = BeamSearch(beam_size=beam, **lengths, cuda_graphs=graphs,
                        check_every=CAPTURED_CHECK_EVERY if device.type == "cuda" else 1)
    passes = []
    for _ in range(2):
        sync(device)
        start = time.perf_counter()
        for src, src_lengths in batches:
            search(model, src, src_lengths)
        sync(device)
        passes.append(sentences / (time.perf_counter() - start))
    row: dict[str, Any] = {"sent_s": passes[1], "first_pass_sent_s": passes[0]}
    step = search.captured(model) if graphs else None
    if step is not None and step.graphs:
        row.update(graphs=step.graphs, steps_per_graph=step.replays / step.graphs)
    return row


# ---------------------------------------------------------------------------------- main
def environment(device: torch.device, fused: bool, data_source: str) -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "device": str(device), "data": data_source, "fused_kernel": fused,
                           "joeynmt": importlib.util.find_spec("joeynmt") is not None}
    if fused:
        import triton

        env["triton"] = triton.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sms=props.multi_processor_count,
                   memory_gb=props.total_memory / 1e9)
    return env


def fused_available(device: torch.device) -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":
        return True
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="the Hansard sample folder (train.en.gz, train.fr.gz); "
                                       "default: a synthetic corpus of its lengths")
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--profile", help="write the profiler's tables of the batch-80 "
                                          "updates here")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path on the CPU at tiny sizes (under 2 minutes)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--paths", nargs="+", choices=[p.name for p in PATHS],
                        help="training paths (default: all)")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="stop starting configurations after this many seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        device, sizes = torch.device("cpu"), SMOKE
        torch.set_num_threads(min(2, torch.get_num_threads()))
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run on a GPU, or give --smoke to try it on a CPU")
        device, sizes = torch.device("cuda"), GPU
    budget = Budget(args.budget_s)
    fused = fused_available(device)
    paths = [p for p in PATHS if args.paths is None or p.name in args.paths]
    pairs, data_source = corpus(args.data, sizes)
    examples, src_vocab, tgt_vocab = encoded(pairs, sizes)
    vocabs = (src_vocab, tgt_vocab)
    report = Report(args.json, environment(device, fused, data_source))
    bandwidth = copy_bandwidth(device)
    report.data["environment"]["copy_gb_s"] = None if bandwidth is None else bandwidth / 1e9
    print(json.dumps(report.data["environment"]), flush=True)
    sections = {
        "check": lambda: check_section(report, device, paths, fused, examples, vocabs),
        "attention": lambda: attention_section(report, device, sizes, fused, bandwidth),
        "decode": lambda: decode_section(report, device, sizes, fused, vocabs, budget),
        "train": lambda: train_section(report, device, paths, sizes, fused, examples, vocabs,
                                       budget, args.profile),
    }
    for section in SECTIONS:
        if section in args.only:
            with recorded(report, section, "(section)"):
                sections[section]()
            report.save()
    report.data["environment"]["seconds"] = round(time.monotonic() - budget.start, 1)
    report.save()
    report.table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
