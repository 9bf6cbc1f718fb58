"""Atomic file writes, shared by checkpoints, vocabularies and the CLI's result files."""

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
