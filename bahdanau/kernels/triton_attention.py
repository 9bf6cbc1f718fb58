"""Fused additive attention in Triton: one alignment step without a (B, S, A) tanh tensor.

Computes the same function as the reference `bahdanau.functional.additive_attention`:

    e_nj = v^T tanh(q_n + k_bj)      a_nj = softmax_j(e_nj) over real j      c_n = sum_j a_nj h_bj

for N query rows q_n = W_a s_{i-1} and B source sentences, row n belonging to sentence b = n // K
(K beams per sentence, stored sentence-major; K = 1 in training). This index replaces K copies of
the keys and annotations: beams of one sentence run as adjacent programs and read the same
source tiles, so the sentence is fetched from DRAM once per step and the rest are cache hits.

Forward (`_forward_kernel`, one program per query row and block of BLOCK_S source positions):
the energies of the block are accumulated over A in BLOCK_A slices of the keys, masked, turned
into unnormalised probabilities with the block's own maximum, and mixed with the annotations in
BLOCK_M slices. With one source block per row the program normalises and writes the result;
with several (S > BLOCK_S, or more programs wanted to fill the GPU, as in flash-decoding) each
block writes its partial context, maximum and sum, and `_combine_kernel` rescales and adds them
(the online softmax). Keys and annotations are read once; nothing of size S x A is written.

Backward recomputes tanh instead of storing it, so the memory kept for backward is the (N, S)
weights, O(B*S) instead of O(B*S*A):

    dh_bj = sum_{n in b} a_nj dc_n            one batched matmul (torch)
    da_nj = dc_n . h_bj + dweights_nj         one batched matmul (torch)
    de_nj = a_nj (da_nj - sum_j' a_nj' da_nj')
    dq_n = sum_j g_nj,  dk_bj = sum_{n in b} g_nj,  dv = sum_nj de_nj tanh(q_n + k_bj),
    with g_nj = de_nj v * (1 - tanh(q_n + k_bj)^2)        `_backward_kernel`, one pass over k

`_backward_kernel` runs one program per (sentence, A slice) and loops over the sentence's query
rows, so it loads each key tile once however many rows attend to it. Stacking the T decoder
steps of a sequence as rows of one sentence turns it into the sequence-level dk kernel (each key
tile loaded once for all steps); the per-step op below uses it with the K rows of one step.

Supported: float32, bfloat16 and float16 inputs (float32 accumulation; outputs in the input
dtype, weights for backward kept in float32), any S >= 1, any mask with a real token per row,
strided query rows (e.g. a split of a fused projection). Differences from the reference:

* float64 is not supported (the reference is the float64 path).
* `fast_tanh=True` uses the GPU's `tanh.approx.f32` (about 2^-11 relative error) for decoding;
  under the interpreter it is ignored.
* Under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors) tanh is computed as
  (1 - exp(-2|x|)) / (1 + exp(-2|x|)) with the sign of x, overflow-safe; on CUDA libdevice's tanh.

The op is registered as `torch.ops.bahdanau.additive_attention` (forward) and
`torch.ops.bahdanau.additive_attention_backward`, with fake (meta) implementations, so it works
under `torch.compile` and passes `torch.library.opcheck`. It is differentiable once (no double
backward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from bahdanau._checks import check_tensor
from bahdanau.errors import InputError
from bahdanau.kernels import FUSED_DTYPES, interpreting

# tanh implementations, chosen per launch (constexpr): the interpreter has no tanh
_TANH_EXP, _TANH_LIBDEVICE, _TANH_APPROX = 0, 1, 2


@triton.jit
def _tanh(x, MODE: tl.constexpr):
    if MODE == 0:                       # exp form, overflow-safe: exp(-2|x|) lies in (0, 1]
        y = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - y) / (1.0 + y)
        out = tl.where(x < 0, -t, t)
    elif MODE == 1:
        out = libdevice.tanh(x)
    else:
        out = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x],
                                        dtype=tl.float32, is_pure=True, pack=1)
    return out


@triton.jit
def _forward_kernel(q_ptr, k_ptr, h_ptr, mask_ptr, v_ptr,            # inputs
                    ctx_ptr, w_ptr, part_ptr, stat_ptr,              # outputs / scratch
                    S, A, M, K,
                    stride_qn, stride_kb, stride_ks, stride_hb, stride_hs, stride_mb,
                    NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_A: tl.constexpr,
                    BLOCK_M: tl.constexpr, TANH: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b = n // K                                                       # beam -> sentence
    offs_s = split * BLOCK_S + tl.arange(0, BLOCK_S)
    in_s = offs_s < S
    real = tl.load(mask_ptr + b * stride_mb + offs_s, mask=in_s, other=0) != 0

    # energies e_nj for this block of positions, accumulated over A
    energy = tl.zeros([BLOCK_S], dtype=tl.float32)
    k_rows = k_ptr + b * stride_kb + offs_s[:, None] * stride_ks
    for a0 in range(0, A, BLOCK_A):
        offs_a = a0 + tl.arange(0, BLOCK_A)
        in_a = offs_a < A
        q = tl.load(q_ptr + n * stride_qn + offs_a, mask=in_a, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs_a, mask=in_a, other=0.0).to(tl.float32)
        k = tl.load(k_rows + offs_a[None, :], mask=in_s[:, None] & in_a[None, :],
                    other=0.0).to(tl.float32)                        # (BLOCK_S, BLOCK_A)
        energy += tl.sum(_tanh(q[None, :] + k, TANH) * v[None, :], axis=1)
    energy = tl.where(real, energy, float("-inf"))

    # unnormalised probabilities with the block's maximum (a block may be all padding)
    block_max = tl.max(energy, axis=0)
    shift = tl.where(block_max == float("-inf"), 0.0, block_max)
    p = tl.exp(energy - shift)                                       # 0 at padding
    total = tl.sum(p, axis=0)
    if NSPLIT == 1:
        p = p / total
        tl.store(w_ptr + n * S + offs_s, p, mask=in_s)
    else:
        tl.store(w_ptr + n * S + offs_s, energy, mask=in_s)          # normalised by the combine
        tl.store(stat_ptr + (n * NSPLIT + split) * 2, block_max)
        tl.store(stat_ptr + (n * NSPLIT + split) * 2 + 1, total)

    # context (or this block's part of it), in slices of M
    h_rows = h_ptr + b * stride_hb + offs_s[:, None] * stride_hs
    for m0 in range(0, M, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        in_m = offs_m < M
        h = tl.load(h_rows + offs_m[None, :], mask=in_s[:, None] & in_m[None, :],
                    other=0.0).to(tl.float32)                        # (BLOCK_S, BLOCK_M)
        acc = tl.sum(p[:, None] * h, axis=0)
        if NSPLIT == 1:
            tl.store(ctx_ptr + n * M + offs_m, acc.to(ctx_ptr.dtype.element_ty), mask=in_m)
        else:
            tl.store(part_ptr + (n * NSPLIT + split) * M + offs_m, acc, mask=in_m)


@triton.jit
def _combine_kernel(ctx_ptr, w_ptr, part_ptr, stat_ptr, S, M,
                    NSPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK_S: tl.constexpr,
                    BLOCK_M: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    mb = tl.program_id(1)
    offs_p = tl.arange(0, SPLIT_P2)
    in_p = offs_p < NSPLIT
    maxima = tl.load(stat_ptr + (n * NSPLIT + offs_p) * 2, mask=in_p, other=float("-inf"))
    sums = tl.load(stat_ptr + (n * NSPLIT + offs_p) * 2 + 1, mask=in_p, other=0.0)
    top = tl.max(maxima, axis=0)                                     # finite: a real token
    scale = tl.where(maxima == float("-inf"), 0.0, tl.exp(maxima - top))
    total = tl.sum(scale * sums, axis=0)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = offs_m < M
    parts = tl.load(part_ptr + (n * NSPLIT + offs_p[:, None]) * M + offs_m[None, :],
                    mask=in_p[:, None] & in_m[None, :], other=0.0)   # (SPLIT_P2, BLOCK_M)
    ctx = tl.sum(parts * scale[:, None], axis=0) / total
    tl.store(ctx_ptr + n * M + offs_m, ctx.to(ctx_ptr.dtype.element_ty), mask=in_m)

    if mb == 0:                                                      # energies -> weights
        for s0 in range(0, S, BLOCK_S):
            offs_s = s0 + tl.arange(0, BLOCK_S)
            in_s = offs_s < S
            energy = tl.load(w_ptr + n * S + offs_s, mask=in_s, other=float("-inf"))
            tl.store(w_ptr + n * S + offs_s, tl.exp(energy - top) / total, mask=in_s)


@triton.jit
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


# ---------------------------------------------------------------------------- launch helpers
def _tanh_mode(fast: bool) -> int:
    if interpreting():
        return _TANH_EXP
    return _TANH_APPROX if fast else _TANH_LIBDEVICE


def _blocks(src_len: int, align: int, width: int) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_A, BLOCK_M). The interpreter's cost is per op, so it gets large blocks;
    on a GPU the (BLOCK_S, BLOCK_A) tile stays small enough to live in registers."""
    p2 = triton.next_power_of_2
    if interpreting():
        return min(p2(src_len), 64), min(p2(align), 128), min(p2(width), 256)
    return min(p2(src_len), 32), min(p2(align), 64), min(p2(width), 128)


def _row_major(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("bahdanau::additive_attention", mutates_args=())
def _attention_op(query_proj: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor,
                  v: Tensor, fast_tanh: bool) -> tuple[Tensor, Tensor]:
    """(N, M) context in the input dtype and (N, S) float32 weights."""
    query_proj, keys, annotations = map(_row_major, (query_proj, keys, annotations))
    batch, src_len, align = keys.shape
    rows, width = query_proj.shape[0], annotations.shape[2]
    block_s, block_a, block_m = _blocks(src_len, align, width)
    nsplit = triton.cdiv(src_len, block_s)
    context = query_proj.new_empty(rows, width)
    weights = query_proj.new_empty(rows, src_len, dtype=torch.float32)
    f32 = torch.float32
    part = query_proj.new_empty(rows * nsplit * width if nsplit > 1 else 1, dtype=f32)
    stat = query_proj.new_empty(rows * nsplit * 2 if nsplit > 1 else 1, dtype=f32)
    mask_u8 = mask.contiguous().view(torch.uint8)
    _forward_kernel[(rows, nsplit)](
        query_proj, keys, annotations, mask_u8, v.contiguous(),
        context, weights, part, stat,
        src_len, align, width, rows // batch,
        query_proj.stride(0), keys.stride(0), keys.stride(1),
        annotations.stride(0), annotations.stride(1), mask_u8.stride(0),
        NSPLIT=nsplit, BLOCK_S=block_s, BLOCK_A=block_a, BLOCK_M=block_m,
        TANH=_tanh_mode(fast_tanh),
    )
    if nsplit > 1:
        _combine_kernel[(rows, triton.cdiv(width, block_m))](
            context, weights, part, stat, src_len, width,
            NSPLIT=nsplit, SPLIT_P2=triton.next_power_of_2(nsplit), BLOCK_S=block_s,
            BLOCK_M=block_m,
        )
    return context, weights


@_attention_op.register_fake
def _(query_proj, keys, annotations, mask, v, fast_tanh):
    rows, src_len = query_proj.shape[0], keys.shape[1]
    return (query_proj.new_empty(rows, annotations.shape[2]),
            query_proj.new_empty(rows, src_len, dtype=torch.float32))


@torch.library.custom_op("bahdanau::additive_attention_backward", mutates_args=())
def _attention_backward_op(grad_context: Tensor, grad_weights: Tensor, query_proj: Tensor,
                           keys: Tensor, annotations: Tensor, v: Tensor, weights: Tensor
                           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients for query_proj, keys, annotations and v (tanh recomputed, never stored)."""
    query_proj, keys = _row_major(query_proj), _row_major(keys)
    batch, src_len, align = keys.shape
    rows, beams = query_proj.shape[0], query_proj.shape[0] // batch
    f32 = torch.float32
    probs = weights.view(batch, beams, src_len)                               # (B, K, S) fp32
    grad_c = grad_context.to(f32).view(batch, beams, -1)                      # (B, K, M)
    grad_h = torch.bmm(probs.transpose(1, 2), grad_c).to(annotations.dtype)  # (B, S, M)
    grad_a = torch.bmm(grad_c, annotations.to(f32).transpose(1, 2))           # (B, K, S)
    grad_a = grad_a + grad_weights.to(f32).view(batch, beams, src_len)
    grad_e = probs * (grad_a - (probs * grad_a).sum(-1, keepdim=True))        # 0 at padding
    block_s, block_a, _ = _blocks(src_len, align, 1)
    nblocks = triton.cdiv(src_len, block_s)
    grad_q = query_proj.new_empty(nblocks, rows, align, dtype=f32)
    grad_k = torch.empty_like(keys)
    grad_v = query_proj.new_empty(batch, align, dtype=f32)
    _backward_kernel[(batch, triton.cdiv(align, block_a))](
        query_proj, keys, v.contiguous(), grad_e.contiguous(),
        grad_q, grad_k, grad_v,
        src_len, align, beams, rows,
        query_proj.stride(0), keys.stride(0), keys.stride(1),
        BLOCK_S=block_s, BLOCK_A=block_a, TANH=_tanh_mode(False),
    )
    return (grad_q.sum(0).to(query_proj.dtype), grad_k, grad_h,
            grad_v.sum(0).to(v.dtype))


@_attention_backward_op.register_fake
def _(grad_context, grad_weights, query_proj, keys, annotations, v, weights):
    return (torch.empty_like(query_proj, memory_format=torch.contiguous_format),
            torch.empty_like(keys, memory_format=torch.contiguous_format),
            torch.empty_like(annotations, memory_format=torch.contiguous_format),
            torch.empty_like(v))


def _setup_context(ctx, inputs, output) -> None:
    query_proj, keys, annotations, _mask, v, _fast = inputs
    ctx.save_for_backward(query_proj, keys, annotations, v, output[1])


def _backward(ctx, grad_context, grad_weights):
    query_proj, keys, annotations, v, weights = ctx.saved_tensors
    if grad_context is None:
        grad_context = query_proj.new_zeros(query_proj.shape[0], annotations.shape[2])
    if grad_weights is None:
        grad_weights = weights.new_zeros(weights.shape)
    grads = torch.ops.bahdanau.additive_attention_backward(
        grad_context, grad_weights, query_proj, keys, annotations, v, weights)
    return (*grads[:3], None, grads[3], None)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


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
        (N, M) context and (N, S) weights, both in the input dtype (weights exactly 0 at padding).
    Raises:
        InputError: tensors not on CUDA (without TRITON_INTERPRET=1), unsupported or mixed
            dtypes, shapes that disagree, or an empty source.
    """
    _check(query_proj, keys, annotations, mask, v)
    context, weights = _attention_op(query_proj, keys, annotations, mask, v, fast_tanh)
    return context, weights.to(query_proj.dtype)


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
    dtypes = {name: t.dtype for name, t in tensors.items() if name != "mask"}
    if len(set(dtypes.values())) != 1 or keys.dtype not in FUSED_DTYPES:
        raise InputError(f"the fused kernel takes one dtype among {FUSED_DTYPES}, got "
                         f"{dtypes}; use impl='reference' for other dtypes")
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
