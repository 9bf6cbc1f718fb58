"""A training run's progress bar: its updates over the run's length, with the loss, the target
tokens per second and the time left.

`train_run` draws it on stderr while it trains (on rank 0), when bars are shown
(`bahdanau._progress`: stderr is a terminal, tqdm is installed, no ``--no-progress``):

    training:  12%|█▏        | 123/1000 [02:03<14:37, 1.00 updates/s, loss 5.123, 843 tgt tok/s]

Its length is the run's in updates: the nearer of ``max_steps`` and ``max_epochs`` (converted
with the batches of an epoch, `updates_left`); a run bounded by time alone has a count without
a length. The time left is tqdm's, from the measured speed. A resumed run's bar starts at its
step. The loss and tok/s are those of the updates since the text after the bar last changed
(at most once a second, `REFRESH_S`), read from the `StepStats` each update already brought to
the host: the bar adds no read back from the device. The bar is no log record: it never
reaches ``train.log`` or a TensorBoard file, and log lines are written above it
(`bahdanau._progress.clear_bars`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from bahdanau._progress import Bar, progress_bar
from bahdanau.training.run import TrainRun
from bahdanau.training.step import StepStats

__all__ = ["REFRESH_S", "TrainBar", "updates_left"]

REFRESH_S = 1.0     # the loss and tok/s after the bar change at most this often (seconds)


def updates_left(run: TrainRun) -> float | None:
    """The updates until the nearer of the run's step and epoch limits (`cfg.max_steps`,
    `cfg.max_epochs`, an epoch counted as this epoch's batches); None: neither is set."""
    cfg, state = run.cfg, run.state
    left: list[float] = []
    if cfg.max_steps is not None:
        left.append(cfg.max_steps - state.step)
    if cfg.max_epochs is not None:
        per_epoch = len(run.plan.sampler.epoch_batches(state.epoch))
        left.append(((cfg.max_epochs - state.epoch) * per_epoch - state.position)
                    / run.plan.size)
    return max(0.0, min(left)) if left else None


class TrainBar:
    """The bar of `run` (rank 0; a bar that draws nothing elsewhere, or when bars are off).

    Args:
        run: the run, at the step it starts from.
    """

    def __init__(self, run: TrainRun) -> None:
        left = updates_left(run) if run.is_main else None
        total = None if left is None else run.state.step + math.ceil(left)
        self._bar: Any = (progress_bar("training", total=total, unit="updates",
                                       initial=run.state.step) if run.is_main else Bar())
        self._since, self._loss, self._tokens = time.monotonic(), 0.0, 0

    def step(self, stats: StepStats) -> None:
        """One update done, with its `stats` (already on the host)."""
        if not stats.non_finite:
            self._loss += stats.loss_sum
            self._tokens += stats.n_tokens
        now = time.monotonic()
        if self._tokens and now - self._since >= REFRESH_S:
            self._bar.set_postfix_str(f"loss {self._loss / self._tokens:.3f}, "
                                      f"{self._tokens / (now - self._since):.0f} tgt tok/s",
                                      refresh=False)     # drawn by the update below
            self._since, self._loss, self._tokens = now, 0.0, 0
        self._bar.update(1)

    def close(self) -> None:
        """Remove the bar."""
        self._bar.close()
