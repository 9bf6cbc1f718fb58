"""Learning-rate schedules: the learning rate of every update, from a `TrainConfig`.

For update `step` (1 for the first), with lr the configured learning rate
(`TrainConfig.learning_rate`) and W = `warmup_steps`:

    lr(step) = warm-up(step) * max(min_lr, lr * decay(step))

    warm-up(step)   min(1, step / W): a linear rise from 0 over the first W updates; 1 for W = 0
    decay(step):
      constant      1                                               (the paper's)
      inverse_sqrt  sqrt(W' / max(step, W')), W' = max(W, 1): 1 up to W, then 1 / sqrt(step)
                    scaled to meet the warm-up (fairseq's and the Transformer's schedule)
      plateau       decay_factor ** decays: decays counts the evaluations after which the run
                    had been `decay_patience`, 2 * `decay_patience`, ... evaluations without
                    improvement (`LRSchedule.decays_after`)
      linear        1 up to W, then (T + 1 - step) / (T + 1 - W) for T = `max_steps`: a
                    straight line from 1 to 0 one update after the run's last, which takes
                    1 / (T + 1 - W) (the decay to zero that suits a run of a fixed length)

`min_lr` (default 0) floors the decayed rate; the warm-up scales from 0 to it as to any other.
The plateau schedule's only state is its number of decays, `TrainState.lr_decays`, which every
checkpoint holds: a resumed run takes the same learning rate as an uninterrupted one. Every
other schedule is a function of the step alone. `bahdanau.training.setup_run` builds the run's
`LRSchedule` once (`LRSchedule.from_config`); `run_step` sets each update's rate and
`validate_run` counts the decays.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from bahdanau._checks import check_type
from bahdanau.config import TrainConfig

__all__ = ["LRSchedule", "set_lr"]


def _constant(step: int, decays: int) -> float:
    return 1.0


def _inverse_sqrt(warmup: int, step: int, decays: int) -> float:
    return math.sqrt(warmup / max(step, warmup))


def _plateau(factor: float, step: int, decays: int) -> float:
    return factor ** decays


def _linear(warmup: int, last: int, step: int, decays: int) -> float:
    return min(1.0, max(0.0, (last + 1 - step) / (last + 1 - warmup)))


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate of each update (see the module docstring for the formulas).

    Args:
        lr: the configured learning rate.
        decay: (step, decays) -> the factor of `lr` before warm-up and floor.
        warmup_steps: W, updates of linear warm-up; 0 for none.
        min_lr: the floor of the decayed rate.
        decay_patience: evaluations without improvement per decay (plateau); None: evaluations
            never decay the rate.
    """

    lr: float
    decay: Callable[[int, int], float]
    warmup_steps: int = 0
    min_lr: float = 0.0
    decay_patience: int | None = None

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> LRSchedule:
        """The schedule `cfg.schedule` names, with `cfg`'s rate, warm-up, floor and decay.

        Raises:
            InputError: `cfg` is not a `TrainConfig` (whose construction checked the values).
        """
        check_type("cfg", cfg, TrainConfig, "a TrainConfig")
        decays: dict[str, Callable[[int, int], float]] = {
            "constant": _constant,
            "inverse_sqrt": partial(_inverse_sqrt, max(cfg.warmup_steps, 1)),
            "plateau": partial(_plateau, cfg.decay_factor)}
        if cfg.schedule == "linear":
            assert cfg.max_steps is not None  # TrainConfig refuses linear without it
            decays["linear"] = partial(_linear, cfg.warmup_steps, cfg.max_steps)
        decay = decays[cfg.schedule]
        return cls(cfg.learning_rate, decay, warmup_steps=cfg.warmup_steps, min_lr=cfg.min_lr,
                   decay_patience=cfg.decay_patience if cfg.schedule == "plateau" else None)

    def __call__(self, step: int, decays: int = 0) -> float:
        """The learning rate of update `step` (1 for the first) after `decays` plateau decays."""
        warm = min(1.0, step / self.warmup_steps) if self.warmup_steps else 1.0
        return warm * max(self.min_lr, self.lr * self.decay(step, decays))

    def decays_after(self, bad_evals: int) -> bool:
        """Whether an evaluation that leaves `bad_evals` evaluations without improvement (the
        count since the last improvement, `TrainState.bad_evals`) decays the rate once more."""
        return (self.decay_patience is not None and bad_evals > 0
                and bad_evals % self.decay_patience == 0)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write `lr` into every parameter group of `optimizer`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
