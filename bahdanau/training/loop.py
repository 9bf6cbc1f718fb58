"""The training loop: `train` and `train_run`, the named pieces of a run put together.

`train` is `setup_run` then `train_run`: the loop of `bahdanau.training.run` with a periodic
log line, early stopping, a final evaluation and checkpoint, and SIGINT/SIGTERM/SIGHUP turned
into a checkpoint and a clean stop; an interrupted run resumes exactly, and under
`torch.distributed` (e.g. `torchrun`) it trains with data parallelism: `BatchPlan` makes each
update `processes x accumulation` consecutive batches, each process training on its share, and
`train_step` gives it the gradient of the update's summed loss over its sentence count, as one
process would.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bahdanau._files import STOP_SIGNALS, handling_signals
from bahdanau.config import TrainConfig
from bahdanau.data.batching import Example
from bahdanau.data.tokenizers import Tokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.training.plan import LoaderWorkerError
from bahdanau.training.progress import TrainBar, updates_left
from bahdanau.training.run import (
    TrainRun,
    Validate,
    divergence,
    run_step,
    save_run,
    setup_run,
    stop_reason,
    validate_run,
)
from bahdanau.training.step import StepStats

_LIMITS = ("max_steps", "max_time", "max_epochs")   # stops after which a last evaluation runs
_ENDS = (*_LIMITS, "patience")     # the run's end; other stops (signals) interrupt it


# What a log line's numbers are called in `train_run`'s `scalars` (history key -> tag).
_SCALAR_TAGS = {"loss": "train/loss", "ppl": "train/ppl", "lr": "train/lr",
                "grad_norm": "train/grad_norm", "tokens_per_s": "train/tgt_tokens_per_s"}
_Scalars = Callable[[int, dict[str, float]], None]    # train_run's `scalars` callback
_LOG = logging.getLogger(__name__)


@contextmanager
def _stop_on_signals(run: TrainRun, log: Callable[[str], None]) -> Iterator[None]:
    """While inside, SIGINT, SIGTERM and SIGHUP set `run.signal` (so the loop saves and stops at
    the end of its step) instead of killing the process; a second one acts as usual."""
    def request_stop(signum: int, frame: Any) -> None:
        run.signal = signal.Signals(signum).name.lower()
        signal.signal(signum, previous[signal.Signals(signum)])
        if run.is_main:
            log(f"{run.signal.upper()}: stopping after this step, with a checkpoint")

    with handling_signals(STOP_SIGNALS, request_stop) as previous:
        yield


@dataclass
class TrainResult:
    """Summary of a `train` / `train_run` call."""

    step: int                          # optimizer steps taken in total (resumed ones included)
    epoch: int                         # epoch of the next batch (TrainState.epoch)
    stopped: str                       # why it stopped: a `stop_reason`
    elapsed_s: float                   # training time, resumed runs included
    start_step: int = 0                # the step this call started from (resumed: > 0)
    best_metric: float | None = None   # best early-stopping metric (validate_run)
    best_step: int | None = None
    train_loss: float = math.nan       # per-token loss, last log window (nan: no step taken)
    history: list[dict[str, float]] = field(default_factory=list)   # one dict per log line
    evals: list[tuple[int, float]] = field(default_factory=list)    # (step, metric)
    last_checkpoint: Path | None = None
    best_checkpoint: Path | None = None


def _format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# A moving average that ends its run still holding more than this share of the initial
# weights is noted when the run starts (0.998 over the default job's 2,270 updates: 1%).
EMA_INITIAL_SHARE = 0.05


def ema_note(decay: float, updates: float | None) -> str | None:
    """The note for a moving average of `decay` over a run of `updates` (None: unknown) that
    would end holding more than `EMA_INITIAL_SHARE` of the initial weights (decay ** updates),
    with the decay that would hold that share; None for a run long enough."""
    if not updates:
        return None
    share = decay ** updates
    if share <= EMA_INITIAL_SHARE:
        return None
    shorter = math.floor(EMA_INITIAL_SHARE ** (1 / updates) * 1000) / 1000
    return (f"note: after this run's {updates:.0f} updates the moving average of the weights "
            f"(ema_decay {decay:g}) still holds {share:.0%} of the initial weights, "
            f"which every translation from its checkpoints uses; ema_decay {shorter:g} or "
            "less suits a run this short (or none)")


def _eta(run: TrainRun, seconds_per_step: float) -> str:
    """Time left until the nearest limit, as h:mm:ss."""
    updates = updates_left(run)
    left = [] if updates is None else [updates * seconds_per_step]
    if run.cfg.max_time_s is not None:
        left.append(run.cfg.max_time_s - run.state.elapsed_s)
    return _format_eta(min(left)) if left else "?"


def _evaluate(run: TrainRun, validate: Validate, result: TrainResult,
              log: Callable[[str], None], scalars: _Scalars | None, *, scheduled: bool = True
              ) -> tuple[float, bool]:
    """`validate_run`, recorded in `result` and logged: ``step N | dev bleu 4.74 chrf 20.10
    ppl 123.40 | best bleu 4.74 at step N``, every score by its name."""
    state = run.state
    lr = run.schedule(state.step + 1, state.lr_decays)
    metric, improved = validate_run(run, validate, scheduled=scheduled)
    result.evals.append((state.step, metric))
    if run.is_main:
        new_lr = run.schedule(state.step + 1, state.lr_decays)
        decayed = f" | lr decayed to {new_lr:.3g}" if new_lr < lr else ""
        scores = " ".join(f"{name} {value:.2f}" for name, value in run.scores.items())
        log(f"step {state.step} | dev {scores} | best {run.cfg.early_stopping_metric} "
            f"{state.best_metric:.2f} at step {state.best_step}{decayed}")
        if scalars is not None:
            scalars(state.step, {f"dev/{name}": value for name, value in run.scores.items()})
    return metric, improved


def train(model: nn.Module, examples: Sequence[Example], cfg: TrainConfig, *, src_vocab: Vocab,
          tgt_vocab: Vocab, checkpoint_dir: str | Path | None = None, resume: bool = True,
          validate: Validate | None = None,
          log: Callable[[str], None] = _LOG.info, device: str | torch.device = "cpu",
          extra: dict[str, Any] | None = None, tokenizer: Tokenizer | None = None,
          scalars: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
    """Train `model` on `examples` until a step, epoch, time or patience limit is reached.

    The loop of `bahdanau.training.run`: `setup_run`, then `run_step` until `stop_reason`, with a
    log line every `cfg.log_every` steps, `validate_run` every `cfg.eval_every` steps and
    `save_run` every `cfg.save_every` steps and at every evaluation whose checkpoint is kept
    (an improvement, or with `cfg.keep_best` > 1 one of the best so far); at the end a last
    evaluation and checkpoint unless this step already had them (that evaluation, off the
    schedule, may be the best but counts for neither the plateau's decays nor the patience:
    `validate_run`'s `scheduled`). `examples` are used as given
    (the longest sentence is a data setting: `encode_pairs(..., max_len=50)`).

    Resumption: with `checkpoint_dir` and `resume`, the latest checkpoint there is restored, so
    an interrupted run ends with the same weights as an uninterrupted one. Distributed: see
    `setup_run`; `validate` runs on rank 0 only, and only rank 0 logs and saves. Every rank
    resumes from the same checkpoint directory.

    Args:
        model, examples, cfg, src_vocab, tgt_vocab, checkpoint_dir, resume, device, extra,
            tokenizer: as for `setup_run`.
        validate: called as `validate(model)` (in eval mode) every `cfg.eval_every` steps (0:
            none) and at the end; returns the early-stopping metric
            (`TrainConfig.early_stopping_metric`) or a dict of scores by name that holds it
            (`validate_run`). Drives best.pt and early stopping.
        log: receives one line every `cfg.log_every` steps and at evaluations (default: the
            ``bahdanau.training.loop`` logger, at INFO).
        scalars: called as `scalars(step, values)` with a log line's numbers by tag
            ("train/loss" and "train/ppl" per target token over the steps since the last line,
            "train/lr", "train/grad_norm" of the last step, "train/tgt_tokens_per_s") and at
            each evaluation with validate's scores as {"dev/NAME": value}; for TensorBoard, pass
            `bahdanau.training.runlog.TensorBoardLog(folder).scalars`. On rank 0 only, as `log`.
    Returns:
        A `TrainResult`.
    Raises:
        InputError: as `setup_run`, before any training.
        LoaderWorkerError: a `cfg.loader_workers` process died; the run saved a checkpoint
            at the step where it stopped first (under torch.distributed: none, the message
            names the last one).
        OSError: a checkpoint could not be written (a full disk, an I/O error): one line
            naming the file; the checkpoints saved before are untouched.
    """
    run = setup_run(model, examples, cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                    checkpoint_dir=checkpoint_dir, resume=resume, device=device, extra=extra,
                    tokenizer=tokenizer)
    return train_run(run, validate=validate, log=log, scalars=scalars)


def train_run(run: TrainRun, *, validate: Validate | None = None,
              log: Callable[[str], None] = _LOG.info,
              scalars: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
    """The loop of `train` over a run from `setup_run`.

    It first logs where a resumed run starts and what the resume changed
    (`run.resume_changes`, which a caller may reword), or, for a new run too short for its
    moving average of the weights, a note saying so (`ema_note`). SIGINT, SIGTERM and SIGHUP
    (in the main thread) do not kill it: the step under way finishes, a checkpoint is saved
    and the result's `stopped` is "sigint", "sigterm" or "sighup"; a second signal acts as
    usual. A run that has already reached a limit trains nothing and writes nothing. While it
    trains, rank 0 draws a progress bar on stderr when bars are shown
    (`bahdanau.training.progress.TrainBar`). A linear schedule (`TrainConfig.schedule`) that the
    time limit stops before max_steps ends with a line saying so: its rate never reached 0.

    Args:
        run: the run.
        validate, log, scalars: as for `train`.
    Returns:
        A `TrainResult`.
    Raises:
        InputError: `run.cfg.schedule` is "plateau" (it decays on evaluations) and `validate`
            is None; nothing is trained then.
    """
    if run.cfg.schedule == "plateau" and validate is None:
        raise InputError("schedule 'plateau' decays the learning rate after evaluations "
                         "without improvement: give validate")
    state = run.state
    if run.resumed_from is not None and run.is_main:
        log(f"resumed from {run.resumed_from} at step {state.step}, epoch {state.epoch}")
        for change in run.resume_changes:
            log(f"changed on resume: {change}")
        for note in run.resume_notes:
            log(f"on resume: {note}")
    if run.ema is not None and state.step == 0 and run.is_main:
        short = ema_note(run.ema.decay, updates_left(run))
        if short:
            log(short)
    result = TrainResult(step=state.step, epoch=state.epoch, stopped="",
                         elapsed_s=state.elapsed_s, start_step=state.step)
    bar = TrainBar(run)
    try:
        with _stop_on_signals(run, log):
            stopped = _loop(run, validate, log, result, scalars, bar)
    finally:
        bar.close()
    last = run.cfg.max_steps
    if stopped == "max_time" and run.cfg.schedule == "linear" and last and run.is_main:
        lr = run.schedule(state.step, state.lr_decays)      # its last update's
        log(f"step {state.step} | the time limit stopped the run {last - state.step} updates "
            f"before max_steps {last}: its linear schedule's learning rate was {lr:.3g}, not "
            "yet 0; resume it with more time, or start again with a max_steps the time allows")
    if run.distributed:          # every rank returns once rank 0 has written the last checkpoint
        torch.distributed.barrier()
    result.step, result.epoch, result.stopped = state.step, state.epoch, stopped
    result.elapsed_s = state.elapsed_s
    result.best_metric, result.best_step = state.best_metric, state.best_step
    if run.manager is not None and run.is_main:
        result.last_checkpoint, result.best_checkpoint = run.manager.latest(), run.manager.best()
    return result


def _loop(run: TrainRun, validate: Validate | None, log: Callable[[str], None],
          result: TrainResult, scalars: _Scalars | None, bar: TrainBar) -> str:
    """`train_run`'s steps, evaluations and checkpoints; returns the stop reason."""
    cfg, state = run.cfg, run.state
    first_step, start = state.step, time.monotonic()
    window_start, window_loss, window_tokens = start, 0.0, 0
    last_saved = last_eval = state.step
    stopped, skipped = stop_reason(run), 0
    while not stopped:
        try:
            stats = run_step(run)
        except LoaderWorkerError as err:      # raised before the step changed anything
            raise _saved_on_failure(run, err, last_saved) from None
        bar.step(stats)
        skipped = _count_skipped(run, stats, skipped, log)
        if not stats.non_finite:
            window_loss += stats.loss_sum
            window_tokens += stats.n_tokens
        if state.step % cfg.log_every == 0 and window_tokens:   # skipped updates: logged above
            now = time.monotonic()
            loss = window_loss / max(window_tokens, 1)
            entry = {"step": state.step, "epoch": state.epoch, "loss": loss,
                     "ppl": math.exp(min(loss, 700.0)), "grad_norm": stats.grad_norm,
                     "tokens_per_s": window_tokens / max(now - window_start, 1e-9),
                     "lr": float(run.optimizer.param_groups[0]["lr"])}
            result.history.append(entry)
            result.train_loss = loss
            if run.is_main:
                eta = _eta(run, (now - start) / (state.step - first_step))
                log(f"step {state.step} | epoch {state.epoch} | loss {loss:.4f} | "
                    f"ppl {entry['ppl']:.2f} | {entry['tokens_per_s']:.0f} tgt tok/s | "
                    f"grad {stats.grad_norm:.3f} | lr {entry['lr']:.3g} | eta {eta}")
                if scalars is not None:
                    scalars(state.step, {tag: entry[key] for key, tag in _SCALAR_TAGS.items()})
            window_start, window_loss, window_tokens = now, 0.0, 0
        metric, improved = None, False
        # a skipped update's step is neither evaluated nor saved on schedule: its weights have
        # just given a loss that is not finite
        if (not skipped and validate is not None and cfg.eval_every
                and state.step % cfg.eval_every == 0):
            metric, improved = _evaluate(run, validate, result, log, scalars)
            last_eval = state.step
        stopped = stop_reason(run)
        if not skipped and (state.step % cfg.save_every == 0 or improved
                            or _kept(run, metric)):
            save_run(run, metric=metric)
            last_saved = state.step

    if skipped and run.is_main:  # fewer than the limit: a transient overflow (fp16), say
        log(f"step {state.step} | the run stopped ({stopped}) after {skipped} skipped "
            f"update{'s' if skipped != 1 else ''} (max_nonfinite_steps "
            f"{cfg.max_nonfinite_steps}): its weights are those of the last applied update")
    if window_tokens:
        result.train_loss = window_loss / window_tokens
    final_metric = None
    if validate is not None and last_eval != state.step and stopped in _LIMITS:
        # off the schedule: it may be the best, but counts no bad evaluation, should the run
        # be continued past this limit
        final_metric, _ = _evaluate(run, validate, result, log, scalars, scheduled=False)
    if last_saved != state.step or _kept(run, final_metric):
        save_run(run, metric=final_metric, stopped=None if stopped in _ENDS else stopped)
    return stopped


def _saved_on_failure(run: TrainRun, err: LoaderWorkerError, last_saved: int
                      ) -> LoaderWorkerError:
    """Save the run at its step (unless that step is saved) when a loader worker died, and the
    one-line error that says so. Under torch.distributed nothing is saved: a save is a
    collective (`save_run` gathers every process's RNG states), which this process, the only
    one whose worker died, would wait in forever; the run continues from its last checkpoint."""
    step = run.state.step
    if run.distributed:
        latest = run.manager.latest() if run.manager is not None else None
        where = (f"the run stopped at step {step} without saving it (one of several processes "
                 "cannot save alone): " + (f"run the same command to continue from {latest}"
                                           if latest is not None else "no checkpoint was written"))
    else:
        path = save_run(run, stopped="loader") if last_saved != step else (
            run.manager.path_for(step) if run.manager is not None else None)
        where = (f"the run stopped at step {step} with its checkpoint {path}: run the same "
                 "command to continue" if path is not None else f"the run stopped at step {step}")
    return LoaderWorkerError(f"{' '.join(str(err).split())} (a --loader-workers process, "
                             f"killed or out of memory); {where}")


def _count_skipped(run: TrainRun, stats: StepStats, skipped: int,
                   log: Callable[[str], None]) -> int:
    """The updates skipped in a row so far, `stats`' included (0 after an applied one): each
    skipped one is logged, and `cfg.max_nonfinite_steps` of them stop the run (divergence)."""
    if not stats.non_finite:
        return 0
    skipped += 1
    limit = run.cfg.max_nonfinite_steps
    if skipped >= limit:
        raise divergence(run, f"{_not_finite(stats, skipped)} (max_nonfinite_steps {limit})")
    if run.is_main:
        log(f"step {run.state.step} | {_values(stats)}: not finite, update skipped ({skipped} "
            f"in a row; the run stops at {limit})")
    return skipped


def _values(stats: StepStats) -> str:
    """A step's loss per token and gradient norm, for a message."""
    return (f"loss {stats.loss_sum / max(stats.n_tokens, 1):.4g}, gradient norm "
            f"{stats.grad_norm:.4g}")


def _not_finite(stats: StepStats, skipped: int) -> str:
    """What a divergence message says of the updates skipped in a row, the last's `stats`."""
    return (f"the loss or gradient norm was not finite for {skipped} update"
            f"{'s' if skipped != 1 else ''} in a row, which were skipped (last: {_values(stats)})")


def _kept(run: TrainRun, metric: float | None) -> bool:
    """Whether the checkpoint manager would keep a checkpoint of this evaluation (it beats the
    best, or ranks among the `keep_best` best): then the step is saved even off `save_every`."""
    return (metric is not None and run.manager is not None and run.is_main
            and run.manager.would_keep(metric))
