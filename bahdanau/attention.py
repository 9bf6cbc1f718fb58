"""AdditiveAttention: the alignment model of Bahdanau et al. (2015), section 3.1 and appendix A.1.2.

    e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j)      a_ij = softmax_j(e_ij)      c_i = sum_j a_ij h_j

`U_a h_j` does not depend on i: `precompute_keys` computes it once per source batch and the caller
keeps it (it is never cached on the module). The paper has no bias in the alignment model and
neither do we.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_dims, check_mask_rows, check_tensor
from bahdanau.kernels import IMPLS, resolve_impl


class AdditiveAttention(nn.Module):
    """Additive (concat / MLP) attention with precomputed keys.

    Args:
        query_size: D, size of the decoder state s_{i-1}.
        key_size: 2H, size of an annotation h_j.
        align_size: A, hidden size of the alignment model (n' in the paper).
        impl: "reference" (plain PyTorch, `bahdanau.functional.additive_attention`, the paper's
            tanh form), "triton" (the fused kernel; raises if it cannot run) or "auto" (Triton on
            CUDA when available; on a CPU the reference computed with
            v^T tanh(x) = (2v)^T sigmoid(2x) - sum(v), whose constant the softmax ignores:
            same weights and context, about twice as fast there).
    """

    def __init__(self, query_size: int, key_size: int, align_size: int, *,
                 impl: str = "auto") -> None:
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.query_size, self.key_size, self.align_size = query_size, key_size, align_size
        self.impl = impl
        self.W_a = nn.Linear(query_size, align_size, bias=False)
        self.U_a = nn.Linear(key_size, align_size, bias=False)
        self.v_a = nn.Parameter(torch.empty(align_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's initialisation: W_a, U_a ~ N(0, 0.001^2), v_a = 0."""
        nn.init.normal_(self.W_a.weight, std=0.001)
        nn.init.normal_(self.U_a.weight, std=0.001)
        nn.init.zeros_(self.v_a)

    def precompute_keys(self, annotations: Tensor) -> Tensor:
        """U_a h_j for every source position: (B, S, 2H) -> (B, S, A). Call once per batch."""
        check_tensor("annotations", annotations, 3, floating=True)
        check_dims("precompute_keys", [("annotations", annotations, 2, self.key_size)])
        return self.U_a(annotations)

    def project_query(self, query: Tensor) -> Tensor:
        """W_a s_{i-1}: (N, D) -> (N, A)."""
        return self.W_a(query)

    def attend(self, query_proj: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor, *,
               check: bool = True) -> tuple[Tensor, Tensor]:
        """Attention from an already projected query (see `bahdanau.functional.additive_attention`).

        Args:
            query_proj: (N, A) W_a s_{i-1}, N = B or B*K (K beams per sentence, sentence-major).
            keys: (B, S, A) from `precompute_keys`.
            annotations: (B, S, 2H).
            mask: (B, S) bool, True at real tokens.
            check: validate shapes and mask rows (the decoder validates once per batch instead).
        Returns:
            (N, 2H) context and (N, S) weights.
        """
        if check:
            self._check(query_proj, keys, annotations, mask)
        if self.is_fused(keys):
            from bahdanau.kernels.triton_attention import additive_attention as fused

            return fused(query_proj, keys, annotations, mask, self.v_a, check=check)
        return functional.additive_attention(query_proj, keys, annotations, mask, self.v_a,
                                             tanh_via_sigmoid=self._via_sigmoid(keys))

    def is_fused(self, keys: Tensor) -> bool:
        """True if `attend` runs the fused Triton kernel for these keys (see `impl`)."""
        return resolve_impl(self.impl, keys) == "triton"

    def weights(self, query_proj: Tensor, keys: Tensor, mask: Tensor) -> Tensor:
        """The (N, S) weights a_ij alone, by the reference path (callers that mix the values
        themselves; not for the fused path, which computes weights and context together)."""
        return functional.attention_weights(query_proj, keys, mask, self.v_a,
                                            tanh_via_sigmoid=self._via_sigmoid(keys))

    def _via_sigmoid(self, keys: Tensor) -> bool:
        # "auto" on a CPU: the same function with sigmoid in place of tanh (cheaper there)
        return self.impl == "auto" and keys.device.type == "cpu"

    def forward(self, query: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor]:
        """One alignment step from the decoder state s_{i-1}.

        Args:
            query: (B, D) previous decoder state s_{i-1} (or (B*K, D) for K beams per sentence).
            keys: (B, S, A) U_a h_j from `precompute_keys`.
            annotations: (B, S, 2H) encoder annotations h_j.
            mask: (B, S) bool, True at real tokens; every row needs one True.
        Returns:
            (N, 2H) context c_i and (N, S) weights a_ij (0 at padding, rows sum to 1), N = B
            or B*K query rows.
        Raises:
            ValueError: shapes or dtypes disagree, or a row of mask is all False.
        """
        check_tensor("query", query, 2, floating=True)
        check_dims("AdditiveAttention", [("query", query, 1, self.query_size)])
        return self.attend(self.project_query(query), keys, annotations, mask)

    def _check(self, query_proj: Tensor, keys: Tensor, annotations: Tensor, mask: Tensor) -> None:
        check_tensor("query_proj", query_proj, 2, floating=True)
        check_tensor("keys", keys, 3, floating=True)
        check_tensor("annotations", annotations, 3, floating=True)
        check_tensor("mask", mask, 2, boolean=True)
        batch, src_len, _ = keys.shape
        check_dims("AdditiveAttention", [
            ("keys", keys, 2, self.align_size),
            ("query_proj", query_proj, 1, self.align_size),
            ("annotations", annotations, 0, batch),
            ("annotations", annotations, 1, src_len),
            ("annotations", annotations, 2, self.key_size),
            ("mask", mask, 0, batch),
            ("mask", mask, 1, src_len),
        ])
        if batch == 0 or src_len == 0:
            raise ValueError(f"keys {tuple(keys.shape)}: empty batch or empty source sequence")
        if query_proj.shape[0] % batch != 0:
            raise ValueError(
                f"query rows ({query_proj.shape[0]}) must be the batch size ({batch}) or a "
                f"multiple of it (beams grouped per sentence)"
            )
        if len({query_proj.dtype, keys.dtype, annotations.dtype}) != 1:
            raise ValueError(
                f"dtypes differ: query {query_proj.dtype}, keys {keys.dtype}, "
                f"annotations {annotations.dtype}"
            )
        check_mask_rows("mask", mask)
