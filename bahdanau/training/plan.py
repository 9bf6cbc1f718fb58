"""Which batches each update trains on: the plan of a run's updates and the loader that serves it.

A `BucketBatchSampler` fixes each epoch's batches (a function of the seed and the epoch);
`BatchPlan` makes each update `processes x accumulation` consecutive batches of that list and
gives each process its share; `BatchLoader` collates them ahead in worker processes, and raises
`LoaderWorkerError` between steps when one of them died.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from bahdanau._checks import check_type, is_int
from bahdanau.data.batching import Batch, BucketBatchSampler, Example, collate
from bahdanau.errors import InputError


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


class LoaderWorkerError(ChildProcessError):
    """A `BatchLoader` worker process died (killed, e.g. by the out-of-memory killer): the
    batches it was collating are lost, and the run must stop."""


# torch reports a dead DataLoader worker by raising a RuntimeError from its SIGCHLD handler, at
# whatever line the main process is: in the middle of an optimizer step, say. `_defer_failures`
# wraps that handler so that the report waits here for `BatchLoader.batches`, between steps.
_worker_failure: list[str] = []


def _defer_failures() -> None:
    """Wrap the SIGCHLD handler that torch's first multi-process DataLoader set (once per
    process, in the main thread) so that its report of a dead worker is kept, not raised."""
    sigchld = getattr(signal, "SIGCHLD", None)
    if sigchld is None or threading.current_thread() is not threading.main_thread():
        return
    torch_handler = signal.getsignal(sigchld)
    if not callable(torch_handler) or getattr(torch_handler, "defers_failures", False):
        return

    def keep_failure(signum: int, frame: Any) -> None:
        try:
            torch_handler(signum, frame)
        except RuntimeError as err:
            _worker_failure.append(str(err))

    keep_failure.defers_failures = True  # type: ignore[attr-defined]
    signal.signal(sigchld, keep_failure)


class BatchLoader:
    """Collates this process's batches of the coming updates ahead of the training step, in
    `workers` processes (a `torch.utils.data.DataLoader`; pinned memory when training on CUDA).

    It hands out the batches of the update that starts at any place (epoch, position) asked
    for, and so knows nothing of resuming: the run's `TrainState` counts the batches the
    optimiser consumed, and asking for another place than where the last update ended (a
    resumed run, or the updates of a new epoch) starts the workers there, on the updates that
    start in that epoch. The batches are those `collate` makes inline, in the same order.
    A worker that died is reported by the next call, before it hands out anything, as a
    `LoaderWorkerError` (torch's own report would come at any line of the training step).
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
        `epoch` (`BatchPlan.update`).

        Raises:
            LoaderWorkerError: a worker process died (its pid and signal or exit code named).
        """
        failure = self._dead_worker()
        if failure is not None:
            raise LoaderWorkerError(failure)
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
            _defer_failures()
        self._next = next(self._starts)
        try:
            return next(self._shares)
        except Exception:                      # a dead worker's batches: a reset connection,
            failure = self._dead_worker(wait=2.0)   # torch's "exited unexpectedly", ...
            if failure is None:
                raise
            raise LoaderWorkerError(failure) from None

    def _dead_worker(self, wait: float = 0.0) -> str | None:
        """What torch said of a worker that died, or what its exit code says; None while all
        are alive. The workers are then gone: a later call starts new ones.

        Args:
            wait: seconds to give a worker that is still exiting (after its batches failed to
                arrive) to be seen dead.
        """
        failure = _worker_failure.pop() if _worker_failure else None
        for worker in getattr(self._shares, "_workers", ()):   # torch's worker processes
            if failure is None and wait:
                worker.join(timeout=wait)
            if failure is None and not worker.is_alive() and worker.exitcode:
                code = worker.exitcode
                failure = (f"DataLoader worker (pid {worker.pid}) is killed by signal: "
                           f"{signal.Signals(-code).name}" if code < 0 else
                           f"DataLoader worker (pid {worker.pid}) exited with status {code}")
        if failure is not None:
            _worker_failure.clear()
            self._shares, self._next = iter(()), None
        return failure
