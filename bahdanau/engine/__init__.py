"""The speed machinery, in one place, each piece beside the reference it must equal.

Each trick, where it lives, the reference it must equal, and the tests that hold them equal:

* The fused step weight [W_a; U], the precomputed values [C; C_o] h_j and hoisted teacher
  forcing: `decoding.DecoderEngine`, twin of `bahdanau.decoder.AttentiveDecoder`
  (tests/unit/test_engine.py).
* Sequence-level gradient sums of the step weight and the values: `sequence_grads.SequenceGrads`,
  twin of plain per-step autograd, `DecoderEngine(sequence_grads=False)`
  (tests/unit/test_engine.py).
* The chunked linear cross-entropy with recycled CPU buffers: `cross_entropy.linear_cross_entropy`,
  twin of `bahdanau.functional.sequence_nll` (tests/unit/test_linear_cross_entropy.py).
* The additive attention through sigmoid (impl "sigmoid"): `sigmoid.sigmoid_attention_weights`,
  twin of `bahdanau.functional.attention_weights` (tests/property/test_attention_properties.py).

The fused Triton attention kernel (impl "triton") lives in `bahdanau.kernels.triton_attention`,
beside the same reference, and is tested in tests/reference/test_triton_attention.py.

Models choose once, at construction: `ModelConfig(engine="fast")` (the default) decodes and
trains through `DecoderEngine`; `engine="reference"` runs the paper-shaped decoder alone.
"""

from bahdanau.engine.cross_entropy import linear_cross_entropy
from bahdanau.engine.decoding import DecoderEngine, EngineMemory
from bahdanau.engine.sequence_grads import SequenceGrads
from bahdanau.engine.sigmoid import sigmoid_attention_weights

__all__ = [
    "DecoderEngine",
    "EngineMemory",
    "SequenceGrads",
    "linear_cross_entropy",
    "sigmoid_attention_weights",
]
