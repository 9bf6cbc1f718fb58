"""The default job as a library call: data, vocabularies, model, run, test report.

`run_train_job` is what ``bahdanau train`` does with its options: it reads the data (the shipped
Multi30k by default, the user's files, or a prepared corpus), builds the vocabularies, the model
and the run (resuming the run in ``--out``), trains with dev evaluations, and scores the test
set, writing the translations, one alignment plot and ``metrics.json`` into the run folder.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bahdanau._about import versions
from bahdanau._progress import StatusLine
from bahdanau.checkpoint.manager import CheckpointManager
from bahdanau.checkpoint.reader import RUN_REPORT, read_checkpoint
from bahdanau.config import TrainConfig
from bahdanau.data.batching import Example, collate, encode_pairs
from bahdanau.data.corpus import PreparedCorpus
from bahdanau.data.text import multi30k_files, read_parallel
from bahdanau.data.tokenizers import DefaultTokenizer, Tokenizer, sides, writes_lowercase
from bahdanau.data.vocab import Vocab
from bahdanau.error_rates import METRICS, error_rates, group_references
from bahdanau.errors import InputError
from bahdanau.evaluate import corpus_scores, translate_corpus
from bahdanau.jobs.files import existing, write_text
from bahdanau.jobs.init_from import InitModel, check_fit, init_weights, read_init_model
from bahdanau.jobs.options import TrainOptions, flag
from bahdanau.jobs.report import (
    TestReport,
    alignment_labels,
    alignment_title,
    plot_alignment_file,
    score_translations,
    typical_sentence,
)
from bahdanau.jobs.resolve import (
    autocast,
    beam_search,
    captured,
    machine,
    machine_line,
    thread_tuner,
)
from bahdanau.jobs.resume import resume_changes, resumed_options
from bahdanau.jobs.run_folder import (
    OLD_RUN_CONFIG,
    RUN_CONFIG,
    holds_run,
    locked,
    remove_run,
    stored_options,
)
from bahdanau.models import build_model
from bahdanau.search import BeamSearch
from bahdanau.training.distributed import (
    check_launcher,
    is_distributed,
    leave_process_group,
    process_group,
)
from bahdanau.training.loop import TrainResult, train_run
from bahdanau.training.run import TrainRun, setup_run, stop_reason
from bahdanau.training.runlog import TensorBoardLog, TrainLog, require_tensorboard
from bahdanau.training.step import evaluate_loss


def _pairs(src: str, tgt: str, split: str) -> list[tuple[str, str]]:
    return read_parallel(existing(src, f"--{split}-src"), existing(tgt, f"--{split}-tgt"),
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
    if o.training.eval_every and not sets[1]:
        raise InputError("--eval-every needs a dev set: give --dev-src and --dev-tgt")
    return sets[0], sets[1], sets[2]


_LOG = logging.getLogger(__name__)


def _quiet(line: str) -> None:
    """The log of a process other than rank 0 under torchrun."""


@dataclass(frozen=True)
class TrainJobResult:
    """What `run_train_job` did: the run folder, where training stopped, and the test report."""

    out: Path
    step: int                        # updates trained, in all (resumed runs included)
    stopped: str                     # why training stopped (`bahdanau.training.stop_reason`)
    report: TestReport | None        # None: no test set, not rank 0, or stopped by a signal
    metrics: dict[str, Any] | None   # what metrics.json holds (the report and the run's numbers)
    trained: bool = True             # False: the run had finished before; nothing was done

    @property
    def signal(self) -> int | None:
        """The number of the signal (SIGINT, SIGTERM, SIGHUP) that stopped training, if one did."""
        if self.stopped in ("sigint", "sigterm", "sighup"):
            return int(getattr(signal, self.stopped.upper()))
        return None


@dataclass(frozen=True)
class _Data:
    """The default job's data: what trains, what is evaluated, and how text becomes ids."""

    examples: Sequence[Example]
    n_pairs: int                     # training pairs read, before the length filter
    dev: list[tuple[str, str]]
    test: list[tuple[str, str]]
    tokenizer: Tokenizer
    src_vocab: Vocab
    tgt_vocab: Vocab
    init: InitModel | None = None    # the trained model the run starts from (--init-from)


def _resumed_checkpoint(o: TrainOptions) -> Path | None:
    """The checkpoint of its own that the run in --out resumes from, if it does."""
    if not o.resume or o.overwrite:
        return None
    return CheckpointManager(Path(o.out) / "checkpoints").latest()


def _stored_vocabularies(path: Path) -> tuple[Vocab, Vocab, Tokenizer]:
    """The vocabularies and tokenizer that a run's checkpoint holds."""
    checkpoint = read_checkpoint(path)
    return checkpoint.src_vocab, checkpoint.tgt_vocab, checkpoint.tokenizer


def _read_data(o: TrainOptions) -> _Data:
    """Read and encode the data of the options: a prepared corpus (--data), the user's files or
    the shipped Multi30k, with vocabularies built from the training side, or those of the
    --init-from model (with --init-vocab). A run that resumes a checkpoint of its own does not
    read the --init-from model (the checkpoint's weights replace it; the model's file may be
    gone): its vocabularies and tokenizer, the model's, come from that checkpoint."""
    resumed = _resumed_checkpoint(o) if o.init_from is not None else None
    init = read_init_model(o.init_from) if o.init_from is not None and resumed is None else None
    corpus = PreparedCorpus(o.data, max_len=o.max_train_len) if o.data else None
    train_pairs, dev_pairs, test_pairs = _data(o, corpus)
    if corpus is not None:
        data = _Data(corpus, corpus.manifest["counts"]["pairs"], dev_pairs, test_pairs,
                     corpus.tokenizer, corpus.src_vocab, corpus.tgt_vocab, init)
    elif o.init_from is not None and o.init_vocab:
        if init is not None:
            src_vocab, tgt_vocab, tokenizer = init.src_vocab, init.tgt_vocab, init.tokenizer
        else:
            assert resumed is not None         # the model is read unless the run resumes
            src_vocab, tgt_vocab, tokenizer = _stored_vocabularies(resumed)
        examples = encode_pairs(train_pairs, src_vocab, tgt_vocab, tokenizer,
                                max_len=o.max_train_len)
        data = _Data(examples, len(train_pairs), dev_pairs, test_pairs, tokenizer, src_vocab,
                     tgt_vocab, init)
    else:
        tokenizer = DefaultTokenizer(lowercase=o.lowercase, joiners=o.joiners)
        src_vocab = Vocab.build((tokenizer.tokenize(s) for s, _ in train_pairs),
                                max_size=o.vocab_size)
        tgt_vocab = Vocab.build((tokenizer.tokenize(t) for _, t in train_pairs),
                                max_size=o.vocab_size)
        examples = encode_pairs(train_pairs, src_vocab, tgt_vocab, tokenizer,
                                max_len=o.max_train_len)
        data = _Data(examples, len(train_pairs), dev_pairs, test_pairs, tokenizer, src_vocab,
                     tgt_vocab, init)
    if not data.examples:
        raise InputError(f"no training pair has at most --max-train-len {o.max_train_len} "
                         "tokens on both sides")
    return data


def _build_model(o: TrainOptions, data: _Data) -> torch.nn.Module:
    """The model of the options' preset and choices, seeded with --seed; with --init-from, one
    that fits its weights (checked first), holding them."""
    config, init = o.model.config(len(data.src_vocab), len(data.tgt_vocab)), data.init
    if init is not None:
        check_fit(init, config, data.src_vocab, data.tgt_vocab, data.tokenizer)
    torch.manual_seed(o.training.seed)
    model = build_model(config)
    if init is not None:
        init_weights(model, init)
    return model


def _check_decoding_memory(o: TrainOptions, data: _Data, model: torch.nn.Module,
                           device: torch.device) -> None:
    """Before any training: the searches of the test set (--beam-size) and of the dev set
    (greedy) fit in the memory of `device` (`BeamSearch.check_memory`, a batch of the longest
    sentence), so a beam or a length the machine cannot hold is refused now, not once the run
    has trained."""
    dev = data.dev[: o.dev_size] if o.training.eval_every else []
    for name, pairs, search in (("test", data.test, beam_search(o)),
                                ("dev", dev, BeamSearch(beam_size=1, max_len=o.max_len))):
        if pairs:
            longest = max(len(data.tokenizer.tokenize(source)) for source, _ in pairs)
            together = min(o.batch_size, len(pairs))
            search.check_memory(model, together, longest, device,
                                f"decoding the {name} set ({together:,} sentences together, "
                                f"up to {longest:,} tokens)")


def _dev_scores(o: TrainOptions, data: _Data, run: TrainRun, device: torch.device,
                board: TensorBoardLog | None
                ) -> Callable[[torch.nn.Module], dict[str, float]] | None:
    """The dev evaluation of the run, or None without --eval-every: BLEU and chrF of the greedy
    translations of --dev-size sentences, and the perplexity of their references (the model's
    loss per target token). Each evaluation's translations go to OUT/dev/step_N.hyp; with
    TensorBoard, one typical sentence's alignment too."""
    if not o.training.eval_every:
        return None
    pairs = data.dev[: o.dev_size]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    examples = encode_pairs(pairs, data.src_vocab, data.tgt_vocab, data.tokenizer)
    batches = [collate(examples[i:i + o.batch_size])
               for i in range(0, len(examples), o.batch_size)]
    shown = typical_sentence(sources, data.tokenizer) if board is not None and sources else None
    folder = Path(o.out) / "dev"
    precision = autocast(o.training.amp, device)          # the run's --amp, as its updates
    search = captured(BeamSearch(beam_size=1, max_len=o.max_len),   # kept: its graphs, if any
                      o.training.cuda_graphs)

    def validate(m: torch.nn.Module) -> dict[str, float]:
        start = time.perf_counter()
        with precision:
            hyps = translate_corpus(m, sources, data.src_vocab, data.tgt_vocab, data.tokenizer,
                                    search=search, batch_size=o.batch_size, device=device,
                                    progress="dev")
        decoded = time.perf_counter()
        folder.mkdir(exist_ok=True)
        write_text(folder / f"step_{run.state.step:08d}.hyp",
                   "".join(h.text + "\n" for h in hyps))
        attention = hyps[shown].hypothesis.attention if shown is not None else None
        if board is not None and shown is not None and attention is not None:
            board.alignment(run.state.step, attention,
                            *alignment_labels(hyps[shown],
                                              data.tokenizer.tokenize(sources[shown])),
                            title=alignment_title(f"{o.out}, step {run.state.step}",
                                                  sources[shown]))
        scores = corpus_scores([h.text for h in hyps], references,
                               lowercase=writes_lowercase(data.tokenizer))
        with torch.no_grad(), precision:
            _, ppl = evaluate_loss(m, batches)
        _LOG.debug(f"dev evaluation at step {run.state.step}: {len(sources)} sentences decoded "
                   f"in {decoded - start:.1f} s, scored and perplexity in "
                   f"{time.perf_counter() - decoded:.1f} s")
        rates = {}
        if o.training.early_stopping_metric in METRICS:   # --early-stopping-metric wer ...
            source_side, target_side = sides(data.tokenizer)
            _, groups, first = group_references(sources, references,
                                                tokenize=source_side.tokenize)
            rates = error_rates([hyps[i].text for i in first], groups,
                                tokenize=target_side.tokenize).as_dict()
        return {"bleu": scores.bleu, "chrf": scores.chrf, "ppl": ppl, **rates}

    return validate


def _test_report(o: TrainOptions, data: _Data, run: TrainRun, device: torch.device
                 ) -> tuple[TestReport, str]:
    """Score the trained model (its moving average, with --ema-decay) on the test set and write
    the translations and a typical sentence's alignment into the run folder; returns the report
    and the line that says where the alignment plot went."""
    out = Path(o.out)
    if run.ema is not None:          # the test scores the weights the checkpoints hold
        run.ema.copy_to(run.model)
    run.model.eval()
    sources, references = [s for s, _ in data.test], [t for _, t in data.test]
    with (autocast(o.training.amp, device),               # the run's --amp, as its updates
          run.threads.chosen() if run.threads is not None else nullcontext()):  # its threads
        report = score_translations(run.model, sources, references, data.src_vocab,
                                    data.tgt_vocab, data.tokenizer, o, device, bleu=o.test_bleu)
    write_text(out / "test.hyp.txt", "".join(t.text + "\n" for t in report.translations))
    pick = typical_sentence(sources, data.tokenizer)
    note = plot_alignment_file(out / "alignment.png", report.translations[pick],
                               data.tokenizer.tokenize(sources[pick]),
                               alignment_title(f"{out}, step {run.state.step}", sources[pick]))
    return report, note


def _checked_options(o: TrainOptions) -> tuple[TrainOptions, torch.device, list[str] | None]:
    """Before any work: the options as the run in --out resumes them (its own --time-budget
    kept), checked with the launcher, the device and the run folder; the device; and what a
    resumed run changes, in the command line's terms (None for a new run)."""
    check_launcher()
    device = machine(o)
    autocast(o.training.amp, device)                      # --amp bf16 where torch cannot: a line
    stored = stored_options(Path(o.out), o)
    if stored is not None:
        o = resumed_options(stored, o)
    if o.tensorboard:
        require_tensorboard()
    if o.unk_replace and o.model.arch == "rnnencdec":
        raise InputError("--unk-replace needs attention weights, which --arch rnnencdec lacks")
    return o, device, resume_changes(stored, o) if stored is not None else None


def _score(o: TrainOptions, data: _Data, run: TrainRun, device: torch.device,
           result: TrainResult, start: float, board: TensorBoardLog | None
           ) -> tuple[TestReport, dict[str, Any]]:
    """The test report of the trained run, written into its folder with ``metrics.json`` (the
    report, the run's numbers and the versions it ran with), logged, and with TensorBoard
    written as test/bleu, test/chrf and test/bleu_no_unk at the last step."""
    out = Path(o.out)
    report, plot_note = _test_report(o, data, run, device)
    metrics = {**report.metrics(), "updates": result.step,
               "train_minutes": round(result.elapsed_s / 60, 2),
               "wall_minutes": round((time.perf_counter() - start) / 60, 2),
               "arch": o.model.arch, "preset": o.model.preset, "versions": versions(device)}
    write_text(out / RUN_REPORT, json.dumps(metrics, indent=2) + "\n")
    if board is not None:
        board.scalars(result.step, {f"test/{name}": metrics[name]
                                    for name in ("bleu", "chrf", "bleu_no_unk")
                                    if metrics[name] is not None})
    for line in report.lines():
        _LOG.info(line)
    _LOG.info(f"translations: {out / 'test.hyp.txt'}; {plot_note}; metrics: "
              f"{out / RUN_REPORT}")
    _LOG.info(f"total wall time {metrics['wall_minutes']:.1f} min")
    return report, metrics


def _open_records(o: TrainOptions, run: TrainRun, log: TrainLog | None, command: str,
                  device: torch.device, stack: ExitStack) -> TensorBoardLog | None:
    """On rank 0 (`log` given), once the run is set up: start its train.log (header: `command`
    and the versions), its TensorBoard events with --tensorboard (returned), and write its
    options, with the versions, as options.json (in place of an earlier version's config.yaml,
    read by `stored_options`)."""
    if log is None:
        return None
    out, record = Path(o.out), versions(device)
    log.open(out / "train.log", command, versions=record)
    board = None
    if o.tensorboard:        # a resumed run drops the events a crash left past its step
        board = stack.enter_context(TensorBoardLog(
            out / "tensorboard", purge_step=run.state.step if run.resumed_from else None))
    write_text(out / RUN_CONFIG, json.dumps({**o.to_record(), "versions": record}, indent=2)
               + "\n")
    (out / OLD_RUN_CONFIG).unlink(missing_ok=True)     # an earlier version's name of it
    return board


def _start_lines(o: TrainOptions, data: _Data, run: TrainRun) -> list[str]:
    """What a run logs as it starts, after the machine: its data and model, where its weights
    come from, how its processes share each update, and whether a test set scores it."""
    lines = [f"data: {len(data.examples)} training pairs (of {data.n_pairs}), vocabularies "
             f"{len(data.src_vocab)} / {len(data.tgt_vocab)}; model {o.model.arch} "
             f"({o.model.name}), {sum(p.numel() for p in run.model.parameters()):,} parameters"]
    if data.init is not None and run.resumed_from is None:
        lines.append(f"weights from {data.init.path} (--init-from); the optimizer starts afresh")
    if run.plan.processes > 1:
        lines.append(f"{run.plan.processes} processes x accumulation {run.cfg.accumulation} = "
                     f"{run.plan.size} batches per update")
    if not data.test:
        lines.append("no test set: the model is trained and saved but not scored (give "
                     "--test-src and --test-tgt to score it)")
    return lines


def _limit_reached(o: TrainOptions, cfg: TrainConfig, finished: str) -> str:
    """The option whose limit a finished run reached, as given ("--max-steps 200"), or the
    reason itself for a stop that no option names."""
    shown = {"max_steps": f"--max-steps {cfg.max_steps}",
             "max_epochs": f"--max-epochs {cfg.max_epochs}",
             "max_time": f"--time-budget {o.time_budget:g}" if o.time_budget else "max_time",
             "patience": f"--patience {cfg.patience}"}
    return shown.get(finished, finished)


def _left_as_it_is(o: TrainOptions, run: TrainRun, finished: str,
                   changes: list[str] | None) -> str:
    """What a start says that finds its run finished and asks for no more training; the run
    is left as it is. With the run's own options (or its updates on another number of
    processes), one line saying so and what to do next.

    Raises:
        InputError: the command changes other options (`changes`, in the command line's
            terms), none of which lengthens the run: one line saying how to train it on,
            leave it, or start over.
    """
    where = (f"the run in {o.out} finished at step {run.state.step} "
             f"({_limit_reached(o, run.cfg, finished)})")
    # setup_run has held the updates to the run's batches (processes x accumulation), so
    # another --accumulation only shares the same updates out over another number of processes
    changes = [line for line in changes or [] if not line.startswith(f"{flag('accumulation')} ")]
    if changes:
        raise InputError(f"{where}, and this command changes {'; '.join(changes)} without "
                         "training it further: give a larger --max-steps, --max-epochs or "
                         "--time-budget to train on, its own options to leave it as it is, "
                         "--overwrite to start over, or another --out")
    return (f"nothing to do: {where}; raise its limit to train on, or score it with "
            "bahdanau evaluate")


def run_train_job(o: TrainOptions, command: str = "bahdanau train") -> TrainJobResult:
    """Train and score the model of `o` in the run folder `o.out` (``bahdanau train``).

    A run folder that holds a run is resumed (its options checked against `o`), or replaced with
    `o.overwrite`. Under torchrun every process calls this; rank 0 alone writes the folder, logs
    and scores the test set.

    Args:
        o: the options.
        command: the command line, for the header of ``train.log``.
    Returns:
        The `TrainJobResult`.
    Raises:
        InputError: a bad option, file, device or run folder (before any work), or a run
            folder whose run cannot continue with these options. An error that stops a run
            once its train.log is open (a divergence, a dead loader worker) is also the log's
            last line (`TrainLog`).
    """
    start = time.perf_counter()
    o, device, changes = _checked_options(o)
    out, cfg = Path(o.out), o.train_config()
    with StatusLine("preparing the run") as preparing:    # seconds before the first update
        preparing("reading the data and building the vocabularies")
        data = _read_data(o)
        preparing("building the model")
        model = _build_model(o, data)
        _check_decoding_memory(o, data, model, device)
    with process_group(device) as main, ExitStack() as stack:
        # rank 0 logs, and writes OUT/train.log once the run starts; the others say nothing
        log = stack.enter_context(TrainLog()) if main else None
        say = _LOG.info if main else _quiet
        tuner = thread_tuner(o, device)
        if main:
            stack.enter_context(locked(out))
            if o.overwrite and holds_run(out):
                remove_run(out)
        if is_distributed():
            torch.distributed.barrier()        # the others read --out once rank 0 holds it
        with StatusLine("preparing the run") as preparing:
            preparing("setting up the run (resuming one: reading its checkpoint)")
            run = setup_run(model, data.examples, cfg, src_vocab=data.src_vocab,
                            tgt_vocab=data.tgt_vocab, checkpoint_dir=out / "checkpoints",
                            resume=o.resume and not o.overwrite, device=device,
                            extra={"options": o.to_record()}, tokenizer=data.tokenizer)
        finished = stop_reason(run)       # then the folder, train.log too, is left as it is
        if finished and (not data.test or (out / RUN_REPORT).is_file()):
            say(_left_as_it_is(o, run, finished, changes))
            return TrainJobResult(out, run.state.step, finished, None, None, trained=False)
        if changes is not None:
            run.resume_changes = changes                 # in the command line's terms
        run.threads = tuner
        board = _open_records(o, run, log, command, device, stack)
        for line in [machine_line(device, tuner, o.training.amp),
                     *_start_lines(o, data, run)]:
            say(line)
        result = train_run(run, validate=_dev_scores(o, data, run, device, board), log=say,
                           scalars=board.scalars if board is not None else None)
        job = TrainJobResult(out, result.step, result.stopped, None, None)
        if job.signal is not None:
            say(f"stopped by {result.stopped.upper()} at step {result.step}; checkpoint "
                f"{result.last_checkpoint}; run the same command to continue")
            return job
        say(f"trained {result.step} updates, stopped by {result.stopped}, "
            f"{result.elapsed_s / 60:.1f} min")
        leave_process_group()           # rank 0 scores the test set alone: no one waits on it
        if not main:
            return job
        if not data.test:
            say(f"checkpoints: {out / 'checkpoints'}")
            return job
        report, metrics = _score(o, data, run, device, result, start, board)
        return replace(job, report=report, metrics=metrics)
