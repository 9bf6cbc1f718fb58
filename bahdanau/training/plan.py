"""Which batches each update trains on: the plan of a run's updates and the loader that serves it.

A `BucketBatchSampler` fixes each epoch's batches (a function of the seed and the epoch);
`BatchPlan` makes each update `processes x accumulation` consecutive batches of that list and
gives each process its share; `BatchLoader` collates them ahead in worker processes.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from typing import NamedTuple

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


class BatchLoader:
    """Collates this process's batches of the coming updates ahead of the training step, in
    `workers` processes (a `torch.utils.data.DataLoader`; pinned memory when training on CUDA).

    It hands out the batches of the update that starts at any place (epoch, position) asked
    for, and so knows nothing of resuming: the run's `TrainState` counts the batches the
    optimiser consumed, and asking for another place than where the last update ended (a
    resumed run, or the updates of a new epoch) starts the workers there, on the updates that
    start in that epoch. The batches are those `collate` makes inline, in the same order.
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
        `epoch` (`BatchPlan.update`)."""
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
        self._next = next(self._starts)
        return next(self._shares)
