"""The `bahdanau` command: prepare, train, translate, evaluate, plot, average, release, score,
export.

`bahdanau train` with no options is the default job: a small RNNsearch trained on the shipped
Multi30k English->French data for 5 epochs (`bahdanau.jobs.options.DEFAULT_EPOCHS`), then evaluated
on test_2016_flickr (BLEU with sacrebleu's signature, BLEU without [UNK], BLEU by length), with
translations and an alignment plot written to the output folder. What it logs (on stderr, each
line with its time) also goes to the run's ``train.log``; ``--tensorboard`` also writes
TensorBoard events (`bahdanau.training.runlog`).

Every command takes ``--quiet`` (only warnings and errors on the console) or ``--verbose`` (more
detail), and ``--no-progress``: with the progress extra, long work draws progress bars on
stderr when it is a terminal (`bahdanau._progress`; training's: `bahdanau.training.progress`);
stdout carries only a command's results (translations, scores). ``bahdanau --version`` prints
the package's version, at once (`bahdanau._about.answer_version`: torch is not imported).

Every option is declared once, in `bahdanau.jobs.options`, and checked with the files, devices and
run folder before any work. A user's mistake (`bahdanau.InputError`, a usage error, a file that
cannot be read or written) and a training loader process that died
(`bahdanau.training.LoaderWorkerError`) end with one ``bahdanau: error: ...`` line and exit
status 2 (``train`` also writes it into the run's train.log); any other exception is a bug and
keeps its traceback. A misspelt option is named with the command's nearest one
(``--max_steps``: did you mean ``--max-steps``?). stdout closed by its reader (``bahdanau
translate ... | head -1``) is no error: the command ends quietly with status 141 (128 +
SIGPIPE), as other Unix tools do, its other outputs left as they were
(`bahdanau.jobs.files.StdoutClosed`).

`bahdanau prepare` tokenises and encodes a corpus of any size once, into a memory-mapped folder
(`bahdanau.data`); `bahdanau train --data FOLDER` trains on it, with its tokenizer and
vocabularies.

`bahdanau train --config FILE` reads options from a YAML (with PyYAML) or JSON file; flags given
on the command line override it.

`bahdanau average` writes one checkpoint whose weights are the mean of several (the last N of a
run, its N best, or files), which the other commands load like any checkpoint; translate,
evaluate and plot given several checkpoints decode with their ensemble.

`bahdanau release` writes a trained model as a folder to share (weights as safetensors, plain
config, vocabularies and tokenizer, a model card, a manifest of digests:
docs/release-format.md), which every command that takes --checkpoint reads.
`bahdanau score` scores given translations (forced decoding, `bahdanau.evaluate.score_corpus`);
`bahdanau export` writes a checkpoint's encoder and decoder step as `torch.export` programs for
serving (`bahdanau.serving.export_folder`).

Under ``torchrun --nproc-per-node N -m bahdanau train ...`` the N processes train one run with
DDP (NCCL on CUDA, each process on cuda:LOCAL_RANK; gloo on CPU): rank 0 alone holds and writes
the run folder, logs, evaluates and scores the test set (docs/guides/multi-gpu.md).

Outputs (``--output``, ``--json``, ``--alignments``) never destroy what their path is: a file is
replaced whole (a symlink keeps linking to it), a device, a FIFO or ``/dev/stdout`` is written
into, and ``evaluate --json -`` / ``--output -`` print to stdout (the report then goes to
stderr). A failed write (a full disk) is one error line; a file of a run folder (its
checkpoints, ``options.json``, ``train.log``, ...) is refused as the output of another command.

A run folder (``--out``) holds one run: its options (``options.json``), its checkpoints and its
results. Running the same command again resumes it; options that define the model, the data or
the batches cannot change on resume, the others (learning rate, limits, cadence, decoding,
threads, device) are applied and logged; a --time-budget not given keeps the run's own.
``--overwrite`` starts a new run there, deleting the old one first (its train.log and
tensorboard/ too). SIGINT (Ctrl-C) or SIGTERM saves a checkpoint at the end of the current step
and exits; a finished run is not trained further. Ctrl-C at any other moment of any command,
its start-up (the imports) included, is one ``bahdanau: interrupted`` line and exit status 130
(`bahdanau._interrupt`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from bahdanau import _interrupt
from bahdanau._about import version_line
from bahdanau._progress import clear_bars, show_progress
from bahdanau.cli.commands import (
    PLOT_MAX_TOKENS,
    average,
    evaluate,
    plot,
    prepare,
    release,
    translate,
)
from bahdanau.cli.export import export
from bahdanau.cli.score import score
from bahdanau.errors import InputError
from bahdanau.jobs.files import StdoutClosed, existing
from bahdanau.jobs.flags import NONE
from bahdanau.jobs.options import (
    AverageOptions,
    EvaluateOptions,
    ExportOptions,
    PlotOptions,
    PrepareOptions,
    ReleaseOptions,
    ScoreOptions,
    SearchOptions,
    TrainOptions,
    TranslateOptions,
    add_arguments,
    flat_settings,
)
from bahdanau.jobs.train_job import run_train_job
from bahdanau.plot import MAX_CELLS, PlotDependencyError
from bahdanau.training.plan import LoaderWorkerError
from bahdanau.training.runlog import LOGGER, LogFormatter

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:                   # one line, no usage dump
        self.exit(2, f"bahdanau: error: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's; a command's (a subparser's) unknown option is refused here, where
        its options are known, with the nearest of them (`_did_you_mean`)."""
        parsed, extras = super().parse_known_args(args, namespace)
        unknown = [arg for arg in extras if arg.startswith("--")]
        if unknown and self.prog != "bahdanau":
            known = [flag for action in self._actions for flag in action.option_strings]
            hint = _did_you_mean(unknown[0].split("=", 1)[0], known)
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed, extras


def _did_you_mean(option: str, known: Sequence[str]) -> str:
    """``; did you mean --x?`` for an unknown `option` near a `known` one: the same with
    dashes for underscores (--max_steps), the initials of its words (--learning_rate: --lr),
    or one close in spelling (difflib); else ''."""
    words = option.lstrip("-").replace("_", "-").split("-")
    for candidate in ("--" + "-".join(words), "--" + "".join(w[:1] for w in words if w)):
        if candidate in known:
            return f"; did you mean {candidate}?"
    names = {flag.lstrip("-"): flag for flag in known if flag.startswith("--")}
    close = difflib.get_close_matches("-".join(words), names, n=1, cutoff=0.7)
    return f"; did you mean {names[close[0]]}?" if close else ""


_COMMANDS: dict[str, tuple[type[Any], str, str]] = {
    "prepare": (PrepareOptions, "tokenise and encode a parallel corpus once, for train --data",
                "Tokenise, filter and encode a parallel corpus (plain or gzip files, any size) "
                "into a memory-mapped prepared folder that train --data reads. Without "
                "--train-src: the shipped Multi30k training data."),
    "train": (TrainOptions, "train a model, then evaluate it on the test set",
              "Train RNNsearch/RNNencdec and evaluate it. Without options: the default job on "
              "the shipped Multi30k en->fr data."),
    "translate": (TranslateOptions, "translate stdin or a file to stdout",
                  "Translate stdin or a file to stdout, one line per line."),
    "evaluate": (EvaluateOptions, "BLEU/chrF of a checkpoint on a test set",
                 "BLEU/chrF of a checkpoint on a test set."),
    "plot": (PlotOptions, "alignment heat map of one sentence",
             f"Alignment heat map of one sentence (at most {PLOT_MAX_TOKENS} tokens; a longer "
             f"one is refused before the model runs): source words along the top, the "
             f"translation down the side, weights on a fixed 0..1 colour scale. At most "
             f"{MAX_CELLS} target rows and source columns are drawn; the title says when the "
             f"translation is cut."),
    "average": (AverageOptions, "average the weights of several checkpoints into one",
                "Write one checkpoint whose weights are the mean of several: the last N or "
                "best N of a training output folder, or the files given."),
    "release": (ReleaseOptions, "write a trained model as a folder to share",
                "Write a model folder to share: the weights as safetensors, the model config, "
                "vocabularies and tokenizer as plain files, a model card (README.md) and a "
                "manifest with the SHA-256 of every file. bahdanau.load, translate, evaluate "
                "and train --init-from read it. Needs the share extra (safetensors)."),
    "score": (ScoreOptions, "log-probabilities of given translations (forced decoding)",
              "Score given translations with a model (a checkpoint file, a model folder from "
              "bahdanau release, or a training output folder): per line, log p(target | source) "
              "(eos included), the score the search would rank it by (--length-penalty), and "
              "the number of target tokens plus eos, tab-separated."),
    "export": (ExportOptions, "the model as torch.export programs, for serving",
               "Write the encoder and the decoder step of a model (a checkpoint file, a model "
               "folder from bahdanau release, or a training output folder) as torch.export "
               "programs (dynamic batch and source length), with its vocabularies, tokenizer, a "
               "manifest and a README of the decoding loop, into a new folder."),
}


def _add_console_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every command that say what it shows on the console (not recorded with a
    run's options): --quiet or --verbose, and --no-progress."""
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true",
                       help="log only warnings and errors on the console (train.log keeps all)")
    shown.add_argument("--verbose", action="store_true", help="also log debugging detail")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (default: on stderr when it is a terminal, with "
                             "the progress extra)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `bahdanau` command (options from `bahdanau.jobs.options`)."""
    parser = _Parser(prog="bahdanau", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (options, helptext, description) in _COMMANDS.items():
        command = sub.add_parser(name, help=helptext, description=description,
                                 allow_abbrev=False)         # --overw is not --overwrite
        if name == "train":
            command.add_argument("--config", metavar="FILE",
                                 help="options from a YAML or JSON file (keys: the option names, "
                                      "e.g. max_steps); flags given here override it; a run's "
                                      "OUT/options.json reproduces it")
        add_arguments(command, options)
        _add_console_flags(command)
    return parser


_RUN: dict[str, Callable[[Any], int]] = {
    "prepare": prepare, "translate": translate, "evaluate": evaluate, "plot": plot,
    "average": average, "release": release, "score": score, "export": export}


class _DuplicateKey(ValueError):
    """A config file names an option twice (raised while parsing; no JSON or YAML error)."""


def _unique(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A mapping's (key, value) pairs as a dict; a key given twice is refused, since the file
    would otherwise silently mean its last value."""
    data: dict[Any, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(f"the option {key!r} is given twice")
        data[key] = value
    return data


def _yaml_load(text: bytes) -> Any:
    """`yaml.safe_load` whose mappings refuse a duplicate key (`_unique`)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            _unique([(self.construct_object(key, deep=deep), None) for key, _ in node.value
                     if key.tag != "tag:yaml.org,2002:merge"])   # "<<" may override, as usual
            return super().construct_mapping(node, deep=deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                    UniqueKeyLoader.construct_mapping)
    return yaml.load(text, Loader=UniqueKeyLoader)


def _config_file(path: str, options: type[SearchOptions]) -> dict[str, Any]:
    """The option values in a --config file: JSON, or YAML (with PyYAML installed); an option
    named twice is refused."""
    text = existing(path, "--config").read_bytes()
    try:
        data = json.loads(text, object_pairs_hook=_unique)
    except _DuplicateKey as err:
        raise InputError(f"--config {path}: {err}") from None
    except RecursionError:
        raise InputError(f"--config {path} is nested too deeply to read; it holds options "
                         "by name") from None
    except ValueError:                   # not JSON (or not UTF-8): YAML, which needs PyYAML
        try:
            import yaml
        except ImportError:
            raise InputError(f"--config {path}: reading YAML needs PyYAML: pip install "
                             "'bahdanau[yaml]' (or write the file as JSON)") from None
        try:
            data = _yaml_load(text)
        except _DuplicateKey as err:
            raise InputError(f"--config {path}: {err}") from None
        except RecursionError:
            raise InputError(f"--config {path} is nested too deeply to read; it holds options "
                             "by name") from None
        except yaml.YAMLError as err:
            detail = " ".join(str(err).split())
            raise InputError(f"--config {path} is not valid YAML: {detail}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"--config {path} must map option names to values, not hold a "
                         f"{type(data).__name__}")
    settings = {setting.key: setting for setting in flat_settings(options)}
    try:                                 # "max-steps" and "max_steps" name one option
        values = _unique([(str(key).replace("-", "_"), value) for key, value in data.items()])
    except _DuplicateKey as err:
        raise InputError(f"--config {path}: {err}") from None
    values.pop("versions", None)         # what a run's options.json records it ran with
    unknown = sorted(set(values) - set(settings))
    if unknown:
        raise InputError(f"--config {path}: unknown option {unknown[0]!r}")
    # In a file a null is a value, not an option left out: an optional number's None, as a
    # run's options.json records a moving average turned off (--ema-decay none)
    return {key: NONE if value is None and settings[key].takes_none else value
            for key, value in values.items()}


class _ConsoleHandler(logging.StreamHandler):
    """Log records on stderr, clearing the progress bars while a line is written."""

    def emit(self, record: logging.LogRecord) -> None:
        with clear_bars():
            super().emit(record)


@contextmanager
def _console(quiet: bool, verbose: bool, no_progress: bool) -> Iterator[None]:
    """While inside: the package's log records on stderr with their time (`LogFormatter`;
    warnings only with `quiet`, debugging detail too with `verbose`), and progress bars as
    asked; on leaving, the logger and the bars are as they were."""
    handler = _ConsoleHandler(sys.stderr)
    handler.setFormatter(LogFormatter())
    handler.setLevel(logging.WARNING if quiet else logging.NOTSET)
    before = LOGGER.level, LOGGER.propagate
    LOGGER.setLevel(logging.DEBUG if verbose else logging.INFO)
    LOGGER.propagate = False                   # the records are shown here, once
    LOGGER.addHandler(handler)
    shown = show_progress(False if no_progress else None)
    try:
        yield
    finally:
        show_progress(shown)
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(before[0])
        LOGGER.propagate = before[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bahdanau` console script and `python -m bahdanau`. Ctrl-C at any
    moment ends it with one line and status 130: while its modules are imported,
    `bahdanau._interrupt`'s handler; from here on, as a KeyboardInterrupt (training stops at
    the end of its step first)."""
    _interrupt.started()
    try:
        args = vars(build_parser().parse_args(argv))
        command = args.pop("command")
        config = args.pop("config", None)
        console = [args.pop(name) for name in ("quiet", "verbose", "no_progress")]
        with _console(*console):
            return _run(command, config, args, argv)
    except KeyboardInterrupt:
        return _interrupt.interrupted()


def _run(command: str, config: str | None, args: dict[str, Any],
         argv: Sequence[str] | None) -> int:
    """Run `command` with the parsed `args`; a user's mistake is one line and status 2."""
    try:
        if config is not None:               # the file's values, then the flags given here
            given = {name: value for name, value in args.items() if value is not None}
            args = {**_config_file(config, _COMMANDS[command][0]), **given}
        options = _COMMANDS[command][0].from_mapping(args, text=True)
        if command == "train":                   # its log file names the command line
            line = sys.argv[1:] if argv is None else list(argv)
            result = run_train_job(options, shlex.join(["bahdanau", *line]))
            return 0 if result.signal is None else 128 + result.signal
        return _RUN[command](options)
    except StdoutClosed:                 # `... | head -1`: what was asked for was read
        _discard_stdout()
        return 128 + signal.SIGPIPE
    except (InputError, LoaderWorkerError, OSError, PlotDependencyError) as exc:
        message = " ".join(str(exc).split("\n"))
        print(f"bahdanau: error: {message}", file=sys.stderr)
        return 2


def _discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is left in its buffer, flushed as the
    process ends, then goes nowhere instead of failing again on the closed pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):     # not a file (a test's stream)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
