"""Frozen configuration dataclasses.

`ModelConfig` holds every size and option needed to build `RNNSearch` or `RNNEncDec`; the
defaults are the paper's RNNsearch-50 (Bahdanau et al. 2015, appendix A.2 and B). Variants are
made with `dataclasses.replace`; presets live in `bahdanau.presets`; checkpoints store
`dataclasses.asdict(cfg)` and rebuild it with `ModelConfig.from_dict`. `TrainConfig` holds the
settings of `bahdanau.training.train`, with the paper's values (appendix B.2) as defaults.

Special token ids are declared here (`PAD_ID`, `BOS_ID`, `EOS_ID`, `UNK_ID`: 0..3), and every
`bahdanau.Vocab` puts its specials at them: `ModelConfig`'s id fields default to them, and
`ModelConfig.check_vocabs` refuses a config and vocabularies that disagree; training, loading a
checkpoint and translating call it before any work. `model_vocabs` is the one reading of what
a model says of its vocabularies (its config's sizes and ids, or its `vocab_sizes` and the
default ids). This module imports nothing of the package's but its checks and errors, so that
everything may import it.

Shape legend used across the package: B batch, S source length, T target length, E embedding,
H encoder hidden per direction (annotations are 2H), D decoder hidden, A alignment size,
L maxout units, V vocabulary, K beam, N decoder rows (B, or B*K with K beams per sentence).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from typing_extensions import Self

from bahdanau._checks import describe, is_int
from bahdanau.errors import InputError
from bahdanau.settings import check_settings, declared, field_name, setting

Arch = Literal["rnnsearch", "rnnencdec"]
AttentionKind = Literal["additive", "luong_general", "luong_dot"]
AttentionImpl = Literal["auto", "reference", "sigmoid", "triton"]
Engine = Literal["fast", "reference"]
GRUForm = Literal["torch", "paper"]
DecoderKind = Literal["paper", "cgru"]
Init = Literal["paper", "glorot"]
Amp = Literal["none", "bf16", "fp16", "auto"]
Schedule = Literal["constant", "inverse_sqrt", "plateau", "linear"]
StoppingMetric = Literal["bleu", "chrf", "ppl", "wer", "per", "accuracy"]
# Scores where less is better (perplexity, the error rates of `bahdanau.error_rates`); the
# others: more.
LOWER_IS_BETTER = frozenset({"ppl", "wer", "per"})
# The early-stopping metric of a run recorded before the metric had a name (a best.json without
# "name", an options.json without early_stopping_metric): BLEU, the only one there was then.
UNNAMED_METRIC: StoppingMetric = "bleu"


def improves(metric: str | None, new: float, best: float | None) -> bool:
    """Whether the score `new` of `metric` beats `best` (None: nothing to beat): a lower
    perplexity or error rate, a higher BLEU, chrF or accuracy (and a higher value of a metric
    without a name)."""
    if best is None:
        return True
    return new < best if metric in LOWER_IS_BETTER else new > best

ATTENTION_IMPLS: tuple[str, ...] = ("auto", "reference", "sigmoid", "triton")
ENGINES: tuple[str, ...] = ("fast", "reference")
GRU_FORMS: tuple[str, ...] = ("torch", "paper")
SPECIAL_IDS: tuple[str, ...] = ("pad_id", "bos_id", "eos_id", "unk_id")
# The special ids, the same in every vocabulary (`bahdanau.data.SPECIALS` sit at them).
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


class VocabSizes(Protocol):
    """What `ModelConfig.check_vocabs` reads of a vocabulary (`bahdanau.Vocab` has it)."""

    @property
    def pad_id(self) -> int:
        """The padding id."""

    @property
    def bos_id(self) -> int:
        """The id of the decoder's first input y_0."""

    @property
    def eos_id(self) -> int:
        """The id that ends every sentence."""

    @property
    def unk_id(self) -> int:
        """The id of the words outside the vocabulary."""

    def __len__(self) -> int:
        """The entries, specials included."""


class DictConfig:
    """Mixin for the dataclasses that checkpoints store (the configs, `TrainState`): a plain-dict
    round trip for checkpoints and JSON."""

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON- and checkpoint-friendly) that `from_dict` turns back."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]  # a mixin of dataclasses

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild a config from `to_dict()` output; an unknown key raises `InputError` (what
        older checkpoints hold that is no longer a field, `bahdanau.checkpoint.upgrade_payload`
        drops)."""
        if not isinstance(data, Mapping):
            raise InputError(f"{cls.__name__}.from_dict needs a dict, got {describe(data)}")
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # a mixin of dataclasses
        known = {f.name for f in fields}
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
    embed_size: int = setting(620, "E, word embedding size, both sides (m in the paper)",
                              low=1, on_resume="fixed", metavar="E")
    hidden_size: int = setting(1000, "H, encoder GRU units per direction; annotations are 2H "
                                     "(n in the paper)", low=1, on_resume="fixed", metavar="H")
    decoder_size: int = setting(1000, "D, decoder GRU units, the state s_i (n in the paper)",
                                low=1, on_resume="fixed", metavar="D")
    align_size: int = setting(1000, "A, alignment model units (n' in the paper)", low=1,
                              on_resume="fixed", metavar="A")
    maxout_size: int = setting(500, "L, units after the maxout over pairs (l in the paper)",
                               low=1, on_resume="fixed", metavar="L")
    arch: Arch = setting("rnnsearch", "model: rnnsearch, or the paper's rnnencdec baseline",
                         on_resume="fixed")
    attention: AttentionKind = setting(
        "additive", "alignment model of rnnsearch: additive (the paper's), or Luong et al. "
        "(2015)'s luong_general or luong_dot (which needs --decoder-size = 2 x --hidden-size)",
        on_resume="fixed")
    attention_impl: AttentionImpl = setting(
        "auto", "how the additive attention is computed, the same function each way: reference "
        "(the paper's tanh form), sigmoid (through sigmoid, faster on a CPU), triton (the fused "
        "kernel, CUDA); auto: triton on CUDA with Triton installed, sigmoid on a CPU, else "
        "reference",
        on_resume="fixed")
    engine: Engine = setting(
        "fast", "fast (the decoder's fast twin, bahdanau.engine) or reference (the "
        "paper-shaped decoder alone): the same function", on_resume="fixed")
    gru_form: GRUForm = setting("torch", "GRU form (paper: the reset gate applied before U, as "
                                         "in appendix A)", on_resume="fixed")
    decoder: DecoderKind = setting(
        "paper", "decoder: paper (attention from s_{i-1}, one GRU on [E y_{i-1}; c_i]) or cgru "
        "(Nematus' conditional GRU: a GRU on E y_{i-1}, attention from its state, a second GRU "
        "on c_i)", on_resume="fixed")
    layer_norm: bool = setting(
        False, "layer normalisation of every GRU's input and recurrent projections, encoder and "
        "decoder (Ba et al. 2016, as Nematus; needs --gru-form torch)", on_resume="fixed")
    encoder_layers: int = setting(
        1, "bidirectional GRU layers of the encoder, each reading the annotations of the one "
        "below (the paper: 1)", low=1, on_resume="fixed", metavar="N")
    dropout: float = setting(0.0, "dropout on the embeddings and the maxout output t_i (the "
                                  "paper: none)", low=0, high=1, below=True, on_resume="fixed")
    dropout_rnn_inputs: float = setting(
        0.0, "dropout on every GRU input: the source and target embeddings (after --dropout), "
        "the decoder's context c_i and a deeper encoder layer's input", low=0, high=1,
        below=True, on_resume="fixed", metavar="P")
    dropout_deep_output: float = setting(
        0.0, "dropout on the deep output t~_i, before the maxout", low=0, high=1, below=True,
        on_resume="fixed", metavar="P")
    init: Init = setting("paper", "initialisation (glorot: Xavier-uniform matrices, which Adam "
                                  "trains much faster; paper: N(0, 0.01^2), N(0, 0.001^2) "
                                  "alignment and orthogonal recurrent matrices)",
                         on_resume="fixed")
    pad_id: int = PAD_ID              # special ids: the vocabularies' (see check_vocabs)
    bos_id: int = BOS_ID              # y_0, the decoder's first input
    eos_id: int = EOS_ID              # ends every target sentence
    unk_id: int = UNK_ID              # [UNK], words outside the vocabulary

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 5:
                raise InputError(f"{name} must be an int >= 5 (4 specials + 1 word), got {value!r}")
        check_settings(self)     # every declared setting: sizes, arch, attention, decoder, ...
        named = {f.name: field_name(f) for f, _, _ in declared(type(self))}  # flags, in a job
        if self.decoder == "cgru" and self.gru_form != "torch":
            raise InputError(f"{named['decoder']} cgru is built of the torch form's GRUs: it "
                             f"needs {named['gru_form']} torch")
        if self.layer_norm and self.gru_form != "torch":
            flag = named["layer_norm"]
            off = f"--no-{flag[2:]}" if flag.startswith("--") else f"{flag}=False"
            raise InputError(f"{flag} normalises U h, the torch form's recurrent projection: it "
                             f"needs {named['gru_form']} torch, or {off} (the paper form "
                             "computes U (r * h))")
        if self.decoder == "cgru" and self.arch != "rnnsearch":
            raise InputError(f"{named['decoder']} cgru attends from its first GRU's state: it "
                             f"needs {named['arch']} rnnsearch (rnnencdec has no attention)")
        if self.attention == "luong_dot" and self.decoder_size != 2 * self.hidden_size:
            raise InputError(
                f"{named['attention']} luong_dot needs {named['decoder_size']} = 2 x "
                f"{named['hidden_size']} (s_{{i-1}} . h_j), got {self.decoder_size} and "
                f"{self.hidden_size}")
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
class ModelVocabs:
    """What a model says of its vocabularies (`model_vocabs`): their sizes, None when it says
    none, and the special ids."""

    src_vocab_size: int | None        # source V
    tgt_vocab_size: int | None        # target V
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    @property
    def sizes(self) -> tuple[int, int] | None:
        """(source V, target V); None when the model says no sizes."""
        if self.src_vocab_size is None or self.tgt_vocab_size is None:
            return None
        return self.src_vocab_size, self.tgt_vocab_size


def model_vocabs(model: object) -> ModelVocabs:
    """What `model` says of its vocabularies: the one reading of it for the search, an
    ensemble's members, the serving programs' manifest and a checkpoint's model assembled from
    parts.

    A model built from a config (a preset's) has a `ModelConfig` as `model.config`: its sizes
    and special ids. A model assembled from parts has none; its ``vocab_sizes`` (source V,
    target V: its embeddings') are its sizes, and its special ids are the defaults (`PAD_ID`,
    `BOS_ID`, `EOS_ID`, `UNK_ID`, every `bahdanau.Vocab`'s). A model with neither says no
    sizes and has the default ids.

    Args:
        model: any object; only its ``config`` and ``vocab_sizes`` attributes are read.
    Returns:
        Its `ModelVocabs`.
    """
    config = getattr(model, "config", None)
    if isinstance(config, ModelConfig):
        return ModelVocabs(config.src_vocab_size, config.tgt_vocab_size,
                           **{name: getattr(config, name) for name in SPECIAL_IDS})
    sizes = getattr(model, "vocab_sizes", None)
    if isinstance(sizes, (tuple, list)) and len(sizes) == 2:
        return ModelVocabs(sizes[0], sizes[1])
    return ModelVocabs(None, None)


@dataclass(frozen=True)
class TrainConfig(DictConfig):
    """Training settings; defaults follow the paper (appendix B.2) where it has one.

    The longest training sentence (50 words for RNNsearch-50) is a data setting:
    `encode_pairs(..., max_len=50)`.
    """

    optimizer: Literal["adadelta", "adam"] = setting(
        "adadelta", "adam (converges within a short budget) or adadelta (the paper: rho 0.95, "
        "eps 1e-6)", on_resume="fixed")
    lr: float | None = setting(None, "learning rate (default 1e-3 for adam, 1.0 for adadelta)",
                               low=0, above=True)
    rho: float = setting(0.95, "Adadelta's decay (the paper's)", low=0, above=True, high=1,
                         below=True)
    eps: float = setting(1e-6, "Adadelta's or Adam's epsilon (the paper's Adadelta value)",
                         low=0, above=True)
    # The learning rate of each update: `bahdanau.training.schedules.LRSchedule` has the formulas.
    schedule: Schedule = setting(
        "constant", "learning-rate schedule: inverse_sqrt multiplies the rate by sqrt(W / step) "
        "after W = --warmup-steps updates; plateau multiplies it by --decay-factor after every "
        "--decay-patience evaluations without improvement (needs --eval-every); linear falls "
        "in a straight line from the rate at W to 0 after the last update (needs --max-steps)")
    warmup_steps: int = setting(0, "updates over which the learning rate rises linearly from "
                                   "0, with any --schedule", low=0)
    decay_factor: float = setting(0.5, "plateau: what each decay multiplies the learning rate "
                                       "by", low=0, above=True, high=1, below=True)
    decay_patience: int = setting(2, "plateau: evaluations without improvement per decay", low=1)
    min_lr: float = setting(0.0, "the decayed learning rate never goes below this", low=0)
    clip_norm: float | None = setting(1.0, "largest L2 norm of the whole gradient (the paper: "
                                           "1)", low=0, above=True)
    max_nonfinite_steps: int = setting(
        5, "stop the run (divergence) after N updates in a row skipped for a loss or gradient "
        "norm that is not finite; the last checkpoint is kept", low=1, metavar="N",
        group="limits")
    batch_size: int = setting(80, "sentences per batch (the paper: 80; ignored with "
                                  "--max-tokens)", low=1, on_resume="fixed",
                              flag="train_batch_size")
    max_tokens: int | None = setting(
        None, "batches by a budget of padded tokens, sentences x max(longest source, longest "
        "target + 1), instead of --train-batch-size", low=1, on_resume="fixed")
    bucket: int = setting(20, "batches sorted by length together (the paper: 20)", low=1,
                          on_resume="fixed")
    accumulation: int = setting(1, "batches per update: their gradients add up to that of one "
                                   "batch N times larger (gradient accumulation)", low=1,
                                metavar="N")
    loader_workers: int = setting(0, "processes collating batches ahead of the training step "
                                     "(0: on the training thread)", low=0, group="machine")
    max_steps: int | None = setting(None, "stop after this many updates", low=1,
                                    group="limits")
    max_epochs: int | None = setting(None, "stop after the update that ends this many epochs "
                                           "(an update of several batches, --accumulation, may "
                                           "take the next epoch's first)", low=1,
                                     group="limits")
    max_time_s: float | None = setting(None, "stop after this many seconds of training, resumed "
                                             "runs included", low=0, above=True, flag="")
    eval_every: int = setting(1000, "evaluate every N updates (the command line: dev BLEU, "
                                    "greedy, on --dev-size sentences); 0: never", low=0,
                              high=2**63 - 1,   # older runs stored 10**12 for "never"
                              group="limits")
    patience: int | None = setting(None, "stop after N evaluations without improvement", low=1,
                                   group="limits")
    early_stopping_metric: StoppingMetric = setting(
        "bleu", "the dev score that ranks checkpoints (best.pt, --keep-best) and counts "
        "--patience: bleu, chrf or accuracy (higher is better), or ppl, the perplexity, wer "
        "or per, the error rates of bahdanau.error_rates (lower is better)",
        on_resume="fixed", group="limits")
    save_every: int = setting(1000, "checkpoint every N updates (and at the end)", low=1,
                              group="output")
    keep_last: int = setting(3, "numbered checkpoints kept: the last N", low=1, group="output")
    keep_best: int = setting(1, "also keep the checkpoints of the N best evaluations (for "
                                "bahdanau average --best N; 1: best.pt alone)", low=1,
                             group="output")
    ema_decay: float | None = setting(
        None, "keep an exponential moving average of the weights with this decay (e.g. 0.999); "
        "evaluations, the test score and every checkpoint's translations use it",
        low=0, above=True, high=1, below=True)
    label_smoothing: float = setting(0.0, "label smoothing of the loss (0: none, as in the "
                                          "paper)", low=0, high=1, below=True)
    amp: Amp = setting("none", "mixed precision: the updates, dev evaluation and test under "
                               "torch.autocast to bf16 or fp16 (fp16 adds a gradient scaler); "
                               "auto: bf16 where it is native and measured no worse "
                               "(bahdanau.training.precision), else float32",
                       group="machine")
    tf32: bool = setting(True, "on CUDA, float32 matmuls and cuDNN on TF32 tensor cores (10-bit "
                               "mantissa products, float32 sums); --no-tf32: full float32",
                         group="machine")
    cuda_graphs: bool = setting(
        False, "on CUDA, make each update with no host sync and replay its forward and "
        "backward as one CUDA graph per batch shape (batches padded to multiples of 8), and "
        "decode dev and test with captured steps too; not on a CPU, nor under torchrun",
        group="machine")
    log_every: int = setting(100, "a log line every N updates", low=1, group="output")
    seed: int = setting(1234, "seed of the weights and the batch order", low=0,
                        high=2**63 - 1, on_resume="fixed")

    def __post_init__(self) -> None:
        check_settings(self)
        if self.min_lr >= self.learning_rate:
            raise InputError(f"{field_name(_FIELDS['min_lr'])} ({self.min_lr:g}) must be below "
                             f"the learning rate ({self.learning_rate:g})")
        if self.schedule == "plateau":
            self._check_plateau()
        if self.schedule == "linear":
            if self.max_steps is None:
                raise InputError(f"{field_name(_FIELDS['schedule'])} linear falls to 0 at the "
                                 f"run's last update: give {field_name(_FIELDS['max_steps'])}")
            if self.warmup_steps >= self.max_steps:
                raise InputError(f"{field_name(_FIELDS['warmup_steps'])} ({self.warmup_steps}) "
                                 f"must be below {field_name(_FIELDS['max_steps'])} "
                                 f"({self.max_steps}) with the linear schedule")

    def _check_plateau(self) -> None:
        """The plateau schedule decays after evaluations: refuse it where no update would
        ever take a decayed rate."""
        schedule, every = field_name(_FIELDS["schedule"]), field_name(_FIELDS["eval_every"])
        if not self.eval_every:
            raise InputError(f"{schedule} plateau decays after dev evaluations: it needs "
                             f"{every} N")
        if self.patience is not None and self.patience <= self.decay_patience:
            raise InputError(
                f"{field_name(_FIELDS['patience'])} {self.patience} stops the run at or before "
                f"the evaluation that first decays the rate "
                f"({field_name(_FIELDS['decay_patience'])} {self.decay_patience}), so "
                f"{schedule} plateau would never act: give a patience above "
                f"{self.decay_patience}, or another schedule")

    def resume_changes(self, stored: TrainConfig) -> list[str]:
        """What resuming a run saved with `stored` under this config changes.

        Args:
            stored: the config the checkpoint was written with.
        Returns:
            One "name: old -> new" line per changed field, to log; they all take effect.
        Raises:
            InputError: a setting declared ``on_resume="fixed"`` differs (named, with both
                values): the optimizer type (its state is of that type) and what defines the
                batches (their order is a function of the seed and the epoch), unless neither
                config reads it (`unused_settings`: batch_size where both batch by
                max_tokens). The others (learning rate and schedule, limits, cadence, ...) are
                applied from the resumed call on; `accumulation` only with another number of
                processes, keeping processes x accumulation, the batches of an update
                (`bahdanau.training.setup_run` checks).
        """
        changes = []
        unused = unused_settings(stored.to_dict()) & unused_settings(self.to_dict())
        for field, _, spec in declared(TrainConfig):
            old, new = getattr(stored, field.name), getattr(self, field.name)
            if old == new:
                continue
            if spec.on_resume == "fixed" and field.name not in unused:
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


def unused_settings(settings: Mapping[str, Any]) -> frozenset[str]:
    """The `TrainConfig` fields that nothing reads under `settings` (field name -> value, as
    `TrainConfig.to_dict` gives them): `batch_size` where `max_tokens` forms the batches (the
    sampler of `bahdanau.training.setup_run` takes no sentence cap then, and the batches, their
    order and a resumed run's place in them are those of `max_tokens`, `bucket` and `seed`).

    A resumed run may change a setting fixed on resume that neither its checkpoint's settings
    nor its own read (`TrainConfig.resume_changes`, `bahdanau.jobs.resume.resume_changes`).
    """
    return frozenset({"batch_size"}) if settings.get("max_tokens") is not None else frozenset()


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
