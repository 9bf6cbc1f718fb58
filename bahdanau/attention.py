"""The decoder-attention seam (`Attention`) and two attentions that implement it.

A new attention implements only its scores. Its `__init__` calls
`super().__init__(query_size=Q, key_size=K)` and it defines

    score(query, keys) -> energies                 (N, Q), (N, S, K) -> (N, S) e_ij

with `query` the decoder states s_{i-1} and `keys` the annotations h_j, or what an optional
`prepare_keys(annotations)` returns once per batch (`U h_j`, say). The base does the rest: the
softmax over real positions, the context, the beam rows and the per-batch memory. A module that
does not follow the seam (not an `Attention`, no `score`, no sizes given to the base) is refused
with one `InputError` saying what to implement, when it is built or given to a decoder; a `score`
that returns energies of another shape, at its first call (`Attention.weights`).

`AttentiveDecoder` and the fast engine (`bahdanau.engine`) meet an attention only through the
methods of `Attention`, at two moments:

    memory = attention.prepare(annotations, mask)        once per source batch (B sentences)
    state  = attention.initial_state(memory)             once per batch: per-row state, or None

    query   = attention.project_query(s)                 every target step, N rows
    weights = attention.weights(query, memory, state)    a_ij, (N, S)
    context, weights = attention.attend(query, memory, values, state)   sum_j a_ij values_j
    state   = attention.next_state(state, weights)

By default `prepare` keeps `AttentionMemory(prepare_keys(annotations), mask)`, `project_query`
is the identity and `weights` is `masked_softmax(score(query, keys))` with the keys laid out per
query row; an attention may override any of these for a faster path, which is then "overriding
more": `AdditiveAttention` and `LuongAttention` keep their fast `weights` beside their `score`,
and tests/unit/test_attention_seam.py holds the two equal in float64.

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

An attention is rebuilt from its class and its constructor's arguments: every size and choice is
a constructor argument, every learned number a parameter or buffer (in the `state_dict`), and
nothing else is kept on the module but what the constructor derives from them.

Per-step calls are not validated beyond the energies' shape: `prepare` checks its inputs' shapes
once per batch, and the values and states a decoder passes are built from them. That every mask
row holds a real token is a value check (it reads the mask), made once per batch at the model's
door: `RNNSearch.check_batch` checks the lengths the encoder builds the mask from, so no
implementation of the seam need.

`AdditiveAttention` is the paper's alignment model; `LuongAttention` (Luong et al. 2015, the
"general" and "dot" scores) is the second implementation of the seam.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_dims, check_sizes, check_tensor, describe, shape_str
from bahdanau.errors import InputError
from bahdanau.kernels import IMPLS, resolve_impl, sigmoid_attention_weights
from bahdanau.parts import Part

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


class AttentionMemory(NamedTuple):
    """What `Attention.prepare` keeps for B sentences (unless an attention overrides it)."""

    keys: Tensor                  # (B, S, K) `prepare_keys(h_j)`: the annotations by default
    mask: Tensor                  # (B, S) bool, True at real tokens


# What every refusal of a module that does not follow the seam says to do.
_SEAM = ("an attention subclasses bahdanau.Attention, calls super().__init__(query_size=Q, "
         "key_size=K) first in its __init__ and defines score(self, query, keys) returning "
         "(N, S) energies (docs/guides/own-attention.md)")


def _refused(name: str, problem: str) -> InputError:
    return InputError(f"{name} {problem}: {_SEAM}")


class Attention(Part, nn.Module):
    """Base class of the decoder-attention seam: a new attention defines only `score`.

    A subclass calls `super().__init__(query_size=Q, key_size=K)` first in its `__init__` and
    defines `score(query, keys)`; it may define `prepare_keys(annotations)` for keys computed
    once per batch. The masking, the softmax over real positions, the context, the beam rows
    and the per-batch memory come from here. An attention that needs more (a fast path, a
    per-row state) overrides more of the seam (see the module docstring); one that overrides
    `weights` need not define `score`.

    Args:
        query_size: Q = D, size of the decoder state s_{i-1}.
        key_size: K = 2H, size of an annotation h_j.
    Raises:
        InputError: the class defines neither `score` nor `weights`, a size is missing or not
            a positive int, or a layer is set before this `__init__` ran.
    """

    query_size: int
    key_size: int

    def __init__(self, *, query_size: int | None = None, key_size: int | None = None) -> None:
        name = type(self).__name__
        if type(self).score is Attention.score and type(self).weights is Attention.weights:
            raise _refused(name, "defines no score(query, keys)")
        if query_size is None or key_size is None:
            raise _refused(name, "gave super().__init__ no query_size and key_size")
        check_sizes(name, query_size=query_size, key_size=key_size)
        super().__init__()
        self.query_size, self.key_size = query_size, key_size

    def __setattr__(self, name: str, value: Any) -> None:
        if "_modules" not in self.__dict__:                 # nn.Module.__init__ has not run
            raise _refused(type(self).__name__, f"sets {name!r} before super().__init__ ran")
        super().__setattr__(name, value)

    # ------------------------------------------------------------------ what a new one defines
    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """The energies e_ij: what a new attention defines.

        Args:
            query: (N, Q) decoder states s_{i-1} (`project_query` of them, where an attention
                overrides it), N = B, or B*K with K beams per sentence.
            keys: (N, S, K) the keys of each row's sentence: its annotations h_j, or what
                `prepare_keys` made of them.
        Returns:
            (N, S) energies; the base masks the padding and takes the softmax.
        """
        raise _refused(type(self).__name__, "defines no score(query, keys)")

    def prepare_keys(self, annotations: Tensor) -> Tensor:
        """The keys `score` reads, once per batch: (B, S, 2H) annotations -> (B, S, K). The
        annotations themselves unless overridden (a projection U h_j, say)."""
        return annotations

    # ------------------------------------------------------------------ the rest of the seam
    def prepare(self, annotations: Tensor, mask: Tensor) -> Any:
        """Per-batch memory: a NamedTuple whose tensors all have B rows along dim 0; by default
        `AttentionMemory(prepare_keys(annotations), mask)`.

        Args:
            annotations: (B, S, 2H) encoder annotations h_j.
            mask: (B, S) bool, True at real tokens; every row needs one True (the caller's
                promise: `RNNSearch.check_batch` checks the lengths it comes from).
        Raises:
            InputError: wrong ranks, dtypes or sizes, or keys that are not (B, S, K).
        """
        self._check_prepare(annotations, mask)
        keys = self.prepare_keys(annotations)
        if not isinstance(keys, Tensor) or keys.dim() != 3 or keys.shape[:2] != mask.shape:
            got = f"shape {shape_str(keys)}" if isinstance(keys, Tensor) else describe(keys)
            raise InputError(f"{type(self).__name__}.prepare_keys returned {got}; it must "
                             f"return (B, S, K) keys, B, S = {tuple(mask.shape)}")
        return AttentionMemory(keys, mask)

    def initial_state(self, memory: Any) -> Tensor | None:
        """The per-row attention state before the first step, (B, ...), or None (stateless)."""
        return None

    def project_query(self, query: Tensor) -> Tensor:
        """The query as `weights` takes it: (N, D) decoder states -> (N, P); the states
        themselves unless overridden (a fast path that projects them first)."""
        return query

    def query_weight(self) -> Tensor | None:
        """The (P, D) matrix W with `project_query(s) == s @ W.T`, or None if there is none."""
        return None

    def weights(self, query: Tensor, memory: Any, state: Tensor | None = None) -> Tensor:
        """The alignment weights a_ij = softmax_j(e_ij) over real positions, e = `score`.

        Args:
            query: (N, P) `project_query` of the decoder states, N = B*K (sentence-major).
            memory: the `AttentionMemory` of `prepare` for the B sentences.
            state: the per-row attention state (unused here).
        Returns:
            (N, S) weights, exactly 0 at padding, rows summing to 1.
        Raises:
            InputError: `score` returned anything but (N, S) floating-point energies.
        """
        keys, mask = memory.keys, memory.mask
        batch, src_len = mask.shape
        rows = query.shape[0]
        beams = rows // batch
        per_row = keys[:, None].expand(batch, beams, *keys.shape[1:])  # (B, K, S, K'): a view
        energies = self.score(query, per_row.reshape(rows, *keys.shape[1:]))   # (N, S) e_ij
        if (not isinstance(energies, Tensor) or energies.shape != (rows, src_len)
                or not energies.dtype.is_floating_point):
            got = (f"shape {shape_str(energies)}, dtype {energies.dtype}"
                   if isinstance(energies, Tensor) else describe(energies))
            raise InputError(f"{type(self).__name__}.score returned {got}; it must return "
                             f"floating-point energies of shape (N, S) = {(rows, src_len)}, "
                             "one per query row and source position")
        weights = functional.masked_softmax(energies.reshape(batch, beams, src_len),
                                            mask[:, None, :])     # (B, K, S) a_ij
        return weights.reshape(rows, src_len)

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


def check_attention(attention: object) -> Attention:
    """`attention` as a decoder takes it: an `Attention` whose `__init__` ran.

    Raises:
        InputError: one line saying what to implement (a plain `nn.Module`, a subclass that
            never called `super().__init__(query_size=Q, key_size=K)`).
    """
    if not isinstance(attention, Attention):
        raise InputError(f"attention must be a bahdanau.Attention or None, got "
                         f"{type(attention).__name__}: {_SEAM}")
    if "query_size" not in vars(attention) or "key_size" not in vars(attention):
        raise _refused(type(attention).__name__,
                       "never called super().__init__(query_size=Q, key_size=K)")
    return attention


class AdditiveAttention(Attention):
    r"""The paper's alignment model (section 3.1, A.1.2):
    $e_{ij} = v_a^\top \tanh(W_a s_{i-1} + U_a h_j)$.

    $U_a h_j$ does not depend on $i$: `prepare_keys` computes it once per source batch, and the
    caller keeps it (nothing is cached on the module). The paper has no bias here and neither do
    we. `score` is the formula as the seam states it; the steps take the faster path beside it:
    `project_query` (W_a s_{i-1}, which the engine fuses into its step matmul through
    `query_weight`) and `weights` in the implementation `impl` chooses.

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
        if impl not in IMPLS:
            raise InputError(f"impl must be one of {IMPLS}, got {impl!r}")
        super().__init__(query_size=query_size, key_size=key_size)
        check_sizes("AdditiveAttention", align_size=align_size)
        self.align_size, self.impl = align_size, impl
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

    def prepare_keys(self, annotations: Tensor) -> Tensor:
        """U_a h_j for every source position, once per batch: (B, S, 2H) -> (B, S, A) keys."""
        return self.U_a(annotations)

    def prepare(self, annotations: Tensor, mask: Tensor) -> AttentionMemory:
        """The keys U_a h_j and the mask, and the implementation resolved for them.

        Raises:
            InputError: wrong ranks, dtypes or sizes.
        """
        memory = super().prepare(annotations, mask)
        self.implementation(memory.keys)                          # resolve before any step
        return memory

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        r"""$e_{ij} = v_a^\top \tanh(W_a s_{i-1} + U_a h_j)$: (N, D) states s_{i-1} and
        (N, S, A) keys U_a h_j -> (N, S), the seam's form of `weights`'s energies."""
        return torch.tanh(self.W_a(query)[:, None, :] + keys) @ self.v_a

    def project_query(self, query: Tensor) -> Tensor:
        """W_a s_{i-1}: (N, D) -> (N, A)."""
        return self.W_a(query)

    def query_weight(self) -> Tensor | None:
        """W_a's (A, D) weight while W_a is a plain bias-free `nn.Linear` (`bias_free_weight`)."""
        return bias_free_weight(self.W_a)

    def weights(self, query: Tensor, memory: AttentionMemory, state: Tensor | None = None
                ) -> Tensor:
        """a_ij from (N, A) projected queries. The fused kernel computes weights and context
        together, so with impl "triton" the weights alone come from the reference formula."""
        if self.implementation(memory.keys) == "sigmoid":
            return sigmoid_attention_weights(query, memory.keys, memory.mask, self.v_a)
        return functional.attention_weights(query, memory.keys, memory.mask, self.v_a)

    def attend(self, query: Tensor, memory: AttentionMemory, values: Tensor,
               state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(N, M) mixed values and (N, S) weights; one fused kernel with impl "triton"."""
        if self.mixes_values(memory):
            from bahdanau.kernels.triton_attention import additive_attention as fused

            return fused(query, memory.keys, values, memory.mask, self.v_a)
        return super().attend(query, memory, values, state)

    def mixes_values(self, memory: AttentionMemory) -> bool:
        """True when the fused Triton kernel runs for these keys."""
        return self.implementation(memory.keys) == "triton"


class LuongAttention(Attention):
    r"""Multiplicative attention of Luong, Pham & Manning (2015), section 3.1.

    - "general": $e_{ij} = (W_a s_{i-1})^\top h_j$, with $W_a$ of shape (2H, D), no bias;
    - "dot": $e_{ij} = s_{i-1}^\top h_j$, which needs D = 2H.

    As in the rest of this decoder (and unlike Luong's, which attends from s_i) the query is the
    previous state s_{i-1}, so it plugs into `AttentiveDecoder` unchanged. The keys are the
    annotations (no `prepare_keys`). `score` is the formula as the seam states it; the steps
    take the faster path beside it: `project_query` (W_a s_{i-1}, which the engine fuses into
    its step matmul through `query_weight`, like `AdditiveAttention`'s) and `weights`, one
    batched matmul against each sentence's annotations, never copied per beam.

    Args:
        query_size: D.
        key_size: 2H.
        form: "general" or "dot", Luong's names for these scores.
    Raises:
        InputError: a size that is not a positive int, an unknown `form`, or "dot" with
            query_size != key_size.
    """

    FORMS = ("general", "dot")

    def __init__(self, query_size: int, key_size: int, *, form: str = "general") -> None:
        if form not in self.FORMS:
            raise InputError(f"form must be one of {self.FORMS}, got {form!r}")
        super().__init__(query_size=query_size, key_size=key_size)
        if form == "dot" and query_size != key_size:
            raise InputError(f"form='dot' needs query_size == key_size, got {query_size} and "
                             f"{key_size}")
        self.form = form
        self.W_a = nn.Linear(query_size, key_size, bias=False) if form == "general" else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_a ~ N(0, 0.01^2), the paper's initialisation of the decoder's other matrices."""
        if self.W_a is not None:
            nn.init.normal_(self.W_a.weight, std=0.01)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        r"""$e_{ij} = (W_a s_{i-1})^\top h_j$ (or $s_{i-1}^\top h_j$): (N, D) states and
        (N, S, 2H) annotations -> (N, S), the seam's form of `weights`'s energies."""
        return torch.bmm(keys, self.project_query(query)[:, :, None]).squeeze(-1)

    def project_query(self, query: Tensor) -> Tensor:
        """W_a s_{i-1} ("general") or s_{i-1} ("dot"): (N, D) -> (N, 2H)."""
        return query if self.W_a is None else self.W_a(query)

    def query_weight(self) -> Tensor | None:
        """W_a's (2H, D) weight for "general" while W_a is a plain bias-free `nn.Linear`
        (`bias_free_weight`); None for "dot" (no projection to fuse) and a wrapped W_a."""
        return None if self.W_a is None else bias_free_weight(self.W_a)

    def weights(self, query: Tensor, memory: AttentionMemory, state: Tensor | None = None
                ) -> Tensor:
        """a_ij = softmax_j(q_n . h_bj) over real positions: (N, 2H) projected queries ->
        (N, S), the K rows of a sentence against its (S, 2H) annotations in one matmul."""
        batch, src_len, width = memory.keys.shape
        scores = torch.bmm(query.view(batch, -1, width), memory.keys.transpose(1, 2))  # (B,K,S)
        weights = functional.masked_softmax(scores, memory.mask[:, None, :])
        return weights.reshape(-1, src_len)
