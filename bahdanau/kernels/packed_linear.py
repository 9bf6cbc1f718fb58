"""`F.linear` with its weight laid out once for oneDNN: the decoder's per-step matmuls in a search.

A search applies the same few weights at every step to a few dozen rows (the sentences, or the
sentences times the beams). For so few rows `F.linear` is bound by reading the weight: the BLAS
packs the whole weight into its kernel's layout at every call (W_o is 10 MB at the small
preset). oneDNN can reorder a weight once into the blocked layout its kernels read
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor uses for frozen CPU weights);
each step then reads it as it is. On a 2-core CPU at the small preset, packing the step weight
and W_o made greedy search about 1.5x and beam-5 search about 1.25x faster
(examples/benchmarks/bench_search.py); packing the other three maps of a step as well (the GRU's
input gates, U_o and V_o) added about 11% to greedy search and 4-8% to beam 5.

`pack_for_steps` chooses once, when a search prepares its memory: the packed form for float32
CPU weights under `torch.inference_mode` (where `BeamSearch` and evaluation decode), without
autocast, with `torch.backends.mkldnn.enabled` and where this build of torch has the two ops;
None (plain `F.linear`) otherwise. The packed op has no backward and takes float32 inputs only,
and a traced program must not capture an opaque packed weight: so training, `torch.no_grad`,
autocast, `torch.compile` and `torch.export` never pack, and `linear` takes `F.linear` for an
input of another dtype. Both forms compute the same products; only the order of the sums
differs, so results differ in the last bits (tests/unit/test_packed_linear.py holds them to
`F.linear` in float32; float64 never packs).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


@functools.cache
def available() -> bool:
    """Whether this build of torch has the two oneDNN ops and they compute `F.linear` here (one
    tiny product, the first time it is asked)."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    weight, x = torch.arange(12.0).view(3, 4) / 8, torch.arange(8.0).view(2, 4) / 8
    try:
        with torch.inference_mode():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2)
            got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except RuntimeError:
        return False
    return bool(torch.allclose(got, F.linear(x, weight)))


def _packs(weight: Tensor) -> bool:
    """Whether `pack_for_steps` packs `weight` (see the module docstring)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.is_inference_mode_enabled() and bool(torch.backends.mkldnn.enabled)
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()
            and available())


def pack_for_steps(weight: Tensor, rows: int) -> Tensor | None:
    """`weight` (out, in) reordered for `linear`, or None where it is not packed.

    Args:
        weight: (out, in), as `F.linear` takes it. The packed copy is a snapshot: it stays
            valid only while `weight` does not change.
        rows: the rows the steps will mostly have (oneDNN picks its layout for them; any
            number runs).
    """
    if not _packs(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, packed: Tensor | None) -> Tensor:
    """`F.linear(x, weight, bias)` for (N, in) `x`, through `packed` (`pack_for_steps` of
    `weight`) when there is one and `x` is float32."""
    if packed is None or x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class PackedLinear(NamedTuple):
    """A linear map with its weight packed: called on (N, in) `x`, `F.linear(x, weight, bias)`."""

    weight: Tensor                # (out, in)
    bias: Tensor | None
    packed: Tensor                # `pack_for_steps` of `weight`

    def __call__(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.packed)


def pack(weights: tuple[Tensor, Tensor | None] | None, rows: int) -> PackedLinear | None:
    """A linear map's (weight, bias) with the weight packed for steps of `rows` rows, or None
    where there are no weights (a layer that is called) or `pack_for_steps` does not pack."""
    if weights is None:
        return None
    weight, bias = weights
    packed = pack_for_steps(weight, rows)
    return None if packed is None else PackedLinear(weight, bias, packed)
