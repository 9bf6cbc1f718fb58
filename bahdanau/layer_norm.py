r"""Layer normalisation of a GRU's pre-activations (Ba, Kiros & Hinton 2016), as Nematus does it.

A layer-normalised GRU (``ModelConfig(layer_norm=True)``) normalises its input projection and
its recurrent projection apart, before they meet, each of its two parts apart: the gates' $2D$
units $[r; z]$ as one layer and the candidate's $D$ units as another (Nematus' ``gru_layer``
with ``layer_normalisation``). For a GRU on input $x$ with state $h$:

$$[r; z] = \sigma(\mathrm{LN}_{rz}(W_{rz} x + b_{rz}) + \mathrm{LN}'_{rz}(U_{rz} h + b'_{rz}))$$

$$\tilde h = \tanh(\mathrm{LN}_n(W_n x + b_n) + r \odot \mathrm{LN}'_n(U_n h + b'_n)), \qquad
h' = (1 - z) \odot \tilde h + z \odot h$$

where $\mathrm{LN}(a) = g \odot (a - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$ over the units of
$a$ ($\mu$, $\sigma^2$ their mean and biased variance, $\epsilon = 10^{-5}$; $g$ starts at 1,
$\beta$ at 0). It needs the torch form of the GRU (the reset gate applied after $U$, as Nematus),
where $U h$ is one projection; the paper form, $U (r \odot h)$, is refused with it. Nematus' own
recurrent projection has no bias; ours keeps $b'$ (it shifts $U h$ before its normalisation).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class GateNorm(nn.Module):
    """LN of a GRU projection's (..., 3D) pre-activations: [r; z] (2D units) and n (D) apart.

    Args:
        size: D, the GRU's units.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.gates = nn.LayerNorm(2 * size)        # LN_rz: its gain g and shift beta
        self.candidate = nn.LayerNorm(size)        # LN_n

    def forward(self, projection: Tensor) -> Tensor:
        """(..., 3D) W x + b (or U h + b') -> (..., 3D) [LN_rz(its first 2D); LN_n(its last D)]."""
        rz, n = projection.split([2 * self.size, self.size], dim=-1)
        return torch.cat([self.gates(rz), self.candidate(n)], dim=-1)

    def reset_parameters(self) -> None:
        """Gains 1, shifts 0."""
        self.gates.reset_parameters()
        self.candidate.reset_parameters()


def reset_gate_norms_(model: nn.Module) -> None:
    """Every `GateNorm` of `model` back to gain 1, shift 0 (after an initialisation that draws
    every vector as 0, which would zero their gains)."""
    for module in model.modules():
        if isinstance(module, GateNorm):
            module.reset_parameters()
