"""Ctrl-C and the `bahdanau` command: one line and exit status 130, at any moment.

`bahdanau.cli.main` turns a KeyboardInterrupt into `interrupted()`'s line, but the command first
spends seconds importing (torch, numpy), and a Ctrl-C then raised KeyboardInterrupt inside the
imports: a traceback of thirty lines, or worse, inside a C extension's initialisation, an
ImportError ("cannot load module more than once") or an abort from C++. So this module, which
`bahdanau/__init__.py` imports before anything else, gives SIGINT a handler that ends the
process at once with that line (`os._exit`: nothing half-imported is touched again) while the
command's process starts; `started`, called by `bahdanau.cli.main` once the imports are done,
puts the usual KeyboardInterrupt back. Only the command's process (`is_command`: ``python -m
bahdanau``, torchrun's ``-m bahdanau``, the `bahdanau` console script) is touched; a program that
imports the library keeps its own SIGINT. Standard library only.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from types import FrameType
from typing import Any

__all__ = ["INTERRUPTED", "interrupted", "is_command", "started"]

INTERRUPTED = 130         # the exit status: 128 + SIGINT, as a shell reports a Ctrl-C
_LINE = "bahdanau: interrupted"
_SCRIPT = re.compile(r"bahdanau(\.exe|-script\.pyw?)?")   # the console script's file names


def interrupted() -> int:
    """Say on stderr that the command was interrupted, in one line; its exit status."""
    print(_LINE, file=sys.stderr)
    return INTERRUPTED


def is_command() -> bool:
    """This process runs the `bahdanau` command: ``python -m bahdanau`` (while the package is
    imported to find it, ``sys.argv[0]`` is "-m" and the interpreter's own arguments name it;
    then its ``__main__`` is `bahdanau.__main__`) or the console script (``sys.argv[0]``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) == "bahdanau.__main__":
        return True
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 == "-m":
        own = sys.orig_argv
        return "-mbahdanau" in own or any(flag == "-m" and name == "bahdanau"
                                          for flag, name in zip(own, own[1:], strict=False))
    return _SCRIPT.fullmatch(os.path.basename(argv0)) is not None


def _exit_now(signum: int, frame: FrameType | None) -> None:
    """SIGINT while the command starts: its line, and the process ends here."""
    os.write(2, f"{_LINE}\n".encode())
    os._exit(INTERRUPTED)


_before: Any = None        # the SIGINT handler `_exit_now` replaced (None: none replaced)


def _guard_start() -> None:
    """In the command's process (main thread), SIGINT ends it with `interrupted`'s line until
    `started`."""
    global _before
    if is_command() and threading.current_thread() is threading.main_thread():
        _before = signal.signal(signal.SIGINT, _exit_now)


def started() -> None:
    """The command has imported what it needs: SIGINT is again what it was (a
    KeyboardInterrupt, which `bahdanau.cli.main` turns into the same line)."""
    global _before
    if _before is not None and signal.getsignal(signal.SIGINT) is _exit_now:
        signal.signal(signal.SIGINT, _before)
    _before = None


_guard_start()
