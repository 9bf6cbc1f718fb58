"""bahdanau: RNNsearch (Bahdanau, Cho & Bengio, ICLR 2015) as composable PyTorch modules."""

from bahdanau import functional, presets
from bahdanau.attention import AdditiveAttention
from bahdanau.config import ModelConfig
from bahdanau.decoder import AttentiveDecoder, DecoderMemory, StepOutput
from bahdanau.encoder import BiRNNEncoder
from bahdanau.models import RNNEncDec, RNNSearch, build_model

__version__ = "0.1.0"

__all__ = [
    "AdditiveAttention",
    "AttentiveDecoder",
    "BiRNNEncoder",
    "DecoderMemory",
    "ModelConfig",
    "RNNEncDec",
    "RNNSearch",
    "StepOutput",
    "build_model",
    "functional",
    "presets",
    "__version__",
]
