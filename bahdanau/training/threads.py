"""Torch's CPU thread count, chosen during a run from the speed the run measures.

A decoder step is many small matrix products and elementwise ops, each split across torch's
threads; a parallel op waits for its slowest thread. On an idle machine all cores are fastest,
but when another program takes a core, the thread that shares it is preempted in almost every
op and the whole run waits for it: two threads beside one busy process train at a third of
their idle speed, one thread at two thirds. No setting chosen at the start is right for both,
and the machine's load changes during a run, so `AdaptiveThreads` measures it: after a few
warm-up updates it times `trial` updates at the current count and `trial` at a neighbouring
one (half, or double up to the cores), keeps the faster (by `margin`), and holds it for a
while, twice as long after each trial that changed nothing (so an idle machine pays for a
trial rarely), and at once again when the speed drops well below what the last choice
measured (another program started).

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

    Every measurement is `trial` updates long. The run starts with `most` threads; after one
    warm-up measurement and one at the start count, it tries a neighbour, then holds.

    Args:
        most: the most threads to use (the usable cores); the run starts with them.
        trial: updates per measurement.
        hold: updates kept at a count after a trial, at first; doubled after each trial that
            changed nothing, up to `longest_hold`.
        margin: how much faster another count must be to be taken (0.1: 10%).
        drop: a measurement this much slower than the chosen count's (0.25: 25%) starts a
            trial at once.
        set_threads: sets the count (`torch.set_num_threads`).
        log: called with a line when the count changes.
    """

    def __init__(self, most: int, *, trial: int = 8, hold: int = 96, longest_hold: int = 1536,
                 margin: float = 0.1, drop: float = 0.25,
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 log: Callable[[str], None] = _LOG.info) -> None:
        if most < 1 or trial < 1 or hold < trial or longest_hold < hold:
            raise ValueError("need most >= 1, trial >= 1 and trial <= hold <= longest_hold")
        self.most, self.trial, self.first_hold, self.longest_hold = most, trial, hold, longest_hold
        self.margin, self.drop = margin, drop
        self.set_threads, self.log = set_threads, log
        self.threads = most                 # the count chosen
        self.rate = 0.0                     # target tokens/s the chosen count measured last
        self.hold = hold                    # updates the current hold lasts
        self.trials = 0                     # trials made
        self._phase = "warm-up"             # warm-up, measure, try or hold
        self._trying = most                 # the count on trial
        self._failed = 0                    # trials in a row that changed nothing
        self._updates = self._held = 0
        self._tokens = self._seconds = 0.0
        set_threads(most)

    def observe(self, tokens: int, seconds: float) -> None:
        """Count one update of `tokens` target tokens that took `seconds`."""
        if self.most == 1:
            return
        self._tokens += tokens
        self._seconds += seconds
        self._updates += 1
        if self._updates < self.trial:
            return
        rate = self._tokens / self._seconds if self._seconds > 0 else 0.0
        self._updates, self._tokens, self._seconds = 0, 0.0, 0.0
        if self._phase == "warm-up":
            self._phase = "measure"
        elif self._phase == "measure":
            self._start_trial(rate)
        elif self._phase == "try":
            self._decide(rate)
        else:
            self._held += self.trial
            if rate < (1 - self.drop) * self.rate:      # slowed down: another program started?
                self.hold = self.first_hold
                self._start_trial(rate)
            elif self._held >= self.hold:
                self._start_trial(rate)

    def _start_trial(self, rate: float) -> None:
        """The chosen count measured `rate`; time a neighbouring count: half, or double (up to
        `most`), taking turns where both exist."""
        self.rate = rate
        options = [n for n in (max(1, self.threads // 2), min(self.most, 2 * self.threads))
                   if n != self.threads]
        self._trying = options[self._failed % len(options)]
        self.trials += 1
        self.set_threads(self._trying)
        self._phase = "try"

    def _decide(self, rate: float) -> None:
        """Keep the count on trial if it measured faster by `margin`; then hold."""
        if rate > (1 + self.margin) * self.rate:
            self.log(f"threads {self.threads} -> {self._trying}: {rate:,.0f} against "
                     f"{self.rate:,.0f} target tokens/s")
            self.threads, self.rate = self._trying, rate
            self.hold, self._failed = self.first_hold, 0
        else:
            self.set_threads(self.threads)
            self.hold, self._failed = min(2 * self.hold, self.longest_hold), self._failed + 1
        self._phase, self._held = "hold", 0
