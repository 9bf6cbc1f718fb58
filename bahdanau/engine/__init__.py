"""The decoder's fast twin: the paper-shaped decoder's arithmetic, reordered for speed.

Each trick, where it lives, the reference it must equal, and the tests that hold them equal:

* The fused step weight [W_a; U], the precomputed values [C; C_o] h_j and hoisted teacher
  forcing: `decoding.DecoderEngine`, twin of `bahdanau.decoder.AttentiveDecoder`
  (tests/unit/test_engine.py).
* The same tricks on the conditional GRU's step: `conditional.ConditionalEngine`, twin of
  `bahdanau.conditional_decoder.ConditionalGRUDecoder` (tests/unit/test_engine.py,
  tests/unit/test_conditional_decoder.py).
* Sequence-level gradient sums of the step weight and the values: `sequence_grads.SequenceGrads`,
  twin of plain per-step autograd, `DecoderEngine(sequence_grads=False)`
  (tests/unit/test_engine.py).

The fast ops it calls (the chunked linear cross-entropy, the step matmuls with packed weights
or in int8, the sigmoid form of the additive attention, the fused Triton attention kernel) live in
`bahdanau.kernels`, each beside the reference it must equal.

Models choose once, at construction: `ModelConfig(engine="fast")` (the default) decodes and
trains through the decoder's twin (`fast_twin`); `engine="reference"` runs the decoder alone.
"""

from __future__ import annotations

from bahdanau.decoder import AttentiveDecoder
from bahdanau.engine.conditional import ConditionalEngine
from bahdanau.engine.decoding import DecoderEngine, EngineMemory, PackedWeights
from bahdanau.engine.sequence_grads import SequenceGrads

__all__ = [
    "ConditionalEngine",
    "DecoderEngine",
    "EngineMemory",
    "PackedWeights",
    "SequenceGrads",
    "fast_twin",
]


def fast_twin(decoder: AttentiveDecoder) -> DecoderEngine | None:
    """The engine that runs `decoder` fast (`DecoderEngine.twin_class`): `ConditionalEngine` for
    the conditional GRU, `DecoderEngine` for the paper's decoder, None for a decoder whose
    `has_fast_twin` is False (a subclass whose step differs), which models run on the reference
    path."""
    twin = DecoderEngine.twin_class(decoder)
    return None if twin is None else twin(decoder)
