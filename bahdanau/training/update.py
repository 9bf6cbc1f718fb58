"""One update with no host synchronisation, and its CUDA-graph capture per batch shape.

`bahdanau.training.step.train_step` reads the loss, the token count and the gradient norm back
to the host after every update, to skip a non-finite update in Python and to report it. On a
GPU each read stalls the queue of launched kernels, and a CUDA graph cannot hold one.
`SyncFreeUpdate` makes the same update with every decision on the device:

* the loss is `RNNSearch.loss(..., sync_free=True)`: shapes that depend on no value (the
  encoder's padded path, every target position, padding ignored by its index), and batches
  from a small set of shapes (`bahdanau.data.pad_to_multiple` rounds B, S and T up);
* the loss, the token count and the gradient norm stay on the device (`DeviceStats`), read
  once, when the caller asks (`DeviceStats.read`);
* a non-finite loss or gradient norm skips the update on the device: a fused Adam takes it as
  the `found_inf` a GradScaler gives it, and Adadelta's step (`adadelta_step`) multiplies
  every change by it;
* clipping is torch's foreach `get_total_norm` and `clip_grads_with_norm_`, the two halves of
  `clip_grad_norm_`, without reading the norm.

With `cuda_graphs=True` (CUDA only) the forward and backward of each batch shape are recorded
once as a CUDA graph (`bahdanau.captured_step.cuda_graph`, the recorder the search's captured
steps use) and replayed: one launch instead of a few thousand kernels. The clipping and the
optimizer step run after it as a handful of foreach kernels, outside the graph, so a learning
rate that a schedule changes between updates is read at each update.

The update is the same function as `train_step`'s (tests/unit/test_sync_free_update.py holds
them equal in float64, and proves that nothing is read back to the host while it runs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from contextlib import nullcontext
from typing import Any, NamedTuple, Protocol, cast

import torch
from torch import Tensor, nn

from bahdanau._checks import check_type
from bahdanau.captured_step import Record, clone, copy_into, cuda_graph, signature
from bahdanau.data.batching import Batch
from bahdanau.errors import InputError
from bahdanau.training.step import StepStats


class _SyncFreeLoss(Protocol):
    """What the update calls on a model: `RNNSearch.loss` with `sync_free`."""

    def loss(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor, *,
             label_smoothing: float = 0.0, sync_free: bool = False) -> tuple[Tensor, Tensor]: ...


class DeviceStats(NamedTuple):
    """What one `SyncFreeUpdate` did, as device tensors (nothing read yet)."""

    loss_sum: Tensor      # () summed target-token loss of the update's batches
    n_tokens: Tensor      # () int64 target tokens (eos included)
    grad_norm: Tensor     # () L2 norm of the gradient before clipping
    non_finite: Tensor    # () bool: as `StepStats.non_finite`
    skipped: Tensor       # () bool: no update applied (non-finite, or a GradScaler overflow)

    def read(self) -> StepStats:
        """The `StepStats` of `train_step`, read from the device in one transfer."""
        values = torch.stack([self.loss_sum.double(), self.n_tokens.double(),
                              self.grad_norm.double(), self.non_finite.double()]).tolist()
        return StepStats(values[0], int(values[1]), values[2], bool(values[3]))


@torch.no_grad()
def adadelta_step(optimizer: torch.optim.Adadelta, apply: Tensor) -> None:
    """`optimizer.step()` of an Adadelta, or, where `apply` is False, nothing at all, decided
    on the device.

    The arithmetic of torch's foreach Adadelta, in its order, with the decay rho taken as 1 and
    the gradient as 0 where `apply` is False: every state then keeps its value exactly (the
    step count included), and so does every weight. The state is `optimizer.state`'s, under
    torch's names, so checkpoints and `optimizer.step()` read it as theirs. Written here
    because torch's optimizers skip a step only through a fused kernel, which Adadelta has not.

    Args:
        optimizer: a `torch.optim.Adadelta` (no weight decay, not maximising).
        apply: () bool, on the weights' device.
    Raises:
        InputError: another optimizer, or Adadelta settings this step does not implement.
    """
    if not isinstance(optimizer, torch.optim.Adadelta):
        raise InputError(f"adadelta_step steps a torch.optim.Adadelta, got "
                         f"{type(optimizer).__name__}")
    for group in optimizer.param_groups:
        if group["weight_decay"] != 0 or group["maximize"]:
            raise InputError("the sync-free Adadelta step has no weight decay and does not "
                             "maximise; use train_step for those settings")
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        states = [optimizer.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:          # torch's lazy initialisation, the step on the device
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["acc_delta"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device != p.device:   # torch keeps it on the CPU: moved once
                state["step"] = state["step"].to(p.device)
        lr, rho, eps = group["lr"], group["rho"], group["eps"]
        grads = [torch.where(apply, p.grad, 0.0) for p in params]
        square_avgs = [s["square_avg"] for s in states]
        acc_deltas = [s["acc_delta"] for s in states]
        # per-tensor lists of the device scalars: a foreach op given one scalar tensor reads it
        # to the host on a CPU
        decay = [torch.where(apply, square_avgs[0].new_tensor(rho), 1.0)] * len(params)
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, [apply.to(steps[0].dtype)] * len(steps))
        torch._foreach_mul_(square_avgs, decay)
        torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - rho)
        std = torch._foreach_add(square_avgs, eps)
        torch._foreach_sqrt_(std)
        deltas = torch._foreach_add(acc_deltas, eps)
        torch._foreach_sqrt_(deltas)
        torch._foreach_div_(deltas, std)
        torch._foreach_mul_(deltas, grads)
        torch._foreach_mul_(acc_deltas, decay)
        torch._foreach_addcmul_(acc_deltas, deltas, deltas, value=1 - rho)
        torch._foreach_add_(params, deltas, alpha=-lr)


def _fused_step(optimizer: torch.optim.Optimizer, apply: Tensor) -> None:
    """`optimizer.step()` of a fused optimizer (Adam), skipped on the device where `apply` is
    False: the fused kernel takes the skip as the `found_inf` a GradScaler hands it."""
    optimizer.found_inf = (~apply).to(torch.float32)   # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf                         # type: ignore[attr-defined]


def _is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer.defaults.get("fused")) and getattr(
        optimizer, "_step_supports_amp_scaling", False)


class SyncFreeUpdate:
    """`train_step`'s update of one batch (or several, accumulated), with no host sync.

    Args:
        model: an `RNNSearch` / `RNNEncDec` (anything with its `loss(..., sync_free=True)`),
            not wrapped in DDP.
        optimizer: a `torch.optim.Adadelta`, or an optimizer with a fused step that takes a
            GradScaler's `found_inf` (`torch.optim.Adam(fused=True)`, what `make_optimizer`
            builds).
        clip_norm: rescale the gradient to at most this L2 norm; None: no clipping.
        label_smoothing: passed to the loss.
        amp_dtype: run the loss under `torch.autocast` with this dtype; None: no autocast.
        scaler: a `torch.amp.GradScaler` (for fp16).
        cuda_graphs: capture the forward and backward of each batch shape into a CUDA graph
            and replay it (CUDA only). Give it batches from few shapes (`pad_to_multiple`).
        record: how `cuda_graphs` records a shape (`bahdanau.captured_step.cuda_graph`, the
            default; `bahdanau.captured_step.replay_eagerly` runs the same bookkeeping on any
            device, which is how it is tested on a CPU).
    Raises:
        InputError: a DDP-wrapped model, a model without `loss(..., sync_free=True)`, an
            optimizer without a sync-free step, `cuda_graphs` with a model that is not on a
            CUDA device (and no `record`), or `record` without `cuda_graphs`.

    Calling it with a batch (on the model's device) or a sequence of them makes one update
    and returns its `DeviceStats`. The batches' values must have been checked
    (`RNNSearch.check_batch`, on the CPU, before they are moved): the update reads none of
    them. With `cuda_graphs`, the returned tensors are copies, valid after the next update.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 clip_norm: float | None = 1.0, label_smoothing: float = 0.0,
                 amp_dtype: torch.dtype | None = None,
                 scaler: torch.amp.GradScaler | None = None, cuda_graphs: bool = False,
                 record: Record[Any] | None = None) -> None:
        check_type("model", model, nn.Module, "a torch.nn.Module such as RNNSearch")
        check_type("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")
        if isinstance(model, nn.parallel.DistributedDataParallel):
            raise InputError("the sync-free update runs one process; use train_step under DDP")
        loss = getattr(model, "loss", None)
        if not callable(loss) or "sync_free" not in inspect.signature(loss).parameters:
            raise InputError(f"the sync-free update calls model.loss(..., sync_free=True), which "
                             f"{type(model).__name__} has not (RNNSearch and RNNEncDec have it)")
        if record is not None and not cuda_graphs:
            raise InputError("record is how cuda_graphs records a batch shape: give it with "
                             "cuda_graphs=True")
        if not (isinstance(optimizer, torch.optim.Adadelta) or _is_fused(optimizer)):
            raise InputError(f"the sync-free update steps Adadelta or a fused optimizer "
                             f"(torch.optim.Adam(fused=True)), got {type(optimizer).__name__}")
        device = next(model.parameters()).device
        if cuda_graphs and record is None and device.type != "cuda":
            raise InputError(f"cuda_graphs needs the model on a CUDA device, it is on {device}")
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.clip_norm, self.label_smoothing = clip_norm, label_smoothing
        self.amp_dtype, self.device = amp_dtype, device
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        if cuda_graphs and record is None:
            record = cuda_graph(torch.cuda.graph_pool_handle())   # one pool for the graphs
        self._record, self._graphs = record, dict[Hashable, _CapturedLoss]()

    @property
    def captured_shapes(self) -> int:
        """How many batch shapes have a captured graph (0 without `cuda_graphs`)."""
        return len(self._graphs)

    def __call__(self, batch: Batch | Sequence[Batch]) -> DeviceStats:
        batches = [batch] if isinstance(batch, Batch) else list(batch)
        if not batches:
            raise InputError("the update needs a batch, got an empty sequence of batches")
        self.model.train()
        pad_id = batches[0].pad_id
        # a real row always has its eos target; the rows pad_to_multiple adds have none
        sentences = sum((b.tgt_out != pad_id).any(1).sum() for b in batches)
        sentences = torch.as_tensor(sentences, dtype=torch.float64).clamp(min=1)
        self._zero_grads()
        losses, counts = [], []
        for b in batches:
            inputs = (b.src, b.src_lengths, b.tgt_in, b.tgt_out)
            if self._record is not None:                # cuda_graphs
                loss_sum, n_tokens = self._replay(inputs, sentences)
            else:
                loss_sum, n_tokens = self._loss_and_backward(*inputs, sentences)
            losses.append(loss_sum)
            counts.append(n_tokens)
        return self._step(torch.stack(losses).sum(), torch.stack(counts).sum())

    # ------------------------------------------------------------------ forward and backward
    def _loss_and_backward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                           tgt_out: Tensor, sentences: Tensor, *, capturing: bool = False
                           ) -> tuple[Tensor, Tensor]:
        """The batch's summed loss and token count; its gradient, over the update's sentence
        count, added to the weights' gradients (as `train_step`'s backward)."""
        autocast = nullcontext() if self.amp_dtype is None else torch.autocast(
            self.device.type, dtype=self.amp_dtype, cache_enabled=not capturing)
        with autocast:
            loss_sum, n_tokens = cast(_SyncFreeLoss, self.model).loss(
                src, src_lengths, tgt_in, tgt_out, label_smoothing=self.label_smoothing,
                sync_free=True)
        # fp16/bf16 losses (autocast) are scaled in float32, float64 ones stay float64
        loss_sum = loss_sum.to(torch.promote_types(loss_sum.dtype, torch.float32))
        loss = loss_sum / sentences.to(loss_sum.dtype)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss_sum.detach(), n_tokens

    def _zero_grads(self) -> None:
        """Zero the gradients in place (a captured backward adds into the same tensors)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    def _replay(self, inputs: tuple[Tensor, ...], sentences: Tensor) -> tuple[Tensor, Tensor]:
        key = signature(inputs)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._graphs[key] = self._capture(inputs, sentences)
        return captured(inputs, sentences)

    def _capture(self, inputs: tuple[Tensor, ...], sentences: Tensor) -> _CapturedLoss:
        """Record one forward and backward of this shape on static copies of its inputs (the
        recorder's warm-up runs add to the gradients: they are put back as they were)."""
        static = tuple(t.clone() for t in (*inputs, sentences))
        saved = [None if p.grad is None else p.grad.clone() for p in self.params]
        assert self._record is not None                # _replay runs with cuda_graphs only
        replay, outputs = self._record(lambda: self._loss_and_backward(*static, capturing=True))
        for p, grad in zip(self.params, saved, strict=True):
            if p.grad is not None:
                if grad is None:
                    p.grad.zero_()
                else:
                    p.grad.copy_(grad)
        return _CapturedLoss(replay, static, outputs)

    # ------------------------------------------------------------------ clip and step
    def _step(self, loss_sum: Tensor, n_tokens: Tensor) -> DeviceStats:
        """Unscale (fp16), clip and step, skipping on the device what `train_step` skips."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            raise InputError("the optimizer holds none of the parameters the loss depends on: "
                             "build it from this model's parameters")
        grad_norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        max_norm = self.clip_norm if self.clip_norm is not None else float("inf")
        torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, grad_norm, foreach=True)
        finite_loss, finite_norm = torch.isfinite(loss_sum), torch.isfinite(grad_norm)
        apply = finite_loss & finite_norm
        if isinstance(self.optimizer, torch.optim.Adadelta):
            adadelta_step(self.optimizer, apply)
        else:
            _fused_step(self.optimizer, apply)
        if self.scaler is not None:
            self.scaler.update()
            non_finite = ~finite_loss      # an overflow is the scaler's to skip and back off
        else:
            non_finite = ~apply
        return DeviceStats(loss_sum, n_tokens, grad_norm, non_finite, ~apply)


class _CapturedLoss(NamedTuple):
    """One batch shape's recorded forward and backward, and its static tensors."""

    replay: Callable[[], None]
    inputs: tuple[Tensor, ...]            # src, src_lengths, tgt_in, tgt_out, sentences
    outputs: tuple[Tensor, Tensor]        # the summed loss and the token count

    def __call__(self, inputs: tuple[Tensor, ...], sentences: Tensor) -> tuple[Tensor, Tensor]:
        copy_into(self.inputs, (*inputs, sentences))
        self.replay()
        return clone(self.outputs)
