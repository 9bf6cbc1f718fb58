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

A whole folder (a prepared corpus, a model folder, an exported folder) is written the same way:
`check_destination` refuses, before any work, a place that cannot be replaced by renaming (the
current folder or one holding it, a mount point, a dangling link, a parent that is a file);
`held` creates the parent, takes the lock beside the folder and removes the temporary folders
of processes that died (`remove_stale`); `new_folder` gives the temporary folder
(`partial_folder`) to write into and puts it in place whole (`replace_folder`). A symbolic link
given as the folder keeps linking: the folder it names is the one replaced. A process killed
between the two renames of `replace_folder` leaves the old folder aside and none at its place:
every reader of such a folder (a checkpoint's path, a model folder, a prepared corpus, an
exported model) first puts it back (`restore_replaced`), as a writer does once `held`.
`sha256_file` is the digest every manifest lists, `process_umask` the mode mask new files are
created with.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shlex
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

from bahdanau.errors import InputError

# The folders whose entries are a process's open file descriptors (/dev/stdout links into one).
_FD_FOLDER = re.compile(r"/proc/[^/]+/fd|/dev/fd")
_MAX_LINKS = 40                                   # symlinks followed, as Linux's limit


@cache
def process_umask() -> int:
    """The process's umask, read once: from /proc/self/status where Linux shows it, else by
    setting and restoring it (once, at the first call: a umask of 0 held by the whole process
    for a moment, which a thread creating a file then could see, so never on every write)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in blocks (never whole in memory)."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        block = bytearray(max(1, min(1 << 22, os.fstat(f.fileno()).st_size)))
        view = memoryview(block)
        while n := f.readinto(block):
            hasher.update(view[:n])
    return hasher.hexdigest()


def repeated_file(paths: list[Path]) -> tuple[Path, Path] | None:
    """The first path of `paths` that names the same file as an earlier one (the same device
    and inode: a symlink, another spelling or a hard link such as a run's ``best.pt``), with
    that earlier path; None when each names its own file. Paths that do not exist are skipped
    (their readers refuse them)."""
    seen: dict[tuple[int, int], Path] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            return path, seen[key]
        seen[key] = path
    return None


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
    inline_container.cc...]"); anything else as it was. An exception raised ``from None`` says
    it has no cause: the error it was raised in handling (stdout closed by its reader,
    `bahdanau.jobs.files.StdoutClosed`) is not taken for a failure of `path`."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        if isinstance(cause, OSError):
            note = f"; {path} is left as it was" if kept else ""
            return OSError(cause.errno or errno.EIO,
                           f"writing {path} failed: {cause.strerror or cause}{note}")
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
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
    try:
        os.chmod(tmp, 0o666 & ~process_umask())   # as open() would create it, not mkstemp's 0600
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


# ------------------------------------------------------------------ whole folders
_LEFTOVERS = ("partial", "old")        # .NAME.partial-PID: being written; .NAME.old-PID: replaced


def check_destination(out: Path, what: str) -> Path:
    """The folder to write for `out` (`what` it will hold, for the messages): `out` itself, or
    the folder a symbolic link names (the link stays; its target is replaced).

    Raises:
        InputError: `out` is a dangling link, the current folder or one that holds it, a mount
            point, or its parent is a file.
    """
    restore_replaced(out)
    if out.is_symlink():
        if not out.exists():
            raise InputError(f"{out} is a symbolic link to {os.readlink(out)}, which does not "
                             "exist: remove the link or choose another folder")
        out = out.resolve()
    folder = Path(os.path.abspath(out))
    cwd = Path.cwd()
    if folder == cwd or folder in cwd.parents:
        raise InputError(f"{out} is the current folder or holds it: {what} replaces its folder "
                         "whole; name a new folder for it")
    if os.path.ismount(folder):
        raise InputError(f"{out} is a mount point, which cannot be replaced by renaming: name "
                         "a folder inside it")
    for parent in folder.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{out} cannot be created: {parent} is a file")
            break
    return folder


@contextmanager
def held(out: Path, busy: str) -> Iterator[None]:
    """Create `out`'s parent and hold the lock beside `out` (``.NAME.lock``) while inside;
    stale temporary folders of dead processes are removed once it is held.

    Raises:
        InputError: `busy` when another process holds the lock, or the parent cannot be
            created or written (read-only, no permission).
    """
    with ExitStack() as stack:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(exclusive_lock(out.parent / f".{out.name}.lock", busy,
                                               remove=True))
        except OSError as err:
            raise InputError(f"cannot write {out}: {err.strerror} ({err.filename})") from None
        remove_stale(out)
        yield


def partial_folder(out: Path, kind: str = "partial", pid: int | None = None) -> Path:
    """The temporary folder beside `out` that this process writes (or moves an old `out` to)."""
    return out.parent / f".{out.name}.{kind}-{os.getpid() if pid is None else pid}"


def remove_stale(out: Path) -> list[Path]:
    """Remove the temporary folders beside `out` left by processes no longer alive; returns
    them. An old folder moved aside by one that died between `replace_folder`'s two renames
    (`out` missing or an empty folder, one ``.NAME.old-PID`` holding a ``manifest.json``) is
    put back at `out` instead; while `out` is still missing or empty (several such old
    folders), none of them is removed: each may be the only copy of what `out` held."""
    _restore_old(out)
    keep = _old_folders(out) if _vacant(out) else []
    removed = []
    for kind in _LEFTOVERS:
        prefix = f".{out.name}.{kind}-"
        for path in out.parent.iterdir():
            pid = path.name[len(prefix):]
            if (path.name.startswith(prefix) and pid.isdigit() and not _alive(int(pid))
                    and path.is_dir() and not path.is_symlink() and path not in keep):
                shutil.rmtree(path)
                removed.append(path)
    return removed


def _vacant(out: Path) -> bool:
    """`out` is missing, or an empty folder (not a symbolic link): where an old folder a dead
    process moved aside is put back (one made by hand, or by a command, after the crash)."""
    try:
        if out.is_symlink() or not out.exists():
            return not out.is_symlink()
        return out.is_dir() and not any(out.iterdir())
    except OSError:
        return False


def _restore_old(out: Path) -> None:
    """Put back at a missing or empty `out` the one old folder (one with a ``manifest.json``: a
    prepared corpus, a model folder, an exported model) a dead process left beside it;
    anything else there stays stale."""
    if not _vacant(out):
        return
    olds = _old_folders(out)
    if len(olds) == 1:
        _put_back(olds[0], out)


def _old_folders(out: Path) -> list[Path]:
    """The old folders (each with a ``manifest.json``) that processes no longer alive moved
    aside from `out` (``.NAME.old-PID``) and did not delete."""
    prefix = f".{out.name}.old-"
    try:
        entries = list(out.parent.iterdir())
    except OSError:                               # no parent, or one that cannot be listed
        return []
    return [path for path in entries
            if path.name.startswith(prefix) and path.name[len(prefix):].isdigit()
            and not _alive(int(path.name[len(prefix):])) and path.is_dir()
            and not path.is_symlink() and (path / "manifest.json").is_file()]


def _put_back(old: Path, out: Path) -> None:
    """Rename `old` to `out` (missing or an empty folder, which the rename replaces); another
    process that put a folder there first wins."""
    try:
        os.replace(old, out)
    except OSError:
        if not _vacant(out):                      # put back (or replaced) by another process
            return
        raise
    fsync_dir(out.parent)


def restore_replaced(folder: str | os.PathLike[str]) -> None:
    """For a reader of a folder that the commands replace whole (a prepared corpus, a model
    folder, an exported model): when a process died between `replace_folder`'s two renames,
    `folder` is missing (or an empty folder made since) and the old folder lies beside it
    (``.NAME.old-PID``); put it back, as `held` does for a writer, so that it reads as it was
    instead of as missing. Nothing is done when `folder` is a file or a folder with entries
    (the common case) or no such old folder is there. A
    symbolic link given as `folder` names the folder that was replaced.

    Raises:
        InputError: the old folder cannot be put back (no permission to write beside it): one
            line naming where it is and the command that puts it back.
    """
    target = Path(os.path.realpath(folder))
    if not _vacant(target):
        return
    olds = _old_folders(target)
    if len(olds) != 1:
        return
    try:
        _put_back(olds[0], target)
    except OSError as err:
        raise InputError(f"{folder} is missing: a process that died while replacing it left it "
                         f"as {olds[0]}, which cannot be put back here ({err.strerror}): put it "
                         f"back with: mv {shlex.quote(str(olds[0]))} "
                         f"{shlex.quote(str(target))}") from None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                      # another user's process
        return True
    return True


def replace_folder(out: Path, partial: Path) -> None:
    """Put the finished folder `partial` at `out`, moving an old folder there aside first
    (deleted only once the new one is in place): `out` is at every moment the old folder,
    absent, or the new one whole. A SIGINT, SIGTERM or SIGHUP between the two renames waits
    until the new folder is in place and the old one removed (`signals_held`); a process killed
    there leaves the old folder aside, which `remove_stale` puts back."""
    with signals_held():
        old = None
        if out.exists():
            old = partial_folder(out, "old")
            os.replace(out, old)
        os.replace(partial, out)
        fsync_dir(out.parent)
        if old is not None:
            shutil.rmtree(old)


# What stops a command that a user ends: Ctrl-C, a scheduler's or `kill`'s request, a closed
# terminal (SIGHUP, where the platform has it).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


@contextmanager
def handling_signals(signals: tuple[int, ...], handler: Callable[[int, Any], None]
                     ) -> Iterator[dict[int, Any]]:
    """While inside, `handler` handles `signals`; on leaving, the handlers in place before are
    back. Yields those (signal -> handler), for a handler that restores them itself. Elsewhere
    than the main thread: no change (an empty dict), as handlers can only be set there."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield previous
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


@contextmanager
def signals_held() -> Iterator[None]:
    """While inside, the `STOP_SIGNALS` are only noted; on leaving, the first one noted is
    raised again for the handler that was in place. For a step that must not be cut in two,
    such as the renames that put a folder in place. A Python handler, not a signal mask: a
    mask holds back only its own thread's signals, and the process's signal may reach another
    thread (a progress bar's, a pool's). Elsewhere than the main thread: no change, as
    handlers can only be set there."""
    noted: list[int] = []
    try:
        with handling_signals(STOP_SIGNALS, lambda signum, frame: noted.append(signum)):
            yield
    finally:
        if noted:
            signal.raise_signal(noted[0])


@contextmanager
def new_folder(out: Path) -> Iterator[Path]:
    """The temporary folder to write `out` into (`partial_folder`, created as mkdir creates
    folders); when the block ends, every file in it is fsynced and it replaces `out` whole
    (`replace_folder`); an exception (Ctrl-C too) removes it instead. `out` comes from
    `check_destination` and is `held`."""
    partial = partial_folder(out)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        yield partial
        for path in sorted(partial.rglob("*")):
            if path.is_file() and not path.is_symlink():
                fsync_file(path)
        fsync_dir(partial)
        replace_folder(out, partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
