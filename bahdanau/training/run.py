"""A training run as named pieces over one state: setup, next batches, step, validate, save, stop.

Users can write their own loop with the same parts (as torchtune's recipes do)::

    run = setup_run(model, examples, cfg, src_vocab=..., tgt_vocab=..., checkpoint_dir=...)
    while not stop_reason(run):                 # step, epoch, time or patience limit
        stats = run_step(run)                   # one update on the next batch
        if run.state.step % 500 == 0:
            metric, improved = validate_run(run, validate)
            save_run(run, metric=metric)         # best.pt if it is the best so far

`setup_run` builds a `TrainRun` (the model, optimizer, batch plan, checkpoint manager, ...) and
resumes its `TrainState` (step, place in the data, best metric, time) from the latest checkpoint.
With `cfg.ema_decay`, `run.ema` keeps a moving average of the weights (`bahdanau.training.ema`):
`run_step` updates it, `validate_run` scores it and `save_run` stores it (what translates from a
checkpoint uses it), while `run.model` keeps the trained weights. Each update's learning rate
comes from `cfg`'s schedule (`bahdanau.training.schedules`): `run_step` sets it, `validate_run`
counts the plateau decays.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from bahdanau._checks import check_type, is_finite_number, resolve_device
from bahdanau.checkpoint.files import complete_old_state, named, parse_section
from bahdanau.checkpoint.manager import CheckpointManager
from bahdanau.checkpoint.reader import Checkpoint, read_checkpoint
from bahdanau.checkpoint.sections import TRAIN_CONFIG, TRAIN_STATE
from bahdanau.config import TrainConfig, improves
from bahdanau.data.batching import (
    Batch,
    BucketBatchSampler,
    Example,
    check_examples,
    collate,
    pad_to_multiple,
)
from bahdanau.data.corpus import PreparedCorpus
from bahdanau.data.sentencepiece import check_vocabs
from bahdanau.data.tokenizers import Tokenizer, tokenizer_to_payload
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.training.distributed import broadcast, gather, is_distributed
from bahdanau.training.ema import WeightEMA
from bahdanau.training.plan import BatchLoader, BatchPlan, PlannedUpdate
from bahdanau.training.precision import amp_dtype
from bahdanau.training.schedules import LRSchedule, set_lr
from bahdanau.training.state import (
    TrainState,
    checkpoint_payload,
    model_config_of,
    restore,
    rng_state,
    rng_streams_notes,
    unwrap_model,
)
from bahdanau.training.step import LossModule, StepStats, make_optimizer, train_step
from bahdanau.training.threads import AdaptiveThreads
from bahdanau.training.update import SyncFreeUpdate

_LOG = logging.getLogger(__name__)


@dataclass
class TrainRun:
    """One training run: the live objects and the `TrainState` that the loop's pieces share.

    Built by `setup_run`; `next_batches`, `run_step`, `validate_run`, `save_run` and `stop_reason`
    read it and update `state`. Only `state` (with the model, optimizer, scaler and RNG states)
    goes into checkpoints; the rest is rebuilt by `setup_run`.
    """

    model: nn.Module                        # the model being trained (no wrappers)
    step_model: nn.Module                   # what train_step calls: model or DDP(LossModule)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None     # fp16 only
    plan: BatchPlan                         # each update's batches (plan.sampler: each epoch's)
    examples: Sequence[Example]
    cfg: TrainConfig
    schedule: LRSchedule                    # each update's learning rate, from cfg
    src_vocab: Vocab
    tgt_vocab: Vocab
    state: TrainState
    device: torch.device
    manager: CheckpointManager | None = None   # None: no checkpoints
    extra: dict[str, Any] = field(default_factory=dict)  # stored in every checkpoint
    tokenizer: Tokenizer | None = None      # stored in every checkpoint's tokenizer section
    distributed: bool = False               # torch.distributed is initialised
    is_main: bool = True                    # rank 0: validates, logs and saves
    resumed_from: Path | None = None        # the checkpoint the state came from
    resume_changes: list[str] = field(default_factory=list)  # logged by train_run
    # logged by train_run: what the resume could not keep (each process resumes the RNG
    # states it saved; with another number of processes, some cannot)
    resume_notes: list[str] = field(default_factory=list)
    signal: str = ""                        # "sigint", "sigterm" or "sighup" once one arrived
    clock: float = field(default_factory=time.monotonic)  # when state.elapsed_s was updated
    loader: BatchLoader | None = None       # with cfg.loader_workers: batches collated ahead
    ema: WeightEMA | None = None            # with cfg.ema_decay: the weights' moving average
    scores: dict[str, float] = field(default_factory=dict)  # the last evaluation's (rank 0)
    threads: AdaptiveThreads | None = None  # None: torch's thread count stays as it is
    update: SyncFreeUpdate | None = None    # with cfg.cuda_graphs: what run_step calls


def _tick(run: TrainRun) -> None:
    """Add the time since the last tick to `run.state.elapsed_s`."""
    now = time.monotonic()
    run.state.elapsed_s += now - run.clock
    run.clock = now


def examples_digest(examples: Sequence[Example]) -> str:
    """SHA-256 of the examples' source and target ids, in order: what a resumed run checks to
    know it trains on the same data (`TrainState.examples_digest`)."""
    hasher = hashlib.sha256()
    for ex in examples:
        hasher.update(np.asarray([len(ex.src), *ex.src, len(ex.tgt), *ex.tgt],
                                 dtype=np.int64).tobytes())
    return hasher.hexdigest()


def setup_run(model: nn.Module, examples: Sequence[Example], cfg: TrainConfig, *,
              src_vocab: Vocab, tgt_vocab: Vocab, checkpoint_dir: str | Path | None = None,
              resume: bool = True, device: str | torch.device = "cpu",
              extra: dict[str, Any] | None = None, tokenizer: Tokenizer | None = None
              ) -> TrainRun:
    """Check the arguments, build the optimizer and batch plan, and resume the latest checkpoint.

    With `checkpoint_dir` and `resume`, the latest checkpoint there is checked whole, then
    restored (weights, optimizer, GradScaler, RNG states, `TrainState`), and a save of it that a
    crash cut short is completed; otherwise torch's RNG is seeded with `cfg.seed`. Under
    `torch.distributed` the model is wrapped in `DistributedDataParallel` (`run.step_model`),
    and each update is `processes x cfg.accumulation` batches shared out by `BatchPlan`. On
    CUDA, TF32 is set as `cfg.tf32` says, and `cfg.cuda_graphs` makes `run.update` the captured
    `SyncFreeUpdate` that `run_step` calls.

    Args:
        model: an `RNNSearch` / `RNNEncDec`, moved to `device`; it needs its `.config` (as
            `build_model` makes it) to be checkpointed.
        examples: training examples, encoded with `src_vocab` and `tgt_vocab`: a list from
            `encode_pairs`, or a `PreparedCorpus` (memory-mapped, the same examples).
        cfg: training settings; at least one of max_steps, max_epochs, max_time_s must be set.
        src_vocab, tgt_vocab: must match `model.config`; stored in checkpoints.
        checkpoint_dir: where checkpoints go; None: no checkpoints.
        resume: continue from the latest checkpoint in `checkpoint_dir`, if any (False needs a
            directory without checkpoints). A resumed run keeps its examples
            (`examples_digest`), the settings `TrainConfig.resume_changes` fixes, and the
            batches of an update (processes x accumulation); every other changed field of
            `cfg` applies and is listed in `run.resume_changes`.
        device: where to train.
        extra: checkpoint-safe entries stored in every checkpoint under "extra".
        tokenizer: the tokenizer the examples were made with, stored in every checkpoint so
            that `bahdanau.load` and the command line translate with it; None stores none.
    Returns:
        The `TrainRun`.
    Raises:
        InputError: a device `cfg` cannot train on (`check_machine`, first), no stopping limit, no
            examples, vocabularies or a tokenizer unfit for the model, a model without `.config` to
            checkpoint, `resume=False` over checkpoints, or a damaged, malformed or mismatched
            checkpoint (its file, then what is wrong). Nothing is trained or written then.
    """
    device = _training_device(device, cfg)       # first: it reads none of the examples
    lengths, digest = _check_inputs(model, examples, cfg, src_vocab, tgt_vocab,
                                    checkpoint_dir is not None, tokenizer)
    manager = (_checkpoint_manager(checkpoint_dir, cfg, resume)
               if checkpoint_dir is not None else None)
    latest = manager.latest() if manager is not None else None
    distributed = is_distributed()
    processes = torch.distributed.get_world_size() if distributed else 1
    rank = torch.distributed.get_rank() if distributed else 0
    stored, changes = (_resumable(latest, cfg, digest, processes) if latest is not None
                       else (None, []))
    model.to(device)
    optimizer = make_optimizer(model, cfg)
    ema = WeightEMA(model, cfg.ema_decay) if cfg.ema_decay is not None else None
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    plan = _batch_plan(lengths, cfg, processes, rank)
    if stored is not None:
        assert manager is not None and latest is not None
        with named(latest):
            restored = restore(stored, model, optimizer, scaler=scaler, src_vocab=src_vocab,
                               tgt_vocab=tgt_vocab, ema=ema, rank=rank)
        assert restored is not None   # _resumable refused a checkpoint without a train_state
        state = restored
        cfg.set_hyperparameters(optimizer)
        _finish_resume(state, latest, manager, plan.sampler, write=rank == 0)
    else:
        state = TrainState(run_id=uuid.uuid4().hex)    # which its checkpoints keep
        torch.manual_seed(cfg.seed)
    state.examples_digest, state.processes = digest, processes
    return TrainRun(model=model, step_model=_step_model(model, device, distributed),
                    optimizer=optimizer, scaler=scaler, plan=plan, examples=examples, cfg=cfg,
                    schedule=LRSchedule.from_config(cfg), src_vocab=src_vocab,
                    tgt_vocab=tgt_vocab, state=state, device=device, manager=manager,
                    extra=dict(extra or {}), tokenizer=tokenizer, distributed=distributed,
                    is_main=rank == 0, resumed_from=latest, resume_changes=changes,
                    resume_notes=rng_streams_notes(stored.payload if stored else None, processes),
                    loader=BatchLoader(examples, plan, cfg.loader_workers,
                                       pin_memory=device.type == "cuda")
                    if cfg.loader_workers else None, ema=ema,
                    update=_cuda_setup(cfg, device, model, optimizer, scaler))


def _batch_plan(lengths: np.ndarray | Sequence[Example], cfg: TrainConfig, processes: int,
                rank: int) -> BatchPlan:
    """The run's batches (the paper's length-sorted minibatches of `cfg`), and this
    process's share of each update."""
    sampler = BucketBatchSampler(lengths, batch_size=None if cfg.max_tokens else cfg.batch_size,
                                 max_tokens=cfg.max_tokens, bucket=cfg.bucket, seed=cfg.seed,
                                 num_replicas=1, rank=0)
    return BatchPlan(sampler, processes=processes, rank=rank, accumulation=cfg.accumulation)


def _training_device(device: str | torch.device, cfg: TrainConfig) -> torch.device:
    """The device, checked (`check_machine`) with `cfg`, which is checked a `TrainConfig`."""
    check_type("cfg", cfg, TrainConfig, "a TrainConfig")
    device = resolve_device(device)
    check_machine(cfg, device, torch.distributed.get_world_size() if is_distributed() else 1)
    return device


def check_machine(cfg: TrainConfig, device: torch.device, processes: int) -> None:
    """What `cfg` asks of the machine: `cuda_graphs` needs one process on a CUDA device.

    Raises:
        InputError: naming the flag and the device or the processes.
    """
    if cfg.cuda_graphs and device.type != "cuda":
        raise InputError(f"--cuda-graphs needs a CUDA device, training is on {device}")
    if cfg.cuda_graphs and processes > 1:
        raise InputError(f"--cuda-graphs runs one process, not {processes}; under torchrun "
                         "leave it off")


def _cuda_setup(cfg: TrainConfig, device: torch.device, model: nn.Module,
                optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None
                ) -> SyncFreeUpdate | None:
    """On CUDA, TF32 as `cfg.tf32` says; with `cfg.cuda_graphs`, the captured update that
    `run_step` calls."""
    if device.type == "cuda":
        set_tf32(cfg.tf32)
    if not cfg.cuda_graphs:
        return None
    return SyncFreeUpdate(model, optimizer, clip_norm=cfg.clip_norm,
                          label_smoothing=cfg.label_smoothing,
                          amp_dtype=amp_dtype(cfg.amp, device),
                          scaler=scaler, cuda_graphs=True)


def set_tf32(on: bool) -> None:
    """Let CUDA float32 matmuls and cuDNN use TF32 tensor cores (`TrainConfig.tf32`): set by
    a training run on CUDA, never at import."""
    precision = "tf32" if on else "ieee"
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.backends.cudnn.fp32_precision = precision


def _finish_resume(state: TrainState, latest: Path, manager: CheckpointManager,
                   sampler: BucketBatchSampler, *, write: bool) -> None:
    """Complete what the checkpoint resumed from leaves open: a save that a crash cut short
    (by the one process that writes the folder), the fields a format-1 state lacks, and the run
    id that a checkpoint of an earlier version lacks (the run's later checkpoints keep it)."""
    state.run_id = state.run_id or uuid.uuid4().hex
    if write:
        manager.complete_save(latest, state)
    complete_old_state(state, recorded_best_step=manager.best_step,
                       epoch_batches=lambda epoch: len(sampler.epoch_batches(epoch)))


def _check_inputs(model: nn.Module, examples: Sequence[Example], cfg: TrainConfig,
                  src_vocab: Vocab, tgt_vocab: Vocab, checkpointed: bool,
                  tokenizer: Tokenizer | None) -> tuple[Any, str]:
    """`setup_run`'s checks of its arguments (but `cfg`'s type and the device: checked before,
    by `_training_device`), before any work; returns the examples' lengths (what the sampler
    reads) and their digest."""
    check_type("model", model, nn.Module, "a torch.nn.Module such as RNNSearch")
    if cfg.max_steps is None and cfg.max_epochs is None and cfg.max_time_s is None:
        raise InputError("cfg needs a limit: set max_steps, max_epochs or max_time_s")
    if len(examples) == 0:
        raise InputError("examples is empty")
    lengths: np.ndarray | Sequence[Example]
    if isinstance(examples, PreparedCorpus):   # checked whole when it was opened
        lengths, digest = examples.lengths, examples.digest()
    else:
        check_examples("examples", examples)
        lengths, digest = examples, examples_digest(examples)
    check_type("src_vocab", src_vocab, Vocab, "a Vocab")
    check_type("tgt_vocab", tgt_vocab, Vocab, "a Vocab")
    config = (model_config_of(model) if checkpointed
              else getattr(unwrap_model(model), "config", None))
    if config is not None:  # a model built without a config uses the Vocab ids
        config.check_vocabs(src_vocab, tgt_vocab)
    if tokenizer is not None:
        tokenizer_to_payload(tokenizer)        # refuses, before any work, what cannot be saved
        check_vocabs(tokenizer, src_vocab, tgt_vocab)
    return lengths, digest


def _checkpoint_manager(checkpoint_dir: str | Path, cfg: TrainConfig, resume: bool
                        ) -> CheckpointManager:
    """The run's checkpoint folder; refuses one that the run cannot continue or must not touch."""
    manager = CheckpointManager(checkpoint_dir, keep_last=cfg.keep_last, keep_best=cfg.keep_best,
                                metric_name=cfg.early_stopping_metric)
    if not resume and (manager.latest() or manager.best()):
        raise InputError(f"{checkpoint_dir} holds checkpoints of an earlier run: resume it, "
                         "or start over in another directory (nothing is deleted)")
    if manager.best() and not manager.latest():
        raise InputError(f"{checkpoint_dir} holds a best.pt but no numbered checkpoint to "
                         "resume: its run cannot continue; start over in another directory")
    return manager


def _resumable(latest: Path, cfg: TrainConfig, digest: str, processes: int
               ) -> tuple[Checkpoint, list[str]]:
    """The checkpoint to resume from, read through the door (once), checked against this run's
    settings, data and processes, and the changes of `cfg` it applies
    (`TrainConfig.resume_changes`)."""
    changes = []
    checkpoint = read_checkpoint(latest)
    payload = checkpoint.payload
    with named(latest):
        if payload[TRAIN_STATE] is None:
            raise InputError(f"checkpoint has no {TRAIN_STATE} to resume from")
        if payload[TRAIN_CONFIG] is not None:
            changes = cfg.resume_changes(TrainConfig.from_dict(payload[TRAIN_CONFIG]))
        stored_digest = payload[TRAIN_STATE].get("examples_digest")
        if stored_digest not in (None, digest):
            raise InputError("the training examples differ from those this run was "
                             "trained on (other files or contents, another length limit "
                             "or tokenisation): a resumed run keeps its data")
        _check_update_size(payload, processes, cfg.accumulation)
    return checkpoint, changes


def _step_model(model: nn.Module, device: torch.device, distributed: bool) -> nn.Module:
    """What `train_step` calls: the model, or under DDP `DistributedDataParallel(LossModule)`."""
    if not distributed:
        return model
    device_ids = None
    if device.type == "cuda":
        device_ids = [device.index if device.index is not None else torch.cuda.current_device()]
    return nn.parallel.DistributedDataParallel(LossModule(model), device_ids=device_ids)


def _check_update_size(payload: dict[str, Any], processes: int, accumulation: int) -> None:
    """Refuse to resume a run whose updates were another number of batches (processes x
    accumulation): the batches of each update would change from the run's place on."""
    if payload[TRAIN_CONFIG] is None:         # the run's accumulation is not known
        return
    before = parse_section(payload, TRAIN_STATE, TrainState.from_dict).processes
    size = before * parse_section(payload, TRAIN_CONFIG, TrainConfig.from_dict).accumulation
    if processes * accumulation == size:
        return
    fix = (f"use accumulation {size // processes}" if size % processes == 0 else
           f"run it on a number of processes that divides {size}")
    raise InputError(f"the run's updates are {size} batch{'es' if size != 1 else ''} "
                     f"({_n_processes(before)} x accumulation {size // before}), not "
                     f"{processes} x {accumulation}; a resumed run keeps its updates: with "
                     f"{_n_processes(processes)}, {fix}")


def _n_processes(n: int) -> str:
    """"1 process", "2 processes"."""
    return f"{n} process{'es' if n != 1 else ''}"


def next_batches(run: TrainRun) -> list[Batch]:
    """This process's batches of the next update, which starts at the run's place in the data
    (`state.epoch`, `state.position`; `run.plan` says which batches make it).

    Does not advance the state; `run_step` does. With `cfg.loader_workers`, the batches come
    from `run.loader`, collated ahead in worker processes; otherwise they are collated here.

    Args:
        run: the run.
    Returns:
        The `Batch`es (`cfg.accumulation` of them), on `run.device`.
    """
    return _batches_of(run, run.plan.update(run.state.epoch, run.state.position))


def _batches_of(run: TrainRun, planned: PlannedUpdate) -> list[Batch]:
    """This process's batches of the update that starts at the run's place, on `run.device`."""
    return [b.to(run.device, non_blocking=True) for b in _host_batches(run, planned)]


def _host_batches(run: TrainRun, planned: PlannedUpdate) -> list[Batch]:
    """This process's batches of the update, collated (by `run.loader`'s workers, or here)."""
    if run.loader is not None:
        return run.loader.batches(run.state.epoch, run.state.position)
    return [collate([run.examples[i] for i in b]) for b in planned.batches]


def _shaped_batches(run: TrainRun, planned: PlannedUpdate) -> list[Batch]:
    """`_batches_of` for `run.update`: each batch checked whole on the CPU (the update reads
    none of its values) and padded to a shape of few (`pad_to_multiple`)."""
    shaped, model = [], cast(Any, run.model)            # an RNNSearch: its check_batch
    for b in _host_batches(run, planned):
        model.check_batch(b.src, b.src_lengths, b.tgt_in, b.tgt_out)
        shaped.append(pad_to_multiple(b).to(run.device, non_blocking=True))
    return shaped


def run_step(run: TrainRun) -> StepStats:
    """One update (`train_step`) at the learning rate `run.schedule` gives it, on the batches
    `run.plan` gives this process from the run's place; the state moves on by a step and by
    the update's batches (`cfg.accumulation` on each process).

    After an epoch's last batch, `state.epoch` is the next epoch and `state.position` 0; the
    batches of one update may come from two epochs. With `run.ema`, the moving average then
    takes the new weights (`WeightEMA.update`; also after an update skipped for a non-finite
    gradient, which left the weights as they were). Under DDP the returned loss and token
    count are those of the whole update, summed over the processes (`train_step` sums them).

    Args:
        run: the run.
    Returns:
        The step's `StepStats`.
    """
    cfg, state, started = run.cfg, run.state, time.perf_counter()
    planned = run.plan.update(state.epoch, state.position)
    set_lr(run.optimizer, run.schedule(state.step + 1, state.lr_decays))
    if run.update is not None:
        stats = run.update(_shaped_batches(run, planned)).read()
    else:
        stats = train_step(run.step_model, _batches_of(run, planned), run.optimizer,
                           clip_norm=cfg.clip_norm, label_smoothing=cfg.label_smoothing,
                           amp_dtype=amp_dtype(cfg.amp, run.device), scaler=run.scaler,
                           update_sentences=planned.sentences if run.distributed else None)
    if run.ema is not None:
        run.ema.update(run.model)
    state.step += 1
    state.epoch, state.position = planned.after
    _tick(run)
    if run.threads is not None and not stats.non_finite:
        run.threads.observe(stats.n_tokens, time.perf_counter() - started)
    return stats


# What scores a model for `validate_run`: the early-stopping metric, or scores by name.
Validate = Callable[[nn.Module], float | Mapping[str, float]]


def validate_run(run: TrainRun, validate: Validate, *, scheduled: bool = True
                 ) -> tuple[float, bool]:
    """Score the model with `validate(model)` and update the best metric.

    `validate` returns the run's early-stopping metric (`TrainConfig.early_stopping_metric`:
    BLEU or chrF, higher is better; perplexity, lower is better), or a dict of scores by name
    that holds it (e.g. {"bleu": 4.7, "chrf": 21.0, "ppl": 123.4}); `run.scores` keeps them
    all (the metric alone under its name when `validate` returns a number). `validate` runs on
    rank 0 only, in eval mode (the model is back in train mode afterwards), and the metric is
    broadcast to every rank. With `run.ema`, the model holds the averaged weights while
    `validate` runs (`WeightEMA.applied_to`): what is scored is what the checkpoints translate
    with; with `run.threads`, it runs at the count the updates chose, never at one on trial
    (`AdaptiveThreads.chosen`). An improvement records the metric and step as the best and
    resets `state.bad_evals`; otherwise `bad_evals` grows by one, and when the schedule decays
    after that many (`LRSchedule.decays_after`), `state.lr_decays` too.

    Args:
        run: the run.
        validate: called as `validate(model)`; returns a number or a dict of numbers.
        scheduled: False for an evaluation off the `eval_every` schedule (`train_run`'s last,
            when a limit stops the run between two): a better metric is the best (best.pt),
            but it leaves `bad_evals` and `lr_decays` as they were, so that a run continued
            past that limit keeps the rates and patience of one that never stopped (unless
            that evaluation was the best: later ones are compared with it).
    Returns:
        (metric, whether it improved on the best so far).
    Raises:
        InputError: the weights hold NaN or inf (`check_finite`), and nothing is scored; or
            `validate` returned a value that is not a finite number, or a dict without the
            early-stopping metric.
    """
    check_finite(run)
    name, metric = run.cfg.early_stopping_metric, None
    if run.is_main:
        run.model.eval()
        try:
            with (run.ema.applied_to(run.model) if run.ema is not None else nullcontext(),
                  run.threads.chosen() if run.threads is not None else nullcontext()):
                returned = validate(run.model)
        finally:
            run.model.train()
        run.scores = _scores(returned, name)
        metric = run.scores[name]
    metric = broadcast(metric, run.distributed)
    state = run.state
    improved = improves(name, metric, state.best_metric)
    if improved:
        state.best_metric, state.best_step = metric, state.step
    if scheduled and improved:
        state.bad_evals = 0
    elif scheduled:
        state.bad_evals += 1
        if run.schedule.decays_after(state.bad_evals):
            state.lr_decays += 1
    _tick(run)
    return metric, improved


def _scores(returned: Any, name: str) -> dict[str, float]:
    """What `validate` returned as scores by name, checked; a number is the metric `name`."""
    if not isinstance(returned, Mapping):  # nan would never be beaten, nor beat anything
        if not is_finite_number(returned):
            raise InputError(f"validate returned {returned!r}; it must return a finite number "
                             "or a dict of them")
        return {name: float(returned)}
    if name not in returned:
        raise InputError(f"validate returned the scores {sorted(returned)}, without {name!r}, "
                         "the early-stopping metric")
    for key, value in returned.items():
        if not is_finite_number(value):
            raise InputError(f"validate returned {key} {value!r}; scores must be finite "
                             "numbers")
    return {str(key): float(value) for key, value in returned.items()}


def save_run(run: TrainRun, *, metric: float | None = None, stopped: str | None = None
             ) -> Path | None:
    """Checkpoint the run at its current step (rank 0 only) through its `CheckpointManager`.

    Args:
        run: the run.
        metric: this step's validation metric, if it was evaluated: the manager ranks it for
            ``best.pt`` and its kept best checkpoints (`TrainConfig.keep_best`).
        stopped: why an interrupted run saves this step off its schedule (a signal's name,
            "loader"), which the checkpoint records (`CheckpointManager.save`); None on the
            schedule and at the run's end.
    Returns:
        The numbered checkpoint's path; None without a checkpoint directory or off rank 0.
    Raises:
        InputError: the weights, their moving average or the optimizer state hold NaN or inf
            (`check_finite`): no checkpoint of a diverged run is written.
    """
    _tick(run)
    if run.manager is None and not run.distributed:
        return None
    check_finite(run)                  # on every process: their weights are the same
    # every process's own random draws; every process takes part, whatever its manager
    rng_by_rank = gather(rng_state(), run.distributed)
    if run.manager is None or not run.is_main:
        return None
    payload = checkpoint_payload(run.model, src_vocab=run.src_vocab, tgt_vocab=run.tgt_vocab,
                                 optimizer=run.optimizer, scaler=run.scaler, train_config=run.cfg,
                                 train_state=run.state, extra=run.extra,
                                 tokenizer=run.tokenizer, ema=run.ema, rng_by_rank=rng_by_rank)
    path = run.manager.save(run.state.step, payload, metric=metric, stopped=stopped)
    _LOG.debug(f"saved {path}")
    return path


def check_finite(run: TrainRun) -> None:
    """Refuse to go on with weights, a moving average or optimizer moments that hold NaN or
    inf: the run has diverged (an update too large for float32, such as a learning rate of
    1e308 gives, makes them so before any loss is computed with them).

    Raises:
        InputError: one line, `divergence`'s, naming what is not finite.
    """
    parts: list[tuple[str, list[torch.Tensor]]] = [("weights", list(run.model.parameters()))]
    if run.ema is not None:
        parts.append(("averaged weights (ema)", list(run.ema.state_dict().values())))
    parts.append(("optimizer moments", [v for s in run.optimizer.state.values()
                                      for v in s.values() if torch.is_tensor(v)]))
    for what, tensors in parts:
        tensors = [t for t in tensors if t.is_floating_point()]
        if tensors and not bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
            raise divergence(run, f"the {what} hold NaN or inf")


def divergence(run: TrainRun, what: str) -> InputError:
    """The one-line error that stops a diverged run: where, why, and which checkpoint is kept."""
    latest = run.manager.latest() if run.manager is not None else None
    kept = (f"the last checkpoint, {latest}, is kept" if latest is not None
            else "no checkpoint was written")
    return InputError(f"training diverged at step {run.state.step}: {what}; {kept} (a lower "
                      "learning rate may help)")


def stop_reason(run: TrainRun) -> str:
    """Why the run must stop now, if it must.

    Args:
        run: the run.
    Returns:
        "sigint", "sigterm" or "sighup" (`train_run` received that signal), "patience",
        "max_steps", "max_time" or "max_epochs" (the first limit reached, in that order), or ""
        if none is.
        Every rank gets the same answer (a signal to any rank, or any rank's time limit, counts
        for all). The time limit compares `state.elapsed_s`, which the other pieces bring up to
        date.
    """
    cfg, state = run.cfg, run.state
    signalled = signal.Signals[run.signal.upper()].value if run.signal else 0
    out_of_time = cfg.max_time_s is not None and state.elapsed_s >= cfg.max_time_s
    if run.distributed:           # one small all-reduce: any rank's signal stops every rank
        agreed = torch.tensor([signalled, int(out_of_time)], device=run.device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
        signalled, out_of_time = int(agreed[0]), bool(agreed[1])
    if signalled:
        return signal.Signals(signalled).name.lower()
    if cfg.patience is not None and state.bad_evals >= cfg.patience:
        return "patience"
    if cfg.max_steps is not None and state.step >= cfg.max_steps:
        return "max_steps"
    if out_of_time:
        return "max_time"
    if cfg.max_epochs is not None and state.epoch >= cfg.max_epochs:
        return "max_epochs"
    return ""
