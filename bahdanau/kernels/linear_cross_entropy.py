"""Summed cross-entropy of a linear layer's logits, in row chunks (the engine's loss).

Twin of `F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="sum")`, held equal to
it in float64 by tests/unit/test_linear_cross_entropy.py. It never stores the (M, V)
log-softmax, and on a CPU it recycles its logits chunk buffers between steps.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from bahdanau.errors import InputError
from bahdanau.functional import upcast


class _BufferPool:
    """Logits chunk buffers given back by finished backward passes, for the next forward.

    Fresh multi-MB CPU tensors cost a page fault per 4 KB page at every step (glibc returns
    freed memory to the system); recycling the chunk buffers avoids that. A buffer is taken in
    forward and given back only after its backward has consumed it, so two forward passes in
    flight never share one. At most `limit_bytes` are kept.
    """

    def __init__(self, limit_bytes: int = 512 << 20) -> None:
        self._free: dict[tuple, list[Tensor]] = {}
        self._bytes, self._limit = 0, limit_bytes
        self._lock = threading.Lock()

    def take(self, rows: int, cols: int, dtype: torch.dtype) -> Tensor:
        with self._lock:
            free = self._free.get((rows, cols, dtype))
            if free:
                buffer = free.pop()
                self._bytes -= buffer.numel() * buffer.element_size()
                return buffer
        return torch.empty(rows, cols, dtype=dtype)

    def give(self, buffers: list[Tensor]) -> None:
        with self._lock:
            for buffer in buffers:
                size = buffer.numel() * buffer.element_size()
                if self._bytes + size > self._limit:
                    break
                self._free.setdefault((*buffer.shape, buffer.dtype), []).append(buffer)
                self._bytes += size


_POOL = _BufferPool()


class _LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `hidden @ weight.T + bias`, in row chunks, without a log-softmax.

    Forward keeps each chunk's logits and log-sum-exp; backward turns the logits into
    softmax minus the (smoothed) one-hot in place and accumulates the weight gradient chunk by
    chunk. Chunks stay a few MB: an (M, V) tensor of more than 32 MB would be a fresh mmap with
    page faults at every allocation on glibc, which costs more than the arithmetic on a CPU.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                label_smoothing: float, chunk: int) -> Tensor:
        loss = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
        logits_chunks, lse_chunks, pooled = [], [], []
        ctx.compute_dtype = hidden.dtype
        recycle = (hidden.device.type == "cpu" and hidden.dtype == weight.dtype
                   and hidden.dtype in (torch.float32, torch.float64)
                   and not torch.is_autocast_enabled("cpu"))
        for start in range(0, hidden.shape[0], chunk):
            rows = hidden[start:start + chunk]
            if recycle:                                           # CPU: reuse chunk buffers
                pooled.append(_POOL.take(chunk, weight.shape[0], hidden.dtype))
                logits = pooled[-1][: rows.shape[0]]
                if bias is None:
                    torch.mm(rows, weight.t(), out=logits)
                else:
                    torch.addmm(bias, rows, weight.t(), out=logits)
            else:
                logits = F.linear(rows, weight, bias)             # (c, V)
                ctx.compute_dtype = logits.dtype                  # bf16/fp16 under autocast
                logits = upcast(logits)
            lse = torch.logsumexp(logits, dim=1)                  # (c,)
            labels = target[start:start + chunk, None]
            chunk_loss = (lse - logits.gather(1, labels).squeeze(1)).sum()
            if label_smoothing > 0.0:
                uniform = (lse - logits.mean(dim=1)).sum()        # -sum_v log p_v / V
                chunk_loss = (1.0 - label_smoothing) * chunk_loss + label_smoothing * uniform
            loss += chunk_loss
            logits_chunks.append(logits)
            lse_chunks.append(lse)
        ctx.save_for_backward(hidden, weight, bias, target)
        ctx.logits_chunks, ctx.lse_chunks, ctx.pooled = logits_chunks, lse_chunks, pooled
        ctx.has_bias, ctx.label_smoothing, ctx.chunk = bias is not None, label_smoothing, chunk
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: Tensor):
        hidden, weight, bias, target = ctx.saved_tensors
        smoothing, chunk, compute = ctx.label_smoothing, ctx.chunk, ctx.compute_dtype
        w = weight.to(compute)                                    # as the forward's matmul saw it
        h = hidden.to(compute)
        logits_chunks = ctx.logits_chunks
        if logits_chunks is None:                                 # a second backward: recompute
            b = None if bias is None else bias.to(compute)
            logits_chunks = [upcast(F.linear(h[i:i + chunk], w, b))
                             for i in range(0, hidden.shape[0], chunk)]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_bias = (weight.new_zeros(weight.shape[0])
                     if ctx.has_bias and ctx.needs_input_grad[2] else None)
        for i, (logits, lse) in enumerate(zip(logits_chunks, ctx.lse_chunks, strict=True)):
            rows = slice(i * chunk, i * chunk + logits.shape[0])
            grad = logits.sub_(lse[:, None]).exp_()               # softmax, in place (c, V)
            if smoothing > 0.0:
                grad.sub_(smoothing / grad.shape[1])
            grad.scatter_add_(1, target[rows, None],
                              grad.new_full((grad.shape[0], 1), smoothing - 1.0))
            grad = grad.mul_(grad_loss).to(compute)
            if grad_hidden is not None:
                grad_hidden[rows] = grad @ w
            if grad_weight is not None:
                if compute == weight.dtype:
                    grad_weight.addmm_(grad.t(), h[rows])
                else:                                             # accumulate in full precision
                    grad_weight += (grad.t() @ h[rows]).to(weight.dtype)
            if grad_bias is not None:
                grad_bias += grad.sum(0).to(weight.dtype)
        ctx.logits_chunks = None                                  # consumed in place above
        _POOL.give(ctx.pooled)
        ctx.pooled = []
        return grad_hidden, grad_weight, grad_bias, None, None, None


def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, *,
                         label_smoothing: float = 0.0, chunk_rows: int | None = None) -> Tensor:
    """Summed cross-entropy of the logits `hidden @ weight.T + bias` against `target`.

    Equal to `F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="sum",
    label_smoothing=label_smoothing)` with less memory traffic: the (M, V) log-softmax is never
    stored. Every row counts (select the non-pad rows first).

    Args:
        hidden: (M, L) features.
        weight: (V, L) output weight.
        bias: (V,) output bias, or None.
        target: (M,) target ids in [0, V).
        label_smoothing: in [0, 1).
        chunk_rows: rows per chunk; default: about 8 MB of logits per chunk.
    Returns:
        The summed loss, a scalar (float32 for half-precision inputs).
    """
    if hidden.dim() != 2 or target.shape != hidden.shape[:1]:
        raise InputError(
            f"hidden {tuple(hidden.shape)} must be (M, L) and target {tuple(target.shape)} (M,)"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise InputError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if chunk_rows is not None and chunk_rows < 1:
        raise InputError(f"chunk_rows must be >= 1, got {chunk_rows}")
    chunk = chunk_rows or max(16, (8 << 20) // (4 * weight.shape[0]))  # ~8 MB of logits
    return _LinearCrossEntropy.apply(hidden, weight, bias, target, label_smoothing, chunk)
