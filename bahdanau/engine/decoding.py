"""DecoderEngine: `AttentiveDecoder`'s function, computed fast, with the decoder's own parameters.

What it does differently from the reference decoder, and why it is the same function:

* Precomputed values. c_i enters the decoder only through linear maps without bias (C c_i in the
  GRU, C_o c_i in the deep output), and c_i = sum_j a_ij h_j with sum_j a_ij = 1, so
  [C; C_o] c_i = sum_j a_ij [C; C_o] h_j. `prepare` computes [C; C_o] h_j
  (`AttentiveDecoder.value_weight`) once per batch in one large matmul, and each step mixes it
  with a_ij through the attention's `attend`: an S-long weighted sum instead of a
  (2H x (3D + 2L)) matmul per row.
* A fused step weight. When the attention offers its query projection (`query_weight`), it is
  stacked with the GRU's recurrent matrix (`AttentiveDecoder.recurrent_weights`): one matmul of
  s_{i-1} per step gives both.
* Hoisting. Teacher forcing embeds and projects all target inputs before the loop, and computes
  the deep output and the vocabulary projection for all positions after it (only the non-pad
  ones for the loss).
* Sequence-level gradient sums (`bahdanau.engine.sequence_grads`) for the step weight and the
  values, and the chunked cross-entropy (`bahdanau.kernels.linear_cross_entropy`) for the loss.
* Packed step weights. For a search under inference mode on a CPU, `prepare` reorders every
  weight a step multiplies (the fused step weight, [W_r; W_z; W], U_o, V_o and W_o) once for
  oneDNN (`bahdanau.kernels.packed_linear`), and every step's matmuls read them as they are.
* int8 step weights (`DecoderEngine(int8=True)`, what `bahdanau.RNNSearch.int8_copy` builds):
  the fused step weight, U_o, V_o and W_o are quantised once, per output channel, when the
  engine is built, and a search's steps multiply them on the CPU's int8 units
  (`bahdanau.kernels.int8_linear`). Not the same function: each product is that of the
  dequantised weights and input (the tests hold it to that in float64), and a search finds
  nearly the float model's tokens. Teacher forcing (`features`, `loss`) stays in float.

Where the precomputed values cannot stand for c_i, the values are the annotations h_j
themselves and each step calls C and C_o on c_i, as the reference decoder does: while dropout on
the GRU inputs (`AttentiveDecoder`'s `dropout_rnn_inputs`) is active
(`AttentiveDecoder.drops_rnn_inputs`), since C maps the dropped c_i, and when the decoder offers
no `AttentiveDecoder.value_weight` (a wrapped layer). Likewise a layer whose weights the
decoder does not offer is called, never packed, and W_o's loss is then `F.cross_entropy` of
its logits.

The engine meets the decoder at its fusion seam (see `AttentiveDecoder`) and the attention at
`bahdanau.attention.Attention`'s methods: it calls their layers and methods and never reads a
layer's parameters or settings.

Under `torch.compile` and `torch.export` the engine uses traceable twins of the sequence-level
gradient sums and the chunked cross-entropy: plain autograd and
`torch.nn.functional.cross_entropy` over every position; it packs no weight there.
tests/unit/test_engine.py holds every path equal to the reference decoder in float64, and
tests/unit/test_packed_linear.py the packed search to it in float32.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from bahdanau import functional
from bahdanau.decoder import AttentiveDecoder, DecoderMemory, DecoderState, StepOutput
from bahdanau.engine.sequence_grads import SequenceGrads
from bahdanau.errors import InputError
from bahdanau.kernels import int8_linear, linear_cross_entropy, packed_linear
from bahdanau.kernels.int8_linear import Int8Linear
from bahdanau.kernels.packed_linear import PackedLinear

# the engine written for each decoder class that has one (`DecoderEngine.twin_class`)
_TWINS: dict[type[AttentiveDecoder], type[DecoderEngine]] = {}

# a linear map a search step calls on (N, in) rows: packed in float32, or in int8
StepLinear = PackedLinear | Int8Linear


class PackedWeights(NamedTuple):
    """The linear maps a search step applies, with their weights reordered for oneDNN (in
    float32, or in int8 for an int8 engine); None where one is not packed (not a float32 CPU
    search, or a layer the decoder does not offer as weights): the step then calls `F.linear`
    or the layer."""

    step: StepLinear | None = None              # [W_a; U] s_{i-1} (`EngineMemory.step_weight`;
                                                # the cGRU's [W_a; U'] s'_i)
    input: StepLinear | None = None             # [W_r; W_z; W] E y_{i-1} + b
    readout_state: StepLinear | None = None     # U_o s_{i-1} + b (the cGRU's U_o s_i + b)
    readout_embed: StepLinear | None = None     # V_o E y_{i-1}
    output: StepLinear | None = None            # W_o t_i + b_o


class EngineMemory(NamedTuple):
    """The decoder's memory plus what the engine precomputes once per batch: valid for the
    weights it was prepared with (the step weight and the packed weights are copies)."""

    decoder: DecoderMemory        # from `AttentiveDecoder.init_state`
    values: Tensor                # (B, S, 3D + 2L) [C; C_o] h_j; RNNencdec: (B, 3D + 2L) [C; C_o] c
    step_weight: Tensor           # (P + R, D) [query_weight; U] (P = 0 without one), R = 3D | 2D
    step_bias: Tensor             # (P + R,) 0 for the query rows, then the GRU's recurrent bias
    query_rows: int               # P
    calls_context: bool = False   # values are h_j (RNNencdec: c), and C, C_o are called on c_i
    packed: PackedWeights = PackedWeights()     # for a search (`prepare(for_search=True)`)

    def select(self, keep: Tensor) -> EngineMemory:
        """The memory of sentences `keep` (the step weights, packed or not, are shared by all
        sentences)."""
        return self._replace(decoder=self.decoder.select(keep),
                             values=self.values.index_select(0, keep))


class DecoderEngine:
    """The fast twin of an `AttentiveDecoder` (see the module docstring).

    Args:
        decoder: the decoder whose parameters and attention it uses (it holds no weights).
        sequence_grads: sum the step-weight and value gradients once per sequence (the default);
            False uses plain per-step autograd, the same gradients in another order.
        int8: quantise the fused step weight, U_o, V_o and W_o now, once, and multiply them in
            int8 in every search step (`bahdanau.kernels.int8_linear`): a snapshot of the
            decoder's weights as they are, for decoding on a CPU only.

    Raises:
        InputError: a decoder whose step this engine does not compute (`twin_class` names the
            one that does); `int8` where int8 matmuls cannot run
            (`int8_linear.unavailable_reason`), or for weights that are not float32 on a CPU.

    An engine for a decoder form of its own subclasses this one and names that decoder class
    its `twin_of` (as `bahdanau.engine.ConditionalEngine` does): `twin_class` then chooses it
    for that class and its subclasses.
    """

    twin_of: ClassVar[type[AttentiveDecoder]] = AttentiveDecoder

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "twin_of" in vars(cls):
            _TWINS[cls.twin_of] = cls

    @staticmethod
    def twin_class(decoder: object) -> type[DecoderEngine] | None:
        """The engine written for `decoder`'s step: the one whose `twin_of` is the nearest class
        of the decoder's MRO that has an engine; None for a decoder whose `has_fast_twin` is
        False (its step is its own) or that is no `AttentiveDecoder`."""
        if not getattr(decoder, "has_fast_twin", False):
            return None
        return next((_TWINS[c] for c in type(decoder).__mro__ if c in _TWINS), None)

    def __init__(self, decoder: AttentiveDecoder, *, sequence_grads: bool = True,
                 int8: bool = False) -> None:
        twin = self.twin_class(decoder)
        if twin is None or twin.twin_of is not self.twin_of:
            raise InputError(f"{type(self).__name__} computes the step of "
                             f"{self.twin_of.__name__}, not of {type(decoder).__name__}: "
                             "bahdanau.engine.fast_twin(decoder) builds a decoder's engine")
        self.decoder = decoder
        self.sequence_grads = sequence_grads
        self.int8 = self._quantized() if int8 else None

    def __deepcopy__(self, memo: dict[int, Any]) -> DecoderEngine:
        """The engine of a copied model: of the copied decoder, quantised again from its
        weights where this one is int8 (oneDNN's packed tensors cannot be copied)."""
        return type(self)(copy.deepcopy(self.decoder, memo),
                          sequence_grads=self.sequence_grads, int8=self.int8 is not None)

    def _fused_recurrent_weights(self) -> tuple[Tensor, Tensor]:
        """The GRU rows fused with the attention's query projection, those that multiply the
        state the attention reads, and their bias: U's, of s_{i-1}."""
        return self.decoder.recurrent_weights()

    def _step_weights(self) -> tuple[Tensor, Tensor, int]:
        """The fused step weight [query_weight; U], its bias (`EngineMemory.step_weight`) and
        the number of query rows."""
        dec = self.decoder
        weight, bias = self._fused_recurrent_weights()
        query_weight = None if dec.attention is None else dec.attention.query_weight()
        if query_weight is None:
            return weight, bias, 0
        return (torch.cat([query_weight, weight]),
                torch.cat([bias.new_zeros(query_weight.shape[0]), bias]), query_weight.shape[0])

    def _quantized(self) -> PackedWeights:
        """The int8 maps of `DecoderEngine(int8=True)`; the input gates stay float."""
        reason = int8_linear.unavailable_reason()
        if reason is not None:
            raise InputError(f"int8 decoding cannot run here: {reason}; decode in float32")
        weight, bias, _ = self._step_weights()
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            raise InputError(f"int8 decoding quantises float32 weights on a CPU, not "
                             f"{weight.dtype} on {weight.device}: move the model with "
                             ".float().cpu() first")
        dec = self.decoder

        def quantize(weights: tuple[Tensor, Tensor | None] | None) -> Int8Linear | None:
            return None if weights is None else int8_linear.quantize(*weights)

        readout = dec.readout_weights() or (None, None)
        return PackedWeights(step=quantize((weight, bias)), readout_state=quantize(readout[0]),
                             readout_embed=quantize(readout[1]),
                             output=quantize(dec.output_weights()))

    def prepare(self, memory: DecoderMemory, *, for_search: bool = False) -> EngineMemory:
        """Once per batch: the values [C; C_o] h_j (or h_j, see the module docstring) and the
        fused step weight.

        Args:
            memory: from `AttentiveDecoder.init_state`.
            for_search: the memory will be stepped (`step`, what a search calls): pack the
                weights a step multiplies where `bahdanau.kernels.packed_linear` packs, laid out
                for the B sentences' rows (a beam search steps B*K rows; any number runs).
                Teacher forcing applies most of them once, outside its loop, and packs nothing.
                An int8 engine's search steps take its int8 maps (and the input gates packed).
        Raises:
            InputError: an int8 engine's search on a device other than the CPU.
        """
        dec = self.decoder
        source = memory.context if dec.attention is None else memory.annotations
        assert source is not None   # init_state builds the context exactly without attention
        value_weight = None if dec.drops_rnn_inputs() else dec.value_weight()
        values = source if value_weight is None else F.linear(source, value_weight)
        weight, bias, query_rows = self._step_weights()
        prepared = EngineMemory(memory, values, weight, bias, query_rows, value_weight is None)
        if not for_search:
            return prepared
        rows = memory.mask.shape[0]                               # B sentences
        if self.int8 is not None and not torch.compiler.is_compiling():
            if values.device.type != "cpu":
                raise InputError(f"an int8 model decodes on a CPU, not on {values.device}: "
                                 "decode the float model there")
            return prepared._replace(packed=self.int8._replace(
                input=packed_linear.pack(dec.input_weights(), rows)))
        readout = dec.readout_weights() or (None, None)
        return prepared._replace(packed=PackedWeights(*(
            packed_linear.pack(weights, rows) for weights in (
                (weight, bias), dec.input_weights(), *readout, dec.output_weights()))))

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: EngineMemory
             ) -> StepOutput:
        """`AttentiveDecoder.step`, from the engine's memory."""
        dec, packed = self.decoder, memory.packed
        embedded = dec.dropout(dec.embedding(prev_tokens))        # (N, E)
        h_gates, gate_terms, readout_terms, weights, attention_state = self._attend(
            state, memory, None)
        x_gates = self._input_gates(dec.rnn_input_dropout(embedded), packed) + gate_terms
        hidden = dec.update(x_gates, h_gates, state.hidden)
        logits = self._step_logits(state.hidden, embedded, readout_terms, packed)
        return StepOutput(logits, DecoderState(hidden, attention_state), weights)

    def _input_gates(self, x: Tensor, packed: PackedWeights) -> Tensor:
        """[W_r; W_z; W] x + b of a step's (N, E) dropped E y_{i-1}, packed where it is."""
        return self.decoder.input_gates(x) if packed.input is None else packed.input(x)

    def _step_logits(self, hidden: Tensor, embedded: Tensor, readout_terms: Tensor,
                     packed: PackedWeights) -> Tensor:
        """A step's (N, V) logits W_o t_i + b_o from the state the readout reads, E y_{i-1} and
        C_o c_i, through the packed weights where they are."""
        dec = self.decoder
        if packed.readout_state is None or packed.readout_embed is None:
            features = dec.readout(hidden, embedded, readout_terms)
        else:                                                     # `dec.readout`, packed
            features = dec.deep_output(packed.readout_state(hidden)
                                       + packed.readout_embed(embedded) + readout_terms)
        return dec.output(features) if packed.output is None else packed.output(features)

    def features(self, tgt_in: Tensor, state: DecoderState, memory: EngineMemory, *,
                 select: Tensor | None = None, return_attention: bool = False
                 ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing up to the maxout output t_i (the logits are `decoder.output` of it).

        Args:
            tgt_in: (B, T) decoder inputs, bos first, padded.
            state, memory: from `AttentiveDecoder.init_state` and `prepare`.
            select: optional (B, T) bool; only those positions are returned, as (M, L) in
                row-major order (what a loss needs: padding costs no vocabulary projection).
            return_attention: also return the (B, T, S) weights (else None).
        Returns:
            (B, T, L) features t_i (or (M, L) with `select`), and the weights or None.
        """
        dec = self.decoder
        dec.check_targets(tgt_in, state.hidden.shape[0])      # ranks and sizes only
        embedded = dec.dropout(dec.embedding(tgt_in))             # (B, T, E)
        x_gates = dec.input_gates(dec.rnn_input_dropout(embedded))   # (B, T, 3D) hoisted
        grads = self._sequence_grads(memory)
        hiddens, readouts, weights = [], [], []
        last = tgt_in.shape[1] - 1
        for i, x_step in enumerate(x_gates.unbind(1)):            # unbind: one backward op
            hiddens.append(state.hidden)
            h_gates, gate_terms, readout_terms, step_weights, attention_state = self._attend(
                state, memory, grads)
            readouts.append(readout_terms)                        # C_o c_i
            if return_attention and step_weights is not None:     # (B, S) a step: kept only
                weights.append(step_weights)                      # when asked for
            if i < last:                                          # s_T is never used
                hidden = dec.update(x_step + gate_terms, h_gates, state.hidden)
                state = DecoderState(hidden, attention_state)
        return self._hoisted_features(hiddens, embedded, readouts, weights, select)

    def _hoisted_features(self, hiddens: list[Tensor], embedded: Tensor, readouts: list[Tensor],
                          weights: list[Tensor], select: Tensor | None
                          ) -> tuple[Tensor, Tensor | None]:
        """`features`' result from its loop's T (B, D) states the readout reads, the (B, T, E)
        embeddings, the T (B, 2L) C_o c_i and the (B, S) weights it kept: the deep output of
        every position (or of `select`'s) in one go, and the (B, T, S) weights or None."""
        dec = self.decoder
        hidden_all, readout_all = torch.stack(hiddens, 1), torch.stack(readouts, 1)
        if select is not None:
            hidden_all, embedded, readout_all = (
                hidden_all[select], embedded[select], readout_all[select])
        features = dec.readout(hidden_all, embedded, readout_all)
        attention = torch.stack(weights, 1) if weights else None  # (B, T, S)
        return features, attention

    def loss(self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, memory: EngineMemory, *,
             label_smoothing: float = 0.0, every_position: bool = False
             ) -> tuple[Tensor, Tensor]:
        """Summed NLL of `tgt_out` (pad ignored) and the number of target tokens.

        Only the non-pad positions are projected onto the vocabulary, in row chunks
        (`linear_cross_entropy`); with `every_position`, while compiling, or when the decoder
        offers no W_o (a wrapped layer), every position through its `output` and
        `F.cross_entropy` with padding ignored by its index: no shape depends on the targets'
        values, so nothing is read back to the host. The ids of `tgt_in` and `tgt_out` are the
        caller's to check (`RNNSearch.loss` does, at its door).
        """
        dec = self.decoder
        output = dec.output_weights()
        if output is None or every_position or torch.compiler.is_compiling():
            features, _ = self.features(tgt_in, state, memory)
            return functional.sequence_nll(dec.output(features), tgt_out, dec.pad_id,
                                           label_smoothing=label_smoothing)
        select = tgt_out != dec.pad_id
        features, _ = self.features(tgt_in, state, memory, select=select)   # (M, L)
        loss = linear_cross_entropy(features, *output, tgt_out[select],
                                    label_smoothing=label_smoothing)
        return loss, select.sum()

    # ------------------------------------------------------------------ one step's attention
    def _attend(self, state: DecoderState, memory: EngineMemory, grads: SequenceGrads | None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
        """From the state the attention reads (N rows: s_{i-1}; the cGRU's s'_i): its product
        with the fused recurrent rows (U s_{i-1}), C c_i (N, 3D), C_o c_i (N, 2L), a_ij and the
        attention's next state. With `grads`, the step matmul and the value mix go through it.
        With `memory.calls_context`, C and C_o are called on c_i."""
        dec, hidden, packed_step = self.decoder, state.hidden, memory.packed.step
        if grads is not None:
            projected = grads.project(hidden)                     # (N, P + R)
        elif packed_step is None:
            projected = F.linear(hidden, memory.step_weight, memory.step_bias)
        else:
            projected = packed_step(hidden)
        attention, weights, attention_state = dec.attention, None, None
        if attention is None:
            beams = hidden.shape[0] // memory.values.shape[0]
            h_gates, context_terms = projected, memory.values.repeat_interleave(beams, 0)
        else:
            query_rows = memory.query_rows
            if query_rows:                                        # W_a s_{i-1} came fused
                query, h_gates = projected.split([query_rows, projected.shape[1] - query_rows],
                                                 1)
            else:
                query, h_gates = attention.project_query(hidden), projected
            attention_memory = memory.decoder.attention
            if grads is not None and grads.values is not None:
                weights = attention.weights(query, attention_memory, state.attention)
                context_terms = grads.mix(weights)                # sum_j a_ij [C; C_o] h_j
            else:
                context_terms, weights = attention.attend(query, attention_memory, memory.values,
                                                          state.attention)
            attention_state = attention.next_state(state.attention, weights)
        if memory.calls_context:                                  # c_i itself
            gate_terms = dec.context_gates(dec.rnn_input_dropout(context_terms))
            readout_terms = dec.readout_context(context_terms)
        else:
            gate_terms, readout_terms = context_terms.split(
                [3 * dec.hidden_size, 2 * dec.maxout_size], 1)
        return h_gates, gate_terms, readout_terms, weights, attention_state

    def _sequence_grads(self, memory: EngineMemory) -> SequenceGrads | None:
        """Per-sequence gradient sums for teacher forcing, or None where plain autograd is used:
        switched off, no gradients wanted, autocast (whose dtypes the sums do not follow), or
        tracing by torch.compile / torch.export. The values are left to the attention when it
        mixes them in a fused kernel (`Attention.mixes_values`)."""
        device = memory.step_weight.device
        if (not self.sequence_grads or not torch.is_grad_enabled()
                or torch.is_autocast_enabled(device.type) or torch.compiler.is_compiling()):
            return None
        attention = self.decoder.attention
        mixes = (attention is not None
                 and not attention.mixes_values(memory.decoder.attention))
        return SequenceGrads(memory.step_weight, memory.step_bias,
                             memory.values if mixes else None)


_TWINS[AttentiveDecoder] = DecoderEngine
