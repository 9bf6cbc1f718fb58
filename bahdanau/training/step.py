"""One update of any model on any batch: the optimizer, the loss module and the step.

`make_optimizer` builds the paper's Adadelta (or Adam) from a `TrainConfig`; `train_step` makes
one update (loss, backward, gradient-norm clipping, optimizer step) over one batch or several
(gradient accumulation), under DDP too; `evaluate_loss` gives the per-token loss and perplexity
of batches. None of them needs a run (`bahdanau.training.run`).

Paper settings (Bahdanau et al. 2015, appendix B.2): Adadelta with rho 0.95 and eps 1e-6,
minibatches of 80 sentences, the gradient's L2 norm clipped to 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import NamedTuple, Protocol, cast

import torch
from torch import Tensor, nn

from bahdanau import functional
from bahdanau._checks import check_type, is_int
from bahdanau.config import TrainConfig
from bahdanau.data.batching import Batch
from bahdanau.errors import InputError
from bahdanau.training.state import (
    unwrap_model,
)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adadelta(lr, rho, eps) as in the paper, or Adam(lr, eps) (fused where torch supports it).

    Raises:
        InputError: Adadelta with a learning rate beyond the largest value of a weight's dtype
            (torch converts it to that dtype, and would fail at the first update).
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_type("cfg", cfg, TrainConfig, "a TrainConfig")
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adadelta":
        for dtype in {p.dtype for p in params if p.is_floating_point()}:
            if cfg.learning_rate > torch.finfo(dtype).max:
                raise InputError(f"adadelta cannot apply the learning rate "
                                 f"{cfg.learning_rate:g} to {dtype} weights: it must be at "
                                 f"most {torch.finfo(dtype).max:.4g}")
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


class _LossModel(Protocol):
    """What training calls on a model: `RNNSearch.loss`."""

    def loss(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor, *,
             label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]: ...


def _with_loss(model: nn.Module) -> _LossModel:
    """`model`, a Module with `RNNSearch.loss` (nn.Module's __getattr__ would type its `loss`
    as a Tensor or Module)."""
    return cast(_LossModel, model)


def _model_loss(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                tgt_out: Tensor, label_smoothing: float) -> tuple[Tensor, Tensor]:
    """`model.loss`: the fused loss (works under autocast too)."""
    return _with_loss(model).loss(src, src_lengths, tgt_in, tgt_out,
                                  label_smoothing=label_smoothing)


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
    # The loss or the gradient norm was not finite, so no update was applied: a sign of
    # divergence, which `train_run` counts. A GradScaler's overflowing scaled gradient (which
    # it skips and backs off from, as fp16 training expects) does not count; its loss does.
    non_finite: bool = False


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
        `StepStats` of all the batches: this process's, and under DDP those of the whole update
        (the loss and token count summed over the processes). A non-finite loss or gradient norm
        skips the update: the optimizer never applies it (the GradScaler lowers its scale on
        a non-finite gradient). Under DDP every process skips together: the gradient is the
        same on all, and the loss of any counts for all.
    Raises:
        InputError: an empty sequence of batches, `update_sentences` without DDP or below
            these batches' sentence count, an optimizer without the parameters the loss
            depends on, or an int8 copy for decoding (`bahdanau.RNNSearch.int8_copy`).
    """
    batches = [batch] if isinstance(batch, Batch) else list(batch)
    if not batches:
        raise InputError("train_step needs a batch, got an empty sequence of batches")
    sentences: float = sum(b.src.shape[0] for b in batches)
    ddp = model if isinstance(model, nn.parallel.DistributedDataParallel) else None
    inner = model.module if ddp is not None else model
    if getattr(inner.module if isinstance(inner, LossModule) else inner, "int8", False) is True:
        raise InputError("this model is an int8 copy for decoding (RNNSearch.int8_copy): train "
                         "the float model it was copied from")
    if update_sentences is not None:
        if ddp is None:
            raise InputError("update_sentences is for a DistributedDataParallel model; one "
                             "process divides by its batches' own sentence count")
        if not is_int(update_sentences) or update_sentences < sentences:
            raise InputError(f"update_sentences must be an int >= these batches' {sentences} "
                             f"sentences, got {update_sentences!r}")
        sentences = update_sentences / torch.distributed.get_world_size(ddp.process_group)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    device = batches[0].src.device
    autocast = (torch.autocast(device.type, dtype=amp_dtype)
                if amp_dtype is not None else nullcontext())
    losses, counts = [], []
    for i, b in enumerate(batches):
        last = i == len(batches) - 1
        with ddp.no_sync() if ddp is not None and not last else nullcontext():
            with autocast:
                loss_sum, n_tokens = _batch_loss(model, b, label_smoothing)
            # fp16/bf16 losses (autocast) are scaled in float32, float64 ones stay float64
            loss = loss_sum.to(torch.promote_types(loss_sum.dtype, torch.float32)) / sentences
            (scaler.scale(loss) if scaler is not None else loss).backward()
        losses.append(loss_sum.detach())
        counts.append(n_tokens)
    total_loss, total_tokens = sum(float(x) for x in losses), sum(int(n) for n in counts)
    if ddp is not None:
        total_loss, total_tokens = _all_ranks(total_loss, total_tokens, ddp, device)
    finite_loss = math.isfinite(total_loss)
    grad_norm, applied = _update(optimizer, scaler, clip_norm, finite_loss)
    non_finite = not finite_loss or (scaler is None and not applied)
    return StepStats(total_loss, total_tokens, grad_norm, non_finite)


def _update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
            clip_norm: float | None, finite_loss: bool) -> tuple[float, bool]:
    """Clip the gradient and step, unless the loss or the gradient norm is not finite; returns
    the norm before clipping and whether the optimizer stepped (with a GradScaler: was asked
    to, which it declines for a gradient that is not finite)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if all(p.grad is None for p in params):
        raise InputError("the optimizer holds none of the parameters the loss depends on: "
                         "build it from this model's parameters")
    max_norm = clip_norm if clip_norm is not None else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    applied = finite_loss and (scaler is not None or math.isfinite(grad_norm))
    if applied and scaler is not None:
        scaler.step(optimizer)       # skips the step itself when the gradient is not finite
    elif applied:
        optimizer.step()
    if scaler is not None:
        scaler.update()
    return grad_norm, applied


def _all_ranks(loss_sum: float, n_tokens: int, ddp: nn.parallel.DistributedDataParallel,
               device: torch.device) -> tuple[float, int]:
    """The loss and token count summed over the processes, in one all-reduce: the loss is not
    finite where any process's is not."""
    totals = torch.tensor([loss_sum, n_tokens], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(totals, group=ddp.process_group)
    return float(totals[0]), int(totals[1])


@torch.no_grad()
def evaluate_loss(model: nn.Module, batches: Iterable[Batch]) -> tuple[float, float]:
    """Per-token loss and perplexity over `batches`, in eval mode (the mode is restored).

    Returns:
        (loss per target token, exp of it); (nan, nan) for no tokens.
    """
    model = unwrap_model(model)
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        total, tokens = 0.0, 0
        for batch in batches:
            batch = batch.to(device)
            loss_sum, n = _with_loss(model).loss(batch.src, batch.src_lengths, batch.tgt_in,
                                                 batch.tgt_out)
            total += float(loss_sum)
            tokens += int(n)
    finally:
        model.train(was_training)
    if tokens == 0:
        return math.nan, math.nan
    loss = total / tokens
    return loss, math.exp(min(loss, 700.0))
