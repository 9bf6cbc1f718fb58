"""AttentiveDecoder: the paper's GRU decoder with attention and a deep maxout output.

Bahdanau et al. (2015), appendix A.2.2, for target step i (y_0 = bos):

    c_i   = attention(s_{i-1}, h)                               (or a fixed c for RNNencdec)
    t~_i  = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i               deep output, 2L units
    t_i   = max over pairs of t~_i                              maxout, L units
    p(y_i | y_<i, x) = softmax(W_o t_i)
    s_i   = GRU(s_{i-1}, [E y_{i-1}; c_i])                      s_0 = tanh(W_s bwd h_1)

Only the GRU update and the attention depend on the recurrence. `forward` (teacher forcing)
therefore embeds and projects all target inputs at once, runs the loop with one fused matmul of
s_{i-1} per step ([W_a; U] s_{i-1}), and computes the deep output and the vocabulary projection for
all positions after the loop. `step` computes exactly the same for one position (for search).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_dims, check_mask_rows, check_tensor, check_token_ids
from bahdanau._sequence_grads import SequenceGrads
from bahdanau.attention import AdditiveAttention
from bahdanau.config import GRU_FORMS
from bahdanau.encoder import init_recurrent_


class DecoderMemory(NamedTuple):
    """Everything the decoder reuses at every step for one source batch (built by `init_state`).

    The context c_i enters the decoder only through linear maps without bias (C c_i in the GRU,
    C_o c_i in the deep output), and c_i = sum_j a_ij h_j with sum_j a_ij = 1, so
    [C; C_o] c_i = sum_j a_ij [C; C_o] h_j. `values` holds [C; C_o] h_j for every source position,
    computed once per batch in one large matmul; each step then only mixes it with a_ij, an
    (S)-long weighted sum instead of a (2H x (3D + 2L)) matmul per row.

    Attributes:
        annotations: (B, S, 2H) encoder annotations h_j.
        mask: (B, S) bool, True at real source tokens.
        keys: (B, S, A) U_a h_j, or None without attention.
        context: (B, 2H) the fixed context c of RNNencdec, or None with attention.
        values: (B, S, 3D + 2L) [C; C_o] h_j with attention; (B, 3D + 2L) [C; C_o] c without.
        state_weight: the fused ([W_a;] U) weight applied to s_{i-1} at every step.
        state_bias: its bias (0 for W_a, then the GRU's recurrent bias).
    """

    annotations: Tensor
    mask: Tensor
    keys: Tensor | None
    context: Tensor | None
    values: Tensor
    state_weight: Tensor
    state_bias: Tensor


class StepOutput(NamedTuple):
    """Result of one decoder step for N rows (N = B, or B*K with beams)."""

    logits: Tensor            # (N, V) scores of y_i
    state: Tensor             # (N, D) s_i
    weights: Tensor | None    # (N, S) a_ij, None without attention


class AttentiveDecoder(nn.Module):
    """GRU decoder with additive attention (RNNsearch) or a fixed context (RNNencdec).

    Args:
        vocab_size: target V.
        embed_size: E.
        hidden_size: D, size of s_i.
        context_size: 2H, size of an annotation (and of c_i).
        maxout_size: L, units after maxout (the deep output has 2L units before it).
        attention: the alignment model; None gives RNNencdec's fixed context
            c = tanh(W_c [fwd h_{T_x}; bwd h_1]) from the encoder (Cho et al. 2014a, with the
            bidirectional encoder's two final states).
        pad_id: padding id of the target vocabulary.
        dropout: dropout on target embeddings and on the maxout output (0 in the paper).
        gru_form: "torch" (r * (U s + b)) or "paper" (U (r * s)); see `functional.gru_update`.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, context_size: int,
                 maxout_size: int, *, attention: AdditiveAttention | None, pad_id: int = 0,
                 dropout: float = 0.0, gru_form: str = "torch") -> None:
        super().__init__()
        if gru_form not in GRU_FORMS:
            raise ValueError(f"gru_form must be one of {GRU_FORMS}, got {gru_form!r}")
        if context_size % 2:
            raise ValueError(f"context_size must be 2H (even), got {context_size}")
        if attention is not None and (attention.query_size, attention.key_size) != (
                hidden_size, context_size):
            raise ValueError(
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
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's initialisation: U orthogonal, other weights N(0, 0.01^2), biases 0."""
        for module in self.modules():
            if module is self.attention:
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.01)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()
        init_recurrent_(self.weight_hh, self.hidden_size)
        nn.init.zeros_(self.bias_hh)
        if self.attention is not None:
            self.attention.reset_parameters()

    # ------------------------------------------------------------------ per source batch
    def init_state(self, annotations: Tensor, mask: Tensor) -> tuple[Tensor, DecoderMemory]:
        """s_0 and the per-batch memory: keys (or the fixed context) and the fused step weight.

        Args:
            annotations: (B, S, 2H) encoder annotations; the last H features of position 0 are
                the backward GRU's final state bwd h_1.
            mask: (B, S) bool, True at real tokens; every row needs one True.
        Returns:
            (B, D) s_0 = tanh(W_s bwd h_1) and the `DecoderMemory` for `step` / `forward`.
        """
        check_tensor("annotations", annotations, 3, floating=True)
        check_tensor("mask", mask, 2, boolean=True)
        check_dims("AttentiveDecoder.init_state", [
            ("annotations", annotations, 2, self.context_size),
            ("mask", mask, 0, annotations.shape[0]),
            ("mask", mask, 1, annotations.shape[1]),
        ])
        if annotations.shape[0] == 0 or annotations.shape[1] == 0:
            raise ValueError(f"annotations {tuple(annotations.shape)}: empty batch or source")
        check_mask_rows("mask", mask)
        half = self.context_size // 2
        backward_first = annotations[:, 0, half:]                 # (B, H) bwd h_1
        s0 = torch.tanh(self.init_proj(backward_first))           # (B, D)
        rows = 3 * self.hidden_size if self.gru_form == "torch" else 2 * self.hidden_size
        u_rz, b_rz = self.weight_hh[:rows], self.bias_hh[:rows]   # U (torch) or U_{r,z} (paper)
        value_weight = torch.cat([self.context_gates.weight, self.readout_context.weight])
        if self.attention is None:
            last = mask.sum(dim=1) - 1                            # index of each last real token
            forward_last = annotations[torch.arange(annotations.shape[0]), last, :half]
            context = torch.tanh(self.context_proj(torch.cat([forward_last, backward_first], -1)))
            memory = DecoderMemory(annotations, mask, None, context,
                                   F.linear(context, value_weight), u_rz, b_rz)  # (B, 3D + 2L)
        else:
            keys = self.attention.precompute_keys(annotations)   # (B, S, A) once per batch
            values = F.linear(annotations, value_weight)          # (B, S, 3D + 2L)
            state_weight = torch.cat([self.attention.W_a.weight, u_rz])  # (A + 3D or A + 2D, D)
            state_bias = torch.cat([b_rz.new_zeros(self.attention.align_size), b_rz])
            memory = DecoderMemory(annotations, mask, keys, None, values, state_weight, state_bias)
        return s0, memory

    # ------------------------------------------------------------------ the recurrence
    def _attend(self, state: Tensor, memory: DecoderMemory, grads: SequenceGrads | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """From s_{i-1} (N rows): U s_{i-1}, C c_i (N, 3D), C_o c_i (N, 2L) and a_ij (N, S).

        With `grads` (teacher forcing with autograd), the step projection and the value mix go
        through it, so their gradients are summed once per sequence.
        """
        if grads is None:
            projected = F.linear(state, memory.state_weight, memory.state_bias)
        else:
            projected = grads.project(state)                      # (N, [A +] 3D|2D)
        if memory.keys is None:
            repeat = state.shape[0] // memory.values.shape[0]
            context_terms = (memory.values.repeat_interleave(repeat, 0) if repeat > 1
                             else memory.values)
            h_gates, weights = projected, None
        else:
            assert self.attention is not None
            query, h_gates = projected.split(
                [self.attention.align_size, projected.shape[1] - self.attention.align_size], 1)
            if grads is not None and grads.values is not None:
                weights = self.attention.weights(query, memory.keys, memory.mask)
                context_terms = grads.mix(weights)                # sum_j a_ij [C; C_o] h_j
            else:
                context_terms, weights = self.attention.attend(query, memory.keys, memory.values,
                                                               memory.mask, check=False)
        gate_terms, readout_terms = context_terms.split(
            [3 * self.hidden_size, 2 * self.maxout_size], 1)
        return h_gates, gate_terms, readout_terms, weights

    def _update(self, x_gates: Tensor, h_gates: Tensor, gate_terms: Tensor, state: Tensor
                ) -> Tensor:
        """s_i = GRU(s_{i-1}, [E y_{i-1}; c_i]) from the pre-activation parts."""
        D = self.hidden_size
        x_gates = x_gates + gate_terms                            # W E y_{i-1} + b + C c_i
        if self.gru_form == "torch":
            return functional.gru_update(x_gates, h_gates, state)
        return functional.gru_update(x_gates, h_gates, state, weight_hn=self.weight_hh[2 * D:],
                                     bias_hn=self.bias_hh[2 * D:])

    def _readout(self, states: Tensor, embedded: Tensor, context_readout: Tensor) -> Tensor:
        """Deep output t_i from s_{i-1}, E y_{i-1} and C_o c_i (any leading shape): (..., L)."""
        t_tilde = (self.readout_state(states) + self.readout_embed(embedded)
                   + context_readout)                             # (..., 2L)
        return self.dropout(functional.maxout(t_tilde))           # (..., L); logits: W_o t_i

    # ------------------------------------------------------------------ public steps
    def step(self, prev_tokens: Tensor, state: Tensor, memory: DecoderMemory) -> StepOutput:
        """One decoding step for N rows (N = B, or B*K beams stored sentence-major).

        Args:
            prev_tokens: (N,) y_{i-1}.
            state: (N, D) s_{i-1}.
            memory: from `init_state` for the B source sentences.
        Returns:
            `StepOutput` with (N, V) logits of y_i, (N, D) s_i and (N, S) weights a_ij.
        """
        embedded = self.dropout(self.embedding(prev_tokens))      # (N, E)
        h_gates, gate_terms, readout_terms, weights = self._attend(state, memory)
        new_state = self._update(self.input_gates(embedded), h_gates, gate_terms, state)
        logits = self.output(self._readout(state, embedded, readout_terms))
        return StepOutput(logits, new_state, weights)

    def forward(self, tgt_in: Tensor, state: Tensor, memory: DecoderMemory, *,
                return_attention: bool = False, select: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced decoding of whole target prefixes: `output(features(...))`.

        Args:
            tgt_in: (B, T) decoder inputs y_0..y_{T-1} (bos first), padded with pad_id.
            state: (B, D) s_0 from `init_state`.
            memory: from `init_state`.
            return_attention: also return the (B, T, S) weights (else None).
            select: optional (B, T) bool; if given, only the selected positions are projected
                onto the vocabulary and the logits come back as (M, V), M = select.sum(), in
                row-major order (what a loss needs: padding costs no vocabulary projection).
        Returns:
            (B, T, V) logits of y_1..y_T (or (M, V), see `select`), and the weights or None.
        """
        features, attention = self.features(tgt_in, state, memory,
                                            return_attention=return_attention, select=select)
        return self.output(features), attention

    def features(self, tgt_in: Tensor, state: Tensor, memory: DecoderMemory, *,
                 return_attention: bool = False, select: Tensor | None = None
                 ) -> tuple[Tensor, Tensor | None]:
        """Like `forward`, but stops before the vocabulary projection W_o.

        Returns:
            (B, T, L) maxout outputs t_i (or (M, L) with `select`), and the weights or None.
        """
        check_tensor("tgt_in", tgt_in, 2, integer=True)
        check_dims("AttentiveDecoder.forward", [("tgt_in", tgt_in, 0, state.shape[0])])
        if tgt_in.shape[1] == 0:
            raise ValueError(f"tgt_in has shape {tuple(tgt_in.shape)}: no target positions")
        check_token_ids("tgt_in", tgt_in, self.vocab_size)
        embedded = self.dropout(self.embedding(tgt_in))           # (B, T, E)
        x_gates = self.input_gates(embedded)                      # (B, T, 3D) hoisted
        grads = self._sequence_grads(memory, tgt_in.device)
        states, readouts, weights = [], [], []
        last = tgt_in.shape[1] - 1
        for i, x_step in enumerate(x_gates.unbind(1)):            # unbind: one backward op
            states.append(state)
            h_gates, gate_terms, readout_terms, step_weights = self._attend(state, memory, grads)
            readouts.append(readout_terms)                        # C_o c_i
            weights.append(step_weights)
            if i < last:                                          # s_T is never used
                state = self._update(x_step, h_gates, gate_terms, state)
        states_all, readouts_all = torch.stack(states, 1), torch.stack(readouts, 1)
        if select is not None:
            check_dims("AttentiveDecoder.forward", [("select", select, 0, tgt_in.shape[0]),
                                                    ("select", select, 1, tgt_in.shape[1])])
            states_all, embedded, readouts_all = (
                states_all[select], embedded[select], readouts_all[select])
        features = self._readout(states_all, embedded, readouts_all)
        attention = None
        if return_attention and memory.keys is not None:
            attention = torch.stack(weights, 1)                   # (B, T, S)
        return features, attention

    def _sequence_grads(self, memory: DecoderMemory, device: torch.device
                        ) -> SequenceGrads | None:
        """Per-sequence gradient sums for the teacher-forced loop (`bahdanau._sequence_grads`), or
        None where plain autograd is used: no gradients wanted, autocast (whose dtypes the
        summation does not follow), or the fused attention kernel (values mixed inside it)."""
        if not torch.is_grad_enabled() or torch.is_autocast_enabled(device.type):
            return None
        mixes = (memory.keys is not None and self.attention is not None
                 and not self.attention.is_fused(memory.keys))
        return SequenceGrads(memory.state_weight, memory.state_bias,
                             memory.values if mixes else None)
