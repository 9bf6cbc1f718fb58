"""bahdanau: RNNsearch (Bahdanau, Cho & Bengio, ICLR 2015) as composable PyTorch modules."""

# _interrupt first, before the imports that take seconds (torch): in the `bahdanau` command's
# process, a Ctrl-C while it starts ends it with one line (bahdanau._interrupt), and
# `bahdanau --version` is answered at once (bahdanau._about.answer_version)
import sys

from bahdanau import _interrupt
from bahdanau._about import __version__, answer_version

if _interrupt.is_command():
    answer_version(sys.argv[1:])

from bahdanau import engine, functional, presets  # noqa: F401
from bahdanau.alignments import argmax_alignment, replace_unk
from bahdanau.attention import AdditiveAttention, Attention, AttentionStep, LuongAttention
from bahdanau.checkpoint import (
    CheckpointManager,
    average_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from bahdanau.conditional_decoder import ConditionalGRUDecoder
from bahdanau.config import ModelConfig, TrainConfig
from bahdanau.data import (
    SPECIALS,
    Batch,
    BucketBatchSampler,
    CharTokenizer,
    DefaultTokenizer,
    Example,
    SentencePieceTokenizer,
    Tokenizer,
    TokenizerPair,
    Vocab,
    WhitespaceTokenizer,
    collate,
    encode_pairs,
    read_parallel,
)
from bahdanau.decoder import AttentiveDecoder, DecoderMemory, DecoderState, StepOutput
from bahdanau.encoder import BiRNNEncoder
from bahdanau.ensemble import Ensemble
from bahdanau.errors import InputError
from bahdanau.evaluate import (
    CorpusScores,
    ForcedScore,
    LengthBucket,
    Translation,
    bleu_by_length,
    bleu_without_unk,
    corpus_bleu,
    corpus_scores,
    score_corpus,
    translate_corpus,
)
from bahdanau.models import RNNEncDec, RNNSearch, build_model
from bahdanau.search import BeamSearch, Hypothesis, greedy_search
from bahdanau.training import (
    LossModule,
    StepStats,
    TrainResult,
    TrainState,
    checkpoint_payload,
    evaluate_loss,
    make_optimizer,
    restore,
    train_step,
)
from bahdanau.translate import Translator, load

__all__ = [
    "AdditiveAttention",
    "Attention",
    "AttentionStep",
    "LuongAttention",
    "DecoderState",
    "engine",
    "AttentiveDecoder",
    "ConditionalGRUDecoder",
    "CorpusScores",
    "LengthBucket",
    "Translation",
    "bleu_by_length",
    "bleu_without_unk",
    "corpus_bleu",
    "corpus_scores",
    "translate_corpus",
    "BeamSearch",
    "Hypothesis",
    "InputError",
    "greedy_search",
    "replace_unk",
    "BiRNNEncoder",
    "DecoderMemory",
    "ModelConfig",
    "RNNEncDec",
    "RNNSearch",
    "StepOutput",
    "build_model",
    "functional",
    "presets",
    "SPECIALS",
    "Batch",
    "BucketBatchSampler",
    "CharTokenizer",
    "CheckpointManager",
    "DefaultTokenizer",
    "Example",
    "LossModule",
    "StepStats",
    "Tokenizer",
    "TokenizerPair",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "Vocab",
    "WhitespaceTokenizer",
    "checkpoint_payload",
    "collate",
    "encode_pairs",
    "evaluate_loss",
    "load_checkpoint",
    "make_optimizer",
    "model_from_checkpoint",
    "read_parallel",
    "restore",
    "save_checkpoint",
    "train_step",
    "SentencePieceTokenizer",
    "Translator",
    "load",
    "Ensemble",
    "average_checkpoints",
    "ForcedScore",
    "score_corpus",
    "argmax_alignment",
    "__version__",
]
