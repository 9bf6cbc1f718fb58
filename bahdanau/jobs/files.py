"""The files a job reads and writes, checked before any work starts.

`existing` refuses an input that is missing, a folder or unreadable (and, where a regular file
is needed, a FIFO or a device); `check_outputs` an output
that cannot be created, that would overwrite an input or another output, or that is a file of a
run, a model folder, a prepared corpus or an exported folder
(`bahdanau.jobs.run_folder.run_file_owner`); `check_output_folder` the same for the folders that
release, export and prepare write, each replacing only a folder of its own kind
(`bahdanau._folders.check_folder_to_write`). An
output that names stdout (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``) is ``-``
(`stdout_as_dash`). `output_file` opens an output (``-``: stdout) and
`write_text` writes one, never destroying what the path is (`bahdanau._files.atomic_file`);
`read_sources` reads the sentences to translate from a file or stdin, `read_aligned` a source
file and its line-aligned translations, `read_phrases` a JSON Lines file of phrases
(``--constraints``, ``--avoid``). Results printed on stdout go through `to_stdout`: stdout
closed by its reader (``bahdanau translate ... | head -1``) is `StdoutClosed`, which the command
line ends quietly, as other Unix tools do, and never a failure of another output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar, overload

from bahdanau._checks import describe
from bahdanau._files import atomic_file, replaced_file, writes_in_place
from bahdanau._folders import Kind, check_folder_to_write, folder_kind
from bahdanau.data.text import decode_lines, read_lines
from bahdanau.errors import InputError
from bahdanau.jobs.run_folder import is_run_folder, run_file_owner


@overload
def existing(path: str, what: str, *, regular: bool = False) -> Path: ...
@overload
def existing(path: None, what: str, *, regular: bool = False) -> None: ...
@overload
def existing(path: str | None, what: str, *, regular: bool = False) -> Path | None: ...
def existing(path: str | None, what: str, *, regular: bool = False) -> Path | None:
    """`path` as a readable file, checked before any work (None stays None). Pipes such as
    /dev/stdin are fine, unless `regular`: a reader that needs a regular file (one it reads
    twice, or hashes) refuses a FIFO, a device or a socket, on which it would wait forever or
    read another stream each time."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} {path}: no such file")
    if p.is_dir():
        raise InputError(f"{what} {path} is a folder, not a file")
    if regular and not p.is_file():
        raise InputError(f"{what} {path} is not a regular file (a FIFO, a device or a socket): "
                         "give a file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{what} {path}: not readable")
    return p


STDOUT = "-"          # an output given as this is written to stdout
_STDOUT_NAMES = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
_O = TypeVar("_O")


def names_stdout(path: str | None) -> bool:
    """`path` is ``-`` or another name of this process's stdout: /dev/stdout, /dev/fd/1,
    /proc/self/fd/1 or /proc/PID/fd/1 (this process's), or a symbolic link to one."""
    if path is None:
        return False
    if path == STDOUT:
        return True
    names = (*_STDOUT_NAMES, f"/proc/{os.getpid()}/fd/1")
    p = os.path.abspath(path)
    for _ in range(40):                          # links followed, as Linux's limit
        if p in names:
            return True
        if not os.path.islink(p):
            return False
        p = os.path.abspath(os.path.join(os.path.dirname(p), os.readlink(p)))
    return False


def stdout_as_dash(o: _O, *fields: str) -> _O:
    """The options `o` with each output field of `fields` that names stdout (`names_stdout`)
    given as ``-``: written as ``-`` is and refused with ``-``'s messages (instead of being
    opened a second time and mixed into what stdout carries)."""
    dashed = {f: STDOUT for f in fields
              if getattr(o, f) not in (None, STDOUT) and names_stdout(getattr(o, f))}
    return dataclasses.replace(o, **dashed) if dashed else o  # type: ignore[type-var]


def check_outputs(outputs: dict[str, str | None], inputs: dict[str, Path | None]) -> None:
    """Refuse, before any work, an output file that cannot be created, that is one of the
    inputs (a checkpoint, a source file) or another output, or that is a file of a run
    folder (its checkpoints, options.json, train.log, ...), of a model folder, a prepared corpus
    or an exported folder (`run_file_owner`): nothing the user gave is lost.
    ``-`` (stdout) is always fine."""
    taken = {os.path.realpath(p): what for what, p in inputs.items() if p is not None}
    for what, path in outputs.items():
        if path is None or path == STDOUT:
            continue
        p = Path(path)
        if p.is_dir():
            raise InputError(f"{what} {path} is a folder, not a file")
        in_place = writes_in_place(p)          # a device, a FIFO, /dev/stdout: written into
        target = replaced_file(p)
        if in_place and not os.access(p, os.W_OK):
            raise InputError(f"{what} {path}: not writable")
        if not in_place:
            parent = target.parent
            if not parent.is_dir():
                problem = "is not a folder" if parent.exists() else "does not exist"
                raise InputError(f"{what} {path}: folder {parent} {problem}")
            if not os.access(parent, os.W_OK) or (target.exists()
                                                  and not os.access(target, os.W_OK)):
                raise InputError(f"{what} {path}: not writable")
        if str(target) in taken:
            raise InputError(f"{what} {path} is also {taken[str(target)]}: writing it would "
                             "destroy it")
        taken[str(target)] = what
        owner = None if in_place else run_file_owner(target)
        if owner is not None:
            shown = path if str(target) == os.path.abspath(path) else f"{path} ({target})"
            raise InputError(f"{what} {shown} is a file of {owner}: writing it would damage "
                             "it; choose a path outside it")


def check_output_folder(what: str, out: str, inputs: dict[str, Path | None], *,
                        writes: Kind) -> None:
    """Refuse, before any work, a folder to write (release's, export's, prepare's --out, of
    kind `writes`) that holds a run or lies inside one (`bahdanau.jobs.run_folder.is_run_folder`),
    lies inside a model folder, a prepared corpus or an exported folder (`run_file_owner`), is
    a folder of another kind or of other files (`bahdanau._folders.check_folder_to_write`,
    whatever --overwrite says), or holds one of the `inputs` (a file the command reads, inside
    the folder it replaces): replacing it whole would take them with it. A folder of the kind
    `writes` already is left to the command's own rules (--overwrite), and may itself be the
    input (a model folder released again over itself, read whole first)."""
    target = Path(os.path.realpath(out))
    shown = out if str(target) == os.path.abspath(out) else f"{out} ({target})"
    if is_run_folder(target):
        raise InputError(f"{what} {shown} holds a run: writing it would replace the run; "
                         "choose a new folder")
    run = next((folder for folder in target.parents if is_run_folder(folder)), None)
    owner = f"the run in {run}" if run is not None else run_file_owner(target)
    if owner is not None:
        raise InputError(f"{what} {shown} is inside {owner}: writing it would damage it; "
                         "choose a folder outside it")
    for name, path in inputs.items():
        given = None if path is None else Path(os.path.realpath(path))
        if given is not None and given.is_relative_to(target) and (
                given != target or folder_kind(target) is not writes):
            raise InputError(f"{what} {shown} holds {name} {path}: writing it would replace "
                             "it; choose a new folder")
    check_folder_to_write(target, writes, name=f"{what} {shown}")


class StdoutClosed(Exception):
    """stdout was closed by its reader (``| head -1``): no mistake of the user's, and no error of
    any file being written; the command line ends with status 141 (128 + SIGPIPE), quietly."""


@contextmanager
def to_stdout() -> Iterator[None]:
    """While inside, write results to stdout (and nothing else): a write that fails because
    its reader has gone raises `StdoutClosed` (with no cause, so an output file open around it
    is not blamed: `bahdanau._files.write_failure`)."""
    try:
        yield
    except BrokenPipeError:
        raise StdoutClosed("stdout was closed") from None


@contextmanager
def output_file(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write the output `path` with: stdout for ``-`` (flushed, left open),
    else `bahdanau._files.atomic_file` (atomic for a file, in place for a device or FIFO)."""
    if str(path) == STDOUT:
        sys.stdout.flush()
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    with atomic_file(Path(path)) as f:
        yield f


def write_text(path: str | Path, text: str) -> None:
    """Write a result file (``-``: stdout) whole: a crash leaves the old file or the new one."""
    data = text.encode("utf-8")
    with output_file(path) as f:
        f.write(data)


def read_sources(path: Path | None, *, needed: str = "a sentence to translate") -> list[str]:
    """The sentences of `path` (None: stdin, read as bytes and decoded exactly like a file); an
    empty line is refused, naming the line and what it is `needed` for."""
    lines = read_lines(path) if path else decode_lines(sys.stdin.buffer.read(), "<stdin>")
    for i, line in enumerate(lines):
        if not line.strip():
            raise InputError(f"{path or '<stdin>'}: line {i + 1} is empty; every line needs "
                             f"{needed}")
    return lines


def read_aligned(src: Path, tgt: Path, *, flags: tuple[str, str], needed: tuple[str, str]
                 ) -> tuple[list[str], list[str]]:
    """A source file and its translations, line by line (`evaluate --src/--ref`, `score
    --src/--tgt`): every line non-empty (`read_sources`, with what each side's line is
    `needed` for), the translations not empty, and as many lines on both sides, each refused in
    one line naming the option (`flags`)."""
    sources = read_sources(src, needed=needed[0])
    targets = read_sources(tgt, needed=needed[1])
    if not targets:
        raise InputError(f"{tgt} is empty: at least one line is needed")
    if len(sources) != len(targets):
        raise InputError(f"{flags[0]} has {len(sources)} lines but {flags[1]} has "
                         f"{len(targets)}")
    return sources, targets


def read_phrases(path: Path, what: str) -> list[list[str]]:
    """The lists of phrases of a JSON Lines file (`what` is its flag, ``--constraints``): one
    JSON list of strings per line, ``[]`` for none; each line that is not one is refused,
    naming it (an empty line too: a missing list would shift every line after it)."""
    out = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            raise InputError(f"{what} {path}: line {number} is empty; write [] for a line "
                             "without phrases")
        try:
            value = json.loads(line)
        except ValueError as err:
            detail = getattr(err, "msg", str(err))
            raise InputError(f"{what} {path}: line {number} is not JSON ({detail}); each line "
                             'is a list of phrases, e.g. ["un vélo", "rouge"]') from None
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise InputError(f"{what} {path}: line {number} must be a JSON list of phrases "
                             f"(strings), got {describe(value)}")
        out.append(value)
    return out
