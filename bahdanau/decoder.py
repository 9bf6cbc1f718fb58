r"""AttentiveDecoder: the paper's GRU decoder with attention and a deep maxout output.

Bahdanau et al. (2015), appendix A.2.2, for target step $i$ ($y_0$ = bos):

$$c_i = \mathrm{attention}(s_{i-1}, h) \quad \text{(or a fixed } c \text{ for RNNencdec)}$$

$$s_i = \mathrm{GRU}(s_{i-1}, [E y_{i-1}; c_i]), \qquad
s_0 = \tanh(W_s \overleftarrow{h}_1)$$

$$\tilde t_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i \quad \text{(deep output, 2L units)}$$

$$t_i = [\max(\tilde t_{i,2j-1}, \tilde t_{i,2j})]_{j=1}^{L} \quad
\text{(maxout, L units)}$$

$$p(y_i \mid y_1, \ldots, y_{i-1}, x) = \mathrm{softmax}(W_o t_i)$$

This module is the reference: `init_state` and `step` compute exactly these equations, and
`forward` (teacher forcing) is a loop of `step`. It meets its attention only through the seam of
`bahdanau.attention.Attention`. The fast path that models use by default, `bahdanau.engine`,
computes the same function with the same parameters and is tested against this one in float64.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_dims, check_tensor
from bahdanau.attention import (
    Attention,
    LinearWeights,
    bias_free_weight,
    check_attention,
    linear_weights,
)
from bahdanau.config import GRU_FORMS
from bahdanau.encoder import init_recurrent_
from bahdanau.errors import InputError
from bahdanau.layer_norm import GateNorm
from bahdanau.parts import Part


class DecoderState(NamedTuple):
    """The recurrent state of N decoder rows (N = B, or B*K with beams)."""

    hidden: Tensor                # (N, D) s_i
    attention: Tensor | None = None   # the attention's per-row state (e.g. coverage), or None

    def rows(self, index: Tensor) -> DecoderState:
        """The state of rows `index` ((N',) long): beam search repeats and reorders rows."""
        attention = self.attention
        return DecoderState(self.hidden.index_select(0, index),
                            None if attention is None else attention.index_select(0, index))


class DecoderMemory(NamedTuple):
    """What every step reuses for B source sentences (built once per batch by `init_state`)."""

    annotations: Tensor           # (B, S, 2H) encoder annotations h_j
    mask: Tensor                  # (B, S) bool, True at real source tokens
    attention: Any                # the attention's memory (`Attention.prepare`), None without
    context: Tensor | None        # (B, 2H) RNNencdec's fixed context c, None with attention

    def select(self, keep: Tensor) -> DecoderMemory:
        """The memory of sentences `keep` ((B',) long): search drops finished sentences."""
        return DecoderMemory(*(select_sentences(field, keep) for field in self))


def select_sentences(memory: Any, keep: Tensor) -> Any:
    """Rows `keep` of every tensor in a (nested) tuple of per-sentence tensors; None stays."""
    if isinstance(memory, Tensor):
        return memory.index_select(0, keep)
    if isinstance(memory, tuple):
        fields = [select_sentences(field, keep) for field in memory]
        return type(memory)(*fields) if hasattr(memory, "_fields") else tuple(fields)
    return memory


class StepOutput(NamedTuple):
    """Result of one decoder step for N rows (N = B, or B*K with beams)."""

    logits: Tensor                # (N, V) scores of y_i
    state: DecoderState           # s_i (and the attention's state)
    weights: Tensor | None        # (N, S) a_ij, None without attention


class AttentiveDecoder(Part, nn.Module):
    r"""GRU decoder with an attention (RNNsearch) or a fixed context (RNNencdec).

    Args:
        vocab_size: target V.
        embed_size: E.
        hidden_size: D, size of s_i.
        context_size: 2H, size of an annotation (and of c_i).
        maxout_size: L, units after maxout (the deep output has 2L units before it).
        attention: any `bahdanau.attention.Attention` (`AdditiveAttention` in the paper; a module
            that is not one is refused, `bahdanau.attention.check_attention`); None
            gives RNNencdec's fixed context
            $c = \tanh(W_c [\overrightarrow{h}_{T_x}; \overleftarrow{h}_1])$ from the encoder
            (Cho et al. 2014a, with the bidirectional encoder's two final states).
        pad_id: padding id of the target vocabulary.
        dropout: dropout on target embeddings and on the maxout output t_i (0 in the paper).
        dropout_rnn_inputs: dropout on the GRU's inputs E y_{i-1} (after `dropout`) and c_i,
            where they enter the GRU (the deep output reads them undropped); 0 in the paper.
        dropout_deep_output: dropout on the deep output t~_i, before the maxout (0 in the paper).
        gru_form: "torch" (r * (U s + b)) or "paper" (U (r * s)); see `functional.gru_update`.
        layer_norm: the layer-normalised GRU (`bahdanau.layer_norm`; torch form only): `update`
            normalises its input pre-activations and its recurrent ones apart (`gate_norms`).

    The fusion seam. A fast twin of this decoder (`bahdanau.engine.DecoderEngine`) computes the
    same function with the same parameters. It calls the decoder's layers and its `update`,
    `readout` and `deep_output`, and reads weights and settings only through these, never
    through its layers' attributes:

        recurrent_rows        R, the rows of [U_r; U_z; U] that multiply s_{i-1} directly
        recurrent_weights()   those (R, D) rows and their bias; `update` takes their product
        value_weight()        the (3D + 2L, 2H) [C; C_o], c_i's two bias-free linear maps
        drops_rnn_inputs()    whether dropout on the GRU's inputs is active (C then maps the
                              dropped c_i, so [C; C_o] h_j cannot be precomputed)
        output_weights()      W_o and its bias, for a loss that projects in row chunks
        input_weights()       [W_r; W_z; W] and its bias, `input_gates`'s
        readout_weights()     U_o's and V_o's: `readout` is `deep_output` of
                              U_o s_{i-1} + b + V_o E y_{i-1} + C_o c_i

    `has_fast_twin` says that the engine may run this decoder: its step is the one above, in
    these parts (`bahdanau.conditional_decoder`'s is its own, with its own twin). A subclass
    whose step differs sets it False, and models decode and train it on the reference path.

    The weights are offered only while their layers are plain `nn.Linear`s
    (`bahdanau.attention.linear_weights`), and None otherwise: a wrapper (LoRA, quantisation) may
    expose its base layer's `weight` without its own change, so a wrapped layer is called, never
    read. A subclass that knows what its wrapped layers hold may offer their weights by
    overriding these methods.

    Inputs are not validated here beyond ranks and sizes: the model checks a batch's values once,
    at its door (`RNNSearch.check_batch`), and the decoder trusts what it is given.
    """

    has_fast_twin: ClassVar[bool] = True

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, context_size: int,
                 maxout_size: int, *, attention: Attention | None, pad_id: int = 0,
                 dropout: float = 0.0, dropout_rnn_inputs: float = 0.0,
                 dropout_deep_output: float = 0.0, gru_form: str = "torch",
                 layer_norm: bool = False) -> None:
        super().__init__()
        if gru_form not in GRU_FORMS:
            raise InputError(f"gru_form must be one of {GRU_FORMS}, got {gru_form!r}")
        if layer_norm and gru_form != "torch":
            raise InputError("layer_norm needs gru_form='torch' (bahdanau.layer_norm)")
        if context_size % 2:
            raise InputError(f"context_size must be 2H (even), got {context_size}")
        if attention is not None:
            attention = check_attention(attention)
        if attention is not None and (attention.query_size, attention.key_size) != (
                hidden_size, context_size):
            raise InputError(
                f"attention expects query_size={attention.query_size}, "
                f"key_size={attention.key_size}; the decoder has hidden_size={hidden_size}, "
                f"context_size={context_size}"
            )
        self.vocab_size, self.embed_size, self.hidden_size = vocab_size, embed_size, hidden_size
        self.context_size, self.maxout_size = context_size, maxout_size
        self.pad_id, self.gru_form = pad_id, gru_form
        self.attention = attention
        D, C, L = hidden_size, context_size, maxout_size
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=pad_id)   # E
        self.dropout = nn.Dropout(dropout)
        self.rnn_input_dropout = nn.Dropout(dropout_rnn_inputs)
        self.deep_output_dropout = nn.Dropout(dropout_deep_output)
        self.init_proj = nn.Linear(C // 2, D)                     # W_s on bwd h_1
        self.input_gates = nn.Linear(embed_size, 3 * D)           # [W_r; W_z; W] E y_{i-1} + b
        self.context_gates = nn.Linear(C, 3 * D, bias=False)      # [C_r; C_z; C] c_i
        self.weight_hh = nn.Parameter(torch.empty(3 * D, D))      # [U_r; U_z; U]
        self.bias_hh = nn.Parameter(torch.empty(3 * D))
        self.readout_state = nn.Linear(D, 2 * L)                  # U_o (+ bias)
        self.readout_embed = nn.Linear(embed_size, 2 * L, bias=False)   # V_o
        self.readout_context = nn.Linear(C, 2 * L, bias=False)    # C_o
        self.output = nn.Linear(L, vocab_size)                    # W_o (+ bias)
        self.context_proj = nn.Linear(C, C) if attention is None else None  # RNNencdec's c
        # LN of the GRU's input and recurrent pre-activations; None: no layer norm
        self.gate_norms = (nn.ModuleList([GateNorm(D), GateNorm(D)]) if layer_norm else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's initialisation: U orthogonal, other weights N(0, 0.01^2), biases 0.

        The attention keeps its own initialisation (its `reset_parameters`, if it has one).
        """
        own_attention = set() if self.attention is None else set(self.attention.modules())
        for module in self.modules():
            if module in own_attention:
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.01)
                bias = getattr(module, "bias", None)   # nn.Embedding has none
                if bias is not None:
                    nn.init.zeros_(bias)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()
        init_recurrent_(self.weight_hh, self.hidden_size)
        nn.init.zeros_(self.bias_hh)
        for module in self.modules():
            if isinstance(module, GateNorm):
                module.reset_parameters()
        reset = getattr(self.attention, "reset_parameters", None)   # optional on the seam
        if reset is not None:
            reset()

    # ------------------------------------------------------------------ per source batch
    def init_state(self, annotations: Tensor, mask: Tensor
                   ) -> tuple[DecoderState, DecoderMemory]:
        r"""$s_0$ and the per-batch memory (the attention's, or RNNencdec's fixed context).

        Args:
            annotations: (B, S, 2H) encoder annotations; the last H features of position 0 are
                the backward GRU's final state bwd h_1.
            mask: (B, S) bool, True at real tokens; every row needs one True. That is the
                caller's promise, not checked here (it would read the mask, a device sync): the
                model checks the lengths the encoder builds the mask from, at its door.
        Returns:
            The (B rows) `DecoderState` with $s_0 = \tanh(W_s \overleftarrow{h}_1)$, and the
            `DecoderMemory`.
        Raises:
            InputError: wrong ranks, dtypes or sizes.
        """
        check_tensor("annotations", annotations, 3, floating=True)
        check_tensor("mask", mask, 2, boolean=True)
        check_dims("AttentiveDecoder.init_state", [
            ("annotations", annotations, 2, self.context_size),
            ("mask", mask, 0, annotations.shape[0]),
            ("mask", mask, 1, annotations.shape[1]),
        ])
        if annotations.shape[0] == 0 or annotations.shape[1] == 0:
            raise InputError(f"annotations {tuple(annotations.shape)}: empty batch or source")
        half = self.context_size // 2
        backward_first = annotations[:, 0, half:]                 # (B, H) bwd h_1
        s0 = torch.tanh(self.init_proj(backward_first))           # (B, D)
        if self.attention is not None:
            memory = self.attention.prepare(annotations, mask)
            state = DecoderState(s0, self.attention.initial_state(memory))
            return state, DecoderMemory(annotations, mask, memory, None)
        last = mask.sum(dim=1) - 1                                # index of each last real token
        forward_last = annotations[torch.arange(annotations.shape[0]), last, :half]
        assert self.context_proj is not None   # built exactly when there is no attention
        context = torch.tanh(self.context_proj(torch.cat([forward_last, backward_first], -1)))
        return DecoderState(s0), DecoderMemory(annotations, mask, None, context)

    # ------------------------------------------------------------------ one target step
    def step(self, prev_tokens: Tensor, state: DecoderState, memory: DecoderMemory
             ) -> StepOutput:
        """One decoding step for N rows (N = B, or B*K beams stored sentence-major).

        Args:
            prev_tokens: (N,) y_{i-1}.
            state: s_{i-1} (and the attention's state) for the N rows.
            memory: from `init_state` for the B source sentences.
        Returns:
            `StepOutput` with (N, V) logits of y_i, the next state and (N, S) weights a_ij.
        """
        embedded = self.dropout(self.embedding(prev_tokens))      # (N, E) E y_{i-1}
        context, weights, attention_state = self.context(state, memory)   # (N, 2H) c_i
        x_gates = (self.input_gates(self.rnn_input_dropout(embedded))
                   + self.context_gates(self.rnn_input_dropout(context)))
        hidden = self.update(x_gates, F.linear(state.hidden, *self.recurrent_weights()),
                             state.hidden)                        # (N, D) s_i
        features = self.readout(state.hidden, embedded, self.readout_context(context))
        return StepOutput(self.output(features), DecoderState(hidden, attention_state), weights)

    def context(self, state: DecoderState, memory: DecoderMemory
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """c_i for N rows: (N, 2H) context, (N, S) weights (None for RNNencdec), next state."""
        if self.attention is None:
            assert memory.context is not None
            beams = state.hidden.shape[0] // memory.context.shape[0]
            return memory.context.repeat_interleave(beams, 0), None, None
        step = self.attention(state.hidden, memory.attention, memory.annotations,
                              state.attention)
        return step.context, step.weights, step.state

    # ------------------------------------------------------------------ the fusion seam
    @property
    def recurrent_rows(self) -> int:
        """R, the rows of [U_r; U_z; U] that multiply s_{i-1} directly: all 3D in the torch
        form, U_{r,z} (2D) in the paper form, where U multiplies r * s_{i-1}."""
        return (3 if self.gru_form == "torch" else 2) * self.hidden_size

    def recurrent_weights(self) -> tuple[Tensor, Tensor]:
        """The (R, D) rows of [U_r; U_z; U] that multiply s_{i-1} directly, and their bias."""
        return self.weight_hh[:self.recurrent_rows], self.bias_hh[:self.recurrent_rows]

    def value_weight(self) -> Tensor | None:
        """The (3D + 2L, 2H) stacked [C; C_o]: c_i enters the step only through these two
        bias-free maps (C into the GRU's gates, C_o into the deep output), so
        [C; C_o] c_i = value_weight() @ c_i. None unless both are plain bias-free layers."""
        gates = bias_free_weight(self.context_gates)
        readout = bias_free_weight(self.readout_context)
        return None if gates is None or readout is None else torch.cat([gates, readout])

    def drops_rnn_inputs(self) -> bool:
        """True while dropout on the GRU's inputs is active (training, `dropout_rnn_inputs` > 0):
        C then maps the dropped c_i, a different draw at every step, and only C_o c_i is linear in
        c_i."""
        return self.training and self.rnn_input_dropout.p > 0

    def output_weights(self) -> LinearWeights | None:
        """W_o's (V, L) weight and (V,) bias: `output(t) == F.linear(t, *output_weights())`."""
        return linear_weights(self.output)

    def input_weights(self) -> LinearWeights | None:
        """[W_r; W_z; W]'s (3D, E) weight and (3D,) bias: `input_gates(x) == F.linear(x, *it)`."""
        return linear_weights(self.input_gates)

    def readout_weights(self) -> tuple[LinearWeights, LinearWeights] | None:
        """U_o's and V_o's weights and biases, for `readout(s, e, r) ==
        deep_output(F.linear(s, *U_o) + F.linear(e, *V_o) + r)`; None unless both are plain."""
        state, embed = linear_weights(self.readout_state), linear_weights(self.readout_embed)
        return None if state is None or embed is None else (state, embed)

    # ------------------------------------------------------------------ the GRU and deep output
    def update(self, x_gates: Tensor, h_gates: Tensor, hidden: Tensor) -> Tensor:
        """s_i = GRU(s_{i-1}, [E y_{i-1}; c_i]) from the pre-activations.

        Args:
            x_gates: (..., 3D) [W_r; W_z; W] E y_{i-1} + b + [C_r; C_z; C] c_i.
            h_gates: (..., 3D or 2D) s_{i-1} through `recurrent_weights`.
            hidden: (..., D) s_{i-1}.
        """
        if self.gate_norms is not None:            # the layer-normalised GRU (torch form)
            x_norm, h_norm = self.gate_norms
            return functional.gru_update(x_norm(x_gates), h_norm(h_gates), hidden)
        if self.gru_form == "torch":
            return functional.gru_update(x_gates, h_gates, hidden)
        rows = self.recurrent_rows
        return functional.gru_update(x_gates, h_gates, hidden, weight_hn=self.weight_hh[rows:],
                                     bias_hn=self.bias_hh[rows:])

    def readout(self, hidden: Tensor, embedded: Tensor, context_readout: Tensor) -> Tensor:
        """Deep output t_i from s_{i-1}, E y_{i-1} and C_o c_i (any leading shape): (..., L)."""
        return self.deep_output(self.readout_state(hidden) + self.readout_embed(embedded)
                                + context_readout)

    def deep_output(self, t_tilde: Tensor) -> Tensor:
        """t_i from t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i: (..., 2L) -> (..., L)."""
        t_tilde = self.deep_output_dropout(t_tilde)
        return self.dropout(functional.maxout(t_tilde))           # (..., L); logits: W_o t_i

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, tgt_in: Tensor, state: DecoderState, memory: DecoderMemory, *,
                return_attention: bool = False) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced decoding of whole target prefixes: `step` at every position.

        Args:
            tgt_in: (B, T) decoder inputs y_0..y_{T-1} (bos first), padded with pad_id.
            state: from `init_state`.
            memory: from `init_state`.
            return_attention: also return the (B, T, S) weights (else None).
        Returns:
            (B, T, V) logits of y_1..y_T, and the weights or None.
        Raises:
            InputError: see `check_targets`.
        """
        self.check_targets(tgt_in, state.hidden.shape[0])
        logits, weights = [], []
        for prev_tokens in tgt_in.unbind(1):
            out = self.step(prev_tokens, state, memory)
            logits.append(out.logits)
            if return_attention and out.weights is not None:     # (B, S) a step: kept only
                weights.append(out.weights)                      # when asked for
            state = out.state
        attention = None
        if return_attention and self.attention is not None:
            attention = torch.stack(weights, 1)                   # (B, T, S)
        return torch.stack(logits, 1), attention

    def check_targets(self, tgt_in: Tensor, batch: int) -> None:
        """(B, T) decoder inputs: integer ids, B rows, T >= 1. Ranks and sizes only; that every
        id is in [0, V) is a value check, made once per batch at the model's door
        (`RNNSearch.check_batch`).

        Raises:
            InputError: naming `tgt_in` and the problem.
        """
        check_tensor("tgt_in", tgt_in, 2, integer=True)
        check_dims("AttentiveDecoder.forward", [("tgt_in", tgt_in, 0, batch)])
        if tgt_in.shape[1] == 0:
            raise InputError(f"tgt_in has shape {tuple(tgt_in.shape)}: no target positions")
