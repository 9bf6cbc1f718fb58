"""The additive attention's weights with sigmoid in place of tanh: the CPU form of impl "sigmoid".

    v^T tanh(x) = v^T (2 sigmoid(2x) - 1) = (2v)^T sigmoid(2x) - sum(v)

The constant sum(v) is the same for every source position, and the softmax ignores it, so the
weights (and any context mixed with them) are those of `bahdanau.functional.attention_weights`;
only the energies differ, by that constant. On a CPU sigmoid costs about a third of tanh.
tests/property/test_attention_properties.py holds the two equal in float64, gradients included.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bahdanau.functional import masked_softmax


def sigmoid_attention_weights(query_proj: Tensor, keys: Tensor, mask: Tensor, v: Tensor
                              ) -> Tensor:
    """`functional.attention_weights` through sigmoid: (N, A), (B, S, A) -> (N, S)."""
    batch, src_len, align = keys.shape
    query = query_proj.view(batch, -1, 1, align)              # (B, K, 1, A)
    scores = torch.sigmoid(2.0 * (query + keys[:, None])) @ (2.0 * v)   # (B, K, S)
    weights = masked_softmax(scores, mask[:, None, :])        # (B, K, S)
    return weights.reshape(-1, src_len)
