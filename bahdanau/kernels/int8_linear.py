"""`F.linear` in int8 on a CPU's int8 dot-product units: the big matmuls of an int8 search step.

A weight is quantised once, per output channel and symmetrically: row c becomes int8 values
q_c in [-127, 127] and a float32 scale s_c = max_k |W_ck| / 127, so W_c ~= s_c q_c
(`quantize_weight`). Each call quantises its input x per tensor and asymmetrically, to uint8
with a scale and a zero point chosen from x's range (`quantize_input`), as dynamic
quantisation does; the product of the two is summed exactly in int32 and scaled back to
float32, with the bias added:

    y_nc = s_x s_c sum_k (qx_nk - z_x) q_ck + b_c

which is `F.linear` of the dequantised input and weight (`dequantized_linear`, the float64
reference tests/unit/test_int8_linear.py holds it to), rounded once to float32. The error
against the float weights is the quantisation's: at most s_c / 2 a weight, s_x / 2 an input.

The kernels are torch's own oneDNN int8 ops, the ones inductor lowers x86 int8 models to:
`torch.ops.onednn.qlinear_prepack` reorders the int8 weight once into the blocked layout its
kernels read, and `torch.ops.onednn.qlinear_pointwise` multiplies, with the scales and the
bias fused, on VNNI's u8 x s8 -> s32 dot products. They take plain uint8 and int8 tensors,
not the quantised dtypes (`torch.qint8`) that torch deprecates, and need no other package
(torchao's int8 dynamic quantisation computes the same product in eager mode through
`torch._int_mm` and a separate rescaling, which measured slower here). Single-threaded, on a
CPU with avx512_vnni, at the small preset: W_o (10,004 x 256) took about 1.6 ms for 64 rows
and 7 ms for 320 against 4.8 and 24 ms packed in float32; the fused step weight (2,048 x 512)
0.35 and 3.2 ms against 1.8 and 8.8 ms.

`available` says whether this build of torch has the two ops and the CPU the instructions
(without VNNI, oneDNN halves int8 weights to keep 16-bit sums from saturating, which breaks
the exact product above): int8 decoding is refused elsewhere, with one line.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

# the widest int8 value a weight takes: symmetric, so -127..127 (never -128)
_QMAX = 127
# uint8's range, for the input
_UMAX = 255


def unavailable_reason() -> str | None:
    """Why int8 matmuls cannot run on this machine, or None where they can."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.onednn, "qlinear_prepack")
            and hasattr(torch.ops.onednn, "qlinear_pointwise")):
        return "this build of torch has no oneDNN int8 linear ops"
    if not torch.cpu._is_vnni_supported():
        return "this CPU has no int8 dot-product instructions (AVX512-VNNI or AVX-VNNI)"
    if not _exact_here():
        return "oneDNN's int8 product differs from the exact one on this CPU"
    return None


def available() -> bool:
    """Whether int8 matmuls run here (`unavailable_reason` is None)."""
    return unavailable_reason() is None


@functools.cache
def _exact_here() -> bool:
    """One small product, the first time it is asked: the int8 op equals its reference to
    float32 rounding (inputs at the ends of their ranges, where saturation would show)."""
    weight = torch.tensor([[1.0, -1.0, 1.0, -1.0], [0.5, 0.25, -1.0, 1.0]]).repeat(1, 16)
    x = torch.tensor([[4.0, -4.0, 4.0, -4.0], [3.0, 2.0, -1.0, 0.0]]).repeat(1, 16)
    try:
        with torch.inference_mode():
            layer = quantize(weight, None)
            got = layer(x)
    except RuntimeError:
        return False
    want = dequantized_linear(x.double(), *quantize_weight(weight), None)
    return bool(torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5))


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(out, in) float `weight` as (out, in) int8 values and (out,) float32 scales, per output
    channel and symmetric: row c is scale_c * values_c, to within scale_c / 2 an entry. A row of
    zeros gets scale 1 (its values are all 0)."""
    scales = weight.detach().abs().amax(1).float() / _QMAX                 # (out,)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    values = torch.round(weight.detach().float() / scales[:, None]).clamp(-_QMAX, _QMAX)
    return values.to(torch.int8), scales


def quantize_input(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(N, in) float `x` as uint8 values, a float32 scale and an int64 zero point, per tensor
    and asymmetric: x ~= scale * (values - zero_point), to within scale / 2 an entry. The range
    [min(x, 0), max(x, 0)] maps onto 0..255, so 0 is exact."""
    low, high = x.amin().clamp(max=0).float(), x.amax().clamp(min=0).float()
    scale = (high - low) / _UMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero_point = torch.round(-low / scale).clamp(0, _UMAX).to(torch.int64)
    values = torch.round(x.float() / scale).add_(zero_point).clamp_(0, _UMAX)
    return values.to(torch.uint8), scale, zero_point


def dequantized_linear(x: Tensor, values: Tensor, scales: Tensor, bias: Tensor | None
                       ) -> Tensor:
    """The reference: `F.linear` of `x` and the bias with the weight `scales * values`, both
    dequantised and with `x` quantised as `quantize_input` does, in `x`'s dtype."""
    qx, x_scale, zero_point = quantize_input(x)
    x_seen = (qx.to(x.dtype) - zero_point.to(x.dtype)) * x_scale.to(x.dtype)
    weight = values.to(x.dtype) * scales.to(x.dtype)[:, None]
    return F.linear(x_seen, weight, None if bias is None else bias.to(x.dtype))


class Int8Linear(NamedTuple):
    """A linear map with its weight in int8 (`quantize`): called on (N, in) `x`, about
    `F.linear(x, weight, bias)`, exactly `dequantized_linear` of it rounded to float32; returns
    float32 whatever `x`'s float dtype."""

    packed: Tensor                # `torch.ops.onednn.qlinear_prepack` of the (out, in) values
    scales: Tensor                # (out,) float32
    zero_points: Tensor           # (out,) int64 zeros: the weight is symmetric
    bias: Tensor | None           # (out,) float32

    def __call__(self, x: Tensor) -> Tensor:
        qx, scale, zero_point = quantize_input(x)
        return torch.ops.onednn.qlinear_pointwise.tensor(
            qx.contiguous(), scale, zero_point, self.packed, self.scales, self.zero_points,
            self.bias, 1.0, 0, torch.float32, "none", [], "")


def quantize(weight: Tensor, bias: Tensor | None) -> Int8Linear:
    """The `Int8Linear` of a float (out, in) CPU `weight` and (out,) bias: a snapshot, quantised
    once (`quantize_weight`); later changes to `weight` do not reach it."""
    values, scales = quantize_weight(weight)
    with torch.no_grad():
        packed = torch.ops.onednn.qlinear_prepack(values, None)
    zeros = torch.zeros(weight.shape[0], dtype=torch.int64)
    return Int8Linear(packed, scales, zeros,
                      None if bias is None else bias.detach().float().clone())
