r"""ConditionalGRUDecoder: Nematus' conditional GRU (cGRU), a decoder form beside the paper's.

Sennrich et al. (2017), "Nematus: a Toolkit for Neural Machine Translation", section 2
(``gru_cond_layer``); the decoder of the WMT17 multimodal task's best text-only system (LIUM-CVC).
For target step $i$ ($y_0$ = bos, $s_0 = \tanh(W_s \overleftarrow{h}_1)$ as in the paper):

$$s'_i = \mathrm{GRU}_1(s_{i-1}, E y_{i-1})$$

$$c_i = \mathrm{attention}(s'_i, h)$$

$$s_i = \mathrm{GRU}_2(s'_i, c_i)$$

$$\tilde t_i = U_o s_i + V_o E y_{i-1} + C_o c_i, \qquad
t_i = \mathrm{maxout}(\tilde t_i), \qquad p(y_i \mid y_{<i}, x) = \mathrm{softmax}(W_o t_i)$$

against the paper's $c_i = \mathrm{attention}(s_{i-1}, h)$, $s_i = \mathrm{GRU}(s_{i-1},
[E y_{i-1}; c_i])$ and $\tilde t_i$ from $s_{i-1}$: the attention reads a state that already
knows the previous word, and the output reads the new state. Both GRUs take the torch form
(the reset gate after $U$, as Nematus), with $\mathrm{GRU}_1$'s input projection
$[W_r; W_z; W] E y_{i-1} + b$ and $\mathrm{GRU}_2$'s $[C_r; C_z; C] c_i$ (its bias on the
recurrent side, inside the reset gate, as Nematus' ``b_nl``/``bx_nl``). With
``layer_norm`` each GRU normalises its input and recurrent projections apart
(`bahdanau.layer_norm`).

Where this differs from Nematus: $s_0$ is the paper's (Nematus: $\tanh(W \,\mathrm{mean}_j h_j)$),
the output layer is the paper's deep maxout (Nematus: $\tanh$ of the same sum), and the attention
is whichever `bahdanau.attention.Attention` the model has (additive by default, without layer
normalisation of its own).

This module is the reference: `step` computes these equations, and teacher forcing is a loop of
`step`. Its fast twin, `bahdanau.engine.ConditionalEngine`, computes the same function with the
same parameters, through the paper decoder's fusion seam and the methods below
(`first_input_norm`, `first_update`, `second_recurrent_weights`, `second_update`); it is
tested against this one in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bahdanau import functional
from bahdanau.attention import Attention
from bahdanau.decoder import AttentiveDecoder, DecoderMemory, DecoderState, StepOutput
from bahdanau.encoder import init_recurrent_
from bahdanau.errors import InputError
from bahdanau.layer_norm import GateNorm


class ConditionalGRUDecoder(AttentiveDecoder):
    """Nematus' conditional GRU decoder (module docstring), built from `AttentiveDecoder`'s parts.

    Takes `AttentiveDecoder`'s arguments; `gru_form` must be "torch" and `attention` is needed.
    Its layers are the paper decoder's, read as: `input_gates`, `weight_hh`, `bias_hh` are
    GRU_1's (on E y_{i-1}), `context_gates` and the new `weight_hh2`, `bias_hh2` are GRU_2's
    (on c_i), and `gate_norms`, `gate_norms2` their layer norms (with ``layer_norm``). Dropout on
    the GRU inputs (`dropout_rnn_inputs`) drops E y_{i-1} where it enters GRU_1 and c_i where it
    enters GRU_2.

    Its fast twin (`bahdanau.engine.ConditionalEngine`) reads `AttentiveDecoder`'s fusion seam,
    where `recurrent_weights` are GRU_1's U and `value_weight` GRU_2's C with C_o, and the GRUs
    through the methods of this class. A subclass whose step differs sets `has_fast_twin` False.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, context_size: int,
                 maxout_size: int, *, attention: Attention | None, pad_id: int = 0,
                 dropout: float = 0.0, dropout_rnn_inputs: float = 0.0,
                 dropout_deep_output: float = 0.0, gru_form: str = "torch",
                 layer_norm: bool = False) -> None:
        if attention is None:
            raise InputError("ConditionalGRUDecoder attends from its first GRU's state: it "
                             "needs an attention")
        if gru_form != "torch":
            raise InputError(f"ConditionalGRUDecoder's GRUs take the torch form (as Nematus), "
                             f"got gru_form={gru_form!r}")
        super().__init__(vocab_size, embed_size, hidden_size, context_size, maxout_size,
                         attention=attention, pad_id=pad_id,
                         dropout=dropout, dropout_rnn_inputs=dropout_rnn_inputs,
                         dropout_deep_output=dropout_deep_output, gru_form=gru_form,
                         layer_norm=layer_norm)
        D = hidden_size
        self.weight_hh2 = nn.Parameter(torch.empty(3 * D, D))     # GRU_2's [U'_r; U'_z; U']
        self.bias_hh2 = nn.Parameter(torch.empty(3 * D))
        self.gate_norms2 = (nn.ModuleList([GateNorm(D), GateNorm(D)]) if layer_norm else None)
        self._reset_second_gru()

    def reset_parameters(self) -> None:
        """`AttentiveDecoder`'s initialisation, and GRU_2's: U' orthogonal, its bias 0."""
        super().reset_parameters()
        if hasattr(self, "weight_hh2"):           # not yet during AttentiveDecoder.__init__
            self._reset_second_gru()

    def _reset_second_gru(self) -> None:
        init_recurrent_(self.weight_hh2, self.hidden_size)
        nn.init.zeros_(self.bias_hh2)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: DecoderMemory
             ) -> StepOutput:
        """One cGRU step for N rows (N = B, or B*K beams stored sentence-major).

        Args:
            prev_tokens: (N,) y_{i-1}.
            state: s_{i-1} (and the attention's state) for the N rows.
            memory: from `init_state` for the B source sentences.
        Returns:
            `StepOutput` with (N, V) logits of y_i, the state s_i and (N, S) weights a_ij.
        """
        embedded = self.dropout(self.embedding(prev_tokens))      # (N, E) E y_{i-1}
        x_gates = self.first_input_norm(self.input_gates(self.rnn_input_dropout(embedded)))
        s_first = self.first_update(x_gates, F.linear(state.hidden, *self.recurrent_weights()),
                                    state.hidden)                 # (N, D) s'_i
        context, weights, attention_state = self.context(
            DecoderState(s_first, state.attention), memory)       # (N, 2H) c_i from s'_i
        hidden = self.second_update(self.context_gates(self.rnn_input_dropout(context)),
                                    F.linear(s_first, *self.second_recurrent_weights()),
                                    s_first)                      # (N, D) s_i
        features = self.readout(hidden, embedded, self.readout_context(context))
        return StepOutput(self.output(features), DecoderState(hidden, attention_state), weights)

    # ------------------------------------------------------------------ the two GRUs
    def first_input_norm(self, x_gates: Tensor) -> Tensor:
        """GRU_1's input pre-activations [W_r; W_z; W] E y_{i-1} + b, layer-normalised with
        ``layer_norm`` (else as they are); any leading shape, so a twin may normalise every
        position at once."""
        return x_gates if self.gate_norms is None else self.gate_norms[0](x_gates)

    def first_update(self, x_gates: Tensor, h_gates: Tensor, hidden: Tensor) -> Tensor:
        """s'_i = GRU_1(s_{i-1}, E y_{i-1}) from `first_input_norm`'s (N, 3D) input
        pre-activations and the (N, 3D) U s_{i-1} + b_h (normalised here)."""
        if self.gate_norms is not None:
            h_gates = self.gate_norms[1](h_gates)
        return functional.gru_update(x_gates, h_gates, hidden)

    def second_recurrent_weights(self) -> tuple[Tensor, Tensor]:
        """GRU_2's (3D, D) [U'_r; U'_z; U'] and its (3D,) bias: they multiply s'_i."""
        return self.weight_hh2, self.bias_hh2

    def second_update(self, c_gates: Tensor, h_gates: Tensor, hidden: Tensor) -> Tensor:
        """s_i = GRU_2(s'_i, c_i) from the (N, 3D) [C_r; C_z; C] c_i and U' s'_i + b', each
        normalised apart with ``layer_norm``; `hidden` is s'_i."""
        if self.gate_norms2 is not None:
            x_norm, h_norm = self.gate_norms2
            c_gates, h_gates = x_norm(c_gates), h_norm(h_gates)
        return functional.gru_update(c_gates, h_gates, hidden)
