"""How every file is written: atomically, without ever destroying what the path is.

`atomic_file` is the one writer of checkpoints, vocabularies, prepared corpora, plots and the
commands' result files. A regular file (or a new path) is written under a temporary name beside
it and renamed over it, so a crash or a failed write leaves the old file or the new one, whole;
a symlink is followed and its target replaced so (the link stays). A path that is not a regular
file (a device such as /dev/null, a FIFO, /dev/stdout or another link to an open file
descriptor) is written into where it is and never replaced (`writes_in_place`). A write that
fails (a full disk, an I/O error) is one `OSError` naming the file; Ctrl-C stays a
KeyboardInterrupt; neither leaves a temporary file behind. `exclusive_lock` keeps two processes
from writing one output folder.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from bahdanau.errors import InputError

# The folders whose entries are a process's open file descriptors (/dev/stdout links into one).
_FD_FOLDER = re.compile(r"/proc/[^/]+/fd|/dev/fd")
_MAX_LINKS = 40                                   # symlinks followed, as Linux's limit


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


def _names_open_file(path: Path) -> bool:
    """`path` is, or links through, an entry of a process's open file descriptors
    (/dev/stdout, /dev/fd/N, /proc/PID/fd/N): replacing what it resolves to would take the
    output away from the process that holds it open."""
    p = Path(os.path.abspath(path))
    for _ in range(_MAX_LINKS):
        if not p.is_symlink():
            return False
        if _FD_FOLDER.fullmatch(os.path.realpath(p.parent)):
            return True
        p = Path(os.path.abspath(p.parent / os.readlink(p)))
    return False


def writes_in_place(path: str | os.PathLike[str]) -> bool:
    """Whether `atomic_file` writes into `path` where it is instead of replacing it: `path` is
    (or links to) something other than a regular file (a device, a FIFO, a socket), or an open
    file descriptor such as /dev/stdout. A folder is neither (writing it is refused)."""
    path = Path(path)
    if _names_open_file(path):
        return True
    try:
        mode = path.stat().st_mode
    except OSError:                               # a new path, or a dangling link
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def replaced_file(path: str | os.PathLike[str]) -> Path:
    """The regular file that an atomic write of `path` replaces: `path` with its symlinks
    followed (a link keeps linking to the new file)."""
    return Path(os.path.realpath(path))


def write_failure(path: Path, err: BaseException, kept: bool) -> BaseException:
    """What a failed write of `path` raises: Ctrl-C as a KeyboardInterrupt, a system error
    (ENOSPC, EIO, ...) as one `OSError` naming the file (and, when `kept`, saying that the file
    is as it was), found also where torch.save wrapped it in a RuntimeError ("[enforce fail at
    inline_container.cc...]"); anything else as it was."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        if isinstance(cause, OSError):
            note = f"; {path} is left as it was" if kept else ""
            return OSError(cause.errno or errno.EIO,
                           f"writing {path} failed: {cause.strerror or cause}{note}")
        cause = cause.__cause__ or cause.__context__
    return err


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` with, which never destroys what `path` is.

    A regular file or a new path: the data goes to a temporary file beside it (beside the
    target of a symlink), fsynced and renamed over it when the block ends without an
    exception; a crash leaves either the old file or the new one, whole. The new file gets the
    mode that `open()` would give it (0666 less the umask). Anything else (`writes_in_place`):
    opened for appending (a device, a FIFO's reader, the file a shell redirected stdout to)
    and written where it is.

    Raises:
        InputError: `path` is a directory.
        OSError: the write failed (one line naming the file); a temporary file is removed.
        KeyboardInterrupt: Ctrl-C while writing; a temporary file is removed.
    """
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a file to write")
    if writes_in_place(path):
        try:
            with open(path, "ab") as f:
                yield f
        except BaseException as err:
            raise write_failure(path, err, kept=False) from None
        return
    target = replaced_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)             # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        raise write_failure(path, err, kept=True) from None
    fsync_dir(target.parent)


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
