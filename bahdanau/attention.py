"""The decoder-attention seam (`Attention`) and two attentions that implement it.

`AttentiveDecoder` and the fast engine (`bahdanau.engine`) meet an attention only through the
methods of `Attention`, at two moments:

    memory = attention.prepare(annotations, mask)        once per source batch (B sentences)
    state  = attention.initial_state(memory)             once per batch: per-row state, or None

    query   = attention.project_query(s)                 every target step, N rows
    weights = attention.weights(query, memory, state)    a_ij, (N, S)
    context, weights = attention.attend(query, memory, values, state)   sum_j a_ij values_j
    state   = attention.next_state(state, weights)

An attention here is a distribution a_ij over source positions: its context is always a weighted
sum of per-position values. The caller chooses the values: the annotations h_j give the paper's
c_i, and the engine passes [C; C_o] h_j instead (the decoder's own linear maps of c_i, computed once
per batch), which serves any attention of this kind unchanged.

Rows: a step sees N = B*K query rows for B sentences (K beams per sentence, sentence-major: row n
belongs to sentence n // K; K = 1 in training). The memory holds B sentences; every tensor in it
has them along dim 0, so beam search can drop finished sentences by indexing each tensor. A
per-row attention state (for example coverage, the sum of past weights) has N rows; beam search
repeats and reorders it with the decoder state.

Two optional hooks let an attention offer more than calls:

* `query_weight()`: the plain (P, D) matrix W when `project_query(s)` is `s @ W.T`. The engine
  then stacks W with the GRU's recurrent matrix, one matmul of s_{i-1} per step. None (the
  default) when the projection is anything else (a LoRA-wrapped linear, an MLP, the identity):
  only a plain layer's weight is offered (`linear_weights`, `bias_free_weight`).
* `mixes_values(memory)`: True when `attend` mixes the values inside a fused kernel. Callers that
  sum the value gradients over a whole sequence themselves then leave mixing to `attend`.

Per-step calls are not validated: `prepare` checks its inputs' shapes once per batch, and the
values and states a decoder passes are built from them. That every mask row holds a real token is
a value check (it reads the mask), made once per batch at the model's door: `RNNSearch.check_batch`
checks the lengths the encoder builds the mask from, so no implementation of the seam need.

`AdditiveAttention` is the paper's alignment model; `LuongAttention` (Luong et al. 2015, the
"general" and "dot" scores) is the second implementation of the seam.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_dims, check_sizes, check_tensor
from bahdanau.errors import InputError
from bahdanau.kernels import IMPLS, resolve_impl, sigmoid_attention_weights

LinearWeights = tuple[Tensor, Tensor | None]   # a linear map's (out, in) weight and its bias


def linear_weights(layer: nn.Module) -> LinearWeights | None:
    """A plain `nn.Linear`'s weight and bias, and None for any other layer (a subclass, a
    wrapper): what a fused path may read in place of calling `layer`. A wrapper (LoRA,
    quantisation) may still expose its base layer's `weight` without its own change, so only a
    plain layer's weight is offered; anything else must be called."""
    if type(layer) is not nn.Linear:
        return None
    return layer.weight, layer.bias


def bias_free_weight(layer: nn.Module) -> Tensor | None:
    """A plain bias-free `nn.Linear`'s weight W (`layer(x) == x @ W.T`), else None."""
    weights = linear_weights(layer)
    return weights[0] if weights is not None and weights[1] is None else None


class AttentionStep(NamedTuple):
    """What `Attention.forward` returns for N query rows."""

    context: Tensor               # (N, M) sum_j a_ij values_j
    weights: Tensor               # (N, S) a_ij, 0 at padding, rows sum to 1
    state: Tensor | None          # the next per-row attention state, or None


class Attention(nn.Module, ABC):
    """Base class of the decoder-attention seam; see the module docstring for the protocol.

    Subclasses set `query_size` (D, the decoder state) and `key_size` (2H, an annotation) and
    implement the abstract `prepare`, `project_query` and `weights` (a subclass that misses one
    cannot be instantiated); the other methods have defaults.
    """

    query_size: int
    key_size: int

    @abstractmethod
    def prepare(self, annotations: Tensor, mask: Tensor) -> Any:
        """Per-batch memory: a NamedTuple whose tensors all have B rows along dim 0.

        Args:
            annotations: (B, S, 2H) encoder annotations h_j.
            mask: (B, S) bool, True at real tokens; every row needs one True (the caller's
                promise: `RNNSearch.check_batch` checks the lengths it comes from).
        """

    def initial_state(self, memory: Any) -> Tensor | None:
        """The per-row attention state before the first step, (B, ...), or None (stateless)."""
        return None

    @abstractmethod
    def project_query(self, query: Tensor) -> Tensor:
        """The query as `weights` takes it: (N, D) decoder states -> (N, P)."""

    def query_weight(self) -> Tensor | None:
        """The (P, D) matrix W with `project_query(s) == s @ W.T`, or None if there is none."""
        return None

    @abstractmethod
    def weights(self, query: Tensor, memory: Any, state: Tensor | None) -> Tensor:
        """The alignment weights a_ij: (N, P) projected queries -> (N, S), 0 at padding."""

    def attend(self, query: Tensor, memory: Any, values: Tensor, state: Tensor | None
               ) -> tuple[Tensor, Tensor]:
        """(N, M) sum_j a_ij values_bj and the (N, S) weights, for (B, S, M) values."""
        weights = self.weights(query, memory, state)
        return functional.weighted_sum(weights, values), weights

    def mixes_values(self, memory: Any) -> bool:
        """True if `attend` mixes the values inside a fused kernel for this memory."""
        return False

    def next_state(self, state: Tensor | None, weights: Tensor) -> Tensor | None:
        """The per-row state after a step with these (N, S) weights (unchanged by default)."""
        return state

    def forward(self, query: Tensor, memory: Any, values: Tensor,
                state: Tensor | None = None) -> AttentionStep:
        """One attention step from decoder states.

        Args:
            query: (N, D) previous decoder states s_{i-1}, N = B or B*K (sentence-major).
            memory: from `prepare` for the B sentences.
            values: (B, S, M) what the weights mix; the annotations give the context c_i.
            state: the per-row attention state (N rows), or None.
        Returns:
            `AttentionStep`: (N, M) context, (N, S) weights and the next state.
        Raises:
            InputError: the query's shape does not fit the attention or the memory.
        """
        check_tensor("query", query, 2, floating=True)
        check_dims(type(self).__name__, [("query", query, 1, self.query_size)])
        check_tensor("values", values, 3, floating=True)
        batch = values.shape[0]
        if batch == 0 or query.shape[0] % batch != 0:
            raise InputError(f"query rows ({query.shape[0]}) must be a positive multiple of "
                             f"the batch size ({batch}): K beams per sentence, sentence-major")
        context, weights = self.attend(self.project_query(query), memory, values, state)
        return AttentionStep(context, weights, self.next_state(state, weights))

    def _check_prepare(self, annotations: Tensor, mask: Tensor) -> None:
        """Ranks, dtypes and sizes of `prepare`'s inputs (no value check: see the module doc)."""
        check_tensor("annotations", annotations, 3, floating=True)
        check_tensor("mask", mask, 2, boolean=True)
        check_dims(type(self).__name__, [
            ("annotations", annotations, 2, self.key_size),
            ("mask", mask, 0, annotations.shape[0]),
            ("mask", mask, 1, annotations.shape[1]),
        ])
        if annotations.shape[0] == 0 or annotations.shape[1] == 0:
            raise InputError(f"annotations {tuple(annotations.shape)}: empty batch or source")


class AdditiveMemory(NamedTuple):
    """`AdditiveAttention.prepare` output for B sentences."""

    keys: Tensor                  # (B, S, A) U_a h_j
    mask: Tensor                  # (B, S) bool, True at real tokens


class AdditiveAttention(Attention):
    r"""The paper's alignment model (section 3.1, A.1.2):
    $e_{ij} = v_a^\top \tanh(W_a s_{i-1} + U_a h_j)$.

    $U_a h_j$ does not depend on $i$: `prepare` computes it once per source batch, and the caller
    keeps it (nothing is cached on the module). The paper has no bias here and neither do we.

    Args:
        query_size: D, size of the decoder state s_{i-1}.
        key_size: 2H, size of an annotation h_j.
        align_size: A, hidden size of the alignment model (n' in the paper).
        impl: how the weights are computed, all the same function:
            "reference" `bahdanau.functional.attention_weights`, the paper's tanh form;
            "sigmoid" `bahdanau.kernels.sigmoid_attention_weights`, v^T tanh(x) computed as
            (2v)^T sigmoid(2x) - sum(v), whose constant the softmax ignores (about twice as fast
            on a CPU);
            "triton" the fused kernel of `bahdanau.kernels.triton_attention` (raises if it
            cannot run);
            "auto" "triton" for CUDA tensors when Triton is installed, "sigmoid" on a CPU,
            "reference" otherwise. `implementation(tensor)` says which one runs.
    Raises:
        InputError: a size that is not a positive int, or an unknown `impl`.
    """

    def __init__(self, query_size: int, key_size: int, align_size: int, *,
                 impl: str = "auto") -> None:
        super().__init__()
        if impl not in IMPLS:
            raise InputError(f"impl must be one of {IMPLS}, got {impl!r}")
        check_sizes("AdditiveAttention", query_size=query_size, key_size=key_size,
                    align_size=align_size)
        self.query_size, self.key_size, self.align_size = query_size, key_size, align_size
        self.impl = impl
        self.W_a = nn.Linear(query_size, align_size, bias=False)
        self.U_a = nn.Linear(key_size, align_size, bias=False)
        self.v_a = nn.Parameter(torch.empty(align_size))
        self._resolved: dict[tuple[str, torch.dtype], str] = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""The paper's initialisation: $W_a, U_a \sim \mathcal{N}(0, 0.001^2)$, $v_a = 0$."""
        nn.init.normal_(self.W_a.weight, std=0.001)
        nn.init.normal_(self.U_a.weight, std=0.001)
        nn.init.zeros_(self.v_a)

    def implementation(self, tensor: Tensor) -> str:
        """The implementation that runs for tensors like `tensor`: reference, sigmoid or triton.

        Resolved once per device type and dtype (`bahdanau.kernels.resolve_impl`).
        """
        key = (tensor.device.type, tensor.dtype)
        impl = self._resolved.get(key)
        if impl is None:
            impl = self._resolved[key] = resolve_impl(self.impl, tensor)
        return impl

    def prepare(self, annotations: Tensor, mask: Tensor) -> AdditiveMemory:
        """U_a h_j for every source position, once per batch: (B, S, 2H) -> (B, S, A) keys.

        Raises:
            InputError: wrong ranks, dtypes or sizes.
        """
        self._check_prepare(annotations, mask)
        keys = self.U_a(annotations)
        self.implementation(keys)                                 # resolve before any step
        return AdditiveMemory(keys, mask)

    def project_query(self, query: Tensor) -> Tensor:
        """W_a s_{i-1}: (N, D) -> (N, A)."""
        return self.W_a(query)

    def query_weight(self) -> Tensor | None:
        """W_a's (A, D) weight while W_a is a plain bias-free `nn.Linear` (`bias_free_weight`)."""
        return bias_free_weight(self.W_a)

    def weights(self, query: Tensor, memory: AdditiveMemory, state: Tensor | None = None
                ) -> Tensor:
        """a_ij from (N, A) projected queries. The fused kernel computes weights and context
        together, so with impl "triton" the weights alone come from the reference formula."""
        if self.implementation(memory.keys) == "sigmoid":
            return sigmoid_attention_weights(query, memory.keys, memory.mask, self.v_a)
        return functional.attention_weights(query, memory.keys, memory.mask, self.v_a)

    def attend(self, query: Tensor, memory: AdditiveMemory, values: Tensor,
               state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(N, M) mixed values and (N, S) weights; one fused kernel with impl "triton"."""
        if self.mixes_values(memory):
            from bahdanau.kernels.triton_attention import additive_attention as fused

            return fused(query, memory.keys, values, memory.mask, self.v_a)
        return super().attend(query, memory, values, state)

    def mixes_values(self, memory: AdditiveMemory) -> bool:
        """True when the fused Triton kernel runs for these keys."""
        return self.implementation(memory.keys) == "triton"


class LuongMemory(NamedTuple):
    """`LuongAttention.prepare` output for B sentences."""

    keys: Tensor                  # (B, S, 2H) the annotations h_j
    mask: Tensor                  # (B, S) bool, True at real tokens


class LuongAttention(Attention):
    r"""Multiplicative attention of Luong, Pham & Manning (2015), section 3.1.

    - "general": $e_{ij} = (W_a s_{i-1})^\top h_j$, with $W_a$ of shape (2H, D), no bias;
    - "dot": $e_{ij} = s_{i-1}^\top h_j$, which needs D = 2H.

    As in the rest of this decoder (and unlike Luong's, which attends from s_i) the query is the
    previous state s_{i-1}, so it plugs into `AttentiveDecoder` unchanged. "general" offers W_a
    through `query_weight`, so the engine fuses it into the step matmul like `AdditiveAttention`'s.

    Args:
        query_size: D.
        key_size: 2H.
        score: "general" or "dot".
    Raises:
        InputError: a size that is not a positive int, an unknown `score`, or "dot" with
            query_size != key_size.
    """

    SCORES = ("general", "dot")

    def __init__(self, query_size: int, key_size: int, *, score: str = "general") -> None:
        super().__init__()
        if score not in self.SCORES:
            raise InputError(f"score must be one of {self.SCORES}, got {score!r}")
        check_sizes("LuongAttention", query_size=query_size, key_size=key_size)
        if score == "dot" and query_size != key_size:
            raise InputError(f"score='dot' needs query_size == key_size, got {query_size} and "
                             f"{key_size}")
        self.query_size, self.key_size, self.score = query_size, key_size, score
        self.W_a = nn.Linear(query_size, key_size, bias=False) if score == "general" else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_a ~ N(0, 0.01^2), the paper's initialisation of the decoder's other matrices."""
        if self.W_a is not None:
            nn.init.normal_(self.W_a.weight, std=0.01)

    def prepare(self, annotations: Tensor, mask: Tensor) -> LuongMemory:
        """The annotations are the keys: nothing to precompute.

        Raises:
            InputError: wrong ranks, dtypes or sizes.
        """
        self._check_prepare(annotations, mask)
        return LuongMemory(annotations, mask)

    def project_query(self, query: Tensor) -> Tensor:
        """W_a s_{i-1} ("general") or s_{i-1} ("dot"): (N, D) -> (N, 2H)."""
        return query if self.W_a is None else self.W_a(query)

    def query_weight(self) -> Tensor | None:
        """W_a's (2H, D) weight for "general" while W_a is a plain bias-free `nn.Linear`
        (`bias_free_weight`); None for "dot" (no projection to fuse) and a wrapped W_a."""
        return None if self.W_a is None else bias_free_weight(self.W_a)

    def weights(self, query: Tensor, memory: LuongMemory, state: Tensor | None = None
                ) -> Tensor:
        """a_ij = softmax_j(q_n . h_bj) over real positions: (N, 2H) -> (N, S)."""
        batch, src_len, width = memory.keys.shape
        scores = torch.bmm(query.view(batch, -1, width), memory.keys.transpose(1, 2))  # (B,K,S)
        weights = functional.masked_softmax(scores, memory.mask[:, None, :])
        return weights.reshape(-1, src_len)
