"""`bahdanau._files.atomic_file`, the one writer of every output: what each kind of path becomes,
and what a failed write (a full disk, an I/O error, Ctrl-C) leaves behind.

A regular file is replaced whole (a temporary file renamed over it); a symlink keeps linking to
its replaced target; a device, a FIFO and a link to an open file descriptor (/dev/stdout) are
written into and stay what they were. Devices are made with `os.mknod` in the test's folder
(root only): a clone of /dev/full is the same device without any risk to the machine's own.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest
import torch
from training_fixtures import failing_writes

from bahdanau._files import (
    atomic_write,
    process_umask,
    repeated_file,
    sha256_file,
    writes_in_place,
)
from bahdanau.checkpoint import load_checkpoint, save_checkpoint


def _device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device of the memory driver (1, minor) in `tmp_path`: 3 null, 7 full."""
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, AttributeError):
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


def test_a_regular_file_is_replaced_whole(tmp_path) -> None:
    path = tmp_path / "out.txt"
    path.write_bytes(b"old")
    atomic_write(path, lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("relative", [False, True])
def test_a_symlink_keeps_its_link_and_its_target_gets_the_content(tmp_path, relative) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "scores.json"
    target.write_bytes(b"old")
    link = tmp_path / "link.json"
    link.symlink_to(os.path.relpath(target, tmp_path) if relative else target)
    atomic_write(link, lambda f: f.write(b"new"))
    assert link.is_symlink() and os.readlink(link) == (
        os.path.relpath(target, tmp_path) if relative else str(target))
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path / "real")) == ["scores.json"]   # no temporary file


def test_a_dangling_symlink_gets_its_target_created(tmp_path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "later.txt")
    atomic_write(link, lambda f: f.write(b"data"))
    assert link.is_symlink() and (tmp_path / "later.txt").read_bytes() == b"data"


@pytest.mark.parametrize("kind", ["fifo", "pipe-fd-link"])
def test_a_fifo_or_a_link_to_an_open_pipe_is_written_into(tmp_path, kind) -> None:
    """The FIFO's reader gets the data (the FIFO stays a FIFO); a link to /proc/self/fd/N (what
    /dev/stdout is) writes into that descriptor and stays a link."""
    got: list[bytes] = []
    if kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)

        def read() -> None:
            with open(path, "rb") as reader:
                got.append(reader.read())

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        atomic_write(path, lambda f: f.write(b"through the fifo"))
        thread.join(timeout=10)
        assert stat.S_ISFIFO(os.lstat(path).st_mode)
        assert got == [b"through the fifo"]
    else:
        read_end, write_end = os.pipe()
        path = tmp_path / "stdout-link"
        path.symlink_to(f"/proc/self/fd/{write_end}")
        try:
            assert writes_in_place(path)
            atomic_write(path, lambda f: f.write(b"through the pipe"))
            os.close(write_end)
            with os.fdopen(read_end, "rb") as reader:
                assert reader.read() == b"through the pipe"
        finally:
            for fd in (read_end, write_end):
                try:
                    os.close(fd)
                except OSError:
                    pass
        assert path.is_symlink() and os.readlink(path) == f"/proc/self/fd/{write_end}"


def test_which_paths_are_written_in_place(tmp_path) -> None:
    (tmp_path / "file").write_bytes(b"")
    assert writes_in_place("/dev/stdout") and writes_in_place("/dev/null")
    assert not writes_in_place(tmp_path / "file") and not writes_in_place(tmp_path / "new")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    assert not writes_in_place(tmp_path / "to-file")       # its target is replaced


def test_a_device_is_written_into_and_never_replaced(tmp_path) -> None:
    null = _device(tmp_path, "null", 3)
    atomic_write(null, lambda f: f.write(b"gone"))
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_a_full_device_is_one_oserror_naming_it_and_stays_a_device(tmp_path) -> None:
    full = _device(tmp_path, "full", 7)
    with pytest.raises(OSError) as info:
        atomic_write(full, lambda f: f.write(b"x" * 100))
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == f"[Errno 28] writing {full} failed: No space left on device"
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def _payload() -> dict:
    return {"format": 2, "model": {"w": torch.arange(10_000.0)}}


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_checkpoint_write_is_one_oserror_and_keeps_the_old_file(tmp_path, monkeypatch,
                                                                         code) -> None:
    """torch.save wraps the file's OSError in "RuntimeError: [enforce fail at
    inline_container.cc...]"; the writer finds the OSError under it."""
    path = tmp_path / "step_00000004.pt"
    save_checkpoint(path, {"format": 2, "model": {"w": torch.zeros(3)}})
    before = path.read_bytes()
    failing_writes(monkeypatch, OSError(code, os.strerror(code)), after=200)
    with pytest.raises(OSError) as info:
        save_checkpoint(path, _payload())
    assert type(info.value) is OSError and info.value.errno == code
    assert str(info.value) == (f"[Errno {code}] writing {path} failed: {os.strerror(code)}; "
                               f"{path} is left as it was")
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("after", [0, 200])
def test_ctrl_c_inside_a_checkpoint_write_stays_a_keyboard_interrupt(tmp_path, monkeypatch,
                                                                     after) -> None:
    path = tmp_path / "average.pt"
    save_checkpoint(path, {"format": 2, "model": {"w": torch.zeros(3)}})
    before = path.read_bytes()
    failing_writes(monkeypatch, KeyboardInterrupt(), after=after)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _payload())
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]
    monkeypatch.undo()
    assert load_checkpoint(path)["model"]["w"].tolist() == [0.0, 0.0, 0.0]


def test_the_umask_is_read_without_setting_it(tmp_path, monkeypatch) -> None:
    """Every write read the umask by setting it to 0 and back: for that moment a thread
    creating a file got mode 0666/0777. Now it is read once (from /proc where Linux shows it)
    and no write touches it."""
    real = os.umask(0o027)
    os.umask(real)
    process_umask.cache_clear()
    try:
        calls: list[int] = []
        monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real)
        assert process_umask() == real
        for name in ("a", "b"):
            atomic_write(tmp_path / name, lambda f: f.write(b"x"))
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~real
        if Path("/proc/self/status").is_file():
            assert calls == []
    finally:
        monkeypatch.undo()
        process_umask.cache_clear()


def test_sha256_file_is_hashlib_of_the_bytes(tmp_path) -> None:
    import hashlib

    for size in (0, 1, (1 << 22) + 3):
        path = tmp_path / f"f{size}"
        data = os.urandom(size)
        path.write_bytes(data)
        assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_repeated_file_sees_hard_links_and_other_spellings(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x")
    b.write_text("x")                                     # equal bytes, another file
    assert repeated_file([a, b]) is None
    os.link(a, tmp_path / "hard")
    (tmp_path / "soft").symlink_to(a)
    assert repeated_file([a, b, tmp_path / "hard"]) == (tmp_path / "hard", a)
    assert repeated_file([tmp_path / "soft", tmp_path / "." / "a"]) == (
        tmp_path / "." / "a", tmp_path / "soft")
    assert repeated_file([a, tmp_path / "missing", tmp_path / "missing"]) is None
