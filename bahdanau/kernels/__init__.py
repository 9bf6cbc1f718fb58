"""Every fast op, each beside the reference it must equal, and the switch between them.

* The additive attention through sigmoid (impl "sigmoid", what "auto" picks on a CPU):
  `sigmoid_attention.sigmoid_attention_weights`, twin of `bahdanau.functional.attention_weights`
  (tests/property/test_attention_properties.py).
* The fused Triton attention step (impl "triton"): `triton_attention`, twin of the same
  reference (tests/reference/test_triton_attention.py).
* The chunked linear cross-entropy with recycled CPU buffers (the engine's loss):
  `linear_cross_entropy.linear_cross_entropy`, twin of `bahdanau.functional.sequence_nll`
  (tests/unit/test_linear_cross_entropy.py).
* Step matmuls with weights reordered once for oneDNN (the engine's search steps on a CPU):
  `packed_linear.linear` with `packed_linear.pack_for_steps` (or `packed_linear.pack`, a
  `packed_linear.PackedLinear`), twin of `torch.nn.functional.linear`
  (tests/unit/test_packed_linear.py).
* Step matmuls in int8 on the CPU's int8 dot-product units (an int8 copy's search steps,
  `bahdanau.RNNSearch.int8_copy`): `int8_linear.quantize`, an `int8_linear.Int8Linear`, twin
  of `torch.nn.functional.linear` of the dequantised input and weight,
  `int8_linear.dequantized_linear` (tests/unit/test_int8_linear.py).
* Each beam's best next tokens in two stages on a CPU (every beam step's per-beam top 2K):
  `grouped_topk.top_k`, twin of `torch.topk` (tests/unit/test_grouped_topk.py).

Triton is imported lazily: `import bahdanau` never loads it (`availability` says whether it
can run, without importing it). `resolve_impl` maps a requested
additive-attention implementation to the one that runs for given tensors; `AdditiveAttention`
calls it once per device type and dtype (`AdditiveAttention.implementation`).
"""

from __future__ import annotations

from torch import Tensor

from bahdanau.config import ATTENTION_IMPLS as IMPLS
from bahdanau.errors import InputError
from bahdanau.kernels.availability import FUSED_DTYPES, has_triton, interpreting
from bahdanau.kernels.linear_cross_entropy import linear_cross_entropy
from bahdanau.kernels.sigmoid_attention import sigmoid_attention_weights

__all__ = [
    "FUSED_DTYPES",
    "IMPLS",
    "has_triton",
    "interpreting",
    "linear_cross_entropy",
    "resolve_impl",
    "sigmoid_attention_weights",
    "triton_unavailable_reason",
]

def triton_unavailable_reason(tensor: Tensor) -> str | None:
    """Why the Triton path cannot run on `tensor`, or None if it can."""
    if not has_triton():
        return "the triton package is not installed (pip install 'bahdanau[triton]')"
    if tensor.device.type != "cuda" and not interpreting():
        return (f"tensors are on {tensor.device.type}; the Triton kernel needs CUDA tensors "
                "(or TRITON_INTERPRET=1 for the slow CPU interpreter)")
    try:
        from bahdanau.kernels import triton_attention  # noqa: F401  (lazy: loads triton)
    except ImportError as exc:
        return f"the Triton kernels could not be loaded ({exc})"
    return None


def resolve_impl(impl: str, tensor: Tensor) -> str:
    """Map an `AdditiveAttention` impl to the one that runs on `tensor`.

    "reference", "sigmoid" and "triton" name themselves; "auto" picks "triton" for CUDA tensors
    of a dtype the kernel takes (`FUSED_DTYPES`) when Triton is importable, "sigmoid" for CPU
    tensors, and "reference" otherwise. An explicit "triton" that cannot run raises `InputError`
    (nothing falls back silently).
    """
    if impl not in IMPLS:
        raise InputError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        if tensor.device.type == "cuda" and tensor.dtype in FUSED_DTYPES and has_triton():
            return "triton"
        return "sigmoid" if tensor.device.type == "cpu" else "reference"
    if impl == "triton":
        reason = triton_unavailable_reason(tensor)
        if reason is not None:
            raise InputError(f"impl='triton' cannot run: {reason}")
    return impl
