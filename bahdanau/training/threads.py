"""Torch's CPU thread count, chosen during a run from the speed the run measures.

A decoder step is many small matrix products and elementwise ops, each split across torch's
threads; a parallel op waits for its slowest thread. On an idle machine all cores are fastest,
but when another program takes a core, the thread that shares it is preempted in almost every
op and the whole run waits for it: two threads beside one busy process train at a third of
their idle speed, one thread at two thirds. No one count is right for both,
and the machine's load changes during a run, so `AdaptiveThreads` measures it: after a
warm-up it times `trial` updates at a neighbouring count (half, or double up to the cores)
between two measurements at the current one, takes it if it beats both by `margin`, and
holds the count for a while, twice as long after each trial that changed nothing (so an idle
machine pays for a trial rarely), and at once again when the speed drops well below what the
last choice measured (another program started).

Speed is target tokens per second of update time, so batches of different lengths compare.
`bahdanau.jobs.train_job` uses it on the CPU when --threads is not given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

_LOG = logging.getLogger(__name__)


class AdaptiveThreads:
    """Chooses torch's CPU thread count from measured update speed (see the module docstring).

    Every measurement is `trial` updates long. A trial times a neighbouring count between two
    measurements at the chosen count, and takes it only if it beats the faster of them by
    `margin`: a speed that drifts (the first updates of a run, still allocating; batches of
    other lengths) does not pass for a better count. The run starts with `most` threads and
    makes its first trial after `warm_up` updates.

    Args:
        most: the most threads to use (the usable cores); the run starts with them.
        trial: updates per measurement.
        warm_up: updates before the first trial, not measured.
        hold: updates kept at a count after a trial, at first; doubled after each trial that
            changed nothing, up to `longest_hold`.
        margin: how much faster another count must be to be taken (0.1: 10%).
        drop: a measurement this much slower than the chosen count's (0.25: 25%) starts a
            trial at once.
        set_threads: sets the count (`torch.set_num_threads`).
        log: called with a line when the count changes.
    """

    def __init__(self, most: int, *, trial: int = 8, warm_up: int = 24, hold: int = 96,
                 longest_hold: int = 1536, margin: float = 0.1, drop: float = 0.25,
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 log: Callable[[str], None] = _LOG.info) -> None:
        if most < 1 or trial < 1 or warm_up < 0 or hold < trial or longest_hold < hold:
            raise ValueError("need most >= 1, trial >= 1, warm_up >= 0 and "
                             "trial <= hold <= longest_hold")
        self.most, self.trial, self.first_hold, self.longest_hold = most, trial, hold, longest_hold
        self.margin, self.drop = margin, drop
        self.set_threads, self.log = set_threads, log
        self.threads = most                 # the count chosen
        self.rate = 0.0                     # target tokens/s the chosen count measured last
        self.hold = hold                    # updates the current hold lasts
        self.trials = 0                     # trials made
        self._phase = "warm-up"             # warm-up, before, try, after or hold
        self._left = warm_up                # updates left in this phase
        self._before = self._trial_rate = 0.0
        self._trying = most                 # the count on trial
        self._failed = 0                    # trials in a row that changed nothing
        self._tokens = self._seconds = 0.0
        set_threads(most)

    def observe(self, tokens: int, seconds: float) -> None:
        """Count one update of `tokens` target tokens that took `seconds`."""
        if self.most == 1:
            return
        self._tokens += tokens
        self._seconds += seconds
        self._left -= 1
        if self._left > 0:
            return
        rate = self._tokens / self._seconds if self._seconds > 0 else 0.0
        self._tokens = self._seconds = 0.0
        if self._phase == "warm-up":
            self._enter("before")
        elif self._phase == "before":
            self._start_trial(rate)
        elif self._phase == "try":
            self._trial_rate = rate
            self.set_threads(self.threads)
            self._enter("after")
        elif self._phase == "after":
            self._decide(rate)
        elif rate < (1 - self.drop) * self.rate:     # in a hold, slowed: another program?
            self.hold = self.first_hold
            self._start_trial(rate)
        else:
            self._held += self.trial
            if self._held >= self.hold:
                self._start_trial(rate)
            else:
                self._enter("hold")

    def _enter(self, phase: str) -> None:
        self._phase, self._left = phase, self.trial

    def _start_trial(self, rate: float) -> None:
        """The chosen count measured `rate`; time a neighbouring count: half, or double (up to
        `most`), taking turns where both exist."""
        self._before = rate
        options = [n for n in (max(1, self.threads // 2), min(self.most, 2 * self.threads))
                   if n != self.threads]
        self._trying = options[self._failed % len(options)]
        self.trials += 1
        self.set_threads(self._trying)
        self._enter("try")

    def _decide(self, after: float) -> None:
        """Take the count on trial if it beat the chosen count, measured before and after it,
        by `margin`; then hold."""
        chosen = max(self._before, after)
        if self._trial_rate > (1 + self.margin) * chosen:
            self.log(f"threads {self.threads} -> {self._trying}: {self._trial_rate:,.0f} "
                     f"against {chosen:,.0f} target tokens/s")
            self.threads, self.rate = self._trying, self._trial_rate
            self.hold, self._failed = self.first_hold, 0
            self.set_threads(self.threads)
        else:
            self.rate = chosen
            self.hold, self._failed = min(2 * self.hold, self.longest_hold), self._failed + 1
        self._held = 0
        self._enter("hold")
