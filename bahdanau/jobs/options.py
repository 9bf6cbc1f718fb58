"""The options of the `bahdanau` command, declared once.

Each command's options are a frozen dataclass (`TrainOptions`, `TranslateOptions`,
`EvaluateOptions`, `PlotOptions`); each field is one option, with its type, default, help text
and bounds in `option(...)`. From this one declaration:

- `add_arguments` builds the argparse options (``train_batch_size`` is ``--train-batch-size``;
  a `tuple[str, ...]` field takes one or more values, ``--checkpoint A B``);
- `from_mapping` turns what argparse parsed (strings) or what a file holds (JSON / YAML values)
  into the dataclass, and construction validates every field, so an option is checked the same
  way whatever it came from, with one `InputError` naming it;
- a run folder stores `TrainOptions.to_record()` as its ``config.yaml``, and `resume_changes`
  sorts the options a resumed run changes into those it must refuse (`Option.on_resume` is
  "fixed": the model, the data and its tokenisation, the batches, the seed, the optimizer type)
  and those it applies and records ("applied": learning rate and schedule, gradient
  accumulation, label smoothing, limits, cadence, threads, device, evaluation and decoding
  settings); `resumed_options` keeps a run's own --time-budget when none is given.

A default that depends on more than the option is resolved in one place: `TrainOptions.limits`
(the default job trains `DEFAULT_EPOCHS` epochs), and, for every command, --device auto and the
--threads default in `bahdanau.cli` (`bahdanau._checks.default_device`, `default_threads`).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from typing_extensions import Self

from bahdanau._checks import is_finite_number, is_int
from bahdanau.config import TrainConfig
from bahdanau.data.text import MULTI30K_LANGS
from bahdanau.errors import InputError

__all__ = [
    "AverageOptions",
    "EvaluateOptions",
    "Option",
    "PlotOptions",
    "PrepareOptions",
    "TrainOptions",
    "TranslateOptions",
    "add_arguments",
    "option",
    "resume_changes",
    "resumed_options",
]

OnResume = Literal["fixed", "applied", "not_recorded"]
_INT_MAX = 2**31 - 1     # the largest integer option unless declared otherwise (thread counts,
                         # lengths and steps are C ints somewhere below)
# Epochs of a default job (the shipped Multi30k, no limit given): about 453 updates of 64
# sentences each over its 28,999 pairs, at about 3.1 updates/s with the small preset on a
# 2-core CPU, so 5 epochs (2,270 updates) take about 12 minutes there (11.6 measured).
DEFAULT_EPOCHS = 5


@dataclass(frozen=True)
class Option:
    """What the declaration says about one option besides its type and default."""

    help: str
    low: float | None = None      # smallest allowed value (numbers)
    high: float | None = None     # largest allowed value (numbers)
    above: bool = False           # the value must be strictly greater than `low`
    below: bool = False           # the value must be strictly less than `high`
    required: bool = False        # must be given (its default None means "missing")
    on_resume: OnResume = "applied"   # see the module docstring; train options only
    metavar: str | None = None


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field declaring an option (see `Option` for the keywords)."""
    return dataclasses.field(default=default, metadata={"option": Option(help, **kwargs)})


def flag(name: str) -> str:
    """The command-line flag of the field `name`: ``--train-batch-size``."""
    return "--" + name.replace("_", "-")


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


def _is_list(base: Any) -> bool:
    """A `tuple[str, ...]` option: one or more strings."""
    return typing.get_origin(base) is tuple


def _describe(base: Any) -> str:
    if _is_list(base):
        return "one or more strings"
    if typing.get_origin(base) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(base)))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[base]


class _Options:
    """Construction, validation and conversion shared by the option dataclasses."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            _check_value(field, hints[field.name], getattr(self, field.name))
        self.check()

    def check(self) -> None:
        """Checks that involve several options; raise `InputError`."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, text: bool = False) -> Self:
        """The options from `values` (field name -> value); absent or None means the default.

        Args:
            values: e.g. `vars(argparse_namespace)` or a parsed config file.
            text: the values are command-line strings to convert (numbers are parsed);
                otherwise they must already have the declared type (a config file).
        Raises:
            InputError: an unknown name, or a value of the wrong type or out of range (named).
        """
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise InputError(f"unknown option {unknown[0]!r} (known: {', '.join(sorted(fields))})")
        kwargs = {}
        for name, value in values.items():
            if value is None:
                continue
            if isinstance(value, list) and _is_list(_base_type(hints[name])[0]):
                value = tuple(value)                        # argparse's nargs, a JSON list
            kwargs[name] = _from_text(name, hints[name], value) if text else value
        return cls(**kwargs)


def _from_text(name: str, annotation: Any, value: Any) -> Any:
    """A command-line string converted to the declared type (booleans come parsed)."""
    base, _ = _base_type(annotation)
    if not isinstance(value, str) or base in (str, bool) or typing.get_origin(base) is Literal:
        return value
    try:
        return int(value) if base is int else float(value)
    except ValueError:
        raise InputError(f"{flag(name)} must be {_describe(base)}, got {value!r}") from None


def _check_value(field: dataclasses.Field, annotation: Any, value: Any) -> None:
    spec: Option = field.metadata["option"]
    name = flag(field.name)
    base, optional = _base_type(annotation)
    if value is None:
        if spec.required:
            raise InputError(f"{name} is required")
        if optional:
            return
        raise InputError(f"{name} must be {_describe(base)}, got None")
    if typing.get_origin(base) is Literal:
        if value not in typing.get_args(base):
            raise InputError(f"{name} must be {_describe(base)}, got {value!r}")
        return
    if _is_list(base):
        if not (isinstance(value, tuple) and value
                and all(isinstance(v, str) and v.strip() for v in value)):
            raise InputError(f"{name} must be {_describe(base)} (not empty), got {value!r}")
        return
    kind_ok = {int: is_int, float: is_finite_number, bool: lambda v: isinstance(v, bool),
               str: lambda v: isinstance(v, str)}[base](value)
    if not kind_ok:
        what = "a finite number" if base is float else _describe(base)
        raise InputError(f"{name} must be {what}, got {value!r}")
    if base is str and not value.strip():
        raise InputError(f"{name} must not be empty")
    if spec.low is not None:
        if value < spec.low or (spec.above and value == spec.low):
            bound = f"> {spec.low:g}" if spec.above else f">= {spec.low:g}"
            raise InputError(f"{name} must be {bound}, got {value!r}")
    high = spec.high if spec.high is not None or base is not int else _INT_MAX
    if high is not None and (value > high or (spec.below and value == high)):
        bound = f"< {high:g}" if spec.below else f"<= {high:g}"
        raise InputError(f"{name} must be {bound}, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser, cls: type[_Options]) -> None:
    """Add one argparse option per field of `cls`.

    Every option's argparse default is None ("not given"), so that `from_mapping` fills in the
    declared default and a config file can be overridden only by what was given.
    """
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec: Option = field.metadata["option"]
        base, _ = _base_type(hints[field.name])
        shown = "" if field.default is None else f" (default {field.default})"
        kwargs: dict[str, Any] = {"default": None, "help": spec.help + shown}
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
            kwargs["help"] = spec.help + f" (default {'yes' if field.default else 'no'})"
        elif typing.get_origin(base) is Literal:
            kwargs["choices"] = typing.get_args(base)
        else:
            kwargs["metavar"] = spec.metavar or field.name.split("_")[-1].upper()
            if _is_list(base):
                kwargs["nargs"] = "+"
        parser.add_argument(flag(field.name), dest=field.name, **kwargs)


def resume_changes(stored: Mapping[str, Any], given: TrainOptions) -> list[str]:
    """What a resumed run changes, as "--flag old -> new" lines; refuses fixed options.

    Args:
        stored: the options the run was last started with (its ``config.yaml``).
        given: the options of this start.
    Returns:
        One line per changed "applied" option, to log ("--threads 2 -> default" when it is
        no longer given).
    Raises:
        InputError: a "fixed" option differs (named, with both values).
    """
    changes = []
    for field in dataclasses.fields(given):
        spec: Option = field.metadata["option"]
        if spec.on_resume == "not_recorded" or field.name not in stored:
            continue
        old, new = stored[field.name], getattr(given, field.name)
        if old == new:
            continue
        if spec.on_resume == "fixed":
            raise InputError(f"{flag(field.name)} was {old!r} when this run began and is {new!r} "
                             "now; a resumed run keeps it (start a new run with another --out, "
                             "or --overwrite this one)")
        changes.append(f"{flag(field.name)} {_shown(old)} -> {_shown(new)}")
    return changes


def _shown(value: Any) -> str:
    """An option's value in a resume change: "default" for an option left unset."""
    return "default" if value is None else repr(value)


def resumed_options(stored: Mapping[str, Any], given: TrainOptions) -> TrainOptions:
    """`given` as it resumes the run that recorded `stored`: a --time-budget not given is the
    run's own, so that a run begun under an older default (12 minutes) keeps the length it had.

    Raises:
        InputError: the stored --time-budget is not a valid value (a damaged config.yaml).
    """
    if given.time_budget is not None or stored.get("time_budget") is None:
        return given
    return dataclasses.replace(given, time_budget=stored["time_budget"])


def _check_shipped_languages(src_lang: str | None, tgt_lang: str | None, own: bool) -> None:
    """--src-lang/--tgt-lang pick the shipped Multi30k's languages, and only when it is used."""
    for name, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if value not in (None, *MULTI30K_LANGS):
            raise InputError(f"{flag(name)} must be one of {', '.join(MULTI30K_LANGS)} "
                             f"(the shipped Multi30k), got {value!r}")
    if own and (src_lang is not None or tgt_lang is not None):
        raise InputError("--src-lang/--tgt-lang choose the shipped Multi30k languages; "
                         "they do nothing with --train-src/--train-tgt")


# ----------------------------------------------------------------------------------------------
# The commands' options

LengthPenalty = Literal["none", "average", "gnmt"]
# --device and --threads of every command (resolved by the command: `bahdanau.jobs.resolve.machine`)
_DEVICE_HELP = "auto (cuda when available, else cpu), cpu, cuda or cuda:N"
_THREADS_HELP = ("torch CPU threads (default: the usable cores divided by LOCAL_WORLD_SIZE, the "
                 "processes on this machine)")


@dataclass(frozen=True)
class SearchOptions(_Options):
    """Beam search settings, shared by every command that decodes."""

    beam_size: int = option(5, "beam width; 1 is greedy", low=1)
    max_len: int = option(100, "most target tokens", low=1)
    max_len_ratio: float | None = option(
        None, "also cap target length at RATIO x source length", low=0, above=True)
    min_len: int = option(1, "fewest target tokens", low=0)
    length_penalty: LengthPenalty = option(
        "none", "length normalisation of scores (none: as in the paper)")
    alpha: float = option(0.6, "exponent of the gnmt length penalty", low=0)
    batch_size: int = option(64, "sentences decoded together", low=1)
    unk_replace: bool = option(False, "replace generated <unk> by the most attended source "
                                      "word (an extension beyond the paper)")

    def check(self) -> None:
        if self.min_len > self.max_len:
            raise InputError(f"--min-len ({self.min_len}) exceeds --max-len ({self.max_len})")


@dataclass(frozen=True)
class TrainOptions(SearchOptions):
    """`bahdanau train`: the data, model, optimisation, limits and run folder."""

    src_lang: str | None = option(None, "source language of the shipped Multi30k data "
                                        "(en when no --train-src)", on_resume="fixed")
    tgt_lang: str | None = option(None, "target language of the shipped Multi30k data "
                                        "(fr when no --train-src)", on_resume="fixed")
    # The training files may move on resume; their examples may not (the run checks a digest).
    data: str | None = option(None, "a prepared corpus (bahdanau prepare) to train on, instead "
                                    "of --train-src/--train-tgt", metavar="DIR")
    train_src: str | None = option(None, "training source file (default: shipped Multi30k)",
                                   metavar="FILE")
    train_tgt: str | None = option(None, "training target file", metavar="FILE")
    dev_src: str | None = option(None, "dev source file (default: shipped Multi30k val when "
                                       "training on it)", metavar="FILE")
    dev_tgt: str | None = option(None, "dev target file", metavar="FILE")
    test_src: str | None = option(None, "test source file (default: shipped Multi30k "
                                        "test_2016_flickr when training on it)", metavar="FILE")
    test_tgt: str | None = option(None, "test target file", metavar="FILE")
    preset: Literal["tiny", "small", "rnnsearch_50"] = option(
        "small", "model sizes (small: E=256, H=256, D=512, A=512, maxout 256)",
        on_resume="fixed")
    arch: Literal["rnnsearch", "rnnencdec"] = option("rnnsearch", "model", on_resume="fixed")
    gru_form: Literal["torch", "paper"] = option(
        "torch", "GRU form (paper: reset gate before U)", on_resume="fixed")
    dropout: float = option(0.0, "dropout on embeddings and the maxout output", low=0, high=1,
                            below=True, on_resume="fixed")
    dropout_rnn_inputs: float = option(
        0.0, "dropout on the GRU inputs (source and target embeddings, after --dropout, and the "
        "decoder's context)", low=0, high=1, below=True, on_resume="fixed", metavar="P")
    dropout_deep_output: float = option(
        0.0, "dropout on the deep output, before the maxout", low=0, high=1, below=True,
        on_resume="fixed", metavar="P")
    init: Literal["paper", "glorot"] = option(
        "glorot", "initialisation (glorot: Xavier-uniform matrices, which Adam trains much "
        "faster; paper: N(0, 0.01^2), N(0, 0.001^2) alignment and orthogonal recurrent "
        "matrices)", on_resume="fixed")
    vocab_size: int = option(10000, "most frequent words kept per side (the paper: 30000)",
                             low=1, on_resume="fixed")
    lowercase: bool = option(False, "lowercase both sides", on_resume="fixed")
    joiners: Literal["prefix", "punctuation"] = option(
        "prefix", "where the tokenizer marks glued tokens (punctuation: on the punctuation, so "
        "words stay the same token)", on_resume="fixed")
    max_train_len: int = option(50, "drop training pairs longer than this many tokens", low=1,
                                on_resume="fixed")
    optimizer: Literal["adadelta", "adam"] = option(
        "adam", "adam (converges within a short budget) or adadelta (the paper: rho 0.95, "
        "eps 1e-6)", on_resume="fixed")
    lr: float | None = option(None, "learning rate (default 1e-3 for adam, 1.0 for adadelta)",
                              low=0, above=True)
    schedule: Literal["constant", "inverse_sqrt", "plateau"] = option(
        "constant", "learning-rate schedule: inverse_sqrt multiplies the rate by sqrt(W / step) "
        "after W = --warmup-steps updates; plateau multiplies it by --decay-factor after every "
        "--decay-patience dev evaluations without improvement (needs --eval-every)")
    warmup_steps: int = option(0, "updates over which the learning rate rises linearly from 0, "
                                  "with any --schedule", low=0)
    decay_factor: float = option(0.5, "plateau: what each decay multiplies the learning rate by",
                                 low=0, above=True, high=1, below=True)
    decay_patience: int = option(2, "plateau: dev evaluations without improvement per decay",
                                 low=1)
    min_lr: float = option(0.0, "the decayed learning rate never goes below this", low=0)
    label_smoothing: float = option(0.0, "label smoothing of the loss (0: none, as in the paper)",
                                    low=0, high=1, below=True)
    train_batch_size: int = option(64, "sentences per batch (ignored with --max-tokens)", low=1,
                                   on_resume="fixed")
    max_tokens: int | None = option(
        None, "batches by a budget of padded tokens, sentences x max(longest source, longest "
        "target + 1), instead of --train-batch-size", low=1, on_resume="fixed")
    accumulation: int = option(1, "batches per update: their gradients add up to that of one "
                                  "batch N times larger (gradient accumulation)", low=1,
                               metavar="N")
    seed: int = option(1234, "seed of the weights and the batch order", low=0, high=2**63 - 1,
                       on_resume="fixed")
    max_steps: int | None = option(None, "stop after this many updates", low=1)
    max_epochs: int | None = option(None, "stop after this many epochs (default: "
                                          f"{DEFAULT_EPOCHS} on the shipped Multi30k when no "
                                          "limit is given)", low=1)
    time_budget: float | None = option(None, "stop after this many minutes of training; 0: no "
                                             "time limit (default: none for a new run, a "
                                             "resumed run keeps its own)", low=0, high=1e9)
    eval_every: int = option(0, "dev BLEU (greedy, --dev-size sentences) every N updates "
                                "(0: never)", low=0)
    dev_size: int = option(500, "dev sentences scored at each evaluation", low=1)
    patience: int | None = option(None, "stop after N dev evaluations without improvement",
                                  low=1)
    save_every: int = option(500, "checkpoint every N updates", low=1)
    keep_last: int = option(3, "numbered checkpoints kept: the last N", low=1)
    keep_best: int = option(1, "also keep the checkpoints of the N best dev evaluations (for "
                               "bahdanau average --best N; 1: best.pt alone)", low=1)
    ema_decay: float | None = option(
        None, "keep an exponential moving average of the weights with this decay (e.g. 0.999); "
        "dev evaluations, the test score and every checkpoint's translations use it",
        low=0, above=True)
    log_every: int = option(100, "a log line every N updates", low=1)
    tensorboard: bool = option(False, "also write TensorBoard events to OUT/tensorboard: each "
                                      "log line's numbers, and dev BLEU and a dev sentence's "
                                      "alignment image per evaluation (needs the tensorboard "
                                      "extra)")
    loader_workers: int = option(0, "processes collating batches ahead of the training step "
                                    "(0: on the training thread)", low=0)
    threads: int | None = option(None, _THREADS_HELP, low=1)
    device: str = option("auto", _DEVICE_HELP)
    amp: Literal["none", "bf16", "fp16"] = option("none", "mixed precision (GPU)")
    out: str = option("runs/multi30k-en-fr", "output folder", on_resume="not_recorded",
                      metavar="DIR")
    resume: bool = option(True, "continue the run in OUT from its latest checkpoint; "
                                "--no-resume refuses an OUT that holds a run",
                          on_resume="not_recorded")
    overwrite: bool = option(False, "start a new run in OUT, deleting the run it holds "
                                    "(checkpoints, config.yaml, results)",
                             on_resume="not_recorded")

    def check(self) -> None:
        super().check()
        own = self.train_src is not None or self.train_tgt is not None
        for split in ("train", "dev", "test"):
            if (getattr(self, f"{split}_src") is None) != (getattr(self, f"{split}_tgt") is None):
                raise InputError(f"give both --{split}-src and --{split}-tgt, or neither")
        _check_shipped_languages(self.src_lang, self.tgt_lang, own)
        if self.data is not None:
            if own:
                raise InputError("--data is the training corpus: give it or --train-src/"
                                 "--train-tgt, not both")
            fixed = [name for name in ("vocab_size", "lowercase", "joiners", "src_lang",
                                       "tgt_lang")
                     if getattr(self, name) != TrainOptions.__dataclass_fields__[name].default]
            if fixed:
                raise InputError(f"{flag(fixed[0])} is fixed by the prepared corpus (--data): "
                                 "set it when running bahdanau prepare")
        if self.eval_every == 0 and self.dev_src is not None:
            raise InputError("--dev-src/--dev-tgt are read only for --eval-every N: give it, or "
                             "leave the dev files out")
        if self.eval_every == 0 and self.patience is not None:
            raise InputError("--patience counts dev evaluations: it needs --eval-every")
        if self.ema_decay is not None and self.ema_decay >= 1:
            raise InputError(f"--ema-decay must be < 1, got {self.ema_decay!r}")
        if self.eval_every == 0 and self.schedule == "plateau":
            raise InputError("--schedule plateau decays after dev evaluations: it needs "
                             "--eval-every")
        lr = TrainConfig(optimizer=self.optimizer, lr=self.lr).learning_rate
        if self.min_lr >= lr:
            raise InputError(f"--min-lr ({self.min_lr:g}) must be below the learning rate "
                             f"({lr:g})")

    def to_record(self) -> dict[str, Any]:
        """The options a run folder records (its config.yaml, and every checkpoint): all but
        those that say where and how to start (--out, --resume, --overwrite)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata["option"].on_resume != "not_recorded"}

    @property
    def limits(self) -> dict[str, int | float | None]:
        """When training stops, as `TrainConfig` fields (max_steps, max_epochs, max_time_s).

        The limits given (--max-steps, --max-epochs, a non-zero --time-budget) and only they;
        with none, the shipped Multi30k trains for `DEFAULT_EPOCHS` epochs. The user's own
        corpus (--train-src or --data) has no default length: it needs a limit. A resumed run
        calls this once its stored --time-budget is known (`bahdanau.cli`).

        Raises:
            InputError: no limit is given and the corpus is the user's own.
        """
        given = {"max_steps": self.max_steps, "max_epochs": self.max_epochs,
                 "max_time_s": self.time_budget * 60 if self.time_budget else None}
        if any(value is not None for value in given.values()):
            return given
        if self.own_data or self.data is not None:
            raise InputError("set --max-steps, --max-epochs or a non-zero --time-budget: your "
                             "own corpus has no default training length")
        return {**given, "max_epochs": DEFAULT_EPOCHS}

    def train_config(self) -> TrainConfig:
        """The `TrainConfig` of these options (`limits` says when training stops)."""
        return TrainConfig(
            optimizer=self.optimizer, lr=self.lr, schedule=self.schedule,
            warmup_steps=self.warmup_steps, decay_factor=self.decay_factor,
            decay_patience=self.decay_patience, min_lr=self.min_lr,
            batch_size=self.train_batch_size, max_tokens=self.max_tokens,
            accumulation=self.accumulation, **self.limits,
            eval_every=self.eval_every or 10**12, save_every=self.save_every,
            patience=self.patience, label_smoothing=self.label_smoothing, amp=self.amp,
            log_every=self.log_every, seed=self.seed, loader_workers=self.loader_workers,
            keep_last=self.keep_last, keep_best=self.keep_best, ema_decay=self.ema_decay)

    @property
    def own_data(self) -> bool:
        """Trains on the user's files, not the shipped Multi30k."""
        return self.train_src is not None


@dataclass(frozen=True)
class DecodeOptions(SearchOptions):
    """What every command that loads a checkpoint takes."""

    checkpoint: tuple[str, ...] | None = option(
        None, "a checkpoint file, or a training output folder (its best, else latest "
        "checkpoint); several decode as an ensemble", required=True, metavar="PATH")
    device: str = option("auto", _DEVICE_HELP)
    threads: int | None = option(None, _THREADS_HELP, low=1)


@dataclass(frozen=True)
class TranslateOptions(DecodeOptions):
    """`bahdanau translate`."""

    input: str | None = option(None, "source file (default: stdin)", metavar="FILE")
    n_best: int = option(1, "hypotheses per sentence; >1 prints 'i ||| text ||| score'", low=1)
    alignments: str | None = option(None, "write JSON lines with tokens and weights here",
                                    metavar="FILE")

    def check(self) -> None:
        super().check()
        if self.n_best > self.beam_size:
            raise InputError(f"--n-best ({self.n_best}) cannot exceed --beam-size "
                             f"({self.beam_size})")


@dataclass(frozen=True)
class EvaluateOptions(DecodeOptions):
    """`bahdanau evaluate`."""

    src: str | None = option(None, "source file", required=True, metavar="FILE")
    ref: str | None = option(None, "reference file", required=True, metavar="FILE")
    output: str | None = option(None, "write the translations here", metavar="FILE")
    json: str | None = option(None, "write the scores here", metavar="FILE")


@dataclass(frozen=True)
class PlotOptions(DecodeOptions):
    """`bahdanau plot`."""

    sentence: str | None = option(None, "the source sentence", metavar="TEXT")
    input: str | None = option(None, "a source file (with --line)", metavar="FILE")
    line: int | None = option(None, "1-based line of --input (default 1)", low=1)
    output: str = option("alignment.png", "image file to write", metavar="FILE")

    def check(self) -> None:
        super().check()
        if (self.sentence is None) == (self.input is None):
            raise InputError("give --sentence or --input (with --line), not both")
        if self.line is not None and self.input is None:
            raise InputError("--line picks a line of --input; with --sentence it does nothing")



@dataclass(frozen=True)
class AverageOptions(_Options):
    """`bahdanau average`: one checkpoint whose weights are the mean of several."""

    checkpoint: tuple[str, ...] | None = option(
        None, "checkpoint files to average, or one training output folder (with --last or "
        "--best)", required=True, metavar="PATH")
    last: int | None = option(None, "average the folder's last N numbered checkpoints", low=1)
    best: int | None = option(None, "average the checkpoints of the folder's N best dev "
                                    "evaluations (train with --keep-best N)", low=1)
    output: str | None = option(None, "the averaged checkpoint to write", required=True,
                                metavar="FILE")

    def check(self) -> None:
        if self.last is not None and self.best is not None:
            raise InputError("give --last N or --best N, not both")


@dataclass(frozen=True)
class PrepareOptions(_Options):
    """`bahdanau prepare`: a parallel corpus tokenised and encoded once, for `train --data`."""

    out: str | None = option(None, "the prepared corpus folder to write", required=True,
                             metavar="DIR")
    train_src: str | None = option(None, "source file, plain or gzip (default: the shipped "
                                         "Multi30k training data)", metavar="FILE")
    train_tgt: str | None = option(None, "target file, line-aligned with --train-src",
                                   metavar="FILE")
    src_lang: str | None = option(None, "source language of the shipped Multi30k data "
                                        "(en when no --train-src)")
    tgt_lang: str | None = option(None, "target language of the shipped Multi30k data "
                                        "(fr when no --train-src)")
    tokenizer: Literal["default", "bpe", "unigram"] = option(
        "default", "default: words and punctuation; bpe or unigram: a SentencePiece model "
        "trained on the corpus (needs the sentencepiece extra)")
    sentencepiece_model: str | None = option(
        None, "use this trained SentencePiece model (instead of --tokenizer)", metavar="FILE")
    subword_vocab: int = option(8000, "pieces of a SentencePiece model trained here", low=1)
    sample_sentences: int = option(1_000_000, "most sentences a side that SentencePiece "
                                              "training reads", low=1)
    vocab_size: int = option(10000, "most frequent tokens kept per side (the paper: 30000)",
                             low=1)
    lowercase: bool = option(False, "lowercase both sides (default tokenizer)")
    joiners: Literal["prefix", "punctuation"] = option(
        "prefix", "where the default tokenizer marks glued tokens")
    max_len: int | None = option(None, "drop pairs with a side longer than this many tokens "
                                       "(default: keep all; train's --max-train-len applies "
                                       "too)", low=1)
    max_ratio: float | None = option(None, "drop pairs whose longer side has more than RATIO "
                                           "times the tokens of the shorter", low=1)
    strict: bool = option(False, "an empty line is an error instead of a dropped pair")
    workers: int | None = option(None, "tokenising processes (default: the usable cores, at "
                                       "most 8)", low=1)
    overwrite: bool = option(False, "replace a prepared corpus of other inputs or options in "
                                    "OUT")

    def check(self) -> None:
        if (self.train_src is None) != (self.train_tgt is None):
            raise InputError("give both --train-src and --train-tgt, or neither")
        _check_shipped_languages(self.src_lang, self.tgt_lang, self.train_src is not None)
        if self.sentencepiece_model is not None and self.tokenizer != "default":
            raise InputError("--sentencepiece-model uses a trained model; --tokenizer "
                             f"{self.tokenizer} would train another: give one of them")
        subwords = self.sentencepiece_model is not None or self.tokenizer != "default"
        if subwords and (self.lowercase or self.joiners != "prefix"):
            raise InputError("--lowercase and --joiners set the default tokenizer, not "
                             "SentencePiece")
