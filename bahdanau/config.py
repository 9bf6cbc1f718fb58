"""Frozen configuration dataclasses.

`ModelConfig` holds every size and option needed to build `RNNSearch` or `RNNEncDec`; the
defaults are the paper's RNNsearch-50 (Bahdanau et al. 2015, appendix A.2 and B). Variants are
made with `dataclasses.replace`; presets live in `bahdanau.presets`; checkpoints store
`dataclasses.asdict(cfg)` and rebuild it with `ModelConfig.from_dict`. `TrainConfig` holds the
settings of `bahdanau.training.train`, with the paper's values (appendix B.2) as defaults.

Special token ids are declared here (`PAD_ID`, `BOS_ID`, `EOS_ID`, `UNK_ID`: 0..3), and every
`bahdanau.Vocab` puts its specials at them: `ModelConfig`'s id fields default to them, and
`ModelConfig.check_vocabs` refuses a config and vocabularies that disagree; training, loading a
checkpoint and translating call it before any work. This module imports nothing of the
package's but its checks and errors, so that everything may import it.

Shape legend used across the package: B batch, S source length, T target length, E embedding,
H encoder hidden per direction (annotations are 2H), D decoder hidden, A alignment size,
L maxout units, V vocabulary, K beam, N decoder rows (B, or B*K with K beams per sentence).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import torch
from typing_extensions import Self

from bahdanau._checks import describe, is_finite_number, is_int
from bahdanau.errors import InputError

Arch = Literal["rnnsearch", "rnnencdec"]
AttentionKind = Literal["additive", "luong_general", "luong_dot"]
AttentionImpl = Literal["auto", "reference", "sigmoid", "triton"]
Engine = Literal["fast", "reference"]
GRUForm = Literal["torch", "paper"]
Init = Literal["paper", "glorot"]
Amp = Literal["none", "bf16", "fp16"]
Schedule = Literal["constant", "inverse_sqrt", "plateau"]

ARCHS: tuple[str, ...] = ("rnnsearch", "rnnencdec")
ATTENTIONS: tuple[str, ...] = ("additive", "luong_general", "luong_dot")
ATTENTION_IMPLS: tuple[str, ...] = ("auto", "reference", "sigmoid", "triton")
ENGINES: tuple[str, ...] = ("fast", "reference")
GRU_FORMS: tuple[str, ...] = ("torch", "paper")
INITS: tuple[str, ...] = ("paper", "glorot")
AMP_MODES: tuple[str, ...] = ("none", "bf16", "fp16")
SCHEDULES: tuple[str, ...] = ("constant", "inverse_sqrt", "plateau")
SPECIAL_IDS: tuple[str, ...] = ("pad_id", "bos_id", "eos_id", "unk_id")
# The special ids, the same in every vocabulary (`bahdanau.data.SPECIALS` sit at them).
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


class VocabSizes(Protocol):
    """What `ModelConfig.check_vocabs` reads of a vocabulary (`bahdanau.Vocab` has it)."""

    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int

    def __len__(self) -> int: ...


class DictConfig:
    """Mixin for the dataclasses that checkpoints store (the configs, `TrainState`): a plain-dict
    round trip for checkpoints and JSON."""

    # Fields that older versions had and that were removed: `from_dict` drops them (so that old
    # checkpoints still load) and refuses every other unknown key.
    _removed_fields: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON- and checkpoint-friendly) that `from_dict` turns back."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild a config from `to_dict()` output.

        Keys of `_removed_fields` (fields that older versions wrote) are dropped; any other
        unknown key raises `InputError`.
        """
        if not isinstance(data, Mapping):
            raise InputError(f"{cls.__name__}.from_dict needs a dict, got {describe(data)}")
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        known = {f.name for f in fields}
        data = {k: v for k, v in data.items() if k not in cls._removed_fields}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            raise InputError(f"unknown {cls.__name__} fields {unknown}; "
                             f"known fields: {sorted(known)}")
        missing = [f.name for f in fields if f.name not in data
                   and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise InputError(f"{cls.__name__} fields {missing} are missing")
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
    dropout: float = 0.0              # on embeddings and the maxout output t_i; the paper uses none
    dropout_rnn_inputs: float = 0.0   # on every GRU input: the encoder's x_j, the decoder's
                                      # E y_{i-1} and c_i (after `dropout` on the embeddings)
    dropout_deep_output: float = 0.0  # on the deep output t~_i, before the maxout
    init: Init = "paper"              # "glorot": Xavier-uniform matrices (see build_model)
    pad_id: int = PAD_ID              # special ids: the vocabularies' (see check_vocabs)
    bos_id: int = BOS_ID              # y_0, the decoder's first input
    eos_id: int = EOS_ID              # ends every target sentence
    unk_id: int = UNK_ID              # [UNK], words outside the vocabulary

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 5:
                raise InputError(f"{name} must be an int >= 5 (4 specials + 1 word), got {value!r}")
        for name in ("embed_size", "hidden_size", "decoder_size", "align_size", "maxout_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InputError(f"{name} must be a positive int, got {value!r}")
        if self.arch not in ARCHS:
            raise InputError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.attention not in ATTENTIONS:
            raise InputError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.attention == "luong_dot" and self.decoder_size != 2 * self.hidden_size:
            raise InputError(f"attention='luong_dot' needs decoder_size == 2 * hidden_size, got "
                             f"{self.decoder_size} and {2 * self.hidden_size}")
        if self.engine not in ENGINES:
            raise InputError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise InputError(
                f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}"
            )
        if self.gru_form not in GRU_FORMS:
            raise InputError(f"gru_form must be one of {GRU_FORMS}, got {self.gru_form!r}")
        if self.init not in INITS:
            raise InputError(f"init must be one of {INITS}, got {self.init!r}")
        for name in ("dropout", "dropout_rnn_inputs", "dropout_deep_output"):
            value = getattr(self, name)
            if not (is_finite_number(value) and 0.0 <= value < 1.0):
                raise InputError(f"{name} must be in [0, 1), got {value!r}")
        specials = {name: getattr(self, name) for name in SPECIAL_IDS}
        if len(set(specials.values())) != len(specials):
            raise InputError(f"special token ids must be distinct, got {specials}")
        smallest = min(self.src_vocab_size, self.tgt_vocab_size)
        for name, value in specials.items():
            if not 0 <= value < smallest:
                raise InputError(
                    f"{name}={value} is outside the vocabularies (sizes {self.src_vocab_size}, "
                    f"{self.tgt_vocab_size})"
                )

    def check_vocabs(self, src_vocab: VocabSizes, tgt_vocab: VocabSizes) -> None:
        """Refuse vocabularies whose sizes or special ids differ from this config's.

        Args:
            src_vocab, tgt_vocab: the source and target vocabularies.
        Raises:
            InputError: one line naming the field and both values, e.g.
                "model config pad_id=5 but src_vocab.pad_id=0: ...".
        """
        for side, vocab in (("src", src_vocab), ("tgt", tgt_vocab)):
            size = getattr(self, f"{side}_vocab_size")
            if size != len(vocab):
                raise InputError(f"model config {side}_vocab_size={size} but len({side}_vocab)="
                                 f"{len(vocab)}")
            for name in SPECIAL_IDS:
                ours, theirs = getattr(self, name), getattr(vocab, name)
                if ours != theirs:
                    raise InputError(f"model config {name}={ours} but {side}_vocab.{name}="
                                     f"{theirs}: the special ids are the vocabularies' (leave "
                                     "the ModelConfig id fields at their defaults)")


@dataclass(frozen=True)
class TrainConfig(DictConfig):
    """Training settings; defaults follow the paper (appendix B.2) where it has one.

    The longest training sentence (50 words for RNNsearch-50) is a data setting:
    `encode_pairs(..., max_len=50)`.
    """

    optimizer: Literal["adadelta", "adam"] = "adadelta"
    lr: float | None = None           # None: 1.0 for Adadelta (the paper), 1e-3 for Adam
    rho: float = 0.95                 # Adadelta decay (the paper)
    eps: float = 1e-6                 # Adadelta / Adam epsilon (the paper's Adadelta value)
    # The learning rate of each update: `bahdanau.training.schedules.LRSchedule` has the formulas.
    schedule: Schedule = "constant"   # the paper's; "inverse_sqrt": lr * sqrt(W / step) after
                                      # the warm-up; "plateau": lr * decay_factor after every
                                      # decay_patience evaluations without improvement
    warmup_steps: int = 0             # W: lr rises linearly over the first W updates; 0: none
    decay_factor: float = 0.5         # plateau: what each decay multiplies the lr by
    decay_patience: int = 2           # plateau: evaluations without improvement per decay
    min_lr: float = 0.0               # the decayed lr never goes below this (warm-up aside)
    clip_norm: float | None = 1.0     # max L2 norm of the whole gradient; None: no clipping
    batch_size: int = 80              # sentences per batch (the paper); ignored with max_tokens
    max_tokens: int | None = None     # padded tokens per batch instead of batch_size
    bucket: int = 20                  # minibatches sorted by length together (the paper)
    accumulation: int = 1             # batches per process per update: the gradient of their loss
                                      # over their total sentence count (one big batch's)
    loader_workers: int = 0           # processes collating batches ahead of the step; 0: inline
    max_steps: int | None = None      # stop after this many updates in total
    max_epochs: int | None = None     # stop after this many passes over the data
    max_time_s: float | None = None   # stop after this much training time (across resumes)
    eval_every: int = 1000            # call validate() every this many steps
    save_every: int = 1000            # checkpoint every this many steps (and at the end)
    keep_last: int = 3                # numbered checkpoints kept (plus best.pt)
    keep_best: int = 1                # also keep the checkpoints of the N best evaluations
    ema_decay: float | None = None    # keep an EMA of the weights (training.ema); None: none
    patience: int | None = None       # stop after this many evaluations without improvement
    label_smoothing: float = 0.0      # 0 in the paper
    amp: Amp = "none"                 # autocast dtype (fp16 adds a GradScaler)
    log_every: int = 100              # steps between log lines
    seed: int = 1234                  # torch RNG at a fresh start, and the batch order

    # Removed fields that older checkpoints still hold: max_len was never read (the length
    # filter is encode_pairs').
    _removed_fields: ClassVar[tuple[str, ...]] = ("max_len",)
    # What a resumed run may not change: the optimizer type (its state is of that type) and
    # what defines the batches (their order is a function of the seed and the epoch). The
    # other fields (learning rate and schedule, limits, cadence, ...) are applied from the
    # resumed call on; `accumulation` only with another number of processes, keeping
    # processes x accumulation, the batches of an update (`bahdanau.training.setup_run` checks).
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = ("optimizer", "batch_size", "max_tokens",
                                                  "bucket", "seed")

    def __post_init__(self) -> None:
        if self.optimizer not in ("adadelta", "adam"):
            raise InputError(f"optimizer must be 'adadelta' or 'adam', got {self.optimizer!r}")
        if self.amp not in AMP_MODES:
            raise InputError(f"amp must be one of {AMP_MODES}, got {self.amp!r}")
        positive_floats = {"lr": self.lr, "eps": self.eps, "clip_norm": self.clip_norm,
                           "max_time_s": self.max_time_s}
        for name, value in positive_floats.items():
            if value is not None and not (is_finite_number(value) and value > 0):
                raise InputError(f"{name} must be a positive finite number or None, got {value!r}")
        if not (is_finite_number(self.rho) and 0.0 < self.rho < 1.0):
            raise InputError(f"rho must be in (0, 1), got {self.rho!r}")
        if not (is_finite_number(self.label_smoothing) and 0.0 <= self.label_smoothing < 1.0):
            raise InputError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        if self.schedule not in SCHEDULES:
            raise InputError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not (is_int(self.warmup_steps) and self.warmup_steps >= 0):
            raise InputError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if not (is_finite_number(self.decay_factor) and 0.0 < self.decay_factor < 1.0):
            raise InputError(f"decay_factor must be in (0, 1), got {self.decay_factor!r}")
        if not (is_finite_number(self.min_lr) and 0.0 <= self.min_lr < self.learning_rate):
            raise InputError(f"min_lr must be in [0, lr) = [0, {self.learning_rate:g}), got "
                             f"{self.min_lr!r}")
        positive_ints = {"batch_size": self.batch_size, "bucket": self.bucket,
                         "decay_patience": self.decay_patience, "accumulation": self.accumulation,
                         "eval_every": self.eval_every, "save_every": self.save_every,
                         "keep_last": self.keep_last, "keep_best": self.keep_best,
                         "log_every": self.log_every}
        optional_ints = {"max_tokens": self.max_tokens, "max_steps": self.max_steps,
                         "max_epochs": self.max_epochs, "patience": self.patience}
        for name, value in {**positive_ints, **optional_ints}.items():
            if value is None and name in optional_ints:
                continue
            if not is_int(value) or value < 1:
                raise InputError(f"{name} must be a positive int"
                                 f"{' or None' if name in optional_ints else ''}, got {value!r}")
        if self.ema_decay is not None and not (is_finite_number(self.ema_decay)
                                               and 0.0 < self.ema_decay < 1.0):
            raise InputError(f"ema_decay must be in (0, 1) or None, got {self.ema_decay!r}")
        if not (is_int(self.loader_workers) and self.loader_workers >= 0):
            raise InputError(f"loader_workers must be an int >= 0, got {self.loader_workers!r}")
        if not (is_int(self.seed) and 0 <= self.seed < 2**63):
            raise InputError(f"seed must be an int in [0, 2**63), got {self.seed!r}")

    def resume_changes(self, stored: TrainConfig) -> list[str]:
        """What resuming a run saved with `stored` under this config changes.

        Args:
            stored: the config the checkpoint was written with.
        Returns:
            One "name: old -> new" line per changed field, to log; they all take effect.
        Raises:
            InputError: a field of `FIXED_ON_RESUME` differs (named, with both values).
        """
        changes = []
        for field in dataclasses.fields(self):
            old, new = getattr(stored, field.name), getattr(self, field.name)
            if old == new:
                continue
            if field.name in self.FIXED_ON_RESUME:
                raise InputError(f"the checkpoint was trained with {field.name}={old!r}, not "
                                 f"{new!r}: a resumed run keeps its {field.name} (start a new "
                                 "run in another directory to change it)")
            changes.append(f"{field.name}: {old!r} -> {new!r}")
        return changes

    def set_hyperparameters(self, optimizer: torch.optim.Optimizer) -> None:
        """Write this config's learning rate, eps (and Adadelta's rho) into `optimizer`'s
        parameter groups: a resumed run uses the values it was called with, not the stored."""
        for group in optimizer.param_groups:
            group["lr"], group["eps"] = self.learning_rate, self.eps
            if self.optimizer == "adadelta":
                group["rho"] = self.rho

    @property
    def learning_rate(self) -> float:
        """`lr`, or the optimizer's default: 1.0 for Adadelta, 1e-3 for Adam."""
        if self.lr is not None:
            return float(self.lr)
        return 1.0 if self.optimizer == "adadelta" else 1e-3
