"""The kinds of folder bahdanau writes, and what a writer may replace.

Four commands write a folder, each of its own `Kind`: ``train`` a run folder, ``release`` a
model folder, ``prepare`` a prepared corpus, ``export`` an exported folder. The last three say
what they are in their ``manifest.json`` ("format": `RELEASE_FORMAT`, `PREPARED_FORMAT`,
`EXPORTED_FORMAT`, declared here and nowhere else); a run folder is known by its checkpoints and
its record (`bahdanau.jobs.run_folder.is_run_folder`). `folder_kind` says what a folder is:
one of those, or a folder of other files (the user's own, another tool's). An exported folder
written before the manifests said what they are has the integer 1 as its "format", beside its
two programs. A folder whose manifest is damaged (not JSON at all) is of a kind only when
every entry in it is a file that kind writes (`_FILES`), so a writer still replaces a damaged
folder of its own (`manifest_kind`); a manifest that is JSON without our "format" is another
tool's, and its folder one of other files.

The rule every writer follows (`check_folder_to_write`, before any work): it writes into a path
that is absent or an empty folder; it replaces only a folder of its own kind (release and
prepare with ``--overwrite``; prepare also reuses one of the same inputs and options; export
replaces none), and only while it holds nothing but that kind's files (those its manifest
lists, or for a damaged manifest those the kind writes, and the manifest: a file the user put
in it is named, never deleted); a folder of another kind, or of other files, is never written
into nor deleted, whatever the flag, and neither is anything inside a model folder, a
prepared corpus or an exported folder (`enclosing_kind`: their manifests list every file's
digest). ``train`` alone writes beside other files (its own names,
`bahdanau.jobs.run_folder.RUN_FILES`, and ``--overwrite`` removes only those).

The names of the files that writers of several folder kinds share (`CONFIG`, `WEIGHTS`,
`TOKENIZER_FILE`, ...) are declared here, once, and those writers and readers import them, as
are a prepared corpus's own arrays (`ids_file`, `offsets_file`, `LINES_FILE`).
"""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path

from bahdanau.errors import InputError

MANIFEST = "manifest.json"
# The names of the files the writers write, each declared once, here, where every writer (and
# `_FILES` below) may import it.
CONFIG, WEIGHTS = "config.json", "model.safetensors"   # a model's half of a model folder
CARD = "README.md"                            # a model folder's card, an exported folder's README
SRC_VOCAB_FILE, TGT_VOCAB_FILE = "src_vocab.json", "tgt_vocab.json"   # `Vocab.save`
TOKENIZER_FILE = "tokenizer.json"             # `bahdanau.data.tokenizers.tokenizer_files`
# A SentencePiece tokenizer's model, beside its JSON: the two folder kinds name it differently.
FOLDER_SENTENCEPIECE = "tokenizer.model"          # in a model folder and an exported folder
PREPARED_SENTENCEPIECE = "sentencepiece.model"    # in a prepared corpus
ENCODER_PROGRAM, STEP_PROGRAM = "encoder.pt2", "step.pt2"     # an exported folder's programs
ENCODER_ONNX, STEP_ONNX = "encoder.onnx", "step.onnx"         # and the same as ONNX
DECODE_FILE = "decode.py"                     # its decoding loops (`bahdanau.serving.decode`)
LINES_FILE = "lines.npy"                      # a prepared corpus: each kept pair's input line
RELEASE_FORMAT = "bahdanau-model"             # a model folder (`bahdanau release`)
PREPARED_FORMAT = "bahdanau prepared corpus"  # a prepared corpus (`bahdanau prepare`)
EXPORTED_FORMAT = "bahdanau exported model"   # an exported folder (`bahdanau export`)
_MANIFEST_BYTES = 1 << 20                     # a manifest.json larger than this is none of ours
SIDES = ("src", "tgt")                        # a prepared corpus's two sides, in this order


def ids_file(side: str) -> str:
    """A prepared corpus's ids of one side ("src" or "tgt"), its sentences end to end."""
    return f"{side}.ids.npy"


def offsets_file(side: str) -> str:
    """A prepared corpus's sentence offsets into `ids_file` of the same side."""
    return f"{side}.offsets.npy"


class Kind(Enum):
    """What a folder is; the value says it in words."""

    RUN = "a run folder"
    MODEL = "a model folder"
    PREPARED = "a prepared corpus"
    EXPORTED = "an exported folder"
    OTHER = "a folder of other files"

    @property
    def writer(self) -> str:
        """The command that writes a folder of this kind (not `OTHER`)."""
        return _WRITERS[self]

    def the(self, folder: Path) -> str:
        """The folder named with its kind: "the model folder M"."""
        return f"the {self.value.split(' ', 1)[1]} {folder}"


_WRITERS = {Kind.RUN: "train", Kind.MODEL: "release", Kind.PREPARED: "prepare",
            Kind.EXPORTED: "export"}
_FORMATS = {RELEASE_FORMAT: Kind.MODEL, PREPARED_FORMAT: Kind.PREPARED,
            EXPORTED_FORMAT: Kind.EXPORTED}
# The files that show what a folder whose manifest.json is damaged (not JSON) was written as,
# and every name its writer (`write_release`, `prepare_corpus`, `export_folder`) may write
# beside the manifest (tests/unit/test_folders.py holds them to the writers' names).
_SIGNS = {Kind.MODEL: (WEIGHTS, CONFIG),
          Kind.PREPARED: tuple(ids_file(side) for side in SIDES),
          Kind.EXPORTED: (ENCODER_PROGRAM, STEP_PROGRAM)}
_FILES = {Kind.MODEL: frozenset({WEIGHTS, CONFIG, CARD, SRC_VOCAB_FILE, TGT_VOCAB_FILE,
                                 TOKENIZER_FILE, FOLDER_SENTENCEPIECE}),
          Kind.PREPARED: frozenset({name(side) for side in SIDES
                                    for name in (ids_file, offsets_file)}
                                   | {SRC_VOCAB_FILE, TGT_VOCAB_FILE, LINES_FILE,
                                      TOKENIZER_FILE, PREPARED_SENTENCEPIECE}),
          Kind.EXPORTED: frozenset({ENCODER_PROGRAM, STEP_PROGRAM, SRC_VOCAB_FILE,
                                    TGT_VOCAB_FILE, TOKENIZER_FILE, CARD, FOLDER_SENTENCEPIECE,
                                    DECODE_FILE, ENCODER_ONNX, STEP_ONNX})}
_DAMAGED = object()                           # `_read_manifest`: a manifest that is not JSON


def _read_manifest(folder: Path) -> object:
    """The JSON of `folder`'s manifest.json; None without one, `_DAMAGED` when it is not JSON
    (or unreadable, or too large, or nested too deeply to parse). Never raises."""
    manifest = folder / MANIFEST
    try:
        if not manifest.is_file():
            return None
        if manifest.stat().st_size > _MANIFEST_BYTES:
            return _DAMAGED
        return json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return _DAMAGED


def _names(folder: Path) -> list[tuple[str, bool]] | None:
    """Each entry of `folder` with whether it is a file (symbolic links not followed); None
    when it cannot be read."""
    try:
        with os.scandir(folder) as entries:
            return sorted((e.name, e.is_file(follow_symlinks=False)) for e in entries)
    except OSError:
        return None


def _kind_of(folder: Path, data: object) -> Kind | None:
    if data is None:
        return None
    if data is _DAMAGED:
        names = _names(folder)
        for kind, signs in _SIGNS.items():
            if (names is not None and all(file and (name == MANIFEST or name in _FILES[kind])
                                          for name, file in names)
                    and set(signs) <= {name for name, _ in names}):
                return kind
        return Kind.OTHER
    found = data.get("format") if isinstance(data, dict) else None
    if isinstance(found, str):
        return _FORMATS.get(found, Kind.OTHER)
    if type(found) is int and found == 1:
        return Kind.EXPORTED if _holds(folder, _SIGNS[Kind.EXPORTED]) else Kind.OTHER
    return Kind.OTHER


def manifest_kind(folder: Path) -> Kind | None:
    """The kind the ``manifest.json`` of `folder` gives it: its "format", or (an exported
    folder written before the folders said what they are) the integer 1 beside the two
    programs; for a damaged manifest (not JSON at all), the kind whose files, and nothing
    else, the folder holds. `Kind.OTHER` for another tool's manifest (JSON without our
    "format"), None without one. Never raises."""
    return _kind_of(folder, _read_manifest(folder))


def foreign_entry(folder: Path, kind: Kind) -> str | None:
    """The first entry of `folder` (a folder of `kind`) that is not that kind's: not a file
    its manifest lists (or, for a damaged manifest or one whose list names no plain files, a
    file the kind writes) nor the manifest. None when there is none; "(unreadable)" when the
    folder cannot be listed. Never raises."""
    names = _names(folder)
    if names is None:
        return "(unreadable)"
    data = _read_manifest(folder)
    listed = data.get("files") if isinstance(data, dict) else None
    plain = isinstance(listed, dict) and all(
        isinstance(k, str) and "/" not in k and k not in ("", ".", "..") for k in listed)
    ours = set(listed) if plain and isinstance(listed, dict) else set(_FILES.get(kind, ()))
    return next((name for name, file in names
                 if not file or (name != MANIFEST and name not in ours)), None)


def _holds(folder: Path, names: tuple[str, ...]) -> bool:
    try:
        return all((folder / name).is_file() for name in names)
    except OSError:
        return False


def folder_kind(folder: Path) -> Kind | None:
    """What `folder` is: None when it is absent, not a folder or empty; a model folder, a
    prepared corpus or an exported folder by its manifest (`manifest_kind`); else
    `Kind.OTHER` (a run folder too: `bahdanau.jobs.run_folder.is_run_folder` knows runs).
    Never raises."""
    try:
        if not folder.is_dir() or not any(folder.iterdir()):
            return None
    except OSError:
        return Kind.OTHER
    kind = manifest_kind(folder)
    return Kind.OTHER if kind is None else kind


def enclosing_kind(path: Path) -> tuple[Kind, Path] | None:
    """The nearest folder holding `path` (symbolic links resolved) that is a model folder, a
    prepared corpus or an exported folder, with its kind; None when none holds it. Never
    raises."""
    for folder in Path(os.path.realpath(path)).parents:
        kind = manifest_kind(folder)
        if kind not in (None, Kind.OTHER):
            return kind, folder
    return None


def _entries(folder: Path) -> str:
    try:
        n = sum(1 for _ in os.scandir(folder))
    except OSError:
        return "unreadable"
    return f"{n} {'entry' if n == 1 else 'entries'}"


def check_folder_to_write(out: Path, writes: Kind, *, name: str | None = None,
                          beside_other_files: bool = False) -> bool:
    """Refuse, before any work, a folder that a writer of `writes` may not write (module
    docstring): a file, a folder inside a model folder, a prepared corpus or an exported
    folder, a folder of another kind, or a folder of other files (unless
    `beside_other_files`, train's rule).

    Args:
        out: the folder to write.
        writes: the kind the writer writes.
        name: `out` as the messages name it ("--out data"; default: the path).
        beside_other_files: a folder of other files is written into (train's run folder).
    Returns:
        True when `out` already is a folder of `writes` (a damaged one too, when its files
        show it) holding nothing else: whether it is replaced or reused is the writer's rule
        (--overwrite); False
        when `out` is absent or empty (or other files, `beside_other_files`).
    Raises:
        InputError: one line naming what `out` is.
    """
    name = str(out) if name is None else name
    if out.exists() and not out.is_dir():
        raise InputError(f"{name} is a file, not a folder")
    inside = enclosing_kind(out)
    if inside is not None:
        raise InputError(f"{name} is inside {inside[0].the(inside[1])}: writing it would "
                         "damage it; choose a folder outside it")
    kind = folder_kind(out)
    if kind is None or (kind is Kind.OTHER and beside_other_files):
        return False
    if kind is writes:
        foreign = foreign_entry(out, kind)
        if foreign is not None:
            raise InputError(f"{name} holds {foreign}, which is not the "
                             f"{kind.value.split(' ', 1)[1]}'s: move it out or choose another "
                             "folder")
        return True
    if kind is Kind.OTHER:
        raise InputError(f"{name} is a folder of other files ({_entries(out)}): {writes.writer} "
                         f"writes {writes.value} whole and never replaces other files; choose "
                         "a new folder")
    raise InputError(f"{name} is {kind.value}: {writes.writer} writes {writes.value}; choose "
                     "another folder")
