"""ConditionalEngine: `ConditionalGRUDecoder`'s function, computed fast, with its own parameters.

The cGRU's step (`bahdanau.conditional_decoder`) attends from s'_i = GRU_1(s_{i-1}, E y_{i-1})
and feeds c_i to a second GRU, s_i = GRU_2(s'_i, c_i). `DecoderEngine`'s tricks carry over with
GRU_2 in the place of the paper's GRU:

* The fused step weight is [W_a; U'], GRU_2's recurrent matrix stacked with the attention's
  query projection: one matmul of s'_i per step gives both.
* The precomputed values [C; C_o] h_j hold, C being GRU_2's input map (and while dropout on
  the GRU inputs is active, C and C_o are called on c_i, as there).
* Teacher forcing embeds E y_{i-1}, projects it through GRU_1's input map and normalises it
  (`ConditionalGRUDecoder.first_input_norm`) for all target positions before the loop, and
  computes the deep output (from s_i) and the vocabulary projection after it.
* Sequence-level gradient sums for both recurrent products: [W_a; U'] of s'_i and GRU_1's U of
  s_{i-1} (`bahdanau.engine.sequence_grads`).
* A search packs the same weights as `DecoderEngine`'s, or quantises them for an int8 copy;
  GRU_1's U s_{i-1} is a plain matmul: packed, its (256 -> 768) product at the Multi30k
  recipe's size took 756 against 758 microseconds for a beam of 5 on 32 sentences (160 rows)
  and 227 against 263 for greedy search's 32 (one thread), not worth a sixth packed map.

tests/unit/test_engine.py and tests/unit/test_conditional_decoder.py hold it equal to the
reference decoder in float64.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from bahdanau.conditional_decoder import ConditionalGRUDecoder
from bahdanau.decoder import DecoderState, StepOutput
from bahdanau.engine.decoding import DecoderEngine, EngineMemory
from bahdanau.engine.sequence_grads import SequenceGrads


class ConditionalEngine(DecoderEngine):
    """The fast twin of a `ConditionalGRUDecoder` (see the module docstring); takes
    `DecoderEngine`'s arguments."""

    decoder: ConditionalGRUDecoder
    twin_of = ConditionalGRUDecoder

    def _fused_recurrent_weights(self) -> tuple[Tensor, Tensor]:
        """GRU_2's U' and its bias: they multiply s'_i, the state the attention reads."""
        return self.decoder.second_recurrent_weights()

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: EngineMemory
             ) -> StepOutput:
        """`ConditionalGRUDecoder.step`, from the engine's memory."""
        dec, packed = self.decoder, memory.packed
        embedded = dec.dropout(dec.embedding(prev_tokens))        # (N, E)
        x_gates = dec.first_input_norm(
            self._input_gates(dec.rnn_input_dropout(embedded), packed))
        s_first = dec.first_update(x_gates, F.linear(state.hidden, *dec.recurrent_weights()),
                                   state.hidden)                  # (N, D) s'_i
        h_gates, gate_terms, readout_terms, weights, attention_state = self._attend(
            DecoderState(s_first, state.attention), memory, None)
        hidden = dec.second_update(gate_terms, h_gates, s_first)  # (N, D) s_i
        logits = self._step_logits(hidden, embedded, readout_terms, packed)
        return StepOutput(logits, DecoderState(hidden, attention_state), weights)

    def features(self, tgt_in: Tensor, state: DecoderState, memory: EngineMemory, *,
                 select: Tensor | None = None, return_attention: bool = False
                 ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing up to the maxout output t_i: `DecoderEngine.features`' arguments
        and result."""
        dec = self.decoder
        dec.check_targets(tgt_in, state.hidden.shape[0])      # ranks and sizes only
        embedded = dec.dropout(dec.embedding(tgt_in))             # (B, T, E)
        x_gates = dec.first_input_norm(
            dec.input_gates(dec.rnn_input_dropout(embedded)))     # (B, T, 3D) hoisted
        grads = self._sequence_grads(memory)
        first_weights = dec.recurrent_weights()                   # GRU_1's U and b_h
        first = None if grads is None else SequenceGrads(*first_weights, None)
        hiddens, readouts, weights = [], [], []
        for x_step in x_gates.unbind(1):                          # unbind: one backward op
            h_first = (F.linear(state.hidden, *first_weights) if first is None
                       else first.project(state.hidden))          # U s_{i-1} + b_h
            s_first = dec.first_update(x_step, h_first, state.hidden)
            h_gates, gate_terms, readout_terms, step_weights, attention_state = self._attend(
                DecoderState(s_first, state.attention), memory, grads)
            state = DecoderState(dec.second_update(gate_terms, h_gates, s_first),
                                 attention_state)
            hiddens.append(state.hidden)                          # s_i: the readout's
            readouts.append(readout_terms)                        # C_o c_i
            if return_attention and step_weights is not None:
                weights.append(step_weights)
        return self._hoisted_features(hiddens, embedded, readouts, weights, select)
