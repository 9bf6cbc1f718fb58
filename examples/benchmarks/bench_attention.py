"""Time one additive-attention step: the eager reference, the compiled reference, the fused kernel.

Three problem sizes, all with S = 50 source positions:

* train: the paper's training batch, B = 80 sentences, A = 1000, 2H = 2000, D = 1000; forward
  and forward + backward (gradients for the query projection, keys, annotations and v_a);
* engine: the same with M = 4000 values, the [C; C_o] h_j the default engine mixes;
* beam: beam search, 64 sentences x 12 beams = 768 query rows sharing their sentence's keys and
  annotations; forward only, as in decoding.

For each path and dtype it prints the median time per step, the bytes that must move at the least
(read keys, annotations, queries, mask, v; write the context and weights; in backward also read
the upstream gradients and write every input gradient), the bandwidth that time implies, and on
CUDA the peak memory the step allocates above its inputs. The eager reference materialises a
(B, S, A) tanh tensor (and keeps it for backward); the fused kernel keeps (N, S) weights only.
With --graph (CUDA) each step is captured in a CUDA graph and the replays are timed: the GPU's
time alone, without the host's cost of launching (which a captured training step or decoding
step does not pay either); without it, a step is timed as called.

Paths:
    eager      `bahdanau.functional.additive_attention`, the tanh form
    sigmoid    the same with v^T tanh(x) = (2v)^T sigmoid(2x) - sum(v) (the CPU path of "auto")
    compiled   `torch.compile` of the eager reference
    fused      `bahdanau.kernels.triton_attention.additive_attention` (CUDA, or the interpreter)

    python examples/benchmarks/bench_attention.py                      # CUDA if present
    python examples/benchmarks/bench_attention.py --device cpu --paths eager sigmoid compiled
    python examples/benchmarks/bench_attention.py --graph --paths eager fused
    python examples/benchmarks/bench_attention.py --json out.json

On a CPU the fused kernel only runs under TRITON_INTERPRET=1, which checks correctness and is
far too slow to time; leave it out there (the default on CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from bahdanau import functional
from bahdanau.captured_step import cuda_graph
from bahdanau.kernels import sigmoid_attention_weights

SIZES = {  # name: (sentences, beams, source length, align A, annotation width 2H)
    "train": (80, 1, 50, 1000, 2000),
    "engine": (80, 1, 50, 1000, 4000),
    "beam": (64, 12, 50, 1000, 2000),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_inputs(size: str, dtype: torch.dtype, device: str, grad: bool):
    batch, beams, src_len, align, width = SIZES[size]
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        t = torch.randn(*shape, generator=gen).to(device, dtype)
        return t.requires_grad_(grad)

    lengths = torch.randint(src_len // 2, src_len + 1, (batch,), generator=gen)
    lengths[0] = src_len
    mask = functional.lengths_to_mask(lengths, src_len).to(device)
    return (randn(batch * beams, align), randn(batch, src_len, align),
            randn(batch, src_len, width), mask, randn(align))


def min_bytes(size: str, dtype: torch.dtype, backward: bool) -> int:
    """Bytes a step must move at the least: each input read once, each output written once."""
    batch, beams, src_len, align, width = SIZES[size]
    rows, item = batch * beams, torch.finfo(dtype).bits // 8
    floats = rows * align + batch * src_len * (align + width) + align  # q, keys, annotations, v
    inputs = floats * item + batch * src_len                            # + the bool mask
    outputs = (rows * width + rows * src_len) * item                    # context, weights
    if not backward:
        return inputs + outputs
    # backward: read the upstream gradients, the saved float32 weights and the inputs again;
    # write a gradient for every floating input
    return inputs + outputs + outputs + rows * src_len * 4 + inputs + floats * item


def paths(device: str) -> dict[str, Callable]:
    reference = functional.additive_attention

    def sigmoid(query_proj, keys, annotations, mask, v):
        weights = sigmoid_attention_weights(query_proj, keys, mask, v)
        return functional.weighted_sum(weights, annotations), weights

    table = {"eager": reference, "sigmoid": sigmoid,
             "compiled": torch.compile(reference, dynamic=False)}
    try:
        from bahdanau.kernels.triton_attention import additive_attention as fused
        table["fused"] = fused
    except ImportError:
        pass
    return table


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_step(fn: Callable, args: tuple, backward: bool, device: str, repeats: int,
              graph: bool = False) -> tuple[float, float | None]:
    """Median seconds per call (per replay of a captured call with `graph`) and the peak bytes
    a call allocates above the inputs (CUDA only)."""
    def once():
        context, weights = fn(*args)
        if backward:
            grads = [a for a in args if a.requires_grad]
            torch.autograd.grad((context.float().sum() + weights.float().sum()), grads)

    if graph:                    # warm-up calls on a side stream (compile, autotune), capture
        step, _ = cuda_graph()(once)
    else:
        for _ in range(3):
            once()                                     # warm up: compile, autotune, caches
        step = once
    sync(device)
    peak = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        once()                                         # a call's peak (a replay allocates none)
        sync(device)
        peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device)
    parser.add_argument("--paths", nargs="+", default=None,
                        help="eager sigmoid compiled fused (default: all that run here)")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--graph", action="store_true",
                        help="time replays of each step captured in a CUDA graph (CUDA only)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = paths(args.device)
    wanted = args.paths or [p for p in table if p != "fused" or args.device == "cuda"]
    missing = [p for p in wanted if p not in table]
    if missing:
        parser.error(f"paths {missing} cannot run here (is triton installed?)")
    if args.graph and args.device != "cuda":
        parser.error("--graph needs --device cuda")

    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else ''}"
          f"{torch.get_num_threads()} threads), torch {torch.__version__}")
    header = (f"{'size':6} {'dtype':5} {'pass':8} {'path':9} {'ms':>9} {'min MB':>8} "
              f"{'GB/s':>8} {'peak MB':>8}")
    print(header)
    rows = []
    for size in args.sizes:
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            passes = ["fwd"] if size == "beam" else ["fwd", "fwd+bwd"]
            for pass_name in passes:
                backward = pass_name == "fwd+bwd"
                inputs = make_inputs(size, dtype, args.device, backward)
                moved = min_bytes(size, dtype, backward)
                for name in wanted:
                    with torch.set_grad_enabled(backward):
                        seconds, peak = time_step(table[name], inputs, backward, args.device,
                                                  args.repeats, args.graph)
                    row = {"size": size, "dtype": dtype_name, "pass": pass_name, "path": name,
                           "ms": 1e3 * seconds, "min_mb": moved / 1e6,
                           "gb_s": moved / seconds / 1e9,
                           "peak_mb": None if peak is None else peak / 1e6}
                    rows.append(row)
                    peak_text = "-" if peak is None else f"{row['peak_mb']:.1f}"
                    print(f"{size:6} {dtype_name:5} {pass_name:8} {name:9} {row['ms']:9.3f} "
                          f"{row['min_mb']:8.1f} {row['gb_s']:8.1f} {peak_text:>8}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
