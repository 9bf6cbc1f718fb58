"""The files a job reads and writes, checked before any work starts.

`existing` refuses an input that is missing, a folder or unreadable; `check_outputs` an output
that cannot be created or that would overwrite an input or another output; `write_text` writes a
result file atomically; `read_sources` reads the sentences to translate from a file or stdin.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import overload

from bahdanau._files import atomic_write
from bahdanau.data.text import decode_lines, read_lines
from bahdanau.errors import InputError


@overload
def existing(path: str, what: str) -> Path: ...
@overload
def existing(path: None, what: str) -> None: ...
@overload
def existing(path: str | None, what: str) -> Path | None: ...
def existing(path: str | None, what: str) -> Path | None:
    """`path` as a readable file, checked before any work (None stays None)."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} {path}: no such file")
    if p.is_dir():                                 # pipes such as /dev/stdin are fine
        raise InputError(f"{what} {path} is a folder, not a file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{what} {path}: not readable")
    return p


def check_outputs(outputs: dict[str, str | None], inputs: dict[str, Path | None]) -> None:
    """Refuse, before any work, an output file that cannot be created, or that is one of the
    inputs (a checkpoint, a source file) or another output: nothing the user gave is lost."""
    taken = {os.path.realpath(p): what for what, p in inputs.items() if p is not None}
    for what, path in outputs.items():
        if path is None:
            continue
        p = Path(path)
        if p.is_dir():
            raise InputError(f"{what} {path} is a folder, not a file")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            problem = "is not a folder" if parent.exists() else "does not exist"
            raise InputError(f"{what} {path}: folder {parent} {problem}")
        if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise InputError(f"{what} {path}: not writable")
        real = os.path.realpath(p)
        if real in taken:
            raise InputError(f"{what} {path} is also {taken[real]}: writing it would destroy it")
        taken[real] = what


def write_text(path: Path, text: str) -> None:
    """Write a result file atomically: a crash leaves the old file or the new one."""
    data = text.encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


def read_sources(path: Path | None, *, needed: str = "a sentence to translate") -> list[str]:
    """The sentences of `path` (None: stdin, read as bytes and decoded exactly like a file); an
    empty line is refused, naming the line and what it is `needed` for."""
    lines = read_lines(path) if path else decode_lines(sys.stdin.buffer.read(), "<stdin>")
    for i, line in enumerate(lines):
        if not line.strip():
            raise InputError(f"{path or '<stdin>'}: line {i + 1} is empty; every line needs "
                             f"{needed}")
    return lines
