"""The `bahdanau` command: prepare, train, translate, evaluate, plot, average.

`bahdanau train` with no options is the default job: a small RNNsearch trained on the shipped
Multi30k English->French data for 5 epochs (`bahdanau.options.DEFAULT_EPOCHS`), then evaluated
on test_2016_flickr (BLEU with sacrebleu's signature, BLEU without [UNK], BLEU by length), with
translations and an alignment plot written to the output folder. What it prints also goes to
the run's ``train.log``; ``--tensorboard`` also writes TensorBoard events
(`bahdanau.training.runlog`).

Every option is declared once, in `bahdanau.options`, and checked with the files, devices and
run folder before any work. A user's mistake (`bahdanau.InputError`, a usage error, a file that
cannot be read or written) ends with one ``bahdanau: error: ...`` line and exit status 2; any
other exception is a bug and keeps its traceback.

`bahdanau prepare` tokenises and encodes a corpus of any size once, into a memory-mapped folder
(`bahdanau.data`); `bahdanau train --data FOLDER` trains on it, with its tokenizer and
vocabularies.

`bahdanau train --config FILE` reads options from a YAML (with PyYAML) or JSON file; flags given
on the command line override it.

`bahdanau average` writes one checkpoint whose weights are the mean of several (the last N of a
run, its N best, or files), which the other commands load like any checkpoint; translate,
evaluate and plot given several checkpoints decode with their ensemble.

Under ``torchrun --nproc-per-node N -m bahdanau train ...`` the N processes train one run with
DDP (NCCL on CUDA, each process on cuda:LOCAL_RANK; gloo on CPU): rank 0 alone holds and writes
the run folder, logs, evaluates and scores the test set (docs/guides/multi-gpu.md).

A run folder (``--out``) holds one run: its options (``config.yaml``), its checkpoints and its
results. Running the same command again resumes it; options that define the model, the data or
the batches cannot change on resume, the others (learning rate, limits, cadence, decoding,
threads, device) are applied and logged; a --time-budget not given keeps the run's own.
``--overwrite`` starts a new run there, deleting the old one first (its train.log and
tensorboard/ too). SIGINT (Ctrl-C) or SIGTERM saves a checkpoint at the end of the current step
and exits; a finished run is not trained further.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from bahdanau import presets
from bahdanau._checks import default_device, default_threads, launcher_value, resolve_device
from bahdanau._files import atomic_file, atomic_write
from bahdanau.checkpoint.averaging import average_checkpoints, select_checkpoints
from bahdanau.checkpoint.files import save_checkpoint
from bahdanau.checkpoint.manager import CheckpointManager, find_checkpoint
from bahdanau.config import TrainConfig
from bahdanau.data.batching import encode_pairs
from bahdanau.data.corpus import PreparedCorpus, TrainSentencePiece, prepare_corpus
from bahdanau.data.sentencepiece import SentencePieceTokenizer
from bahdanau.data.text import decode_lines, iter_lines, multi30k_files, read_lines, read_parallel
from bahdanau.data.tokenizers import DefaultTokenizer, Tokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.evaluate import Translation, corpus_bleu, score_test_set, translate_corpus
from bahdanau.models import build_model
from bahdanau.options import (
    AverageOptions,
    DecodeOptions,
    EvaluateOptions,
    PlotOptions,
    PrepareOptions,
    SearchOptions,
    TrainOptions,
    TranslateOptions,
    add_arguments,
    resume_changes,
    resumed_options,
)
from bahdanau.plot import PlotDependencyError
from bahdanau.search import BeamSearch
from bahdanau.training.distributed import leave_process_group
from bahdanau.training.loop import train_run
from bahdanau.training.run import setup_run, stop_reason
from bahdanau.training.runlog import TensorBoardLog, TrainLog, require_tensorboard
from bahdanau.translate import load

RUN_CONFIG = "config.yaml"      # a run folder's options (JSON, which YAML readers also read)
RUN_FILES = ("checkpoints", RUN_CONFIG, "metrics.json", "test.hyp.txt", "alignment.png",
             "train.log", "tensorboard")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:                   # one line, no usage dump
        self.exit(2, f"bahdanau: error: {message} (see '{self.prog} --help')\n")


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
             "Alignment heat map of one sentence."),
    "average": (AverageOptions, "average the weights of several checkpoints into one",
                "Write one checkpoint whose weights are the mean of several: the last N or "
                "best N of a training output folder, or the files given."),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `bahdanau` command (options from `bahdanau.options`)."""
    parser = _Parser(prog="bahdanau", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (options, helptext, description) in _COMMANDS.items():
        command = sub.add_parser(name, help=helptext, description=description,
                                 allow_abbrev=False)         # --overw is not --overwrite
        if name == "train":
            command.add_argument("--config", metavar="FILE",
                                 help="options from a YAML or JSON file (keys: the option names, "
                                      "e.g. max_steps); flags given here override it; a run's "
                                      "OUT/config.yaml reproduces it")
        add_arguments(command, options)
    return parser


# --------------------------------------------------------------------------------- helpers
def _existing(path: str | None, what: str) -> Path | None:
    """`path` as a readable file, checked before any work."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} {path}: no such file")
    if p.is_dir():                                 # pipes such as /dev/stdin are fine
        raise InputError(f"{what} {path} is a folder, not a file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{what} {path}: not readable")
    return p


def _check_outputs(outputs: dict[str, str | None], inputs: dict[str, Path | None]) -> None:
    """Refuse, before any work, an output file that cannot be created, or that is one of the
    inputs (a checkpoint, a source file) or another output: nothing the user gave is lost."""
    taken = {os.path.realpath(p): what for what, p in inputs.items() if p is not None}
    for what, path in outputs.items():
        if path is None:
            continue
        p = Path(path)
        if p.is_dir():
            raise InputError(f"{what} {path} is a folder, not a file")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            problem = "is not a folder" if parent.exists() else "does not exist"
            raise InputError(f"{what} {path}: folder {parent} {problem}")
        if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise InputError(f"{what} {path}: not writable")
        real = os.path.realpath(p)
        if real in taken:
            raise InputError(f"{what} {path} is also {taken[real]}: writing it would destroy it")
        taken[real] = what


def _write_text(path: Path, text: str) -> None:
    """Write a result file atomically: a crash leaves the old file or the new one."""
    data = text.encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


def _pairs(src: str, tgt: str, split: str) -> list[tuple[str, str]]:
    return read_parallel(_existing(src, f"--{split}-src"), _existing(tgt, f"--{split}-tgt"),
                         non_empty=True)


def _shipped(split: str, src_lang: str, tgt_lang: str) -> list[tuple[str, str]]:
    name = {"train": "train", "dev": "val", "test": "test_2016_flickr"}[split]
    return read_parallel(multi30k_files(name, src_lang), multi30k_files(name, tgt_lang))


def _data(o: TrainOptions, corpus: PreparedCorpus | None) -> tuple[list, list, list]:
    """(train, dev, test) pairs; train is [] with a prepared `corpus` (--data). The shipped
    Multi30k is used only when no --train-src is given (or the prepared corpus is the shipped
    one); with the user's own files, dev and test come only from --dev-*/--test-* (or are
    empty)."""
    shipped = None if o.own_data else {"src_lang": o.src_lang or "en",
                                       "tgt_lang": o.tgt_lang or "fr"}
    if corpus is not None:
        shipped = corpus.manifest.get("shipped")
    sets = []
    for split in ("train", "dev", "test"):
        src, tgt = getattr(o, f"{split}_src"), getattr(o, f"{split}_tgt")
        if src is not None:
            sets.append(_pairs(src, tgt, split))
        elif shipped is not None and not (split == "train" and corpus is not None):
            sets.append(_shipped(split, shipped["src_lang"], shipped["tgt_lang"]))
        else:
            sets.append([])
    if o.eval_every and not sets[1]:
        raise InputError("--eval-every needs a dev set: give --dev-src and --dev-tgt")
    return sets[0], sets[1], sets[2]


def _sentences(path: Path | None) -> list[str]:
    """The source sentences of `path` (None: stdin, read as bytes and decoded exactly like a
    file); an empty line is refused, naming the line."""
    lines = read_lines(path) if path else decode_lines(sys.stdin.buffer.read(), "<stdin>")
    for i, line in enumerate(lines):
        if not line.strip():
            raise InputError(f"{path or '<stdin>'}: line {i + 1} is empty; every line needs a "
                             "sentence to translate")
    return lines


def _search(o: SearchOptions, n_best: int = 1) -> BeamSearch:
    return BeamSearch(beam_size=o.beam_size, n_best=n_best, max_len=o.max_len,
                      max_len_ratio=o.max_len_ratio, min_len=o.min_len,
                      length_penalty=o.length_penalty, alpha=o.alpha)


def _machine(o: TrainOptions | DecodeOptions) -> torch.device:
    """Check --device (auto: cuda when available, else cpu) and set --threads (default: the
    usable cores divided by LOCAL_WORLD_SIZE); returns the device. Under torchrun, cuda is
    each process's own GPU, cuda:LOCAL_RANK."""
    device = resolve_device(default_device() if o.device == "auto" else o.device, "--device")
    if launcher_value("WORLD_SIZE") > 1 and device.type == "cuda":
        if device.index is not None:
            raise InputError(f"--device {o.device}: under torchrun each process trains on "
                             "cuda:LOCAL_RANK; give --device cuda (or auto)")
        device = resolve_device(f"cuda:{launcher_value('LOCAL_RANK')}", "cuda:LOCAL_RANK")
        torch.cuda.set_device(device)
    torch.set_num_threads(o.threads or default_threads())
    return device


def _check_launcher() -> None:
    """Several processes (WORLD_SIZE > 1) need torch.distributed and what torchrun sets."""
    world = launcher_value("WORLD_SIZE")
    if world == 1:
        return
    if not torch.distributed.is_available():
        raise InputError(f"WORLD_SIZE is {world}, but this torch has no torch.distributed")
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise InputError(f"WORLD_SIZE is {world} but {', '.join(missing)} not set: start the "
                         "processes with torchrun")


@contextmanager
def _processes(device: torch.device) -> Iterator[bool]:
    """Under torchrun (WORLD_SIZE > 1, checked by `_check_launcher`), the process group of the
    run's processes (NCCL on CUDA, gloo on CPU) while inside; yields whether this process is
    rank 0, the one that writes the run folder, logs and scores the test set."""
    if launcher_value("WORLD_SIZE") == 1:
        yield True
        return
    dist = torch.distributed
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield dist.get_rank() == 0
    except BaseException:                   # the others may be anywhere: no barrier
        dist.destroy_process_group()
        raise
    leave_process_group()


def _checkpoints(o: DecodeOptions) -> dict[str, Path]:
    """The --checkpoint files (each a file, or a folder's best or latest), named for
    `_check_outputs`: "--checkpoint", or "--checkpoint FILE" for each of several."""
    paths = [find_checkpoint(p, "--checkpoint") for p in o.checkpoint]
    if len(paths) == 1:
        return {"--checkpoint": paths[0]}
    return {f"--checkpoint {p}": p for p in paths}


def _load(o: DecodeOptions, paths: dict[str, Path], device: torch.device
          ) -> tuple[torch.nn.Module, Vocab, Vocab, Tokenizer]:
    """The checkpoint's model (the ensemble of several), vocabularies and the tokenizer it was
    trained with."""
    files = list(paths.values())
    t = load(files[0] if len(files) == 1 else files, device=device)
    if o.unk_replace and t.model.arch == "rnnencdec":
        what = "is an RNNencdec model" if len(files) == 1 else "are RNNencdec models"
        raise InputError(f"--unk-replace needs attention weights; {' '.join(map(str, files))} "
                         f"{what}")
    return t.model, t.src_vocab, t.tgt_vocab, t.tokenizer


def _report(model, sources: list[str], references: list[str], src_vocab: Vocab, tgt_vocab: Vocab,
            tokenizer: Tokenizer, o: SearchOptions, search: BeamSearch,
            device: torch.device) -> tuple[dict[str, Any], list]:
    start = time.perf_counter()
    out = translate_corpus(model, sources, src_vocab, tgt_vocab, tokenizer, search=search,
                           batch_size=o.batch_size, unk_replace=o.unk_replace, device=device)
    seconds = time.perf_counter() - start
    metrics = score_test_set([t.text for t in out], sources, references, src_vocab, tgt_vocab,
                             tokenizer)
    metrics.update(beam_size=o.beam_size, decode_seconds=round(seconds, 2))
    return metrics, out


def _print_metrics(metrics: dict[str, Any], say: Callable[[str], None] = print) -> None:
    say(f"BLEU {metrics['bleu']:.2f}  chrF {metrics['chrf']:.2f}  "
        f"({metrics['sentences']} sentences, beam {metrics['beam_size']}, "
        f"{metrics['decode_seconds']:.1f} s)")
    say(f"  {metrics['bleu_signature']}")
    no_unk = metrics["bleu_no_unk"]
    say(f"BLEU without [UNK]: {'-' if no_unk is None else f'{no_unk:.2f}'} "
        f"({metrics['sentences_no_unk']} sentences)")
    say("BLEU by source length:")
    for b in metrics["bleu_by_length"]:
        if b["sentences"]:
            span = f"{b['low']}-{b['high'] - 1}" if b["high"] is not None else f"{b['low']}+"
            say(f"  {span:>7} tokens: {b['bleu']:6.2f}  ({b['sentences']} sentences)")


def _typical(sources: list[str], tokenizer: Tokenizer) -> int:
    """The index of the sentence whose alignment a run shows: the first of about 12 tokens."""
    return min(range(len(sources)), key=lambda i: abs(len(tokenizer.tokenize(sources[i])) - 12))


def _labels(translation: Translation, src_tokens: list[str]) -> tuple[list[str], list[str]]:
    """The source and target axis labels of an alignment (without the attachment mark)."""
    label = DefaultTokenizer.display
    return [label(t) for t in src_tokens], [*map(label, translation.tokens), "</s>"]


def _plot_one(out_path: Path, translation, src_tokens: list[str]) -> str:
    from bahdanau.plot import plot_alignment

    if translation.hypothesis.attention is None:
        return "no alignment plot: the model has no attention"
    try:
        figure = plot_alignment(translation.hypothesis.attention,
                                *_labels(translation, src_tokens), out_path)
    except PlotDependencyError as exc:
        return f"no alignment plot: {exc}"
    import matplotlib.pyplot as plt

    plt.close(figure)                        # saved: pyplot would otherwise keep it open
    return f"alignment plot: {out_path}"


# --------------------------------------------------------------------------------- run folder
def _stored_options(out: Path, o: TrainOptions) -> dict[str, Any] | None:
    """The options of the run `out` holds, to resume it; None when a new run starts there.

    Raises:
        InputError: `out` is a file, its config.yaml is damaged, or it holds a run and neither
            resuming (the default) nor --overwrite was asked for.
    """
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder")
    config = out / RUN_CONFIG
    if not _holds_run(out) or o.overwrite:
        return None
    if not o.resume:
        raise InputError(f"--out {out} holds a run: resume it (without --no-resume), start "
                         "over with --overwrite (deleting it), or choose another --out")
    if not config.is_file():
        return None                  # checkpoints of an earlier version: train() checks them
    try:
        stored = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{config} is damaged ({err}); it records the run's options") from None
    if not isinstance(stored, dict):
        raise InputError(f"{config} is damaged: it holds a {type(stored).__name__}, not options")
    return stored


def _holds_run(out: Path) -> bool:
    """`out` holds a run: its config.yaml or checkpoints."""
    manager = CheckpointManager(out / "checkpoints")
    return (out / RUN_CONFIG).is_file() or bool(manager.latest() or manager.best())


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Create `out` and hold a lock on it while inside: a second `train` into the same folder
    is refused instead of mixing two runs' checkpoints."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "a") as handle:
        try:
            import fcntl
        except ImportError:                               # no advisory locks on this platform
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"--out {out} is in use by another bahdanau train; wait for it "
                             "to finish or choose another --out") from None
        yield


def _remove_run(out: Path) -> None:
    """Delete the run in `out` (--overwrite): its files are first moved out of the way, so the
    folder never mixes two runs; files of the user's own are kept."""
    trash = out / ".overwritten"
    if trash.exists():
        shutil.rmtree(trash)                       # left by an earlier --overwrite that died
    trash.mkdir()
    for name in RUN_FILES:                         # checkpoints first: a crash in between
        if (out / name).exists():                  # leaves no checkpoint of the old run
            os.replace(out / name, trash / name)
    shutil.rmtree(trash)


# --------------------------------------------------------------------------------- commands
def _train_config(o: TrainOptions) -> TrainConfig:
    """The `TrainConfig` of the options (built before any work, so that it checks them first;
    `TrainOptions.limits` says when training stops)."""
    return TrainConfig(
        optimizer=o.optimizer, lr=o.lr, schedule=o.schedule, warmup_steps=o.warmup_steps,
        decay_factor=o.decay_factor, decay_patience=o.decay_patience, min_lr=o.min_lr,
        batch_size=o.train_batch_size, max_tokens=o.max_tokens, accumulation=o.accumulation,
        **o.limits, eval_every=o.eval_every or 10**12, save_every=o.save_every,
        patience=o.patience, label_smoothing=o.label_smoothing, amp=o.amp,
        log_every=o.log_every, seed=o.seed, loader_workers=o.loader_workers,
        keep_last=o.keep_last, keep_best=o.keep_best, ema_decay=o.ema_decay)


def _quiet(line: str) -> None:
    """The log of a process other than rank 0 under torchrun."""


def _train(o: TrainOptions, command: str = "bahdanau train") -> int:
    """`bahdanau train`; `command` is the command line, for the header of train.log."""
    start = time.perf_counter()
    _check_launcher()
    device = _machine(o)
    search = _search(o)
    out = Path(o.out)
    stored = _stored_options(out, o)
    if stored is not None:
        o = resumed_options(stored, o)
    if o.tensorboard:
        require_tensorboard()
    changes = resume_changes(stored, o) if stored is not None else []
    if o.unk_replace and o.arch == "rnnencdec":
        raise InputError("--unk-replace needs attention weights, which --arch rnnencdec lacks")
    tcfg = _train_config(o)
    corpus = PreparedCorpus(o.data, max_len=o.max_train_len) if o.data else None
    train_pairs, dev_pairs, test_pairs = _data(o, corpus)
    if corpus is not None:
        tokenizer, src_vocab, tgt_vocab = corpus.tokenizer, corpus.src_vocab, corpus.tgt_vocab
        examples, n_pairs = corpus, corpus.manifest["counts"]["pairs"]
    else:
        tokenizer = DefaultTokenizer(lowercase=o.lowercase, joiners=o.joiners)
        src_vocab = Vocab.build((tokenizer.tokenize(s) for s, _ in train_pairs),
                                max_size=o.vocab_size)
        tgt_vocab = Vocab.build((tokenizer.tokenize(t) for _, t in train_pairs),
                                max_size=o.vocab_size)
        examples = encode_pairs(train_pairs, src_vocab, tgt_vocab, tokenizer,
                                max_len=o.max_train_len)
        n_pairs = len(train_pairs)
    if not examples:
        raise InputError(f"no training pair has at most --max-train-len {o.max_train_len} "
                         "tokens on both sides")
    cfg = getattr(presets, o.preset)(len(src_vocab), len(tgt_vocab))
    cfg = replace(cfg, arch=o.arch, gru_form=o.gru_form, dropout=o.dropout,
                  dropout_rnn_inputs=o.dropout_rnn_inputs,
                  dropout_deep_output=o.dropout_deep_output, init=o.init)
    torch.manual_seed(o.seed)
    model = build_model(cfg)
    with _processes(device) as main, ExitStack() as stack:
        # rank 0 prints and writes OUT/train.log once the run starts; the others say nothing
        say = stack.enter_context(TrainLog()) if main else _quiet
        if not test_pairs:
            say("no test set: the model is trained and saved but not scored (give --test-src "
                "and --test-tgt to score it)")
        if main:
            stack.enter_context(_locked(out))
            if o.overwrite and _holds_run(out):
                _remove_run(out)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()            # the others read --out once rank 0 holds it
        run = setup_run(model, examples, tcfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                        checkpoint_dir=out / "checkpoints", resume=o.resume and not o.overwrite,
                        device=device, extra={"options": o.to_record()}, tokenizer=tokenizer)
        finished = stop_reason(run)       # then the folder, train.log too, is left as it is
        if finished and (not test_pairs or (out / "metrics.json").is_file()):
            if main:
                print(f"nothing to do: the run in {out} finished at step {run.state.step} "
                      f"({finished}); raise its limit to train on, or score it with bahdanau "
                      "evaluate")
            return 0
        if stored is not None:
            run.resume_changes = changes                 # in the command line's terms
        board = None
        if main:
            say.open(out / "train.log", command)
            if o.tensorboard:    # a resumed run drops the events a crash left past its step
                board = stack.enter_context(TensorBoardLog(
                    out / "tensorboard", tags={"dev/metric": "dev/bleu"},
                    purge_step=run.state.step if run.resumed_from else None))
            _write_text(out / RUN_CONFIG, json.dumps(o.to_record(), indent=2) + "\n")
        say(f"data: {len(examples)} training pairs (of {n_pairs}), vocabularies "
            f"{len(src_vocab)} / {len(tgt_vocab)}; model {o.arch} ({o.preset}), "
            f"{sum(p.numel() for p in model.parameters()):,} parameters")
        if run.plan.processes > 1:
            say(f"{run.plan.processes} processes x accumulation {o.accumulation} = "
                f"{run.plan.size} batches per update")
        dev_sources = [s for s, _ in dev_pairs[: o.dev_size]]
        dev_refs = [t for _, t in dev_pairs[: o.dev_size]]
        shown = _typical(dev_sources, tokenizer) if board is not None and dev_sources else None

        def validate(m: torch.nn.Module) -> float:
            hyps = translate_corpus(m, dev_sources, src_vocab, tgt_vocab, tokenizer,
                                    search=BeamSearch(beam_size=1, max_len=o.max_len),
                                    batch_size=o.batch_size, device=device)
            if shown is not None and hyps[shown].hypothesis.attention is not None:
                board.alignment(run.state.step, hyps[shown].hypothesis.attention,
                                *_labels(hyps[shown], tokenizer.tokenize(dev_sources[shown])))
            return corpus_bleu([h.text for h in hyps], dev_refs,
                               lowercase=getattr(tokenizer, "lowercase", False))

        result = train_run(run, validate=validate if o.eval_every else None, log=say,
                           scalars=board.scalars if board is not None else None)
        if result.stopped in ("sigint", "sigterm", "sighup"):
            say(f"stopped by {result.stopped.upper()} at step {result.step}; checkpoint "
                f"{result.last_checkpoint}; run the same command to continue")
            return 128 + int(getattr(signal, result.stopped.upper()))
        say(f"trained {result.step} updates, stopped by {result.stopped}, "
            f"{result.elapsed_s / 60:.1f} min")
        leave_process_group()           # rank 0 scores the test set alone: no one waits on it
        if not main:
            return 0
        if not test_pairs:
            say(f"checkpoints: {out / 'checkpoints'}")
            return 0
        if run.ema is not None:          # the test scores the weights the checkpoints hold
            run.ema.copy_to(model)
        model.eval()
        sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
        metrics, translations = _report(model, sources, references, src_vocab, tgt_vocab, tokenizer,
                                        o, search, device)
        _write_text(out / "test.hyp.txt", "".join(t.text + "\n" for t in translations))
        pick = _typical(sources, tokenizer)
        plot_note = _plot_one(out / "alignment.png", translations[pick],
                              tokenizer.tokenize(sources[pick]))
        metrics.update(updates=result.step, train_minutes=round(result.elapsed_s / 60, 2),
                       wall_minutes=round((time.perf_counter() - start) / 60, 2),
                       arch=o.arch, preset=o.preset)
        _write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
        _print_metrics(metrics, say)
        say(f"translations: {out / 'test.hyp.txt'}; {plot_note}; metrics: {out / 'metrics.json'}")
        say(f"total wall time {metrics['wall_minutes']:.1f} min")
        return 0


def _prepare(o: PrepareOptions) -> int:
    if o.train_src is not None:
        src, tgt = _existing(o.train_src, "--train-src"), _existing(o.train_tgt, "--train-tgt")
        shipped = None
    else:
        src_lang, tgt_lang = o.src_lang or "en", o.tgt_lang or "fr"
        src, tgt = multi30k_files("train", src_lang), multi30k_files("train", tgt_lang)
        shipped = {"corpus": "multi30k", "src_lang": src_lang, "tgt_lang": tgt_lang}
    if o.sentencepiece_model is not None:
        tokenizer: Any = SentencePieceTokenizer.load(
            _existing(o.sentencepiece_model, "--sentencepiece-model"))
    elif o.tokenizer != "default":
        tokenizer = TrainSentencePiece(model_type=o.tokenizer, vocab_size=o.subword_vocab,
                                       max_sentences=o.sample_sentences)
    else:
        tokenizer = DefaultTokenizer(lowercase=o.lowercase, joiners=o.joiners)
    prepare_corpus(src, tgt, o.out, tokenizer=tokenizer, vocab_size=o.vocab_size,
                   max_len=o.max_len, max_ratio=o.max_ratio, strict=o.strict,
                   workers=o.workers, overwrite=o.overwrite, shipped=shipped,
                   log=lambda line: print(line, flush=True))
    return 0


# Sentences translated together: the paper's 20 batches, sorted by length within the window.
WINDOW_BATCHES = 20


def _translate(o: TranslateOptions) -> int:
    """Translate in windows of WINDOW_BATCHES batches (one line at a time from a terminal):
    each window's output is printed, in input order, before the next is read, so memory stays
    bounded and a pipe sees results as they come. An empty line gives an empty output line."""
    device = _machine(o)
    search = _search(o, o.n_best)
    path = _existing(o.input, "--input")
    checkpoints = _checkpoints(o)
    _check_outputs({"--alignments": o.alignments}, {"--input": path, **checkpoints})
    if sys.stdout is None or (path is None and sys.stdin is None):
        raise InputError("stdin or stdout is closed: translate reads stdin (or --input) and "
                         "writes stdout")
    model, src_vocab, tgt_vocab, tokenizer = _load(o, checkpoints, device)
    with ExitStack() as stack:
        stream = stack.enter_context(path.open("rb")) if path else sys.stdin.buffer
        alignments = (stack.enter_context(atomic_file(Path(o.alignments)))
                      if o.alignments else None)
        progress = _Progress(path)
        lines = iter_lines(stream, str(path) if path else "<stdin>")
        # typed at a terminal: each line is answered at once
        size = 1 if path is None and sys.stdin.isatty() else o.batch_size * WINDOW_BATCHES
        done = 0
        while window := list(itertools.islice(lines, size)):
            sentences = [line for line in window if line.strip()]
            translated = iter(translate_corpus(
                model, sentences, src_vocab, tgt_vocab, tokenizer, search=search,
                batch_size=o.batch_size, unk_replace=o.unk_replace, device=device)
                if sentences else [])
            for line in window:
                t = next(translated) if line.strip() else None
                _print_translation(done, t, o.n_best, tokenizer, tgt_vocab)
                if alignments is not None:
                    alignments.write(_alignment_row(line, t, tokenizer).encode())
                done += 1
            sys.stdout.flush()
            progress.update(done, stream)
        progress.finish(done)
    return 0


def _print_translation(index: int, t: Translation | None, n_best: int,
                       tokenizer: Tokenizer, tgt_vocab: Vocab) -> None:
    """One line (its n-best lines with --n-best; none for an empty input line)."""
    if n_best == 1:
        print("" if t is None else t.text)
        return
    for hyp in [] if t is None else t.nbest:
        text = tokenizer.detokenize(tgt_vocab.decode(hyp.tokens))
        print(f"{index} ||| {text} ||| {hyp.score:.4f}")


def _alignment_row(line: str, t: Translation | None, tokenizer: Tokenizer) -> str:
    """The JSON line --alignments writes for one input line."""
    if t is None:
        return json.dumps({"source": [], "target": [], "weights": None}) + "\n"
    att = t.hypothesis.attention
    return json.dumps({"source": tokenizer.tokenize(line), "target": [*t.tokens, "</s>"],
                       "weights": None if att is None else
                       [[round(float(x), 5) for x in row] for row in att]}) + "\n"


class _Progress:
    """Sentences/s (and, reading a file, an ETA from the bytes read) on stderr, only when
    stderr is a terminal."""

    def __init__(self, path: Path | None) -> None:
        self.enabled = sys.stderr is not None and sys.stderr.isatty()
        self.size = path.stat().st_size if path else None
        self.start = time.perf_counter()

    def update(self, done: int, stream: Any) -> None:
        if not self.enabled:
            return
        seconds = time.perf_counter() - self.start
        line = f"{done} sentences, {done / max(seconds, 1e-9):.1f} sentences/s"
        if self.size:
            fraction = min(stream.tell() / self.size, 1.0)
            if fraction > 0:
                line += f", about {seconds * (1 - fraction) / fraction:.0f} s left"
        print(f"\r{line}\x1b[K", end="", file=sys.stderr, flush=True)

    def finish(self, done: int) -> None:
        if self.enabled:
            print(f"\r{done} sentences in {time.perf_counter() - self.start:.1f} s\x1b[K",
                  file=sys.stderr, flush=True)


def _evaluate(o: EvaluateOptions) -> int:
    device = _machine(o)
    search = _search(o)
    src, ref = _existing(o.src, "--src"), _existing(o.ref, "--ref")
    checkpoints = _checkpoints(o)
    _check_outputs({"--output": o.output, "--json": o.json},
                   {"--src": src, "--ref": ref, **checkpoints})
    sources, references = _sentences(src), read_lines(ref, non_empty=True)
    if len(sources) != len(references):
        raise InputError(f"--src has {len(sources)} lines but --ref has {len(references)}")
    model, src_vocab, tgt_vocab, tokenizer = _load(o, checkpoints, device)
    metrics, out = _report(model, sources, references, src_vocab, tgt_vocab, tokenizer, o,
                           search, device)
    _print_metrics(metrics)
    if o.output:
        _write_text(Path(o.output), "".join(t.text + "\n" for t in out))
    if o.json:
        _write_text(Path(o.json), json.dumps(metrics, indent=2) + "\n")
    return 0


def _plot(o: PlotOptions) -> int:
    from bahdanau.plot import check_image_path

    device = _machine(o)
    search = _search(o)
    path = _existing(o.input, "--input")
    checkpoints = _checkpoints(o)
    _check_outputs({"--output": o.output}, {"--input": path, **checkpoints})
    check_image_path(o.output)
    sentence = o.sentence
    if sentence is None:
        lines = read_lines(path)
        line = o.line or 1
        if not 1 <= line <= len(lines):
            raise InputError(f"--line {line} is outside {o.input} (1..{len(lines)})")
        sentence = lines[line - 1]
        if not sentence.strip():
            raise InputError(f"--input {o.input}: line {line} is empty")
    model, src_vocab, tgt_vocab, tokenizer = _load(o, checkpoints, device)
    if model.arch == "rnnencdec":
        what = ("is an RNNencdec model: it has" if len(o.checkpoint) == 1
                else "are RNNencdec models: they have")
        raise InputError(f"{' '.join(o.checkpoint)} {what} no alignment to plot")
    [translation] = translate_corpus(model, [sentence], src_vocab, tgt_vocab, tokenizer,
                                     search=search, unk_replace=o.unk_replace, device=device)
    note = _plot_one(Path(o.output), translation, tokenizer.tokenize(sentence))
    print(translation.text)
    print(note)
    return 0


def _average(o: AverageOptions) -> int:
    paths = select_checkpoints(o.checkpoint, last=o.last, best=o.best)
    _check_outputs({"--output": o.output}, {f"--checkpoint {p}": p for p in paths})
    save_checkpoint(o.output, average_checkpoints(paths))
    print(f"averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''} "
          f"({', '.join(map(str, paths))}) into {o.output}")
    return 0


_RUN = {"prepare": _prepare, "train": _train, "translate": _translate, "evaluate": _evaluate,
        "plot": _plot, "average": _average}


def _config_file(path: str, options: type[SearchOptions]) -> dict[str, Any]:
    """The option values in a --config file: JSON, or YAML (with PyYAML installed)."""
    text = _existing(path, "--config").read_bytes()
    try:
        data = json.loads(text)
    except ValueError:                   # not JSON (or not UTF-8): YAML, which needs PyYAML
        try:
            import yaml
        except ImportError:
            raise InputError(f"--config {path}: reading YAML needs PyYAML: pip install "
                             "'bahdanau[yaml]' (or write the file as JSON)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            detail = " ".join(str(err).split())
            raise InputError(f"--config {path} is not valid YAML: {detail}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"--config {path} must map option names to values, not hold a "
                         f"{type(data).__name__}")
    known = {f.name for f in dataclasses.fields(options)}
    values = {str(key).replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InputError(f"--config {path}: unknown option {unknown[0]!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bahdanau` console script and `python -m bahdanau`."""
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    config = args.pop("config", None)
    try:
        if config is not None:               # the file's values, then the flags given here
            given = {name: value for name, value in args.items() if value is not None}
            args = {**_config_file(config, _COMMANDS[command][0]), **given}
        options = _COMMANDS[command][0].from_mapping(args, text=True)
        if command == "train":                   # its log file names the command line
            line = sys.argv[1:] if argv is None else list(argv)
            return _train(options, shlex.join(["bahdanau", *line]))
        return _RUN[command](options)
    except (InputError, OSError, PlotDependencyError) as exc:
        message = " ".join(str(exc).split("\n"))
        print(f"bahdanau: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bahdanau: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
