"""The decoder's fast twin: the paper-shaped decoder's arithmetic, reordered for speed.

Each trick, where it lives, the reference it must equal, and the tests that hold them equal:

* The fused step weight [W_a; U], the precomputed values [C; C_o] h_j and hoisted teacher
  forcing: `decoding.DecoderEngine`, twin of `bahdanau.decoder.AttentiveDecoder`
  (tests/unit/test_engine.py).
* Sequence-level gradient sums of the step weight and the values: `sequence_grads.SequenceGrads`,
  twin of plain per-step autograd, `DecoderEngine(sequence_grads=False)`
  (tests/unit/test_engine.py).

The fast ops it calls (the chunked linear cross-entropy, the step matmuls with packed weights
or in int8, the sigmoid form of the additive attention, the fused Triton attention kernel) live in
`bahdanau.kernels`, each beside the reference it must equal.

Models choose once, at construction: `ModelConfig(engine="fast")` (the default) decodes and
trains through `DecoderEngine`; `engine="reference"` runs the paper-shaped decoder alone.
"""

from bahdanau.engine.decoding import DecoderEngine, EngineMemory, PackedWeights
from bahdanau.engine.sequence_grads import SequenceGrads

__all__ = [
    "DecoderEngine",
    "EngineMemory",
    "PackedWeights",
    "SequenceGrads",
]
