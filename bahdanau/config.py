"""Frozen configuration dataclasses.

`ModelConfig` holds every size and option needed to build `RNNSearch` or `RNNEncDec`; the
defaults are the paper's RNNsearch-50 (Bahdanau et al. 2015, appendix A.2 and B). Variants are
made with `dataclasses.replace`; presets live in `bahdanau.presets`; checkpoints store
`dataclasses.asdict(cfg)` and rebuild it with `ModelConfig.from_dict`.

Shape legend used across the package: B batch, S source length, T target length, E embedding,
H encoder hidden per direction (annotations are 2H), D decoder hidden, A alignment size,
L maxout units, V vocabulary, K beam, N decoder rows (B, or B*K with K beams per sentence).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from typing_extensions import Self

Arch = Literal["rnnsearch", "rnnencdec"]
AttentionKind = Literal["additive", "luong_general", "luong_dot"]
AttentionImpl = Literal["auto", "reference", "sigmoid", "triton"]
Engine = Literal["fast", "reference"]
GRUForm = Literal["torch", "paper"]

ARCHS: tuple[str, ...] = ("rnnsearch", "rnnencdec")
ATTENTIONS: tuple[str, ...] = ("additive", "luong_general", "luong_dot")
ATTENTION_IMPLS: tuple[str, ...] = ("auto", "reference", "sigmoid", "triton")
ENGINES: tuple[str, ...] = ("fast", "reference")
GRU_FORMS: tuple[str, ...] = ("torch", "paper")


class DictConfig:
    """Mixin for frozen dataclass configs: a plain-dict round trip for checkpoints and JSON."""

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON- and checkpoint-friendly) that `from_dict` turns back."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild a config from `to_dict()` output; unknown keys raise `ValueError`."""
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {unknown}; "
                             f"known fields: {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True)
class ModelConfig(DictConfig):
    """Sizes and options of an RNNsearch / RNNencdec model.

    Defaults follow RNNsearch-50 (Bahdanau et al. 2015, appendix A and B.2): 620-dimensional
    embeddings, 1000 hidden units per encoder direction and in the decoder, a 1000-unit alignment
    model and a 500-unit maxout layer.
    """

    src_vocab_size: int               # source V, from the source Vocab (specials included)
    tgt_vocab_size: int               # target V, from the target Vocab (specials included)
    embed_size: int = 620             # E (m in the paper), both sides
    hidden_size: int = 1000           # H per encoder direction (n in the paper)
    decoder_size: int = 1000          # D, decoder state s_i (n in the paper)
    align_size: int = 1000            # A (n' in the paper)
    maxout_size: int = 500            # L, units after maxout over pairs (l in the paper)
    arch: Arch = "rnnsearch"          # which model `bahdanau.build_model` makes from this config
    attention: AttentionKind = "additive"   # the paper's; "luong_*": Luong et al. (2015)
    attention_impl: AttentionImpl = "auto"  # additive only; see AdditiveAttention's `impl`
    engine: Engine = "fast"           # "reference": the paper-shaped decoder alone (see engine)
    gru_form: GRUForm = "torch"       # "paper": reset gate applied before U (eq. of appendix A)
    dropout: float = 0.0              # on embeddings and the maxout output; the paper uses none
    pad_id: int = 0                   # special ids, shared with the vocabularies (Vocab)
    bos_id: int = 1                   # y_0, the decoder's first input
    eos_id: int = 2                   # ends every target sentence
    unk_id: int = 3                   # [UNK], words outside the vocabulary

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 5:
                raise ValueError(f"{name} must be an int >= 5 (4 specials + 1 word), got {value!r}")
        for name in ("embed_size", "hidden_size", "decoder_size", "align_size", "maxout_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.attention == "luong_dot" and self.decoder_size != 2 * self.hidden_size:
            raise ValueError(f"attention='luong_dot' needs decoder_size == 2 * hidden_size, got "
                             f"{self.decoder_size} and {2 * self.hidden_size}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}"
            )
        if self.gru_form not in GRU_FORMS:
            raise ValueError(f"gru_form must be one of {GRU_FORMS}, got {self.gru_form!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        specials = {"pad_id": self.pad_id, "bos_id": self.bos_id,
                    "eos_id": self.eos_id, "unk_id": self.unk_id}
        if len(set(specials.values())) != len(specials):
            raise ValueError(f"special token ids must be distinct, got {specials}")
        smallest = min(self.src_vocab_size, self.tgt_vocab_size)
        for name, value in specials.items():
            if not 0 <= value < smallest:
                raise ValueError(
                    f"{name}={value} is outside the vocabularies (sizes {self.src_vocab_size}, "
                    f"{self.tgt_vocab_size})"
                )
