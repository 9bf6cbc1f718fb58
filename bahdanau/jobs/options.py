"""The options of the `bahdanau` command, each declared once.

Each command's options are a frozen dataclass (`TrainOptions`, `TranslateOptions`,
`EvaluateOptions`, `PlotOptions`, `AverageOptions`, `PrepareOptions`, `ScoreOptions`,
`ExportOptions`, `ReleaseOptions`); each field is one option
declared with `bahdanau.settings.setting` (type, default, help, bounds, resume rule), or a
section of settings declared elsewhere and flattened into the same flags: `TrainOptions.model`
(`bahdanau.presets.ModelChoices`) and `TrainOptions.training` (`bahdanau.config.TrainConfig`,
with the default job's values, `JOB_TRAINING`), and how BLEU reads the text
(`bahdanau.bleu_text.BleuText`: `EvaluateOptions.bleu`, and `TrainOptions.test_bleu`, whose
flags take the prefix ``--test-``, beside train's own --lowercase). From these declarations
(`bahdanau.jobs.flags`, how an options class becomes flags):

- `add_arguments` builds the argparse options (``train_batch_size`` is ``--train-batch-size``;
  a `tuple[str, ...]` field takes one or more values, ``--checkpoint A B``);
- `from_mapping` turns what argparse parsed (strings) or what a file holds (JSON / YAML values)
  into the dataclass, and construction validates every field, once, in the dataclasses, with
  one `InputError` naming the flag;
- a run folder stores `TrainOptions.to_record()` as its ``options.json``, which
  `bahdanau.jobs.resume` compares with the options of a resumed run.

Adding a training setting is one declaration in `TrainConfig` (and its use): the flag, the
config file key, the resume rule and the checks follow from it.

A default that depends on more than the option is resolved in one place: `TrainOptions.limits`
(the default job trains `DEFAULT_EPOCHS` epochs), and, for every command, --device auto and the
--threads default in `bahdanau.jobs.resolve.machine`; --amp becomes a `torch.autocast` on the
device in `bahdanau.jobs.resolve.autocast`.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, replace
from typing import Any, Literal

from bahdanau.bleu_text import BleuText
from bahdanau.config import Amp, TrainConfig
from bahdanau.data.text import MULTI30K_LANGS
from bahdanau.error_rates import METRICS
from bahdanau.errors import InputError
from bahdanau.jobs.flags import (
    GROUPS,
    Options,
    add_arguments,
    flag,
    flat_settings,
    section,
)
from bahdanau.presets import ModelChoices
from bahdanau.settings import setting as option

__all__ = ["AverageOptions", "EvaluateOptions", "ExportOptions", "JOB_TRAINING", "PlotOptions",
           "PrepareOptions", "ReleaseOptions", "ScoreOptions", "TrainOptions", "TranslateOptions",
           "TrustOptions", "GROUPS", "add_arguments", "flag", "flat_settings"]

# Epochs of a default job (the shipped Multi30k, no limit given): about 453 updates of 64
# sentences each over its 28,999 pairs, at 2 to 3 updates/s with the small preset on an idle
# 2-core CPU, so 5 epochs (2,270 updates) take 13 to 20 minutes there (19.3 measured on one
# machine; the other took 11.6 before layer norm, which costs up to 1.1 times an update).
DEFAULT_EPOCHS = 5
# The default job's training settings where they are not the paper's: Adam (converges within a
# short budget), batches of 64, label smoothing 0.1 (2.87 val BLEU more at equal updates, over
# three seeds: docs/default-job.md#label-smoothing), a moving average of the weights (3.01 val
# BLEU more, over three seeds: docs/default-job.md#a-moving-average-of-the-weights), no dev
# evaluation unless asked, a checkpoint every 500 updates.
JOB_TRAINING = TrainConfig(optimizer="adam", batch_size=64, label_smoothing=0.1,
                           ema_decay=0.998, eval_every=0, save_every=500)


class Limits(typing.TypedDict):
    """When training stops, as the `TrainConfig` fields of the limits."""

    max_steps: int | None
    max_epochs: int | None
    max_time_s: float | None


def _needs(needed: str, rules: list[tuple[bool, str, str]]) -> None:
    """Refuse, in one line, an option given where it does nothing, without `needed` (the
    option it acts with): each rule is (it is given, the option as given, what it does)."""
    for given, shown, does in rules:
        if given:
            raise InputError(f"{shown} {does}: it needs {needed}")


def _default(options: Any, name: str) -> Any:
    """The declared default of the option field `name` of `options`' class."""
    return type(options).__dataclass_fields__[name].default


def _check_alpha(options: Any) -> None:
    """--alpha is the exponent of the gnmt length penalty alone."""
    if options.length_penalty != "gnmt":
        _needs("--length-penalty gnmt", [
            (options.alpha != _default(options, "alpha"), f"--alpha {options.alpha:g}",
             "is the exponent of the gnmt length penalty")])


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
# What --checkpoint takes, for every command that reads a model (`find_checkpoint`).
_CHECKPOINT_HELP = ("a checkpoint file, a model folder (bahdanau release), or a training output "
                    "folder (its best, else latest checkpoint)")
_THREADS_HELP = ("torch CPU threads, at most the usable cores; fixes the count (default: "
                 "OMP_NUM_THREADS, else the usable cores divided by LOCAL_WORLD_SIZE, the "
                 "processes on this machine; on a CPU a lone process then keeps as many as "
                 "measure fastest beside the machine's other work)")
# --amp of every command that decodes or scores (`bahdanau.jobs.resolve.autocast`); train's is
# `TrainConfig.amp`
_AMP_HELP = ("mixed precision: run the model under torch.autocast in bf16 or fp16 on --device "
             "(none: float32; auto: as train --amp auto); the search adds up its "
             "log-probabilities in float32")


@dataclass(frozen=True)
class SearchOptions(Options):
    """Beam search settings, shared by every command that decodes."""

    beam_size: int = option(5, "beam width; 1 is greedy", low=1, group="decoding")
    max_len: int = option(100, "most target tokens", low=1, group="decoding")
    max_len_ratio: float | None = option(
        None, "also cap target length at RATIO x source length", low=0, above=True,
        group="decoding")
    min_len: int = option(1, "fewest target tokens", low=0, group="decoding")
    length_penalty: LengthPenalty = option(
        "none", "length normalisation of scores (none: as in the paper)", group="decoding")
    alpha: float = option(0.6, "exponent of the gnmt length penalty", low=0, group="decoding")
    batch_size: int = option(64, "sentences decoded together", low=1, group="decoding")
    unk_replace: bool = option(False, "replace generated <unk> by the most attended source "
                                      "word (an extension beyond the paper)", group="decoding")

    def check(self) -> None:
        if self.min_len > self.max_len:
            raise InputError(f"--min-len ({self.min_len}) exceeds --max-len ({self.max_len})")
        _check_alpha(self)


@dataclass(frozen=True)
class TrainOptions(SearchOptions):
    """`bahdanau train`: the data, model, optimisation, limits and run folder."""

    src_lang: str | None = option(None, "source language of the shipped Multi30k data "
                                        "(en when no --train-src)", on_resume="fixed", group="data")
    tgt_lang: str | None = option(None, "target language of the shipped Multi30k data "
                                        "(fr when no --train-src)", on_resume="fixed", group="data")
    # The training files may move on resume; their examples may not (the run checks a digest).
    data: str | None = option(None, "a prepared corpus (bahdanau prepare) to train on, instead "
                                    "of --train-src/--train-tgt", metavar="DIR", group="data")
    train_src: str | None = option(None, "training source file (default: shipped Multi30k)",
                                   metavar="FILE", group="data")
    train_tgt: str | None = option(None, "training target file", metavar="FILE", group="data")
    dev_src: str | None = option(None, "dev source file (default: shipped Multi30k val when "
                                       "training on it)", metavar="FILE", group="data")
    dev_tgt: str | None = option(None, "dev target file", metavar="FILE", group="data")
    test_src: str | None = option(None, "test source file (default: shipped Multi30k "
                                        "test_2016_flickr when training on it)", metavar="FILE",
                                  group="data")
    test_tgt: str | None = option(None, "test target file", metavar="FILE", group="data")
    model: ModelChoices = section(ModelChoices(), "model")  # --preset, --arch, --dropout, ...
    training: TrainConfig = section(JOB_TRAINING, "optimisation")  # --lr, --max-steps, ...
    # how the test report's BLEU reads the text: --test-lowercase, --test-tokenize, ...
    test_bleu: BleuText = section(BleuText(), "scoring", prefix="test_")
    init_from: str | None = option(
        None, "fine-tune: start from the weights of a trained model (a checkpoint, a run folder "
        "or a bahdanau release folder) on this run's data; the optimizer starts afresh (a "
        "resumed run keeps the model it began with: leave it out then)",
        on_resume="fixed", metavar="PATH", group="model")
    init_vocab: bool = option(
        True, "with --init-from: encode the data with the model's vocabularies and tokenizer "
        "(--no-init-vocab: build them from the data; they must equal the model's)",
        on_resume="fixed", group="model")
    vocab_size: int = option(10000, "most frequent words kept per side (the paper: 30000)",
                             low=1, on_resume="fixed", group="data")
    lowercase: bool = option(False, "lowercase both sides", on_resume="fixed", group="data")
    joiners: Literal["prefix", "punctuation"] = option(
        "prefix", "where the tokenizer marks glued tokens (punctuation: on the punctuation, so "
        "words stay the same token)", on_resume="fixed", group="data")
    max_train_len: int = option(50, "drop training pairs longer than this many tokens", low=1,
                                on_resume="fixed", group="data")
    time_budget: float | None = option(None, "stop after this many minutes of training; 0: no "
                                             "time limit (default: none for a new run, a "
                                             "resumed run keeps its own)", low=0, high=1e9,
                                      group="limits")
    dev_size: int = option(500, "dev sentences scored at each evaluation", low=1, group="data")
    tensorboard: bool = option(False, "also write TensorBoard events to OUT/tensorboard: each "
                                      "log line's numbers; per evaluation the dev BLEU, chrF "
                                      "and perplexity and a dev sentence's alignment image; "
                                      "the test scores at the end (needs the tensorboard "
                                      "extra)", group="output")
    threads: int | None = option(None, _THREADS_HELP, low=1, group="machine")
    device: str = option("auto", _DEVICE_HELP, group="machine")
    out: str = option("runs/multi30k-en-fr", "output folder", on_resume="not_recorded",
                      metavar="DIR", group="output")
    resume: bool = option(True, "continue the run in OUT from its latest checkpoint; "
                                "--no-resume refuses an OUT that holds a run",
                          on_resume="not_recorded", group="output")
    overwrite: bool = option(False, "start a new run in OUT, deleting the run it holds "
                                    "(checkpoints, options.json, results; other files stay)",
                             on_resume="not_recorded", group="output")

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
        self._check_init()
        self._check_inert()

    def _check_inert(self) -> None:
        """Options that act only with another one, given without it (which left them silently
        ignored): the dev evaluations' (--eval-every), the plateau schedule's, a decaying
        schedule's floor (--min-lr: the constant rate never decays to it), Adadelta's. (The
        plateau schedule itself without evaluations: `TrainConfig` refuses it.)"""
        t, job = self.training, JOB_TRAINING
        if not t.eval_every:
            _needs("--eval-every N", [
                (self.dev_src is not None, "--dev-src/--dev-tgt", "are read by dev evaluations"),
                (self.dev_size != _default(self, "dev_size"), f"--dev-size {self.dev_size}",
                 "sets the sentences of each dev evaluation"),
                (t.patience is not None, "--patience", "counts dev evaluations"),
                (t.early_stopping_metric != job.early_stopping_metric,
                 f"--early-stopping-metric {t.early_stopping_metric}",
                 "ranks dev evaluations (best.pt, --patience, --keep-best)"),
                (t.keep_best > 1, f"--keep-best {t.keep_best}",
                 "keeps the checkpoints of the best dev evaluations")])
        if t.schedule != "plateau":
            _needs("--schedule plateau", [
                (t.decay_factor != job.decay_factor, f"--decay-factor {t.decay_factor:g}",
                 "sets the plateau schedule's decays"),
                (t.decay_patience != job.decay_patience, f"--decay-patience {t.decay_patience}",
                 "sets the plateau schedule's decays")])
        if t.schedule == "constant":
            _needs("--schedule inverse_sqrt, plateau or linear", [
                (t.min_lr != job.min_lr, f"--min-lr {t.min_lr:g}",
                 "floors a decaying learning rate")])
        if t.optimizer != "adadelta":
            _needs("--optimizer adadelta", [
                (t.rho != job.rho, f"--rho {t.rho:g}", "is Adadelta's decay")])

    def _check_init(self) -> None:
        """--init-from's model brings its vocabularies and tokenizer (unless --no-init-vocab)."""
        if self.init_from is None:
            if not self.init_vocab:
                raise InputError("--no-init-vocab chooses the vocabularies of an --init-from "
                                 "run; it does nothing without --init-from")
            return
        if self.init_vocab and self.data is None:
            fixed = [name for name in ("vocab_size", "lowercase", "joiners")
                     if getattr(self, name) != TrainOptions.__dataclass_fields__[name].default]
            if fixed:
                raise InputError(f"{flag(fixed[0])} is fixed by the --init-from model (its "
                                 "vocabularies and tokenizer): leave it out, or give "
                                 "--no-init-vocab")

    @property
    def limits(self) -> Limits:
        """When training stops, as `TrainConfig` fields (max_steps, max_epochs, max_time_s).

        The limits given (--max-steps, --max-epochs, a non-zero --time-budget) and only they;
        with none, the shipped Multi30k trains for `DEFAULT_EPOCHS` epochs. The user's own
        corpus (--train-src or --data) has no default length: it needs a limit. A resumed run
        calls this once its stored --time-budget is known (`run_train_job`).

        Raises:
            InputError: no limit is given and the corpus is the user's own.
        """
        given = self.limits_given
        if any(value is not None for value in given.values()):
            return given
        if self.own_data or self.data is not None:
            raise InputError("set --max-steps, --max-epochs or a non-zero --time-budget: your "
                             "own corpus has no default training length")
        return Limits(max_steps=None, max_epochs=DEFAULT_EPOCHS, max_time_s=None)

    @property
    def limits_given(self) -> Limits:
        """The limits these options name (--max-steps, --max-epochs, a non-zero
        --time-budget), None for each one they leave out."""
        return Limits(max_steps=self.training.max_steps, max_epochs=self.training.max_epochs,
                      max_time_s=self.time_budget * 60 if self.time_budget else None)

    def train_config(self) -> TrainConfig:
        """The `TrainConfig` of these options: `training` with the `limits`."""
        return replace(self.training, **self.limits)

    @property
    def own_data(self) -> bool:
        """Trains on the user's files, not the shipped Multi30k."""
        return self.train_src is not None


@dataclass(frozen=True)
class TrustOptions(Options):
    """Whether a model of parts may import classes outside bahdanau (`read_checkpoint`)."""
    trust_code: bool = option(False, "import the classes outside bahdanau that a model's "
                              "config.json names (runs their code): for models you trust")


@dataclass(frozen=True)
class DecodeOptions(SearchOptions, TrustOptions):
    """What every command that loads a checkpoint takes."""

    checkpoint: tuple[str, ...] = option(
        None, f"{_CHECKPOINT_HELP}; several decode as an ensemble", required=True,
        metavar="PATH")
    device: str = option("auto", _DEVICE_HELP)
    threads: int | None = option(None, _THREADS_HELP, low=1)
    amp: Amp = option("none", _AMP_HELP)
    cuda_graphs: bool = option(False, "on CUDA, replay the decoder step as a CUDA graph "
                                      "recorded once per shape, the host looking at the batch "
                                      "every few steps (bahdanau.BeamSearch's cuda_graphs)")
    int8: bool = option(False, "on a CPU with VNNI, the decoder step's big matmuls in int8, per "
                               "output channel (bahdanau.RNNSearch.int8_copy)", group="decoding")


@dataclass(frozen=True)
class PhraseOptions(DecodeOptions):
    """What the commands that decode a file of sentences take besides: phrases each line's
    translation must hold, or must not (lexically constrained decoding, `bahdanau.constraints`;
    read by `bahdanau.jobs.resolve.phrase_files`)."""

    constraints: str | None = option(
        None, "JSON Lines, one list of phrases per input line (e.g. [\"un vélo\"]; [] for "
        "none) that its translation must hold, each contiguously (constrained decoding)",
        metavar="FILE", group="decoding")
    avoid: str | None = option(
        None, "JSON Lines, one list of phrases per input line that its translation must not "
        "hold", metavar="FILE", group="decoding")


@dataclass(frozen=True)
class TranslateOptions(PhraseOptions):
    """`bahdanau translate`."""

    input: str | None = option(None, "source file (default: stdin)", metavar="FILE")
    n_best: int = option(1, "hypotheses per sentence; >1 prints 'i ||| text ||| score'", low=1)
    alignments: str | None = option(None, "write each sentence's alignment here, one line per "
                                          "input line, as --alignments-format says",
                                    metavar="FILE")
    alignments_format: Literal["json", "pharaoh"] | None = option(
        None, "what --alignments holds per line: json (tokens and weights; the default) or "
        "pharaoh ('i-j' pairs, 0-based source token i and target token j, each target token "
        "with its most attended source token)")

    def check(self) -> None:
        super().check()
        if self.n_best > self.beam_size:
            raise InputError(f"--n-best ({self.n_best}) cannot exceed --beam-size "
                             f"({self.beam_size})")
        if self.alignments is None:
            _needs("--alignments FILE", [
                (self.alignments_format is not None,
                 f"--alignments-format {self.alignments_format}",
                 "sets what --alignments FILE holds")])


@dataclass(frozen=True)
class EvaluateOptions(PhraseOptions):
    """`bahdanau evaluate`."""

    src: str = option(None, "source file", required=True, metavar="FILE")
    ref: str = option(None, "reference file", required=True, metavar="FILE")
    output: str | None = option(None, "write the translations here", metavar="FILE")
    json: str | None = option(None, "write the scores here", metavar="FILE")
    bleu: BleuText = section(BleuText(), "scoring")     # --lowercase, --tokenize, --moses-lang
    metric: tuple[str, ...] | None = option(
        None, "also score as transduction, beside BLEU/chrF: wer (a line is wrong unless it "
        "equals a reference), per (edit distance in target tokens to the closest reference) "
        "or accuracy; lines of the same source are one item with several references "
        "(bahdanau.error_rates)", metavar="NAME")

    def check(self) -> None:
        super().check()
        for name in self.metric or ():
            if name not in METRICS:
                raise InputError(f"--metric {name}: choose from {', '.join(METRICS)}")


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
class ScoreOptions(TrustOptions):
    """`bahdanau score`: the log-probabilities of given translations (forced decoding)."""

    checkpoint: str = option(None, _CHECKPOINT_HELP, required=True, metavar="PATH")
    src: str = option(None, "source file, one sentence a line", required=True, metavar="FILE")
    tgt: str = option(None, "the translations to score, line-aligned with --src",
                      required=True, metavar="FILE")
    output: str | None = option(None, "write the scores here (default: stdout)", metavar="FILE")
    batch_size: int = option(64, "sentences scored together", low=1)
    length_penalty: LengthPenalty = option(
        "none", "the normalisation of the second column, as translate's --length-penalty")
    alpha: float = option(0.6, "exponent of the gnmt length penalty", low=0)
    device: str = option("auto", _DEVICE_HELP)
    threads: int | None = option(None, _THREADS_HELP, low=1)
    amp: Amp = option("none", _AMP_HELP)

    def check(self) -> None:
        _check_alpha(self)


@dataclass(frozen=True)
class ExportOptions(TrustOptions):
    """`bahdanau export`: the encoder and the decoder step as programs for serving."""

    checkpoint: str = option(None, _CHECKPOINT_HELP, required=True, metavar="PATH")
    out: str = option(None, "the folder to write (created; absent or empty)", required=True,
                      metavar="DIR")
    onnx: bool = option(False, "also write both programs as ONNX (encoder.onnx, step.onnx) for "
                               "onnxruntime; needs the onnx extra: pip install 'bahdanau[onnx]'")

@dataclass(frozen=True)
class AverageOptions(Options):
    """`bahdanau average`: one checkpoint whose weights are the mean of several."""

    checkpoint: tuple[str, ...] = option(
        None, "checkpoint files to average, or one training output folder (with --last or "
        "--best)", required=True, metavar="PATH")
    last: int | None = option(None, "average the folder's last N numbered checkpoints (of the "
                                    "run's last --keep-last saves)", low=1)
    best: int | None = option(None, "average the checkpoints of the folder's N best dev "
                                    "evaluations (train with --keep-best N)", low=1)
    output: str = option(None, "the averaged checkpoint to write", required=True,
                                metavar="FILE")
    allow_different_runs: bool = option(False, "average checkpoints of different runs too "
                                               "(another seed or data; their mean usually "
                                               "translates worse)")

    def check(self) -> None:
        if self.last is not None and self.best is not None:
            raise InputError("give --last N or --best N, not both")


# An SPDX licence id, or an expression of them ("apache-2.0", "MIT OR Apache-2.0",
# "GPL-2.0-only WITH Classpath-exception-2.0", "LicenseRef-mine"): what --license takes.
_SPDX_WORD = r"[A-Za-z0-9][A-Za-z0-9.+:-]*"
SPDX_ID = re.compile(rf"{_SPDX_WORD}(?: (?:AND|OR|WITH) {_SPDX_WORD})*")

# Words a side that `bahdanau prepare` keeps by default (a SentencePiece model keeps its pieces).
PREPARE_WORDS = 10000


@dataclass(frozen=True)
class ReleaseOptions(TrustOptions):
    """`bahdanau release`: a trained model as a folder to share (docs/release-format.md)."""

    checkpoint: str = option(None, _CHECKPOINT_HELP, required=True, metavar="PATH")
    out: str = option(None, "the model folder to write", required=True, metavar="DIR")
    overwrite: bool = option(False, "replace the model folder OUT holds (never a folder of "
                                    "another kind or of other files)")
    license: str | None = option(None, "the licence the model is shared under, as an SPDX id "
                                       "(apache-2.0, cc-by-4.0, mit, ...; other), written into "
                                       "the model card (default: not stated)",
                                 metavar="SPDX-ID")

    def check(self) -> None:
        if self.license is not None and not SPDX_ID.fullmatch(self.license):
            raise InputError(f"--license {self.license!r} is not an SPDX licence id: give one "
                             "like apache-2.0, cc-by-4.0 or mit (or other)")


@dataclass(frozen=True)
class PrepareOptions(Options):
    """`bahdanau prepare`: a parallel corpus tokenised and encoded once, for `train --data`."""

    out: str = option(None, "the prepared corpus folder to write", required=True,
                             metavar="DIR")
    train_src: str | None = option(None, "source file, plain or gzip (default: the shipped "
                                         "Multi30k training data)", metavar="FILE")
    train_tgt: str | None = option(None, "target file, line-aligned with --train-src",
                                   metavar="FILE")
    src_lang: str | None = option(None, "source language of the shipped Multi30k data "
                                        "(en when no --train-src)")
    tgt_lang: str | None = option(None, "target language of the shipped Multi30k data "
                                        "(fr when no --train-src)")
    tokenizer: Literal["default", "char", "bpe", "unigram"] = option(
        "default", "default: words and punctuation; char: characters (a space is the symbol "
        "U+2581); bpe or unigram: a SentencePiece model trained on the corpus (needs the "
        "sentencepiece extra)")
    target_tokenizer: Literal["same", "default", "whitespace", "char"] = option(
        "same", "the target side's own tokenizer (same: --tokenizer's); e.g. --tokenizer char "
        "--target-tokenizer whitespace: letters in, space-separated phonemes out")
    sentencepiece_model: str | None = option(
        None, "use this trained SentencePiece model (instead of --tokenizer)", metavar="FILE")
    subword_vocab: int = option(8000, "pieces of a SentencePiece model trained here", low=1)
    sample_sentences: int = option(1_000_000, "most sentences a side that SentencePiece "
                                              "training reads", low=1)
    vocab_size: int | None = option(None, "most frequent tokens kept per side (default: "
                                          f"{PREPARE_WORDS} words, or every piece of a "
                                          "SentencePiece model; the paper: 30000)", low=1)
    lowercase: bool = option(False, "lowercase the sides of the default tokenizer (both, "
                                    "unless --tokenizer or --target-tokenizer gives one another)")
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
                                    "OUT, or rebuild a damaged one")

    def check(self) -> None:
        if (self.train_src is None) != (self.train_tgt is None):
            raise InputError("give both --train-src and --train-tgt, or neither")
        _check_shipped_languages(self.src_lang, self.tgt_lang, self.train_src is not None)
        if self.sentencepiece_model is not None and self.tokenizer != "default":
            raise InputError("--sentencepiece-model uses a trained model; --tokenizer "
                             f"{self.tokenizer} would train another: give one of them")
        subwords = self.sentencepiece_model is not None or self.tokenizer in ("bpe", "unigram")
        if subwords and self.target_tokenizer != "same":
            raise InputError(f"--target-tokenizer {self.target_tokenizer}: a SentencePiece "
                             "model tokenizes both sides; leave it out")
        uses_default = "default" in (self.tokenizer, self.target_tokenizer) and not subwords
        if not uses_default and (self.lowercase or self.joiners != "prefix"):
            raise InputError("--lowercase and --joiners set the default tokenizer, which "
                             "neither side uses")
        if self.tokenizer in ("default", "char"):      # no SentencePiece model trained here
            _needs("--tokenizer bpe or unigram", [
                (self.subword_vocab != _default(self, "subword_vocab"),
                 f"--subword-vocab {self.subword_vocab}",
                 "sizes the SentencePiece model trained here"),
                (self.sample_sentences != _default(self, "sample_sentences"),
                 f"--sample-sentences {self.sample_sentences}",
                 "is what SentencePiece training reads")])
