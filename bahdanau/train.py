"""Training: the paper's Adadelta step with gradient-norm clipping, evaluation, a resumable loop.

The loop is made of named pieces over explicit state, so that users can write their own loop
with the same parts (as torchtune's recipes do):

    run = setup_run(model, examples, cfg, src_vocab=..., tgt_vocab=..., checkpoint_dir=...)
    while not stop_reason(run):                 # step, epoch, time or patience limit
        stats = run_step(run)                   # one update on the next batch
        if run.state.step % 500 == 0:
            metric, improved = validate_run(run, validate)
            save_run(run, metric=metric)         # best.pt if it is the best so far

`setup_run` builds a `TrainRun` (the model, optimizer, sampler, checkpoint manager, ...) and
resumes its `TrainState` (step, place in the data, best metric, time) from the latest checkpoint.
With `cfg.ema_decay`, `run.ema` keeps a moving average of the weights (`bahdanau.ema`):
`run_step` updates it, `validate_run` scores it and `save_run` stores it (what translates
from a checkpoint uses it), while `run.model` keeps the trained weights.
Lower still, `make_optimizer`, `train_step` (one update of any model on any batch) and
`evaluate_loss` work without a run, and `bahdanau.checkpoint`'s utilities are re-exported here.
`train` is `setup_run` then `train_run`: the loop above with a periodic log line, early
stopping, a final evaluation and checkpoint, and SIGINT/SIGTERM turned into a checkpoint and a
clean stop; an interrupted run resumes exactly, and under `torch.distributed` (e.g. `torchrun`)
it trains with data parallelism: `BatchPlan` makes each update `processes x accumulation`
consecutive batches, each process training on its share, and `train_step` gives it the
gradient of the update's summed loss over its sentence count, as one process would.

Paper settings (Bahdanau et al. 2015, appendix B.2): Adadelta with rho 0.95 and eps 1e-6,
minibatches of 80 sentences, the gradient's L2 norm clipped to 1, training sentences up to 50
words for RNNsearch-50. Beyond the paper, `TrainConfig` offers Adam, label smoothing, batches
by a token budget, learning-rate schedules with warm-up (`bahdanau.schedules`: `run_step` sets
each update's rate, `validate_run` counts the plateau decays) and gradient accumulation (one
update per `accumulation` consecutive batches, as if they were one batch).
"""

from __future__ import annotations

import hashlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_type, is_finite_number, is_int, resolve_device
from bahdanau.checkpoint import (
    CheckpointManager,
    TrainState,
    _config_of,
    _named,
    _parse,
    _unwrap,
    checkpoint_payload,
    load_checkpoint,
    model_from_checkpoint,
    restore,
    save_checkpoint,
    upgrade_payload,
)
from bahdanau.config import TrainConfig
from bahdanau.data.batching import Batch, BucketBatchSampler, Example, check_examples, collate
from bahdanau.data.corpus import PreparedCorpus
from bahdanau.data.sentencepiece import check_vocabs
from bahdanau.data.tokenizers import Tokenizer, tokenizer_to_payload
from bahdanau.data.vocab import Vocab
from bahdanau.ema import WeightEMA
from bahdanau.errors import InputError
from bahdanau.schedules import LRSchedule, set_lr

__all__ = [
    "CheckpointManager",
    "BatchLoader",
    "BatchPlan",
    "LossModule",
    "PlannedUpdate",
    "StepStats",
    "TrainConfig",
    "TrainResult",
    "TrainRun",
    "TrainState",
    "checkpoint_payload",
    "evaluate_loss",
    "examples_digest",
    "leave_process_group",
    "load_checkpoint",
    "make_optimizer",
    "model_from_checkpoint",
    "next_batches",
    "restore",
    "run_step",
    "save_checkpoint",
    "save_run",
    "setup_run",
    "stop_reason",
    "train",
    "train_run",
    "train_step",
    "validate_run",
]

# Ctrl-C, a scheduler's or `kill`'s request, a closed terminal (where the platform has it).
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                      if hasattr(signal, name))
_LIMITS = ("max_steps", "max_time", "max_epochs")   # stops after which a last evaluation runs
_AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# What a log line's numbers are called in `train_run`'s `scalars` (history key -> tag).
_SCALAR_TAGS = {"loss": "train/loss", "ppl": "train/ppl", "lr": "train/lr",
                "grad_norm": "train/grad_norm", "tokens_per_s": "train/tgt_tokens_per_s"}
_Scalars = Callable[[int, dict[str, float]], None]    # train_run's `scalars` callback


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adadelta(lr, rho, eps) as in the paper, or Adam(lr, eps) (fused where torch supports it)."""
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_type("cfg", cfg, TrainConfig, "a TrainConfig")
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adadelta":
        return torch.optim.Adadelta(params, lr=cfg.learning_rate, rho=cfg.rho, eps=cfg.eps)
    try:
        return torch.optim.Adam(params, lr=cfg.learning_rate, eps=cfg.eps, fused=True)
    except (RuntimeError, ValueError, TypeError):  # fused unsupported for these params/device
        return torch.optim.Adam(params, lr=cfg.learning_rate, eps=cfg.eps)


class LossModule(nn.Module):
    """Wraps a model so that `forward` returns `model.loss(...)`: what DDP must wrap.

    `DistributedDataParallel` synchronises gradients only for calls through its `forward`, so
    `train` wraps `DDP(LossModule(model))` rather than calling `model.loss` directly.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor, *,
                label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
        """(summed loss, number of target tokens), as `RNNSearch.loss`."""
        return _model_loss(self.module, src, src_lengths, tgt_in, tgt_out, label_smoothing)


def _model_loss(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                tgt_out: Tensor, label_smoothing: float) -> tuple[Tensor, Tensor]:
    """`model.loss`: the fused loss (works under autocast too)."""
    return model.loss(src, src_lengths, tgt_in, tgt_out, label_smoothing=label_smoothing)


def _batch_loss(model: nn.Module, batch: Batch, label_smoothing: float) -> tuple[Tensor, Tensor]:
    args = (batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if isinstance(inner, LossModule):
        return model(*args, label_smoothing=label_smoothing)
    if inner is not model:  # DDP around a plain model: go through its forward
        logits = model(batch.src, batch.src_lengths, batch.tgt_in)
        return functional.sequence_nll(logits, batch.tgt_out, batch.pad_id,
                                       label_smoothing=label_smoothing)
    return _model_loss(model, *args, label_smoothing)


class StepStats(NamedTuple):
    """What one `train_step` did."""

    loss_sum: float    # summed target-token loss of the batch
    n_tokens: int      # target tokens (eos included) in the batch
    grad_norm: float   # L2 norm of the gradient before clipping (inf/nan: update skipped)


def train_step(model: nn.Module, batch: Batch | Sequence[Batch],
               optimizer: torch.optim.Optimizer, *, clip_norm: float | None = 1.0,
               label_smoothing: float = 0.0, amp_dtype: torch.dtype | None = None,
               scaler: torch.amp.GradScaler | None = None,
               update_sentences: int | None = None) -> StepStats:
    """One update: loss, backward, clip the gradient norm, optimizer step.

    The gradient is that of the summed loss divided by B, the minibatch average of sentence
    negative log-likelihoods as in the paper (so longer sentences weigh more than in a
    per-token average). Several batches (gradient accumulation) make one update with the
    gradient of their summed loss divided by their total sentence count: what one batch of all
    their sentences gives, with the activations of one batch at a time in memory. Under DDP
    the gradients are synchronised once, after the last batch; with `update_sentences`, the
    sentences of the whole update on all processes, the gradient is that of the update's
    summed loss divided by that count, however its batches are shared among the processes
    (each scales its loss by processes / `update_sentences`, which DDP's mean undoes).

    Args:
        model: an `RNNSearch` (or anything with its `loss`), a `LossModule`, or DDP of either.
        batch: a `Batch` on the model's device, or a sequence of them for one update.
        optimizer: the optimizer of the model's parameters.
        clip_norm: rescale the gradient to at most this L2 norm; None: no clipping.
        label_smoothing: passed to the loss.
        amp_dtype: run the loss under `torch.autocast` with this dtype; None: no autocast.
        scaler: a `torch.amp.GradScaler` (for fp16).
        update_sentences: under DDP, the sentence count of the update's batches on every
            process together; None: each process divides by its own batches' count (the
            gradient is then the mean of the processes' per-sentence averages).
    Returns:
        `StepStats` of all the batches (this process's). A non-finite gradient norm skips the
        update (the GradScaler also lowers its scale then).
    Raises:
        InputError: an empty sequence of batches, `update_sentences` without DDP or below
            these batches' sentence count, or an optimizer without the parameters the loss
            depends on.
    """
    batches = [batch] if isinstance(batch, Batch) else list(batch)
    if not batches:
        raise InputError("train_step needs a batch, got an empty sequence of batches")
    sentences = sum(b.src.shape[0] for b in batches)
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    if update_sentences is not None:
        if not ddp:
            raise InputError("update_sentences is for a DistributedDataParallel model; one "
                             "process divides by its batches' own sentence count")
        if not is_int(update_sentences) or update_sentences < sentences:
            raise InputError(f"update_sentences must be an int >= these batches' {sentences} "
                             f"sentences, got {update_sentences!r}")
        sentences = update_sentences / torch.distributed.get_world_size(model.process_group)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    autocast = (torch.autocast(batches[0].src.device.type, dtype=amp_dtype)
                if amp_dtype is not None else nullcontext())
    losses, counts = [], []
    for i, b in enumerate(batches):
        last = i == len(batches) - 1
        with model.no_sync() if ddp and not last else nullcontext():  # type: ignore[operator]
            with autocast:
                loss_sum, n_tokens = _batch_loss(model, b, label_smoothing)
            # fp16/bf16 losses (autocast) are scaled in float32, float64 ones stay float64
            loss = loss_sum.to(torch.promote_types(loss_sum.dtype, torch.float32)) / sentences
            (scaler.scale(loss) if scaler is not None else loss).backward()
        losses.append(loss_sum.detach())
        counts.append(n_tokens)
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if all(p.grad is None for p in params):
        raise InputError("the optimizer holds none of the parameters the loss depends on: "
                         "build it from this model's parameters")
    max_norm = clip_norm if clip_norm is not None else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if scaler is not None:
        scaler.step(optimizer)   # skips the step itself when the gradient is not finite
        scaler.update()
    elif math.isfinite(grad_norm):
        optimizer.step()
    return StepStats(sum(float(x) for x in losses), sum(int(n) for n in counts), grad_norm)


@torch.no_grad()
def evaluate_loss(model: nn.Module, batches: Iterable[Batch]) -> tuple[float, float]:
    """Per-token loss and perplexity over `batches`, in eval mode (the mode is restored).

    Returns:
        (loss per target token, exp of it); (nan, nan) for no tokens.
    """
    model = _unwrap(model)
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        total, tokens = 0.0, 0
        for batch in batches:
            batch = batch.to(device)
            loss_sum, n = model.loss(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
            total += float(loss_sum)
            tokens += int(n)
    finally:
        model.train(was_training)
    if tokens == 0:
        return math.nan, math.nan
    loss = total / tokens
    return loss, math.exp(min(loss, 700.0))


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
    signal: str = ""                        # "sigint", "sigterm" or "sighup" once one arrived
    clock: float = field(default_factory=time.monotonic)  # when state.elapsed_s was updated
    loader: BatchLoader | None = None       # with cfg.loader_workers: batches collated ahead
    ema: WeightEMA | None = None            # with cfg.ema_decay: the weights' moving average


def _broadcast(value: Any, distributed: bool) -> Any:
    """Rank 0's `value` on every rank."""
    if not distributed:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def leave_process_group() -> None:
    """Ends the default `torch.distributed` process group on every process together, once
    training is over: the replacement for `torch.distributed.destroy_process_group()` after
    `train` under DDP (`bahdanau train` under torchrun calls it).

    gloo frees a collective's tensors on its own worker threads, after the collective has
    returned, and freeing a tensor made in Python takes the GIL: a worker thread that asks
    for it while the interpreter exits aborts the process ("terminate called without an
    active exception"), and the threads outlive `destroy_process_group` while a
    `DistributedDataParallel` model holds the group. So on gloo the last collective is an
    all-reduce that returns once gloo has let go of its tensor (or after 10 s, should a
    later torch keep it).
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo":
        last, deadline = torch.zeros(1), time.monotonic() + 10
        dist.all_reduce(last)
        while last._use_count() > 1 and time.monotonic() < deadline:   # gloo still holds it
            time.sleep(0.001)
    else:
        dist.barrier()
    dist.destroy_process_group()


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
              extra: dict[str, Any] | None = None,
              tokenizer: Tokenizer | None = None) -> TrainRun:
    """Check the arguments, build the optimizer and sampler, and resume the latest checkpoint.

    With `checkpoint_dir` and `resume`, the latest checkpoint there is restored (weights,
    optimizer, GradScaler, RNG states and the `TrainState`) once it is checked whole, and the
    save of it that a crash may have cut short is completed (`CheckpointManager.complete_save`);
    otherwise torch's RNG is seeded with `cfg.seed` and the state starts at step 0. Under
    `torch.distributed` the model is wrapped in `DistributedDataParallel` (as
    `run.step_model`), and each update is `processes x cfg.accumulation` batches of which
    every process takes its share (`BatchPlan`).

    Args:
        model: an `RNNSearch` / `RNNEncDec`, moved to `device`; it needs its `.config` (as
            `build_model` makes it) to be checkpointed.
        examples: training examples, encoded with `src_vocab` and `tgt_vocab`: a list from
            `encode_pairs`, or a `PreparedCorpus` (memory-mapped, the same examples).
        cfg: training settings; at least one of max_steps, max_epochs, max_time_s must be set.
        src_vocab, tgt_vocab: must match `model.config` (sizes and special ids); stored in
            checkpoints and checked on resume.
        checkpoint_dir: where checkpoints go; None: no checkpoints.
        resume: continue from the latest checkpoint in `checkpoint_dir`, if any. False needs a
            directory without checkpoints: an earlier run's files are never overwritten. A
            resumed run keeps its examples (`examples_digest`), the stored optimizer type,
            batch definition and seed (`TrainConfig.FIXED_ON_RESUME`; a change is refused) and
            the batches of an update, processes x accumulation (another number of processes
            needs the accumulation that keeps the product), and it applies every other
            changed field of `cfg`, listed in `run.resume_changes`; the optimizer's settings
            are set from `cfg` (`TrainConfig.set_hyperparameters`), and each update's learning
            rate from `cfg`'s schedule and the stored plateau decays (`TrainState.lr_decays`).
        device: where to train.
        extra: checkpoint-safe entries stored in every checkpoint under "extra".
        tokenizer: the tokenizer the examples were made with (`DefaultTokenizer`,
            `WhitespaceTokenizer` or `SentencePieceTokenizer`), stored in every checkpoint
            (its `tokenizer` section), so that `bahdanau.load` and the command line translate
            with it; None stores none.
    Returns:
        The `TrainRun`.
    Raises:
        InputError: no stopping limit, no examples, vocabularies whose sizes or special ids
            differ from `model.config`'s, a tokenizer that cannot be stored or (SentencePiece)
            whose pieces the vocabularies' words are not, a checkpoint directory with a model
            that has no `.config`, `resume=False` with a directory holding checkpoints, or a
            checkpoint that is damaged, malformed or does not match: model config,
            vocabularies, a fixed `cfg` field or the batches of an update (the file first,
            then what is wrong). Nothing
            is trained and no file is written then.
    """
    check_type("model", model, nn.Module, "a torch.nn.Module such as RNNSearch")
    check_type("cfg", cfg, TrainConfig, "a TrainConfig")
    if cfg.max_steps is None and cfg.max_epochs is None and cfg.max_time_s is None:
        raise InputError("cfg needs a limit: set max_steps, max_epochs or max_time_s")
    if len(examples) == 0:
        raise InputError("examples is empty")
    if isinstance(examples, PreparedCorpus):   # checked whole when it was opened
        lengths, digest = examples.lengths, examples.digest()
    else:
        check_examples("examples", examples)
        lengths, digest = examples, examples_digest(examples)
    check_type("src_vocab", src_vocab, Vocab, "a Vocab")
    check_type("tgt_vocab", tgt_vocab, Vocab, "a Vocab")
    device = resolve_device(device)
    config = (_config_of(model) if checkpoint_dir is not None
              else getattr(_unwrap(model), "config", None))
    if config is not None:  # a model built without a config uses the Vocab ids
        config.check_vocabs(src_vocab, tgt_vocab)
    if tokenizer is not None:
        tokenizer_to_payload(tokenizer)        # refuses, before any work, what cannot be saved
        check_vocabs(tokenizer, src_vocab, tgt_vocab)
    manager = None
    if checkpoint_dir is not None:
        manager = CheckpointManager(checkpoint_dir, keep_last=cfg.keep_last,
                                    keep_best=cfg.keep_best)
        if not resume and (manager.latest() or manager.best()):
            raise InputError(f"{checkpoint_dir} holds checkpoints of an earlier run: resume it, "
                             "or start over in another directory (nothing is deleted)")
        if manager.best() and not manager.latest():
            raise InputError(f"{checkpoint_dir} holds a best.pt but no numbered checkpoint to "
                             "resume: its run cannot continue; start over in another directory")
    latest = manager.latest() if manager is not None else None
    payload = None
    changes = []
    if latest is not None:
        with _named(latest):
            payload = upgrade_payload(load_checkpoint(latest))
            if payload["train_state"] is None:
                raise InputError("checkpoint has no train_state to resume from")
            if payload["train_config"] is not None:
                changes = cfg.resume_changes(TrainConfig.from_dict(payload["train_config"]))
            stored_digest = payload["train_state"].get("examples_digest")
            if stored_digest not in (None, digest):
                raise InputError("the training examples differ from those this run was "
                                 "trained on (other files or contents, another length limit "
                                 "or tokenisation): a resumed run keeps its data")
    dist = torch.distributed
    distributed = dist.is_available() and dist.is_initialized()
    processes = dist.get_world_size() if distributed else 1
    if payload is not None:
        with _named(latest):
            _check_update_size(payload, processes, cfg.accumulation)
    model.to(device)
    optimizer = make_optimizer(model, cfg)
    ema = WeightEMA(model, cfg.ema_decay) if cfg.ema_decay is not None else None
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    sampler = BucketBatchSampler(lengths, batch_size=None if cfg.max_tokens else cfg.batch_size,
                                 max_tokens=cfg.max_tokens, bucket=cfg.bucket, seed=cfg.seed,
                                 num_replicas=1, rank=0)
    plan = BatchPlan(sampler, processes=processes, rank=dist.get_rank() if distributed else 0,
                     accumulation=cfg.accumulation)
    if payload is not None:
        with _named(latest):
            state = restore(payload, model, optimizer, scaler=scaler, src_vocab=src_vocab,
                            tgt_vocab=tgt_vocab, ema=ema)
        cfg.set_hyperparameters(optimizer)
        if not distributed or dist.get_rank() == 0:   # one process writes the directory
            manager.complete_save(latest, state)   # a crash may have cut its save short
        if state.best_step is None and state.best_metric is not None:  # format 1: in best.json
            state.best_step = manager.best_step
        if state.position >= len(sampler.epoch_batches(state.epoch)):  # format 1: epoch's end
            state.epoch, state.position = state.epoch + 1, 0
        state.examples_digest = digest
    else:
        state = TrainState(examples_digest=digest)
        torch.manual_seed(cfg.seed)
    state.processes = processes
    step_model: nn.Module = model
    if distributed:
        device_ids = None
        if device.type == "cuda":
            device_ids = [device.index if device.index is not None else torch.cuda.current_device()]
        step_model = nn.parallel.DistributedDataParallel(LossModule(model), device_ids=device_ids)
    return TrainRun(model=model, step_model=step_model, optimizer=optimizer, scaler=scaler,
                    plan=plan, examples=examples, cfg=cfg,
                    schedule=LRSchedule.from_config(cfg), src_vocab=src_vocab,
                    tgt_vocab=tgt_vocab, state=state, device=device, manager=manager,
                    extra=dict(extra or {}), tokenizer=tokenizer, distributed=distributed,
                    is_main=not distributed or dist.get_rank() == 0, resumed_from=latest,
                    resume_changes=changes,
                    loader=BatchLoader(examples, plan, cfg.loader_workers,
                                       pin_memory=device.type == "cuda")
                    if cfg.loader_workers else None, ema=ema)


def _check_update_size(payload: dict[str, Any], processes: int, accumulation: int) -> None:
    """Refuse to resume a run whose updates were another number of batches (processes x
    accumulation): the batches of each update would change from the run's place on."""
    if payload["train_config"] is None:         # the run's accumulation is not known
        return
    before = _parse(payload, "train_state", TrainState.from_dict).processes
    size = before * _parse(payload, "train_config", TrainConfig.from_dict).accumulation
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


class PlannedUpdate(NamedTuple):
    """One update as `BatchPlan.update` plans it."""

    batches: list[np.ndarray]   # this process's batches, as positions into the examples
    sentences: int              # sentences of the whole update, on every process together
    after: tuple[int, int]      # the (epoch, position) where the next update starts


class BatchPlan:
    """Which batches make each update, and which of them this process trains on.

    An update is `processes x accumulation` consecutive batches of the sampler's list (which
    depends only on the seed and the epoch; one epoch runs on into the next), and process
    `rank` takes `accumulation` of them: those from rank x accumulation on. The updates
    therefore depend only on the seed and that product: a run resumed with other processes
    and accumulation of the same product trains on the same updates, and `train_step` makes
    each one's gradient that of its summed loss over its sentence count however it is shared.

    Args:
        sampler: a one-process `BucketBatchSampler` (num_replicas=1): the batches of the whole
            run.
        processes: processes taking a share of every update (the DDP world size).
        rank: this process's rank, in [0, processes).
        accumulation: batches per process per update.
    """

    def __init__(self, sampler: BucketBatchSampler, *, processes: int = 1, rank: int = 0,
                 accumulation: int = 1) -> None:
        check_type("sampler", sampler, BucketBatchSampler, "a BucketBatchSampler")
        if sampler.num_replicas != 1:
            raise InputError("a BatchPlan shares the batches among processes itself: give it a "
                             f"sampler with num_replicas=1, not {sampler.num_replicas}")
        for name, value in (("processes", processes), ("accumulation", accumulation)):
            if not is_int(value) or value < 1:
                raise InputError(f"{name} must be a positive int, got {value!r}")
        if not is_int(rank) or not 0 <= rank < processes:
            raise InputError(f"rank must be in [0, {processes}), got {rank!r}")
        self.sampler, self.processes, self.rank = sampler, processes, rank
        self.accumulation = accumulation

    @property
    def size(self) -> int:
        """Batches per update: processes x accumulation."""
        return self.processes * self.accumulation

    def update(self, epoch: int, position: int) -> PlannedUpdate:
        """The update that starts at batch `position` of `epoch`."""
        mine = range(self.rank * self.accumulation, (self.rank + 1) * self.accumulation)
        batches, sentences = [], 0
        for i in range(self.size):
            batch = self.sampler.epoch_batches(epoch)[position]
            sentences += len(batch)
            if i in mine:
                batches.append(batch)
            epoch, position = self._after(epoch, position)
        return PlannedUpdate(batches, sentences, (epoch, position))

    def _after(self, epoch: int, position: int) -> tuple[int, int]:
        if position + 1 == len(self.sampler.epoch_batches(epoch)):
            return epoch + 1, 0
        return epoch, position + 1


class _Shares(torch.utils.data.Dataset):
    """Item i: the collated batches of share i (what a DataLoader worker makes)."""

    def __init__(self, examples: Sequence[Example], shares: Sequence[list[np.ndarray]]) -> None:
        self.examples, self.shares = examples, shares

    def __len__(self) -> int:
        return len(self.shares)

    def __getitem__(self, i: int) -> list[Batch]:
        return [collate([self.examples[j] for j in batch]) for batch in self.shares[i]]


def _ignore_sigint(worker_id: int) -> None:
    """Ctrl-C reaches the whole process group: the workers leave it to the main process,
    which stops at the end of its step and saves."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class BatchLoader:
    """Collates this process's batches of the coming updates ahead of the training step, in
    `workers` processes (a `torch.utils.data.DataLoader`; pinned memory when training on CUDA).

    It hands out the batches of the update that starts at any place (epoch, position) asked
    for, and so knows nothing of resuming: the run's `TrainState` counts the batches the
    optimiser consumed, and asking for another place than where the last update ended (a
    resumed run, or the updates of a new epoch) starts the workers there, on the updates that
    start in that epoch. The batches are those `collate` makes inline, in the same order.
    """

    def __init__(self, examples: Sequence[Example], plan: BatchPlan, workers: int,
                 pin_memory: bool) -> None:
        self.examples, self.plan = examples, plan
        self.workers, self.pin_memory = workers, pin_memory
        self._shares: Iterator[list[Batch]] = iter(())
        self._starts: Iterator[tuple[int, int] | None] = iter(())
        self._next: tuple[int, int] | None = None

    def batches(self, epoch: int, position: int) -> list[Batch]:
        """This process's collated batches of the update that starts at batch `position` of
        `epoch` (`BatchPlan.update`)."""
        if self._next != (epoch, position):
            starts, shares, place = [], [], (epoch, position)
            while place[0] == epoch:          # the updates that start in this epoch
                planned = self.plan.update(*place)
                shares.append(planned.batches)
                place = planned.after
                starts.append(place)
            self._starts = iter([*starts[:-1], None])   # None: the workers' list has ended
            self._shares = iter(torch.utils.data.DataLoader(
                _Shares(self.examples, shares), batch_size=None, num_workers=self.workers,
                pin_memory=self.pin_memory, worker_init_fn=_ignore_sigint))
        self._next = next(self._starts)
        return next(self._shares)


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
    if run.loader is not None:
        batches = run.loader.batches(run.state.epoch, run.state.position)
    else:
        batches = [collate([run.examples[i] for i in b]) for b in planned.batches]
    return [b.to(run.device, non_blocking=True) for b in batches]


def run_step(run: TrainRun) -> StepStats:
    """One update (`train_step`) at the learning rate `run.schedule` gives it, on the batches
    `run.plan` gives this process from the run's place; the state moves on by a step and by
    the update's batches (`cfg.accumulation` on each process).

    After an epoch's last batch, `state.epoch` is the next epoch and `state.position` 0; the
    batches of one update may come from two epochs. With `run.ema`, the moving average then
    takes the new weights (`WeightEMA.update`; also after an update skipped for a non-finite
    gradient, which left the weights as they were). Under DDP the returned loss and token
    count are those of the whole update, summed over the processes.

    Args:
        run: the run.
    Returns:
        The step's `StepStats`.
    """
    cfg, state = run.cfg, run.state
    planned = run.plan.update(state.epoch, state.position)
    batches = _batches_of(run, planned)
    set_lr(run.optimizer, run.schedule(state.step + 1, state.lr_decays))
    stats = train_step(run.step_model, batches, run.optimizer, clip_norm=cfg.clip_norm,
                       label_smoothing=cfg.label_smoothing, amp_dtype=_AMP_DTYPES[cfg.amp],
                       scaler=run.scaler,
                       update_sentences=planned.sentences if run.distributed else None)
    if run.distributed:
        totals = torch.tensor([stats.loss_sum, stats.n_tokens], dtype=torch.float64,
                              device=run.device)
        torch.distributed.all_reduce(totals)
        stats = stats._replace(loss_sum=float(totals[0]), n_tokens=int(totals[1]))
    if run.ema is not None:
        run.ema.update(run.model)
    state.step += 1
    state.epoch, state.position = planned.after
    _tick(run)
    return stats


def validate_run(run: TrainRun, validate: Callable[[nn.Module], float]) -> tuple[float, bool]:
    """Score the model with `validate(model)` (higher is better) and update the best metric.

    `validate` runs on rank 0 only, in eval mode (the model is back in train mode afterwards),
    and its result is broadcast to every rank. With `run.ema`, the model holds the averaged
    weights while `validate` runs (`WeightEMA.applied_to`): what is scored is what the
    checkpoints translate with. An improvement records the metric and step as the best and
    resets `state.bad_evals`; otherwise `bad_evals` grows by one, and when the schedule decays
    after that many (`LRSchedule.decays_after`), `state.lr_decays` too.

    Args:
        run: the run.
        validate: called as `validate(model)`; returns a float, higher is better (e.g. BLEU).
    Returns:
        (metric, whether it improved on the best so far).
    """
    metric = None
    if run.is_main:
        run.model.eval()
        try:
            with run.ema.applied_to(run.model) if run.ema is not None else nullcontext():
                metric = validate(run.model)
        finally:
            run.model.train()
        if not is_finite_number(metric):      # nan would never be beaten, nor beat anything
            raise InputError(f"validate returned {metric!r}; it must return a finite number "
                             "(higher is better)")
        metric = float(metric)
    metric = _broadcast(metric, run.distributed)
    state = run.state
    improved = state.best_metric is None or metric > state.best_metric
    if improved:
        state.best_metric, state.best_step, state.bad_evals = metric, state.step, 0
    else:
        state.bad_evals += 1
        if run.schedule.decays_after(state.bad_evals):
            state.lr_decays += 1
    _tick(run)
    return metric, improved


def save_run(run: TrainRun, *, metric: float | None = None) -> Path | None:
    """Checkpoint the run at its current step (rank 0 only) through its `CheckpointManager`.

    Args:
        run: the run.
        metric: this step's validation metric, if it was evaluated: the manager ranks it for
            ``best.pt`` and its kept best checkpoints (`TrainConfig.keep_best`).
    Returns:
        The numbered checkpoint's path; None without a checkpoint directory or off rank 0.
    """
    _tick(run)
    if run.manager is None or not run.is_main:
        return None
    payload = checkpoint_payload(run.model, src_vocab=run.src_vocab, tgt_vocab=run.tgt_vocab,
                                 optimizer=run.optimizer, scaler=run.scaler, train_config=run.cfg,
                                 train_state=run.state, extra=run.extra,
                                 tokenizer=run.tokenizer, ema=run.ema)
    return run.manager.save(run.state.step, payload, metric=metric)


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


@contextmanager
def _stop_on_signals(run: TrainRun, log: Callable[[str], None]) -> Iterator[None]:
    """While inside, SIGINT, SIGTERM and SIGHUP set `run.signal` (so the loop saves and stops at
    the end of its step) instead of killing the process; a second one acts as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield                                  # handlers can only be set in the main thread
        return
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}

    def request_stop(signum: int, frame: Any) -> None:
        run.signal = signal.Signals(signum).name.lower()
        signal.signal(signum, previous[signal.Signals(signum)])
        if run.is_main:
            log(f"{run.signal.upper()}: stopping after this step, with a checkpoint")

    for sig in previous:
        signal.signal(sig, request_stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class TrainResult:
    """Summary of a `train` / `train_run` call."""

    step: int                          # optimizer steps taken in total (resumed ones included)
    epoch: int                         # epoch of the next batch (TrainState.epoch)
    stopped: str                       # why it stopped: a `stop_reason`
    elapsed_s: float                   # training time, resumed runs included
    start_step: int = 0                # the step this call started from (resumed: > 0)
    best_metric: float | None = None   # best validate() value
    best_step: int | None = None
    train_loss: float = math.nan       # per-token loss, last log window (nan: no step taken)
    history: list[dict[str, float]] = field(default_factory=list)   # one dict per log line
    evals: list[tuple[int, float]] = field(default_factory=list)    # (step, metric)
    last_checkpoint: Path | None = None
    best_checkpoint: Path | None = None


def _format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _eta(run: TrainRun, seconds_per_step: float) -> str:
    """Time left until the nearest limit, as h:mm:ss."""
    cfg, state = run.cfg, run.state
    left = []
    if cfg.max_steps is not None:
        left.append((cfg.max_steps - state.step) * seconds_per_step)
    if cfg.max_time_s is not None:
        left.append(cfg.max_time_s - state.elapsed_s)
    if cfg.max_epochs is not None:
        per_epoch = len(run.plan.sampler.epoch_batches(state.epoch))
        left.append(((cfg.max_epochs - state.epoch) * per_epoch - state.position)
                    / run.plan.size * seconds_per_step)
    return _format_eta(min(left)) if left else "?"


def _evaluate(run: TrainRun, validate: Callable[[nn.Module], float], result: TrainResult,
              log: Callable[[str], None], scalars: _Scalars | None) -> tuple[float, bool]:
    """`validate_run`, recorded in `result` and logged."""
    state = run.state
    lr = run.schedule(state.step + 1, state.lr_decays)
    metric, improved = validate_run(run, validate)
    result.evals.append((state.step, metric))
    if run.is_main:
        new_lr = run.schedule(state.step + 1, state.lr_decays)
        decayed = f" | lr decayed to {new_lr:.3g}" if new_lr < lr else ""
        log(f"step {state.step} | eval {metric:.4f} | best {state.best_metric:.4f} at step "
            f"{state.best_step}{decayed}")
        if scalars is not None:
            scalars(state.step, {"dev/metric": metric})
    return metric, improved


def train(model: nn.Module, examples: Sequence[Example], cfg: TrainConfig, *, src_vocab: Vocab,
          tgt_vocab: Vocab, checkpoint_dir: str | Path | None = None, resume: bool = True,
          validate: Callable[[nn.Module], float] | None = None,
          log: Callable[[str], None] = print, device: str | torch.device = "cpu",
          extra: dict[str, Any] | None = None, tokenizer: Tokenizer | None = None,
          scalars: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
    """Train `model` on `examples` until a step, epoch, time or patience limit is reached.

    The loop of the module docstring: `setup_run`, then `run_step` until `stop_reason`, with a
    log line every `cfg.log_every` steps, `validate_run` every `cfg.eval_every` steps and
    `save_run` every `cfg.save_every` steps and at every evaluation whose checkpoint is kept
    (an improvement, or with `cfg.keep_best` > 1 one of the best so far); at the end a last
    evaluation and checkpoint unless this step already had them. `examples` are used as given
    (the longest sentence is a data setting: `encode_pairs(..., max_len=50)`).

    Resumption: with `checkpoint_dir` and `resume`, the latest checkpoint there is restored, so
    an interrupted run ends with the same weights as an uninterrupted one. Distributed: see
    `setup_run`; `validate` runs on rank 0 only, and only rank 0 logs and saves. Every rank
    resumes from the same checkpoint directory.

    Args:
        model, examples, cfg, src_vocab, tgt_vocab, checkpoint_dir, resume, device, extra,
            tokenizer: as for `setup_run`.
        validate: called as `validate(model)` (in eval mode) every `cfg.eval_every` steps and at
            the end; higher is better (e.g. dev BLEU). Drives best.pt and early stopping.
        log: receives one line every `cfg.log_every` steps and at evaluations.
        scalars: called as `scalars(step, values)` with a log line's numbers by tag
            ("train/loss" and "train/ppl" per target token over the steps since the last line,
            "train/lr", "train/grad_norm" of the last step, "train/tgt_tokens_per_s") and at
            each evaluation with {"dev/metric": validate's value}; for TensorBoard, pass
            `bahdanau.runlog.TensorBoardLog(folder).scalars`. On rank 0 only, as `log`.
    Returns:
        A `TrainResult`.
    Raises:
        InputError: as `setup_run`, before any training.
    """
    run = setup_run(model, examples, cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                    checkpoint_dir=checkpoint_dir, resume=resume, device=device, extra=extra,
                    tokenizer=tokenizer)
    return train_run(run, validate=validate, log=log, scalars=scalars)


def train_run(run: TrainRun, *, validate: Callable[[nn.Module], float] | None = None,
              log: Callable[[str], None] = print,
              scalars: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
    """The loop of `train` over a run from `setup_run`.

    It first logs where a resumed run starts and what the resume changed
    (`run.resume_changes`, which a caller may reword). SIGINT, SIGTERM and SIGHUP (in the main
    thread) do not kill it: the step under way finishes, a checkpoint is saved and the result's
    `stopped` is "sigint", "sigterm" or "sighup"; a second signal acts as usual. A run that has
    already reached a limit trains nothing and writes nothing.

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
    result = TrainResult(step=state.step, epoch=state.epoch, stopped="",
                         elapsed_s=state.elapsed_s, start_step=state.step)
    with _stop_on_signals(run, log):
        stopped = _loop(run, validate, log, result, scalars)
    if run.distributed:          # every rank returns once rank 0 has written the last checkpoint
        torch.distributed.barrier()
    result.step, result.epoch, result.stopped = state.step, state.epoch, stopped
    result.elapsed_s = state.elapsed_s
    result.best_metric, result.best_step = state.best_metric, state.best_step
    if run.manager is not None and run.is_main:
        result.last_checkpoint, result.best_checkpoint = run.manager.latest(), run.manager.best()
    return result


def _loop(run: TrainRun, validate: Callable[[nn.Module], float] | None,
          log: Callable[[str], None], result: TrainResult, scalars: _Scalars | None) -> str:
    """`train_run`'s steps, evaluations and checkpoints; returns the stop reason."""
    cfg, state = run.cfg, run.state
    first_step, start = state.step, time.monotonic()
    window_start, window_loss, window_tokens = start, 0.0, 0
    last_saved = last_eval = state.step
    stopped = stop_reason(run)
    while not stopped:
        stats = run_step(run)
        window_loss += stats.loss_sum
        window_tokens += stats.n_tokens
        if state.step % cfg.log_every == 0:
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
        if validate is not None and state.step % cfg.eval_every == 0:
            metric, improved = _evaluate(run, validate, result, log, scalars)
            last_eval = state.step
        stopped = stop_reason(run)
        if state.step % cfg.save_every == 0 or improved or _kept(run, metric):
            save_run(run, metric=metric)
            last_saved = state.step

    if window_tokens:
        result.train_loss = window_loss / window_tokens
    final_metric = None
    if validate is not None and last_eval != state.step and stopped in _LIMITS:
        final_metric, _ = _evaluate(run, validate, result, log, scalars)
    if last_saved != state.step or _kept(run, final_metric):
        save_run(run, metric=final_metric)
    return stopped


def _kept(run: TrainRun, metric: float | None) -> bool:
    """Whether the checkpoint manager would keep a checkpoint of this evaluation (it beats the
    best, or ranks among the `keep_best` best): then the step is saved even off `save_every`."""
    return (metric is not None and run.manager is not None and run.is_main
            and run.manager.would_keep(metric))
