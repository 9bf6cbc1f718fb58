"""Where `bahdanau.data.prepare_corpus` writes: the `out` folder, checked and held before any work.

A prepared folder is written under a temporary name beside `out` (``.NAME.partial-PID``) and
renamed into place when whole, so `out` must be a folder that can be replaced by renaming:
`check_destination` refuses, before any tokenising or SentencePiece training, the current
folder (``--out .``) or one holding it, a mount point, a dangling symbolic link and a parent
that cannot be created. `held` creates the parent, takes the lock beside `out` (a second
prepare into the same folder is refused while the first runs; a read-only parent is refused
here) and removes the temporary folders of processes that died (`remove_stale`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bahdanau._files import exclusive_lock, fsync_dir
from bahdanau.errors import InputError

__all__ = ["check_destination", "held", "partial_folder", "remove_stale", "replace_folder"]

_LEFTOVERS = ("partial", "old")        # .NAME.partial-PID: being written; .NAME.old-PID: replaced


def check_destination(out: Path) -> Path:
    """The folder to write for `out`: `out` itself, or the folder a symbolic link names.

    Raises:
        InputError: `out` is a dangling link, the current folder or one that holds it, a mount
            point, or its parent is a file.
    """
    if out.is_symlink():
        if not out.exists():
            raise InputError(f"{out} is a symbolic link to {os.readlink(out)}, which does not "
                             "exist: remove the link or choose another folder")
        out = out.resolve()
    folder = Path(os.path.abspath(out))
    cwd = Path.cwd()
    if folder == cwd or folder in cwd.parents:
        raise InputError(f"{out} is the current folder or holds it: a prepared corpus replaces "
                         "its folder whole; name a new folder for it (e.g. prepared/)")
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
def held(out: Path) -> Iterator[None]:
    """Create `out`'s parent and hold the lock beside `out` (``.NAME.lock``) while inside;
    stale temporary folders of dead processes are removed once it is held.

    Raises:
        InputError: another process prepares `out`, or the parent cannot be created or written
            (read-only, no permission).
    """
    with ExitStack() as stack:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(exclusive_lock(
                out.parent / f".{out.name}.lock", f"{out} is being prepared by another process: "
                "wait for it to finish or choose another folder", remove=True))
        except OSError as err:
            raise InputError(f"cannot write {out}: {err.strerror} ({err.filename})") from None
        remove_stale(out)
        yield


def partial_folder(out: Path, kind: str = "partial", pid: int | None = None) -> Path:
    """The temporary folder beside `out` that this process writes (or moves an old `out` to)."""
    return out.parent / f".{out.name}.{kind}-{os.getpid() if pid is None else pid}"


def remove_stale(out: Path) -> list[Path]:
    """Remove the temporary folders beside `out` left by processes no longer alive; returns
    them. An old corpus moved aside by one that died between `replace_folder`'s two renames
    (`out` missing, one ``.NAME.old-PID`` holding a corpus) is put back at `out` instead."""
    _restore_old(out)
    removed = []
    for kind in _LEFTOVERS:
        prefix = f".{out.name}.{kind}-"
        for path in out.parent.iterdir():
            pid = path.name[len(prefix):]
            if (path.name.startswith(prefix) and pid.isdigit() and not _alive(int(pid))
                    and path.is_dir() and not path.is_symlink()):
                shutil.rmtree(path)
                removed.append(path)
    return removed


def _restore_old(out: Path) -> None:
    """Put back at a missing `out` the one old corpus (a folder with a ``manifest.json``: what
    prepare replaces) a dead process left beside it; anything else there stays stale."""
    if out.exists() or out.is_symlink():
        return
    prefix = f".{out.name}.old-"
    olds = [path for path in out.parent.iterdir()
            if path.name.startswith(prefix) and path.name[len(prefix):].isdigit()
            and not _alive(int(path.name[len(prefix):])) and path.is_dir()
            and not path.is_symlink() and (path / "manifest.json").is_file()]
    if len(olds) == 1:
        os.replace(olds[0], out)
        fsync_dir(out.parent)


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
    """Put the finished folder `partial` at `out`, moving an old corpus there aside first
    (it is deleted only once the new one is in place)."""
    old = None
    if out.exists():
        old = partial_folder(out, "old")
        os.replace(out, old)
    os.replace(partial, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old)
