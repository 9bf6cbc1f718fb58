"""Model presets: functions that return frozen `ModelConfig`s.

`rnnsearch_50` is the paper's model; `small` is the mid-size model used by our benchmarks and the
default training job; `g2p` is sized for short character-level sequences (a word's letters to
its phonemes, transliteration, inflection); `tiny` is for tests. Use
`dataclasses.replace(cfg, ...)` for variants, e.g.
`replace(rnnsearch_50(30001, 30001), arch="rnnencdec")` for the paper's RNNencdec-50 baseline.
`ModelChoices` is a preset with such variants (its sizes overridden, another arch or attention,
dropout, ...), as the training job chooses its model: each choice is declared once, in
`ModelConfig`, and is a flag of `bahdanau train` (``--attention luong_general``) and a key of its
config file; the checkpoint's `ModelConfig` records it, so every command rebuilds the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from bahdanau.config import (
    Arch,
    AttentionImpl,
    AttentionKind,
    DecoderKind,
    Engine,
    GRUForm,
    Init,
    ModelConfig,
)
from bahdanau.settings import check_settings, like, setting


def rnnsearch_50(src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """RNNsearch-50 of Bahdanau et al. (2015): E=620, H=D=1000, A=1000, maxout L=500.

    The paper's vocabularies hold the 30,000 most frequent words plus [UNK]; with our four
    specials (pad, bos, eos, unk) that is `rnnsearch_50(30003, 30003)`. The "-50" refers to the
    maximum training sentence length, a data setting (see `bahdanau.data`), not a model size.
    """
    return ModelConfig(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)


def small(src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """A CPU-sized RNNsearch: E=256, H=256, D=512, A=512, L=256 (the paper's ratios, halved)."""
    return ModelConfig(
        src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
        embed_size=256, hidden_size=256, decoder_size=512, align_size=512, maxout_size=256,
    )


def g2p(src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
    """A character-level RNNsearch: E=64, H=256, D=256, A=128, L=128.

    Sized for grapheme-to-phoneme conversion on a CPU: vocabularies of a few dozen symbols need
    small embeddings, and sequences of about ten symbols a narrow alignment; the recurrent
    layers keep most of the capacity (examples/g2p/cmudict.py trains it on CMUdict).
    """
    return ModelConfig(
        src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
        embed_size=64, hidden_size=256, decoder_size=256, align_size=128, maxout_size=128,
    )


def tiny(src_vocab_size: int = 16, tgt_vocab_size: int = 16) -> ModelConfig:
    """A very small RNNsearch for tests and quick checks: E=8, H=8, D=12, A=10, L=6."""
    return ModelConfig(
        src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
        embed_size=8, hidden_size=8, decoder_size=12, align_size=10, maxout_size=6,
    )


@dataclass(frozen=True)
class ModelChoices:
    """The model of a training job: a preset's sizes, any of them overridden, and `ModelConfig`'s
    choices (each declared there, with the job's defaults: `init` is glorot, which Adam trains
    much faster, and `layer_norm` on, which learns faster still (docs/default-job.md); a size
    left None is the preset's)."""

    preset: Literal["tiny", "small", "g2p", "rnnsearch_50"] = setting(
        "small", "model sizes (small: E=256, H=256, D=512, A=512, maxout 256; g2p, for "
        "characters: E=64, H=256, D=256, A=128, maxout 128), each of which "
        "--embed-size, --hidden-size, --decoder-size, --align-size and --maxout-size override",
        on_resume="fixed")
    embed_size: int | None = like(ModelConfig, "embed_size", default=None)
    hidden_size: int | None = like(ModelConfig, "hidden_size", default=None)
    decoder_size: int | None = like(ModelConfig, "decoder_size", default=None)
    align_size: int | None = like(ModelConfig, "align_size", default=None)
    maxout_size: int | None = like(ModelConfig, "maxout_size", default=None)
    arch: Arch = like(ModelConfig, "arch")
    attention: AttentionKind = like(ModelConfig, "attention")
    attention_impl: AttentionImpl = like(ModelConfig, "attention_impl")
    engine: Engine = like(ModelConfig, "engine")
    gru_form: GRUForm = like(ModelConfig, "gru_form")
    decoder: DecoderKind = like(ModelConfig, "decoder")
    layer_norm: bool = like(ModelConfig, "layer_norm", default=True)
    encoder_layers: int = like(ModelConfig, "encoder_layers")
    dropout: float = like(ModelConfig, "dropout")
    dropout_rnn_inputs: float = like(ModelConfig, "dropout_rnn_inputs")
    dropout_deep_output: float = like(ModelConfig, "dropout_deep_output")
    init: Init = like(ModelConfig, "init", default="glorot")

    def __post_init__(self) -> None:
        check_settings(self)
        self.config(5, 5)          # the choices that only go together, before any work

    def config(self, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
        """The `ModelConfig` of these choices for vocabularies of these sizes: the preset's,
        with the sizes given and every other choice."""
        choices = {name: getattr(self, name) for name in self.__dataclass_fields__
                   if name != "preset" and getattr(self, name) is not None}
        return replace(_PRESETS[self.preset](src_vocab_size, tgt_vocab_size), **choices)

    @property
    def name(self) -> str:
        """The preset, the sizes that override it, an attention other than the paper's and a
        deeper encoder: "small", "small, embed_size=128" or "tiny, attention=luong_general"."""
        sizes = [f"{name}={getattr(self, name)}" for name in _SIZES
                 if getattr(self, name) is not None]
        if self.arch == "rnnsearch" and self.attention != "additive":
            sizes.append(f"attention={self.attention}")
        if self.encoder_layers != 1:
            sizes.append(f"encoder_layers={self.encoder_layers}")
        return ", ".join([self.preset, *sizes])


_SIZES = ("embed_size", "hidden_size", "decoder_size", "align_size", "maxout_size")
_PRESETS = {"tiny": tiny, "small": small, "g2p": g2p, "rnnsearch_50": rnnsearch_50}
