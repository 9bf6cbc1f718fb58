"""An exponential moving average (EMA) of a model's weights, kept beside training.

With decay d, after the t-th training step

    e_0 = w_0                         the weights when the average starts
    e_t = d e_{t-1} + (1 - d) w_t     w_t: the weights after step t

so that e_t weighs the last ~1 / (1 - d) steps' weights most (d = 0.999: the last thousand).
Averaged weights often translate better than the last ones, without a second training run.

`bahdanau.training` keeps one in `TrainRun.ema` when `TrainConfig.ema_decay` is set: it is updated
after every step, the dev evaluations score it (so ``best.pt`` is the best average), and every
checkpoint stores it in its `ema` section, from which an exact resume restores it. Whatever loads
a checkpoint to translate (`bahdanau.load`, `model_from_checkpoint`, the command line, averaging
and ensembles) uses the `ema` weights when a checkpoint has them; the `model` section keeps the
trained weights that training resumes from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from bahdanau._checks import is_finite_number
from bahdanau.errors import InputError

__all__ = ["WeightEMA"]


class WeightEMA:
    """The moving average of every floating-point entry of `model.state_dict()`.

    The average is kept in float32 (float64 for float64 weights), on the weights' device; entries
    that are not floating point (none in bahdanau's models) follow the model's values. It holds
    its own tensors: the model is only read (in `update`) or written (`copy_to`, `applied_to`).

    Args:
        model: the model whose weights are averaged; e_0 is a copy of its weights now.
        decay: d in (0, 1).
    Raises:
        InputError: `decay` outside (0, 1).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not (is_finite_number(decay) and 0.0 < decay < 1.0):
            raise InputError(f"decay must be a number in (0, 1), got {decay!r}")
        self.decay = float(decay)
        self.weights: dict[str, Tensor] = {
            key: value.detach().to(_average_dtype(value.dtype), copy=True)
            for key, value in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One step of the recursion: e <- d e + (1 - d) w, with w the weights of `model` now."""
        for key, value in model.state_dict().items():
            average = self.weights[key]
            if average.is_floating_point():
                average.lerp_(value.to(average.dtype), 1.0 - self.decay)  # e + (1-d)(w - e)
            else:
                average.copy_(value)

    def state_dict(self) -> dict[str, Tensor]:
        """The averaged weights, keyed like `model.state_dict()` (the checkpoint's `ema`)."""
        return dict(self.weights)

    @torch.no_grad()
    def load_state_dict(self, weights: Mapping[str, Tensor]) -> None:
        """Take the averaged weights of `state_dict()` (e.g. a checkpoint's `ema` section).

        Raises:
            InputError: other keys or shapes than the model's (nothing is changed then).
        """
        if set(weights) != set(self.weights):
            raise InputError(f"ema weights have the keys {sorted(weights)}, the model "
                             f"{sorted(self.weights)}")
        for key, value in weights.items():
            if not isinstance(value, Tensor) or value.shape != self.weights[key].shape:
                raise InputError(f"ema weight {key!r} is {_shape(value)}, the model's "
                                 f"{tuple(self.weights[key].shape)}")
        for key, value in weights.items():
            self.weights[key].copy_(value)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Put the averaged weights into `model` (cast to its dtypes)."""
        model.load_state_dict(self.weights)

    @contextmanager
    def applied_to(self, model: nn.Module) -> Iterator[nn.Module]:
        """`model` holding the averaged weights inside the block, its own weights again after
        (restored bit for bit, also when the block raises)."""
        own = {key: value.detach().clone() for key, value in model.state_dict().items()}
        self.copy_to(model)
        try:
            yield model
        finally:
            with torch.no_grad():
                model.load_state_dict(own)


def _average_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16/float32 weights, float64 for float64; others unchanged."""
    if not dtype.is_floating_point:
        return dtype
    return torch.promote_types(dtype, torch.float32)


def _shape(value: object) -> str:
    return f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
