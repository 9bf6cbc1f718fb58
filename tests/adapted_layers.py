"""A decoder's linear layers wrapped as LoRA wraps them, for the tests of the fusion seam."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# every linear layer of `AttentiveDecoder` whose weights a fused path could read
DECODER_LINEARS = ("input_gates", "context_gates", "readout_state", "readout_embed",
                   "readout_context", "output")


class LowRankAdapted(nn.Module):
    """A linear layer plus a low-rank change B A x. Like common LoRA wrappers it exposes its
    base layer's `weight` and `bias`, which alone no longer give its output."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base
        gen = torch.Generator().manual_seed(base.in_features * 100 + base.out_features)
        dtype = base.weight.dtype
        self.down = nn.Parameter(0.5 * torch.randn(rank, base.in_features, generator=gen,
                                                   dtype=dtype))
        self.up = nn.Parameter(0.5 * torch.randn(base.out_features, rank, generator=gen,
                                                 dtype=dtype))

    @property
    def weight(self) -> Tensor:
        return self.base.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + F.linear(F.linear(x, self.down), self.up)


def adapt(decoder: nn.Module) -> None:
    """Wrap every one of the decoder's linear layers, and its attention's query projection W_a
    if it has one, in a `LowRankAdapted`."""
    for name in DECODER_LINEARS:
        setattr(decoder, name, LowRankAdapted(getattr(decoder, name)))
    attention = decoder.attention
    if getattr(attention, "W_a", None) is not None:
        attention.W_a = LowRankAdapted(attention.W_a)
