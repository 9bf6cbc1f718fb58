"""Torch's CPU thread count, chosen during a run from the speed the run measures.

A decoder step is many small matrix products and elementwise ops, each split across torch's
threads; a parallel op waits for its slowest thread. On an idle machine all cores are fastest,
but when another program takes a core, the thread that shares it is preempted in almost every
op and the whole run waits for it: two threads beside one busy process train at a third of
their idle speed, one thread at two thirds. A beam search suffers most: beside two 1-thread
training runs on 2 cores, a beam-5 step of 2 threads took 730 ms where one of 1 thread took
35 ms. No one count is right for both,
and the machine's load changes during a run, so `AdaptiveThreads` measures it: after a
warm-up it times `trial` updates at a neighbouring count (half, or double up to the cores)
between two measurements at the current one, takes it if it beats both by `margin`, and
holds the count for a while, twice as long after each trial that changed nothing (so an idle
machine pays for a trial rarely), and at once again when the speed drops well below what the
last choice measured (another program started).

Speed is target tokens per second of update time, so batches of different lengths compare.
`bahdanau.jobs.train_job` uses it on the CPU when --threads is not given, observing each
update. The decoding commands (translate, evaluate, plot) use it too, built by
`AdaptiveThreads.for_decoding` and observing each search step (`bahdanau.BeamSearch`'s
`observe`: a step's beam rows are its target tokens). A step is short and a slow count costs
far more than a fast one misses, so decoding starts at one thread, and a trial whose first
step is less than half as fast ends there. Inside a training run, the dev and test decoding run
at the count the run's updates chose (`AdaptiveThreads.chosen`), never a count on trial.
The thread count changes only the last bits of some float sums: an update beyond them not at
all, a search's hypotheses only where two were tied within them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
            trial at once, unless the count is 1 (a slower machine never favours more threads).
        start: the count the run starts with (default: `most`).
        cut: a trial whose first update measures under `cut` times the speed measured just
            before it ends after that update (None: every trial lasts `trial` updates).
        set_threads: sets the count (`torch.set_num_threads`).
        log: called with a line when the count changes.
    """

    def __init__(self, most: int, *, trial: int = 8, warm_up: int = 24, hold: int = 96,
                 longest_hold: int = 1536, margin: float = 0.1, drop: float = 0.25,
                 start: int | None = None, cut: float | None = None,
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 log: Callable[[str], None] = _LOG.info) -> None:
        start = most if start is None else start
        if (most < 1 or trial < 1 or warm_up < 0 or hold < trial or longest_hold < hold
                or not 1 <= start <= most):
            raise ValueError("need most >= 1, trial >= 1, warm_up >= 0, "
                             "trial <= hold <= longest_hold and 1 <= start <= most")
        self.most, self.trial, self.first_hold, self.longest_hold = most, trial, hold, longest_hold
        self.margin, self.drop, self.start, self.cut = margin, drop, start, cut
        self.set_threads, self.log = set_threads, log
        self.threads = start                # the count chosen
        self.rate = 0.0                     # target tokens/s the chosen count measured last
        self.hold = hold                    # updates the current hold lasts
        self.trials = 0                     # trials made
        self._phase = "warm-up"             # warm-up, before, try, after or hold
        self._left = warm_up                # updates left in this phase
        self._before = self._trial_rate = 0.0
        self._trying = most                 # the count on trial
        self._failed = 0                    # trials in a row that changed nothing
        self._tokens = self._seconds = 0.0
        self._current = start               # the count set now (the chosen one, or on trial)
        set_threads(start)

    @classmethod
    def for_decoding(cls, most: int, *,
                     set_threads: Callable[[int], None] = torch.set_num_threads,
                     log: Callable[[str], None] = _LOG.info) -> AdaptiveThreads:
        """The tuner of a search, observing each step (`bahdanau.BeamSearch`'s `observe`).

        A step takes milliseconds, so measurements are two steps long and holds last 64 steps
        at first, doubling up to 2,048. Decoding starts at one thread: on an idle 2-core machine
        one thread runs at about 0.75 of two, while beside busy processes two threads ran 20
        times slower than one, so the count that may be slow is the one put on trial, and a
        trial whose first step is under half as fast ends there (`cut`). A measurement at a
        quarter of the chosen count's speed (another program started) starts a trial at once.
        """
        return cls(most, trial=2, warm_up=1, hold=64, longest_hold=2048, drop=0.75, start=1,
                   cut=0.5, set_threads=set_threads, log=log)

    def _set(self, n: int) -> None:
        """Set the count (`set_threads`) and remember it."""
        self._current = n
        self.set_threads(n)

    @contextmanager
    def chosen(self) -> Iterator[None]:
        """Run the block at the chosen count, not at a count on trial, then set back the
        count the tuner had set: other work between two updates (a training run's dev
        decoding) neither pays for a trial nor changes it."""
        current = self._current
        if current != self.threads:
            self.set_threads(self.threads)
        try:
            yield
        finally:
            if current != self.threads:
                self.set_threads(current)

    def observe(self, tokens: int, seconds: float) -> None:
        """Count one update of `tokens` target tokens that took `seconds`."""
        if self.most == 1:
            return
        self._tokens += tokens
        self._seconds += seconds
        self._left -= 1
        if (self._phase == "try" and self.cut is not None and self._left > 0
                and self._tokens < self.cut * self._before * self._seconds):
            self._left = 0                          # far slower already: the trial ends here
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
            self._set(self.threads)
            self._enter("after")
        elif self._phase == "after":
            self._decide(rate)
        elif self.threads > 1 and rate < (1 - self.drop) * self.rate:   # another program?
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
        self._set(self._trying)
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
            self._set(self.threads)
        else:
            self.rate = chosen
            self.hold, self._failed = min(2 * self.hold, self.longest_hold), self._failed + 1
        self._held = 0
        self._enter("hold")
