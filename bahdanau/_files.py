"""Atomic file writes, shared by checkpoints, vocabularies and the CLI's result files, and the
lock that keeps two processes from writing one output folder."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from bahdanau.errors import InputError


def fsync_file(path: Path) -> None:
    """Flush a written file's data to disk (errors raise: the data must be there)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable (where the platform allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. directories cannot be opened on Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` with: written under a temporary name beside it, fsynced
    and renamed to `path` when the block ends without an exception, removed when it raises.

    A crash leaves either the old file or the new one, whole. The new file gets the mode that
    `open()` would give it (0666 less the umask).

    Raises:
        InputError: `path` is a directory.
    """
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)                 # as open() would create it, not mkstemp's 0600
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write via `write(file)` into an `atomic_file(path)`."""
    with atomic_file(path) as f:
        write(f)


@contextmanager
def exclusive_lock(path: Path, busy: str, *, remove: bool = False) -> Iterator[None]:
    """Hold an advisory lock on the file `path` (created if missing) while inside.

    Args:
        path: the lock file; its folder must exist.
        busy: the message of the InputError raised when another process holds the lock.
        remove: delete the lock file when leaving (for a lock beside the folder it guards, so
            nothing is left behind). A process that opened the file before it was deleted then
            holds a lock on a file no longer at `path`: it sees that and takes the new one.
    Raises:
        InputError: `busy`, when another process holds the lock.
        OSError: the file cannot be created (e.g. a read-only folder).
    """
    try:
        import fcntl
    except ImportError:                                   # no advisory locks on this platform
        yield
        return
    while True:
        handle = open(path, "a")                          # noqa: SIM115 (closed below)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise InputError(busy) from None
        try:
            same = os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()                                    # deleted by its last holder: again
    try:
        yield
    finally:
        if remove:
            Path(path).unlink(missing_ok=True)
        handle.close()
