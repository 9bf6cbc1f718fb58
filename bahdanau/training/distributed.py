"""The life of a `torch.distributed` process group: one owner, from launch to the last collective.

`check_launcher` refuses, before any work, several processes without what torchrun sets;
`process_group` holds the group of a command's processes (NCCL on CUDA, gloo on CPU) and ends
it with `leave_process_group`, which every process calls together once training is over;
`broadcast` gives rank 0's value to every rank, `gather` every rank's to rank 0.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from bahdanau._checks import launcher_value
from bahdanau.errors import InputError

__all__ = ["broadcast", "check_launcher", "gather", "is_distributed", "leave_process_group",
           "process_group"]


def is_distributed() -> bool:
    """A default `torch.distributed` process group is initialised (this process is one of a
    group's)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def broadcast(value: Any, distributed: bool) -> Any:
    """Rank 0's `value` on every rank."""
    if not distributed:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: Any, distributed: bool) -> list[Any] | None:
    """Every rank's `value`, in rank order, on rank 0 (None on the others); None when not
    `distributed`."""
    if not distributed:
        return None
    dist = torch.distributed
    values: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, values, dst=0)
    return values


def leave_process_group() -> None:
    """Ends the default `torch.distributed` process group on every process together, once
    training is over: the replacement for `torch.distributed.destroy_process_group()` after
    `train` under DDP (`bahdanau train` under torchrun calls it).

    gloo frees a collective's tensors on its own worker threads, after the collective has
    returned, and freeing a tensor made in Python takes the GIL: a worker thread that asks
    for it while the interpreter exits aborts the process ("terminate called without an
    active exception"), and the threads outlive `destroy_process_group` while a
    `DistributedDataParallel` model holds the group. So on gloo the last collective is an
    all-reduce that returns once gloo has let go of its tensor (or after 10 s, should a
    later torch keep it).
    """
    if not is_distributed():
        return
    dist = torch.distributed
    if dist.get_backend() == "gloo":
        last, deadline = torch.zeros(1), time.monotonic() + 10
        dist.all_reduce(last)
        # gloo still holds it; _use_count is a private Tensor method that torch's stubs lack
        while (last._use_count() > 1  # type: ignore[attr-defined]
               and time.monotonic() < deadline):
            time.sleep(0.001)
    else:
        dist.barrier()
    dist.destroy_process_group()


def check_launcher() -> None:
    """Several processes (WORLD_SIZE > 1) need torch.distributed and what torchrun sets."""
    world = launcher_value("WORLD_SIZE")
    if world == 1:
        return
    if not torch.distributed.is_available():
        raise InputError(f"WORLD_SIZE is {world}, but this torch has no torch.distributed")
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise InputError(f"WORLD_SIZE is {world} but {', '.join(missing)} not set: start the "
                         "processes with torchrun")


@contextmanager
def process_group(device: torch.device) -> Iterator[bool]:
    """Under torchrun (WORLD_SIZE > 1, checked by `check_launcher`), the process group of the
    run's processes (NCCL on CUDA, gloo on CPU) while inside; yields whether this process is
    rank 0, the one that writes the run folder, logs and scores the test set."""
    if launcher_value("WORLD_SIZE") == 1:
        yield True
        return
    dist = torch.distributed
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield dist.get_rank() == 0
    except BaseException:                   # the others may be anywhere: no barrier
        dist.destroy_process_group()
        raise
    leave_process_group()
