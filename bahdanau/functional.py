r"""The paper's math in plain PyTorch: the reference every other path is checked against.

Everything here works on any device and dtype and gets its gradients from autograd. Shapes follow
the legend in `bahdanau.config`; N is a number of decoder rows, either B (one per sentence) or B*K
(K beam hypotheses per sentence, stored sentence-major: row n belongs to sentence n // K).

The alignment model (section 3.1 and appendix A.1.2 of the paper), `additive_attention`:

$$e_{ij} = v_a^\top \tanh(W_a s_{i-1} + U_a h_j), \qquad
\alpha_{ij} = \frac{\exp e_{ij}}{\sum_{k=1}^{T_x} \exp e_{ik}}, \qquad
c_i = \sum_{j=1}^{T_x} \alpha_{ij} h_j$$

and the deep output's maxout (appendix A.2.2), `maxout`:
$t_i = [\max(\tilde t_{i,2j-1}, \tilde t_{i,2j})]_{j=1}^{l}$.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bahdanau.errors import InputError


def lengths_to_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """(B,) lengths -> (B, max_len) bool mask, True at the first `lengths[b]` positions."""
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] < lengths[:, None]


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last dim restricted to `mask`: exactly 0 where mask is False.

    Args:
        scores: (..., S) energies e_ij.
        mask: bool, broadcastable to `scores`, True at real positions; every row needs one True
            (the caller checks it: a row with none would give NaN).
    """
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def additive_attention(query_proj: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor,
                       v: Tensor) -> tuple[Tensor, Tensor]:
    """One alignment step: e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j), a = softmax_j(e), c = a h.

    Args:
        query_proj: (N, A) W_a s_{i-1}; N = B, or B*K with K beams per sentence (sentence-major).
        keys: (B, S, A) U_a h_j, computed once per source batch.
        annotations: (B, S, 2H) encoder annotations h_j.
        mask: (B, S) bool, True at real tokens; every row needs one True.
        v: (A,) v_a.
    Returns:
        (N, 2H) context c_i and (N, S) weights a_ij (exactly 0 at padding, rows sum to 1).
    """
    weights = attention_weights(query_proj, keys, mask, v)
    return weighted_sum(weights, annotations), weights


def attention_weights(query_proj: Tensor, keys: Tensor, mask: Tensor, v: Tensor) -> Tensor:
    """The weights a_ij of `additive_attention` alone: (N, S), exactly 0 at padding."""
    batch, src_len, align = keys.shape
    query = query_proj.view(batch, -1, 1, align)              # (B, K, 1, A)
    scores = torch.tanh(query + keys[:, None]) @ v            # (B, K, S)  e_ij
    weights = masked_softmax(scores, mask[:, None, :])        # (B, K, S)  a_ij
    return weights.reshape(-1, src_len)


def weighted_sum(weights: Tensor, values: Tensor) -> Tensor:
    """c_n = sum_j a_nj values_bj for row n of sentence b = n // K: (N, S), (B, S, M) -> (N, M)."""
    batch, src_len, _ = values.shape
    mixed = torch.bmm(weights.view(batch, -1, src_len), values)   # (B, K, M)
    return mixed.reshape(weights.shape[0], -1)


def gru_update(x_gates: Tensor, h_gates: Tensor, h: Tensor, *, weight_hn: Tensor | None = None,
               bias_hn: Tensor | None = None) -> Tensor:
    """One GRU state update from precomputed gate pre-activations (gate order r, z, n).

    Two formulations of the candidate state n (both update h' = (1 - z) * n + z * h):

    * torch form (`weight_hn is None`): `h_gates` is U h + b_h, shape (..., 3D), and
      n = tanh(x_n + r * (U_n h + b_hn)), as `torch.nn.GRU` computes it.
    * paper form: `h_gates` is U_{r,z} h + b_{r,z}, shape (..., 2D), and
      n = tanh(x_n + U_n (r * h) + b_hn), the reset gate applied before U as in the paper's
      appendix A. It costs one extra (N, D) x (D, D) matmul per step.

    The paper writes the update as h' = (1 - z) h + z n; ours is the same family with z relabelled
    (z -> 1 - z), as torch does.

    Args:
        x_gates: (..., 3D) input pre-activations W x (+ C c) + b_x.
        h_gates: (..., 3D) or (..., 2D), see above.
        h: (..., D) previous state.
        weight_hn: (D, D) U_n, paper form only.
        bias_hn: (D,) b_hn, paper form only.
    Returns:
        (..., D) the new state.
    """
    size = h.shape[-1]
    x_rz, x_n = x_gates.split([2 * size, size], dim=-1)
    if weight_hn is None:
        h_rz, h_n = h_gates.split([2 * size, size], dim=-1)
        r, z = torch.sigmoid(x_rz + h_rz).chunk(2, dim=-1)
        n = torch.tanh(x_n + r * h_n)
    else:
        r, z = torch.sigmoid(x_rz + h_gates).chunk(2, dim=-1)
        n = torch.tanh(x_n + F.linear(r * h, weight_hn, bias_hn))
    return torch.lerp(n, h, z)                                # (1 - z) * n + z * h


def maxout(x: Tensor, pool: int = 2) -> Tensor:
    """Maxout over consecutive groups of `pool` units: (..., pool*L) -> (..., L)."""
    return x.unflatten(-1, (x.shape[-1] // pool, pool)).amax(dim=-1)


def sequence_nll(logits: Tensor, target: Tensor, pad_id: int, *,
                 label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """Summed negative log-likelihood of `target` under `logits`, padding ignored.

    Args:
        logits: (B, T, V) unnormalised scores.
        target: (B, T) token ids; positions equal to `pad_id` contribute nothing.
        pad_id: padding id.
        label_smoothing: as in `torch.nn.functional.cross_entropy`; 0 (the paper) by default.
    Returns:
        The summed loss (a scalar) and the number of non-pad target tokens (a scalar tensor).
    """
    if logits.shape[:2] != target.shape:
        raise InputError(
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree on (B, T)"
        )
    logits = upcast(logits)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=pad_id, reduction="sum", label_smoothing=label_smoothing)
    return loss, (target != pad_id).sum()


def upcast(t: Tensor) -> Tensor:
    """Half-precision tensors (float16, bfloat16) to float32, for accumulation (a loss, a
    log-softmax); others unchanged."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
