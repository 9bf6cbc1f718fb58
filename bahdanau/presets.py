"""Model presets: functions that return frozen `ModelConfig`s.

`rnnsearch_50` is the paper's model; `small` is the mid-size model used by our benchmarks and the
default training job; `tiny` is for tests. Use `dataclasses.replace(cfg, ...)` for variants, e.g.
`replace(rnnsearch_50(30001, 30001), arch="rnnencdec")` for the paper's RNNencdec-50 baseline.
"""

from __future__ import annotations

from bahdanau.config import ModelConfig


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


def tiny(src_vocab_size: int = 16, tgt_vocab_size: int = 16) -> ModelConfig:
    """A very small RNNsearch for tests and quick checks: E=8, H=8, D=12, A=10, L=6."""
    return ModelConfig(
        src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
        embed_size=8, hidden_size=8, decoder_size=12, align_size=10, maxout_size=6,
    )
