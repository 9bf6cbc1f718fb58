"""Training: the paper's Adadelta step with gradient-norm clipping, evaluation, a resumable loop.

The pieces are public so that users can write their own loops: `make_optimizer`, `train_step`
(one update), `evaluate_loss` (per-token loss and perplexity), and the checkpoint utilities of
`bahdanau.checkpoint` (re-exported here). `train` is one such loop: length-bucketed batches,
a periodic log line, validation with early stopping, atomic checkpoints, exact resumption, and
`torch.distributed` data parallelism when a process group is initialised (e.g. under `torchrun`).

Paper settings (Bahdanau et al. 2015, appendix B.2): Adadelta with rho 0.95 and eps 1e-6,
minibatches of 80 sentences, the gradient's L2 norm clipped to 1, training sentences up to 50
words for RNNsearch-50.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from bahdanau import functional
from bahdanau.checkpoint import (
    CheckpointManager,
    _unwrap,
    checkpoint_payload,
    load_checkpoint,
    model_from_checkpoint,
    restore,
    save_checkpoint,
)
from bahdanau.config import DictConfig
from bahdanau.data import Batch, BucketBatchSampler, Example, Vocab, collate

__all__ = [
    "CheckpointManager",
    "LossModule",
    "StepStats",
    "TrainConfig",
    "TrainResult",
    "checkpoint_payload",
    "evaluate_loss",
    "load_checkpoint",
    "make_optimizer",
    "model_from_checkpoint",
    "restore",
    "save_checkpoint",
    "train",
    "train_step",
]

_AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainConfig(DictConfig):
    """Training settings; defaults follow the paper (appendix B.2) where it has one."""

    optimizer: Literal["adadelta", "adam"] = "adadelta"
    lr: float | None = None           # None: 1.0 for Adadelta (the paper), 1e-3 for Adam
    rho: float = 0.95                 # Adadelta decay (the paper)
    eps: float = 1e-6                 # Adadelta / Adam epsilon (the paper's Adadelta value)
    clip_norm: float | None = 1.0     # max L2 norm of the whole gradient; None: no clipping
    batch_size: int = 80              # sentences per batch (the paper); ignored with max_tokens
    max_tokens: int | None = None     # padded tokens per batch instead of batch_size
    bucket: int = 20                  # minibatches sorted by length together (the paper)
    max_len: int | None = 50          # encode_pairs filter (RNNsearch-50); train() does not filter
    max_steps: int | None = None      # stop after this many updates in total
    max_epochs: int | None = None     # stop after this many passes over the data
    max_time_s: float | None = None   # stop after this much training time (across resumes)
    eval_every: int = 1000            # call validate() every this many steps
    save_every: int = 1000            # checkpoint every this many steps (and at the end)
    keep_last: int = 3                # numbered checkpoints kept (plus best.pt)
    patience: int | None = None       # stop after this many evaluations without improvement
    label_smoothing: float = 0.0      # 0 in the paper
    amp: Literal["none", "bf16", "fp16"] = "none"  # autocast dtype (fp16 adds a GradScaler)
    log_every: int = 100              # steps between log lines
    seed: int = 1234                  # torch RNG at a fresh start, and the batch order

    def __post_init__(self) -> None:
        if self.optimizer not in ("adadelta", "adam"):
            raise ValueError(f"optimizer must be 'adadelta' or 'adam', got {self.optimizer!r}")
        if self.amp not in _AMP_DTYPES:
            raise ValueError(f"amp must be one of {tuple(_AMP_DTYPES)}, got {self.amp!r}")
        positive_floats = {"lr": self.lr, "eps": self.eps, "clip_norm": self.clip_norm,
                           "max_time_s": self.max_time_s}
        for name, value in positive_floats.items():
            if value is not None and (not isinstance(value, (int, float)) or not value > 0
                                      or math.isinf(value)):
                raise ValueError(f"{name} must be a positive finite number or None, got {value!r}")
        if not isinstance(self.rho, (int, float)) or not 0.0 < self.rho < 1.0:
            raise ValueError(f"rho must be in (0, 1), got {self.rho!r}")
        if not isinstance(self.label_smoothing, (int, float)) or not (
                0.0 <= self.label_smoothing < 1.0):
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        positive_ints = {"batch_size": self.batch_size, "bucket": self.bucket,
                         "eval_every": self.eval_every, "save_every": self.save_every,
                         "keep_last": self.keep_last, "log_every": self.log_every}
        optional_ints = {"max_tokens": self.max_tokens, "max_len": self.max_len,
                         "max_steps": self.max_steps, "max_epochs": self.max_epochs,
                         "patience": self.patience}
        for name, value in {**positive_ints, **optional_ints}.items():
            if value is None and name in optional_ints:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int"
                                 f"{' or None' if name in optional_ints else ''}, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an int, got {self.seed!r}")

    @property
    def learning_rate(self) -> float:
        """`lr`, or the optimizer's default: 1.0 for Adadelta, 1e-3 for Adam."""
        if self.lr is not None:
            return float(self.lr)
        return 1.0 if self.optimizer == "adadelta" else 1e-3



def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adadelta(lr, rho, eps) as in the paper, or Adam(lr, eps) (fused where torch supports it)."""
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


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, *,
               clip_norm: float | None = 1.0, label_smoothing: float = 0.0,
               amp_dtype: torch.dtype | None = None,
               scaler: torch.amp.GradScaler | None = None) -> StepStats:
    """One update: loss, backward, clip the gradient norm, optimizer step.

    The gradient is that of the summed loss divided by B, the minibatch average of sentence
    negative log-likelihoods as in the paper (so longer sentences weigh more than in a
    per-token average).

    Args:
        model: an `RNNSearch` (or anything with its `loss`), a `LossModule`, or DDP of either.
        batch: a `Batch` on the model's device.
        optimizer: the optimizer of the model's parameters.
        clip_norm: rescale the gradient to at most this L2 norm; None: no clipping.
        label_smoothing: passed to the loss.
        amp_dtype: run the loss under `torch.autocast` with this dtype; None: no autocast.
        scaler: a `torch.amp.GradScaler` (for fp16).
    Returns:
        `StepStats`. A non-finite gradient norm skips the update (the GradScaler also lowers its
        scale then).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    autocast = (torch.autocast(batch.src.device.type, dtype=amp_dtype)
                if amp_dtype is not None else nullcontext())
    with autocast:
        loss_sum, n_tokens = _batch_loss(model, batch, label_smoothing)
    loss = loss_sum.float() / batch.src.shape[0]
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    max_norm = clip_norm if clip_norm is not None else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if scaler is not None:
        scaler.step(optimizer)   # skips the step itself when the gradient is not finite
        scaler.update()
    elif math.isfinite(grad_norm):
        optimizer.step()
    return StepStats(float(loss_sum.detach()), int(n_tokens), grad_norm)


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
class TrainResult:
    """Summary of a `train` call."""

    step: int                          # optimizer steps taken in total (resumed ones included)
    epoch: int                         # epoch the run stopped in
    stopped: str                       # "max_steps", "max_epochs", "max_time" or "patience"
    elapsed_s: float                   # training time, resumed runs included
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


def _broadcast(value: Any, distributed: bool) -> Any:
    """Rank 0's `value` on every rank."""
    if not distributed:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def train(model: nn.Module, examples: Sequence[Example], cfg: TrainConfig, *, src_vocab: Vocab,
          tgt_vocab: Vocab, checkpoint_dir: str | Path | None = None, resume: bool = True,
          validate: Callable[[nn.Module], float] | None = None,
          log: Callable[[str], None] = print, device: str | torch.device = "cpu",
          extra: dict[str, Any] | None = None) -> TrainResult:
    """Train `model` on `examples` until a step, epoch, time or patience limit is reached.

    At least one of `cfg.max_steps`, `cfg.max_epochs`, `cfg.max_time_s` must be set. `examples`
    are used as given (`cfg.max_len` is applied by the caller through `encode_pairs`).

    Resumption: with `checkpoint_dir` and `resume`, the latest checkpoint there is restored
    (model, optimizer, GradScaler, RNG states, sampler epoch and position, step, best metric),
    so an interrupted run ends with the same weights as an uninterrupted one. A fresh start seeds
    torch's RNG with `cfg.seed`.

    Distributed: if `torch.distributed` is initialised, the model is wrapped in
    `DistributedDataParallel`, each rank trains on its shard of every epoch's batches, `validate`
    runs on rank 0 only (its result is broadcast), and only rank 0 logs and saves. Every rank
    resumes from the same checkpoint directory.

    Args:
        model: an `RNNSearch` / `RNNEncDec` (with `.config`), moved to `device`.
        examples: training examples.
        cfg: training settings.
        src_vocab, tgt_vocab: stored in checkpoints and checked on resume.
        checkpoint_dir: where checkpoints go; None: no checkpoints.
        resume: continue from the latest checkpoint in `checkpoint_dir`, if any.
        validate: called as `validate(model)` (in eval mode) every `cfg.eval_every` steps and at
            the end; higher is better (e.g. dev BLEU). Drives best.pt and early stopping.
        log: receives one line every `cfg.log_every` steps and at evaluations.
        device: where to train.
        extra: checkpoint-safe entries stored in every checkpoint under "extra" (e.g. the
            tokenizer settings a translation command needs).
    Returns:
        A `TrainResult`.
    Raises:
        ValueError: no stopping limit, no examples, vocabulary sizes that differ from the
            model's, or a checkpoint that does not match.
    """
    if cfg.max_steps is None and cfg.max_epochs is None and cfg.max_time_s is None:
        raise ValueError("cfg needs a limit: set max_steps, max_epochs or max_time_s")
    if len(examples) == 0:
        raise ValueError("examples is empty")
    device = torch.device(device)
    dist = torch.distributed
    distributed = dist.is_available() and dist.is_initialized()
    is_main = not distributed or dist.get_rank() == 0
    model.to(device)
    optimizer = make_optimizer(model, cfg)
    amp_dtype = _AMP_DTYPES[cfg.amp]
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    sampler = BucketBatchSampler(examples, batch_size=None if cfg.max_tokens else cfg.batch_size,
                                 max_tokens=cfg.max_tokens, bucket=cfg.bucket, seed=cfg.seed)
    manager = CheckpointManager(checkpoint_dir, keep_last=cfg.keep_last) if checkpoint_dir else None
    config = getattr(_unwrap(model), "config", None)
    if config is not None:
        for side, vocab in (("src", src_vocab), ("tgt", tgt_vocab)):
            size = getattr(config, f"{side}_vocab_size")
            if size != len(vocab):
                raise ValueError(f"model config {side}_vocab_size={size} but len({side}_vocab)="
                                 f"{len(vocab)}")
    pad_id, bos_id, eos_id = src_vocab.pad_id, tgt_vocab.bos_id, tgt_vocab.eos_id

    step, best_metric, best_step, bad_evals, elapsed_before = 0, None, None, 0, 0.0
    latest = manager.latest() if manager is not None and resume else None
    if latest is not None:
        state = restore(load_checkpoint(latest), model, optimizer, sampler=sampler, scaler=scaler,
                        src_vocab=src_vocab, tgt_vocab=tgt_vocab)
        step, best_metric, bad_evals = state["step"], state["best_metric"], state["bad_evals"]
        elapsed_before = state["elapsed_s"]
        best_step = manager.best_step
        if is_main:
            log(f"resumed from {latest} at step {step}, epoch {sampler.epoch}")
    else:
        torch.manual_seed(cfg.seed)
    train_model: nn.Module = model
    if distributed:
        device_ids = None
        if device.type == "cuda":
            device_ids = [device.index if device.index is not None else torch.cuda.current_device()]
        train_model = nn.parallel.DistributedDataParallel(LossModule(model), device_ids=device_ids)

    result = TrainResult(step=step, epoch=sampler.epoch, stopped="", elapsed_s=elapsed_before,
                         best_metric=best_metric, best_step=best_step)
    start = time.monotonic()
    window_start, window_loss, window_tokens = start, 0.0, 0
    last_saved, last_eval = step, step

    def elapsed() -> float:
        return elapsed_before + time.monotonic() - start

    def save(metric: float | None = None) -> None:
        nonlocal last_saved
        last_saved = step
        if manager is None or not is_main:
            return
        payload = checkpoint_payload(
            model, optimizer, model_config=config, train_config=cfg, src_vocab=src_vocab,
            tgt_vocab=tgt_vocab, step=step, epoch=sampler.epoch,
            sampler_state=sampler.state_dict(), best_metric=best_metric, scaler=scaler,
            bad_evals=bad_evals, elapsed_s=elapsed(), extra=extra)
        result.last_checkpoint = manager.save(step, payload, metric=metric)
        result.best_checkpoint = manager.best()

    def evaluate() -> bool:
        """Run validate(); True if it improved on the best."""
        nonlocal best_metric, best_step, bad_evals, last_eval
        last_eval = step
        metric = None
        if is_main:
            model.eval()
            try:
                metric = float(validate(model))
            finally:
                model.train()
        metric = _broadcast(metric, distributed)
        result.evals.append((step, metric))
        improved = best_metric is None or metric > best_metric
        if improved:
            best_metric, best_step, bad_evals = metric, step, 0
        else:
            bad_evals += 1
        if is_main:
            log(f"step {step} | eval {metric:.4f} | best {best_metric:.4f} at step {best_step}")
        return improved

    def eta() -> str:
        rate = (time.monotonic() - start) / max(step - result.step, 1)  # seconds per step
        left = []
        if cfg.max_steps is not None:
            left.append((cfg.max_steps - step) * rate)
        if cfg.max_time_s is not None:
            left.append(cfg.max_time_s - elapsed())
        if cfg.max_epochs is not None:
            batches_left = (cfg.max_epochs - sampler.epoch) * len(sampler) - sampler.position
            left.append(batches_left * rate)
        return _format_eta(min(left)) if left else "?"

    stopped = ""
    while not stopped:
        if cfg.max_epochs is not None and sampler.epoch >= cfg.max_epochs:
            stopped = "max_epochs"
            break
        if cfg.max_steps is not None and step >= cfg.max_steps:
            stopped = "max_steps"
            break
        for positions in sampler:
            batch = collate([examples[i] for i in positions], pad_id=pad_id, bos_id=bos_id,
                            eos_id=eos_id).to(device, non_blocking=True)
            stats = train_step(train_model, batch, optimizer, clip_norm=cfg.clip_norm,
                               label_smoothing=cfg.label_smoothing, amp_dtype=amp_dtype,
                               scaler=scaler)
            step += 1
            window_loss += stats.loss_sum
            window_tokens += stats.n_tokens
            if step % cfg.log_every == 0:
                now = time.monotonic()
                loss = window_loss / max(window_tokens, 1)
                entry = {"step": step, "epoch": sampler.epoch, "loss": loss,
                         "ppl": math.exp(min(loss, 700.0)), "grad_norm": stats.grad_norm,
                         "tokens_per_s": window_tokens / max(now - window_start, 1e-9)}
                result.history.append(entry)
                result.train_loss = loss
                if is_main:
                    log(f"step {step} | epoch {sampler.epoch} | loss {loss:.4f} | "
                        f"ppl {entry['ppl']:.2f} | {entry['tokens_per_s']:.0f} tgt tok/s | "
                        f"grad {stats.grad_norm:.3f} | eta {eta()}")
                window_start, window_loss, window_tokens = now, 0.0, 0
            improved = False
            if validate is not None and step % cfg.eval_every == 0:
                improved = evaluate()
                if cfg.patience is not None and bad_evals >= cfg.patience:
                    stopped = "patience"
            if cfg.max_steps is not None and step >= cfg.max_steps:
                stopped = stopped or "max_steps"
            if cfg.max_time_s is not None and _broadcast(elapsed() >= cfg.max_time_s,
                                                         distributed):
                stopped = stopped or "max_time"
            if step % cfg.save_every == 0 or improved:
                save(result.evals[-1][1] if improved else None)
            if stopped:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)

    if window_tokens:
        result.train_loss = window_loss / window_tokens
    final_metric = None
    if validate is not None and last_eval != step and stopped != "patience":
        final_metric = result.evals[-1][1] if evaluate() else None
    if last_saved != step or final_metric is not None:
        save(final_metric)
    result.step, result.epoch, result.stopped = step, sampler.epoch, stopped
    result.elapsed_s = elapsed()
    result.best_metric, result.best_step = best_metric, best_step
    if manager is not None and is_main:
        result.last_checkpoint, result.best_checkpoint = manager.latest(), manager.best()
    return result
