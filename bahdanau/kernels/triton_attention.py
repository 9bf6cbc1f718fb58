"""Fused additive attention in Triton: one alignment step without a (B, S, A) tanh tensor.

Computes the same function as the reference `bahdanau.functional.additive_attention`:

    e_nj = v^T tanh(q_n + k_bj)      a_nj = softmax_j(e_nj) over real j      c_n = sum_j a_nj h_bj

for N query rows q_n = W_a s_{i-1} and B source sentences, row n belonging to sentence b = n // K
(K beams per sentence, stored sentence-major; K = 1 in training). The index replaces K copies of
the keys and annotations.

Forward, in three steps:

1. `_energy_kernel`, one program per sentence, and per chunk of its source positions while the
   sentences are fewer than `_PROGRAMS_PER_SM` programs per multiprocessor (as in
   flash-decoding): for each block of BLOCK_S positions and slice of BLOCK_A alignment units it
   loads the key tile once and forms tanh(q + k) for BLOCK_R rows of the sentence at once, a
   (BLOCK_R, BLOCK_S, BLOCK_A) tile reduced over A against v. The key tile serves all its rows
   (more than BLOCK_R beams loop over the program's chunk again, from cache), so each key comes
   from DRAM once however many beams attend to it. It writes the masked energies, (N, S)
   float32, -inf at padding.
2. `torch.softmax` over them: the (N, S) float32 weights, the only thing kept for backward.
3. The value mix, one batched matmul (B, K, S) x (B, S, M): it reads each annotation tile once
   for the K rows of its sentence. Values are M = 2H wide, or 4000 in the engine ([C; C_o] h_j),
   too wide to carry across S in registers; a matmul library mixes them at full bandwidth, in
   the values' dtype (half-precision values: the weights rounded to it, float32 accumulation,
   as the reference's matmul under autocast).

Backward recomputes tanh instead of storing it, so the memory kept for backward is the (N, S)
weights, O(B*S) instead of O(B*S*A):

    dh_bj = sum_{n in b} a_nj dc_n            one batched matmul
    da_nj = dc_n . h_bj + dweights_nj         one batched matmul
    de_nj = a_nj (da_nj - sum_j' a_nj' da_nj')
    dq_n = sum_j g_nj,  dk_bj = sum_{n in b} g_nj,  dv = sum_nj de_nj tanh(q_n + k_bj),
    with g_nj = de_nj v * (1 - tanh(q_n + k_bj)^2)        `_backward_kernel`, one pass over k

`_backward_kernel` runs one program per (sentence, A slice) and loops over the sentence's query
rows, so it loads each key tile once however many rows attend to it.

Launch configurations (`_Config`: BLOCK_S, BLOCK_A, warps) are timed on CUDA on first use and
kept per key: the source length rounded up to a power of two (`_length_bucket`), A, the rows per
sentence rounded likewise (capped at the row block in the forward's key, BLOCK_R), the input
dtypes and the tanh form. No
compiled constant comes from S: S, the row count and the strides that contain S are runtime
ints Triton does not specialise (`do_not_specialize`), so a new source length reuses the
binaries of its configuration and `compiled_variants` stays put. Under the interpreter one fixed
configuration runs (nothing can be timed there), and while a CUDA graph is being captured
nothing is timed either: an untimed key gets its default configuration (the first of its
candidates, `_candidates`).

Supported: float32, bfloat16 and float16 inputs in any mix (under `torch.autocast` the
projections arrive in half precision and v_a in float32; everything is accumulated in float32),
any S >= 1, any mask with a real token per row, strided query rows (e.g. a split of a fused
projection). The outputs take the dtypes the reference returns for the same inputs under the
same autocast state (`_output_dtypes`), and each gradient the dtype of its input. Differences
from the reference:

* float64 is not supported (the reference is the float64 path).
* tanh is computed as (1 - exp(-2|x|)) / (1 + exp(-2|x|)) with the sign of x, overflow-safe; on
  a GPU through the fast exp2 and division (a few ulp, as libdevice's tanh, at less cost).
* `fast_tanh=True` uses the GPU's `tanh.approx.f32` (about 2^-11 relative error) for decoding;
  under the interpreter (TRITON_INTERPRET=1, CPU tensors) it is ignored.

The op is registered as `torch.ops.bahdanau.additive_attention` (forward) and
`torch.ops.bahdanau.additive_attention_backward`, with fake (meta) implementations, so it works
under `torch.compile` and passes `torch.library.opcheck`. It is differentiable once (no double
backward).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources
from triton.testing import do_bench

from bahdanau._checks import check_tensor
from bahdanau.errors import InputError
from bahdanau.kernels.availability import FUSED_DTYPES, interpreting

# tanh forms, chosen per launch (constexpr)
_TANH_EXP, _TANH_APPROX = 0, 1


@triton.jit
def _tanh(x, MODE: tl.constexpr):
    if MODE == 0:       # exp form, overflow-safe as exp(-2|x|) lies in (0, 1]; on a GPU exp2 and
        y = tl.exp2(-2.8853900817779268 * tl.abs(x))        # the division are the fast ones
        t = tl.fdiv(1.0 - y, 1.0 + y)
        out = tl.where(x < 0, -t, t)
    else:
        out = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x],
                                        dtype=tl.float32, is_pure=True, pack=1)
    return out


@triton.jit(do_not_specialize=["S", "chunk", "stride_kb", "stride_mb"])
def _energy_kernel(q_ptr, k_ptr, mask_ptr, v_ptr, e_ptr,
                   S, A, K, chunk,
                   stride_qn, stride_kb, stride_ks, stride_mb,
                   BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_A: tl.constexpr,
                   TANH: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)                                # sentence
    s_start = tl.program_id(1) * chunk                               # its positions [start, end)
    s_end = tl.minimum(s_start + chunk, S)
    k_sentence = k_ptr + b * stride_kb
    for r0 in range(0, K, BLOCK_R):                                  # once when K <= BLOCK_R
        rows = r0 + tl.arange(0, BLOCK_R)
        in_r = rows < K
        n = b * K + rows                                             # (BLOCK_R,) query rows
        for s0 in range(s_start, s_end, BLOCK_S):
            offs_s = s0 + tl.arange(0, BLOCK_S)
            in_s = offs_s < s_end
            energy = tl.zeros([BLOCK_R, BLOCK_S], dtype=tl.float32)
            for a0 in range(0, A, BLOCK_A):
                offs_a = a0 + tl.arange(0, BLOCK_A)
                in_a = offs_a < A
                k = tl.load(k_sentence + offs_s[:, None] * stride_ks + offs_a[None, :],
                            mask=in_s[:, None] & in_a[None, :],
                            other=0.0).to(tl.float32)                # (BLOCK_S, BLOCK_A), once
                q = tl.load(q_ptr + n[:, None] * stride_qn + offs_a[None, :],
                            mask=in_r[:, None] & in_a[None, :],
                            other=0.0).to(tl.float32)                # (BLOCK_R, BLOCK_A)
                v = tl.load(v_ptr + offs_a, mask=in_a, other=0.0).to(tl.float32)
                t = _tanh(q[:, None, :] + k[None, :, :], TANH)       # (BLOCK_R, BLOCK_S, BLOCK_A)
                energy += tl.sum(t * v[None, None, :], axis=2)
            real = tl.load(mask_ptr + b * stride_mb + offs_s, mask=in_s, other=0) != 0
            energy = tl.where(real[None, :], energy, float("-inf"))
            tl.store(e_ptr + n[:, None] * S + offs_s[None, :], energy,
                     mask=in_r[:, None] & in_s[None, :])


@triton.jit(do_not_specialize=["S", "N", "stride_kb"])
def _backward_kernel(q_ptr, k_ptr, v_ptr, de_ptr,                    # inputs
                     dq_ptr, dk_ptr, dv_ptr,                         # outputs (scratch for dq, dv)
                     S, A, K, N,
                     stride_qn, stride_kb, stride_ks,
                     BLOCK_S: tl.constexpr, BLOCK_A: tl.constexpr, TANH: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs_a = tl.program_id(1) * BLOCK_A + tl.arange(0, BLOCK_A)
    in_a = offs_a < A
    v = tl.load(v_ptr + offs_a, mask=in_a, other=0.0).to(tl.float32)
    dv = tl.zeros([BLOCK_A], dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        in_s = offs_s < S
        tile = in_s[:, None] & in_a[None, :]
        k = tl.load(k_ptr + b * stride_kb + offs_s[:, None] * stride_ks + offs_a[None, :],
                    mask=tile, other=0.0).to(tl.float32)             # loaded once per tile
        dk = tl.zeros([BLOCK_S, BLOCK_A], dtype=tl.float32)
        for r in range(0, K):                                        # the sentence's rows
            n = b * K + r
            q = tl.load(q_ptr + n * stride_qn + offs_a, mask=in_a, other=0.0).to(tl.float32)
            de = tl.load(de_ptr + n * S + offs_s, mask=in_s, other=0.0)   # 0 at padding
            t = _tanh(q[None, :] + k, TANH)
            dv += tl.sum(de[:, None] * t, axis=0)
            g = de[:, None] * v[None, :] * (1.0 - t * t)
            dk += g
            # one partial dq per source block, summed afterwards: no read-modify-write
            tl.store(dq_ptr + ((s0 // BLOCK_S) * N + n) * A + offs_a, tl.sum(g, axis=0),
                     mask=in_a)
        tl.store(dk_ptr + (b * S + offs_s[:, None]) * A + offs_a[None, :],
                 dk.to(dk_ptr.dtype.element_ty), mask=tile)
    tl.store(dv_ptr + b * A + offs_a, dv, mask=in_a)


# ---------------------------------------------------------------------------- configurations
class _Config(NamedTuple):
    """One launch configuration: source block, alignment slice, warps per program."""

    block_s: int
    block_a: int
    num_warps: int


# Timed on CUDA; the first candidate that fits a key is its default (used untimed during a CUDA
# graph capture). The forward's tile is (BLOCK_R, BLOCK_S, BLOCK_A) float32 values: kept at 8 to
# 64 per thread, so a large row block (beams) keeps the configurations with small tiles.
_FORWARD_CONFIGS = tuple(_Config(*c) for c in (
    (16, 128, 4), (8, 128, 2), (8, 128, 4), (8, 256, 4), (16, 256, 4), (16, 256, 8),
    (8, 64, 4), (8, 128, 8)))
_BACKWARD_CONFIGS = tuple(_Config(*c) for c in (
    (16, 128, 4), (8, 128, 2), (8, 256, 4), (16, 256, 4), (32, 128, 4), (16, 128, 8)))
# The interpreter's cost is per block operation: one configuration, small enough that the tests'
# sizes cross blocks of S and A, and a split of S forced by the small program target below.
_INTERPRETER_CONFIG = _Config(32, 64, 1)
_INTERPRETER_PROGRAMS = 4
# Measured on an H200 (12 beams, S = 50, A = 1000): row blocks of 4 beat 16 (which wastes a
# quarter of its rows on 12 beams and leaves room for fewer configurations), and 4 programs per
# multiprocessor beat 1 and 2 (8 gained nothing more).
_MAX_ROW_BLOCK = 4                       # rows of a sentence handled together (BLOCK_R)
_PROGRAMS_PER_SM = 4                     # the forward splits S until it has this many per SM
_TUNED: dict[tuple, _Config] = {}        # key -> the fastest configuration, timed on CUDA


def _row_block(beams: int) -> int:
    """BLOCK_R: the rows per sentence rounded up to a power of two, at most `_MAX_ROW_BLOCK`
    (more rows loop)."""
    return min(triton.next_power_of_2(beams), _MAX_ROW_BLOCK)


def _length_bucket(src_len: int) -> int:
    """The source length in tuning keys: rounded up to a power of two, at least 16."""
    return max(triton.next_power_of_2(src_len), 16)


def _candidates(configs: tuple[_Config, ...], rows: int) -> tuple[_Config, ...]:
    """The configurations whose (rows, BLOCK_S, BLOCK_A) float32 tile holds 8 to 64 values per
    thread (rows = 1 for the backward's 2-D tile); the first is the default."""
    return tuple(c for c in configs
                 if 8 <= rows * c.block_s * c.block_a // (32 * c.num_warps) <= 64)


def _target_programs(device: torch.device) -> int:
    """How many programs the forward aims for: a few per multiprocessor, so that tanh's latency
    is hidden (the interpreter: a small number, so that small tests take the split path too)."""
    if device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    return _PROGRAMS_PER_SM * _multiprocessors(device.index)


@functools.cache
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _choose(key: tuple, candidates: tuple[_Config, ...], launch: Callable[[_Config], Any]
            ) -> _Config:
    """The configuration for `key`: timed once on CUDA (every candidate run through `launch`,
    which only writes its outputs, so a rerun is harmless), fixed under the interpreter, and
    never timed during a CUDA graph capture (an untimed key then gets its first candidate)."""
    if interpreting():
        return _INTERPRETER_CONFIG
    best = _TUNED.get(key)
    if best is not None:
        return best
    if torch.cuda.is_current_stream_capturing():
        return candidates[0]
    times = {}
    for config in candidates:
        try:
            times[config] = do_bench(functools.partial(launch, config), warmup=5, rep=20)
        except OutOfResources:
            continue
    best = _TUNED[key] = min(times, key=times.__getitem__)
    return best


def compiled_variants() -> int:
    """The number of compiled binaries the module's kernels hold now (0 under the interpreter,
    which compiles nothing): a new source length must not add to it."""
    total = 0
    for kernel in (_energy_kernel, _backward_kernel):
        caches = getattr(kernel, "device_caches", {})
        total += sum(len(cache[0]) for cache in caches.values())
    return total


# ---------------------------------------------------------------------------- launch helpers
def _tanh_mode(fast: bool) -> int:
    return _TANH_APPROX if fast and not interpreting() else _TANH_EXP


def _row_major(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _energy_launch(query_proj: Tensor, keys: Tensor, mask: Tensor, v: Tensor, energies: Tensor,
                   config: _Config, tanh: int) -> tuple[tuple[int, int], dict[str, Any]]:
    """The grid and keyword arguments of one `_energy_kernel` launch.

    The grid is (B, splits): the S blocks of a sentence are shared among `splits` programs only
    when the B sentences are fewer than `_target_programs`. `mask` is the (B, S) mask viewed as
    uint8; `energies` the (N, S) float32 output.
    """
    batch, src_len, align = keys.shape
    beams = query_proj.shape[0] // batch
    blocks = triton.cdiv(src_len, config.block_s)
    wanted = max(1, min(blocks, triton.cdiv(_target_programs(keys.device), batch)))
    per_split = triton.cdiv(blocks, wanted)                          # S blocks per program
    args = dict(q_ptr=query_proj, k_ptr=keys, mask_ptr=mask, v_ptr=v, e_ptr=energies,
                S=src_len, A=align, K=beams, chunk=per_split * config.block_s,
                stride_qn=query_proj.stride(0), stride_kb=keys.stride(0),
                stride_ks=keys.stride(1), stride_mb=mask.stride(0),
                BLOCK_R=_row_block(beams), BLOCK_S=config.block_s, BLOCK_A=config.block_a,
                TANH=tanh, num_warps=config.num_warps)
    return (batch, triton.cdiv(blocks, per_split)), args


def _backward_launch(query_proj: Tensor, keys: Tensor, v: Tensor, grad_e: Tensor,
                     grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, config: _Config
                     ) -> tuple[tuple[int, int], dict[str, Any]]:
    """The grid and keyword arguments of one `_backward_kernel` launch (`_backward_buffers`
    makes the outputs for `config`)."""
    batch, src_len, align = keys.shape
    args = dict(q_ptr=query_proj, k_ptr=keys, v_ptr=v, de_ptr=grad_e,
                dq_ptr=grad_q, dk_ptr=grad_k, dv_ptr=grad_v,
                S=src_len, A=align, K=query_proj.shape[0] // batch, N=query_proj.shape[0],
                stride_qn=query_proj.stride(0), stride_kb=keys.stride(0),
                stride_ks=keys.stride(1),
                BLOCK_S=config.block_s, BLOCK_A=config.block_a, TANH=_tanh_mode(False),
                num_warps=config.num_warps)
    return (batch, triton.cdiv(align, config.block_a)), args


def _backward_buffers(query_proj: Tensor, keys: Tensor, config: _Config
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """(S blocks, N, A) float32 partial query gradients, the key gradient in the keys' dtype,
    and (B, A) float32 partial v gradients."""
    batch, src_len, align = keys.shape
    f32 = torch.float32
    blocks = triton.cdiv(src_len, config.block_s)
    return (query_proj.new_empty(blocks, query_proj.shape[0], align, dtype=f32),
            torch.empty_like(keys, memory_format=torch.contiguous_format),
            query_proj.new_empty(batch, align, dtype=f32))


def _dtypes_key(*tensors: Tensor) -> tuple[str, ...]:
    return tuple(str(t.dtype) for t in tensors)


def _energies(query_proj: Tensor, keys: Tensor, mask: Tensor, v: Tensor, fast_tanh: bool
              ) -> Tensor:
    """(N, S) float32 energies e_nj, -inf at padding (`_energy_kernel`)."""
    batch, src_len, align = keys.shape
    beams = query_proj.shape[0] // batch
    energies = query_proj.new_empty(query_proj.shape[0], src_len, dtype=torch.float32)
    mask_u8 = mask.contiguous().view(torch.uint8)
    tanh = _tanh_mode(fast_tanh)

    def launch(config: _Config) -> None:
        grid, args = _energy_launch(query_proj, keys, mask_u8, v, energies, config, tanh)
        _energy_kernel[grid](**args)

    row_block = _row_block(beams)
    key = ("energy", _length_bucket(src_len), align, row_block, tanh,
           *_dtypes_key(query_proj, keys, v))
    launch(_choose(key, _candidates(_FORWARD_CONFIGS, row_block), launch))
    return energies


def _key_grads(query_proj: Tensor, keys: Tensor, v: Tensor, grad_e: Tensor
               ) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of the query rows, keys and v from the energies' (N, S) float32 gradient,
    each in its input's dtype (`_backward_kernel`)."""
    batch, src_len, align = keys.shape
    beams = query_proj.shape[0] // batch

    def launch(config: _Config) -> tuple[Tensor, Tensor, Tensor]:
        buffers = _backward_buffers(query_proj, keys, config)
        grid, args = _backward_launch(query_proj, keys, v, grad_e, *buffers, config)
        _backward_kernel[grid](**args)
        return buffers

    key = ("backward", _length_bucket(src_len), align, triton.next_power_of_2(beams),
           *_dtypes_key(query_proj, keys, v))
    grad_q, grad_k, grad_v = launch(_choose(key, _candidates(_BACKWARD_CONFIGS, 1), launch))
    return grad_q.sum(0).to(query_proj.dtype), grad_k, grad_v.sum(0).to(v.dtype)


def _no_autocast(t: Tensor) -> contextlib.AbstractContextManager:
    """Inside the ops every dtype is chosen here: autocast, still on when a custom op runs,
    must not recast the matmuls (entered only when on: entering costs host time)."""
    device = t.device.type
    if torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------- registered ops
@torch.library.custom_op("bahdanau::additive_attention", mutates_args=())
def _attention_op(query_proj: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor,
                  v: Tensor, fast_tanh: bool, context_dtype: torch.dtype
                  ) -> tuple[Tensor, Tensor]:
    """(N, M) context in `context_dtype` and (N, S) float32 weights."""
    query_proj, keys = _row_major(query_proj), _row_major(keys)
    batch, src_len, _ = keys.shape
    rows = query_proj.shape[0]
    with _no_autocast(keys):
        weights = torch.softmax(_energies(query_proj, keys, mask, v.contiguous(), fast_tanh),
                                dim=-1)                                   # (N, S) float32
        probs = weights.view(batch, rows // batch, src_len).to(annotations.dtype)
        context = torch.bmm(probs, annotations).view(rows, -1)           # (B, K, M), fp32 acc.
    return context.to(context_dtype), weights


@_attention_op.register_fake
def _(query_proj, keys, annotations, mask, v, fast_tanh, context_dtype):
    rows, src_len = query_proj.shape[0], keys.shape[1]
    return (query_proj.new_empty(rows, annotations.shape[2], dtype=context_dtype),
            query_proj.new_empty(rows, src_len, dtype=torch.float32))


def _weight_grads(grad_c: Tensor, annotations: Tensor) -> Tensor:
    """(B, K, S) float32 dc_n . h_bj. Half-precision annotations are read as they are where
    the matmul can write float32 (CUDA) and the context gradient has their dtype; otherwise
    both are taken to float32 first."""
    half = annotations.dtype != torch.float32 and grad_c.dtype == annotations.dtype
    if half and annotations.device.type == "cuda":
        return torch.bmm(grad_c, annotations.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(grad_c.float(), annotations.float().transpose(1, 2))


@torch.library.custom_op("bahdanau::additive_attention_backward", mutates_args=())
def _attention_backward_op(grad_context: Tensor, grad_weights: Tensor, query_proj: Tensor,
                           keys: Tensor, annotations: Tensor, v: Tensor, weights: Tensor
                           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients for query_proj, keys, annotations and v, each in its input's dtype (tanh
    recomputed, never stored)."""
    query_proj, keys = _row_major(query_proj), _row_major(keys)
    batch, src_len, _ = keys.shape
    beams = query_proj.shape[0] // batch
    with _no_autocast(keys):
        probs = weights.view(batch, beams, src_len)                           # (B, K, S) fp32
        grad_c = grad_context.view(batch, beams, -1)                          # (B, K, M)
        grad_h = torch.bmm(probs.transpose(1, 2).to(annotations.dtype),
                           grad_c.to(annotations.dtype))                      # (B, S, M)
        grad_a = _weight_grads(grad_c, annotations)                           # (B, K, S) fp32
        grad_a = grad_a + grad_weights.float().view(batch, beams, src_len)
        grad_e = probs * (grad_a - (probs * grad_a).sum(-1, keepdim=True))    # 0 at padding
        grad_q, grad_k, grad_v = _key_grads(query_proj, keys, v.contiguous(),
                                            grad_e.view(-1, src_len).contiguous())
    return grad_q, grad_k, grad_h, grad_v


@_attention_backward_op.register_fake
def _(grad_context, grad_weights, query_proj, keys, annotations, v, weights):
    return (torch.empty_like(query_proj, memory_format=torch.contiguous_format),
            torch.empty_like(keys, memory_format=torch.contiguous_format),
            torch.empty_like(annotations, memory_format=torch.contiguous_format),
            torch.empty_like(v))


def _setup_context(ctx, inputs, output) -> None:
    query_proj, keys, annotations, _mask, v, _fast, _dtype = inputs
    ctx.save_for_backward(query_proj, keys, annotations, v, output[1])


def _backward(ctx, grad_context, grad_weights):
    query_proj, keys, annotations, v, weights = ctx.saved_tensors
    if grad_context is None:
        grad_context = query_proj.new_zeros(query_proj.shape[0], annotations.shape[2])
    if grad_weights is None:
        grad_weights = weights.new_zeros(weights.shape)
    grads = torch.ops.bahdanau.additive_attention_backward(
        grad_context, grad_weights, query_proj, keys, annotations, v, weights)
    return (*grads[:3], None, grads[3], None, None)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------- public entry
def additive_attention(query_proj: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor,
                       v: Tensor, *, fast_tanh: bool = False) -> tuple[Tensor, Tensor]:
    """One fused alignment step; the same contract as `bahdanau.functional.additive_attention`.

    Args:
        query_proj: (N, A) W_a s_{i-1}; N = B, or B*K with K beams per sentence (sentence-major).
        keys: (B, S, A) U_a h_j.
        annotations: (B, S, M) what the weights mix: h_j (M = 2H), or any per-position values
            (the decoder passes [C; C_o] h_j).
        mask: (B, S) bool, True at real tokens; every row needs one True. As for the reference,
            that is the caller's promise, not checked here: the check would read the mask back to
            the host (a device sync) at every step. `RNNSearch` checks the lengths the mask comes
            from once per batch, at its door.
        v: (A,) v_a.
        fast_tanh: use the GPU's approximate tanh (for decoding; ignored by the interpreter).
    Returns:
        (N, M) context and (N, S) weights (exactly 0 at padding), in the dtypes the reference
        returns for these inputs here (`_output_dtypes`); gradients in their inputs' dtypes.
    Raises:
        InputError: tensors not on CUDA (without TRITON_INTERPRET=1), a dtype other than
            float32, bfloat16 and float16, shapes that disagree, or an empty source.
    """
    _check(query_proj, keys, annotations, mask, v)
    context_dtype, weights_dtype = _output_dtypes(query_proj, keys, annotations, v)
    context, weights = _attention_op(query_proj, keys, annotations, mask, v, fast_tanh,
                                     context_dtype)
    return context, weights.to(weights_dtype)


def _output_dtypes(query_proj: Tensor, keys: Tensor, annotations: Tensor, v: Tensor
                   ) -> tuple[torch.dtype, torch.dtype]:
    """(context dtype, weights dtype) as `bahdanau.functional.additive_attention` returns them.

    Under autocast for the tensors' device the reference's matmuls (the energies' product with
    v, the value mix) run in the autocast dtype, and so does its softmax on a CPU; on CUDA
    autocast runs softmax in float32. Without autocast the reference's dtypes promote.
    """
    device = keys.device.type
    if torch.is_autocast_enabled(device):
        low = torch.get_autocast_dtype(device)
        return low, torch.float32 if device == "cuda" else low
    weights = torch.promote_types(torch.promote_types(query_proj.dtype, keys.dtype), v.dtype)
    return torch.promote_types(weights, annotations.dtype), weights


def _check(query_proj: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor, v: Tensor
           ) -> None:
    check_tensor("query_proj", query_proj, 2, floating=True)
    check_tensor("keys", keys, 3, floating=True)
    check_tensor("annotations", annotations, 3, floating=True)
    check_tensor("mask", mask, 2, boolean=True)
    check_tensor("v", v, 1, floating=True)
    tensors = {"query_proj": query_proj, "keys": keys, "annotations": annotations, "mask": mask,
               "v": v}
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        raise InputError(f"tensors are on different devices: {devices}")
    if keys.device.type != "cuda" and not interpreting():
        raise InputError(f"the fused kernel needs CUDA tensors, got {keys.device} "
                         "(or set TRITON_INTERPRET=1 before importing triton)")
    unsupported = {name: t.dtype for name, t in tensors.items()
                   if name != "mask" and t.dtype not in FUSED_DTYPES}
    if unsupported:
        raise InputError(f"the fused kernel takes {FUSED_DTYPES} in any mix, got "
                         f"{unsupported}; use impl='reference' for other dtypes")
    batch, src_len, align = keys.shape
    expected = {"query_proj": (query_proj.shape[0], align), "v": (align,),
                "annotations": (batch, src_len, annotations.shape[2]), "mask": (batch, src_len)}
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise InputError(f"{name} has shape {tuple(tensors[name].shape)}, expected {shape} "
                             f"for keys {tuple(keys.shape)}")
    if batch == 0 or src_len == 0 or annotations.shape[2] == 0 or align == 0:
        raise InputError(f"keys {tuple(keys.shape)}, annotations "
                         f"{tuple(annotations.shape)}: empty batch, source or feature size")
    if query_proj.shape[0] % batch != 0 or query_proj.shape[0] == 0:
        raise InputError(f"query_proj rows ({query_proj.shape[0]}) must be a positive multiple "
                         f"of the batch size ({batch}): K beams per sentence, sentence-major")
