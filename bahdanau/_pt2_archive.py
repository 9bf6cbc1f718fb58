"""`torch.export` programs as data: saved with nothing pickled, loaded only when nothing is.

``torch.export.load`` unpickles some members of a ``.pt2`` archive (the sample inputs, weights
of tensor subclasses, custom and opaque objects, the legacy formats), falling back to
``torch.load(weights_only=False)``, which runs whatever code a pickle names. A program that
someone else wrote must not be able to do that. torch offers no loader that never unpickles,
so `load_program` reads the archive with torch's own reader (the one ``torch.export.load``
reads with, so both see the same members) and refuses it unless every member is one of those
a pickle-free program has: the JSON graph, the JSON weight and constant tables with no entry
marked as pickled, raw tensor bytes, the archive's version records, and empty sample inputs
(and Python's zip reader, which torch's fallback for older formats uses, must list the same
members once each); only then does ``torch.export.load`` read it, from the same bytes.
`program_bytes` writes such an archive (a program without sample inputs) and checks it by the
same rule, so a torch whose archives hold pickles fails at export, not at load.

The JSON graph names operators, which the deserializer looks up among those registered; it
cannot name Python code.
"""

from __future__ import annotations

import copy
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from bahdanau.errors import InputError

__all__ = ["load_program", "program_bytes"]

MODEL = "model"                        # the one program an archive of `torch.export.save` holds
_RECORDS = {
    ".data/version", ".data/serialization_id", "byteorder",     # the archive writer's own
    "archive_format", "archive_version",
    f"models/{MODEL}.json",                                     # the graph
    f"data/sample_inputs/{MODEL}.pt",                           # must be empty (a pickle else)
    f"data/weights/{MODEL}_weights_config.json",                # the tensor tables
    f"data/constants/{MODEL}_constants_config.json",
}
_SAMPLE_INPUTS = f"data/sample_inputs/{MODEL}.pt"
_TABLES = {"data/weights/": f"data/weights/{MODEL}_weights_config.json",
           "data/constants/": f"data/constants/{MODEL}_constants_config.json"}
_TENSOR = re.compile(r"data/(weights/weight|constants/tensor)_\d+")   # raw bytes of one tensor


def program_bytes(program: ExportedProgram) -> bytes:
    """The ``.pt2`` archive of `program` without its sample inputs (which are pickled), checked
    by `load_program`'s rule.

    Raises:
        InputError: this torch stores something of the program pickled (a tensor subclass, a
            custom object), which `load_program` would refuse.
    """
    program = copy.copy(program)          # a shallow copy: the caller's keeps its inputs
    program.example_inputs = None
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    data = buffer.getvalue()
    try:
        check_archive(data, "the exported program")
    except InputError as err:
        raise InputError(f"{err} (torch {torch.__version__} stores it so; an exported folder "
                         "must load without unpickling)") from None
    return data


def check_archive(data: bytes, what: str) -> None:
    """Refuse a ``.pt2`` archive that loading could unpickle anything from (see the module
    docstring), naming `what` it is.

    Raises:
        InputError: not an archive torch reads, or a member other than a pickle-free program's.
    """
    try:
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        records = set(reader.get_all_records())
        with zipfile.ZipFile(io.BytesIO(data)) as archive:    # what torch's fallbacks read
            names = archive.namelist()
    except Exception as err:          # RuntimeError, zipfile.BadZipFile, ... for no archive
        raise InputError(f"{what} is not a torch.export archive ({_first_line(err)})") from None
    folders = {name.split("/", 1)[0] for name in names}
    if (len(folders) != 1 or len(names) != len(set(names)) or len(names) != len(records)
            or {name.split("/", 1)[-1] for name in names} != records):
        raise InputError(f"{what} is an archive whose members read differently to different "
                         "readers: refused")
    refused = sorted(r for r in records if r not in _RECORDS and not _TENSOR.fullmatch(r))
    if refused:
        raise InputError(f"{what} holds {refused[0]}, which a program saved as data does not: "
                         "loading it could run code, so it is refused")
    missing = sorted(_RECORDS - records)
    if missing:
        raise InputError(f"{what} has no {missing[0]}: not a whole torch.export archive")
    if reader.get_record(_SAMPLE_INPUTS):
        raise InputError(f"{what} holds pickled sample inputs ({_SAMPLE_INPUTS}), which loading "
                         "would unpickle: refused")
    for folder, table in _TABLES.items():
        for name, entry in _table(reader.get_record(table), what, table).items():
            if not (isinstance(entry, dict) and entry.get("use_pickle") is False
                    and isinstance(entry.get("path_name"), str)
                    and _TENSOR.fullmatch(folder + entry["path_name"])):
                raise InputError(f"{what}: {table} stores {name!r} as a pickle or an object, "
                                 "which loading would unpickle: refused")


def _table(raw: bytes, what: str, table: str) -> dict[str, Any]:
    """The entries of a weight or constant table (``{"config": {name: entry}}``)."""
    try:
        entries = json.loads(raw.decode("utf-8"))["config"]
    except (ValueError, KeyError, TypeError):
        entries = None
    if not isinstance(entries, dict):
        raise InputError(f"{what}: {table} is not a table of tensors")
    return entries


def load_program(data: bytes, what: str | Path) -> ExportedProgram:
    """The program of a ``.pt2`` archive's bytes, once `check_archive` finds nothing in it
    that loading could unpickle.

    Raises:
        InputError: `check_archive` refuses it, or torch cannot read it (one line, naming
            `what`).
    """
    check_archive(data, str(what))
    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as err:       # torch's deserializer raises many kinds on a damaged graph
        raise InputError(f"{what} is not a program this torch reads "
                         f"({type(err).__name__}: {_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else type(err).__name__
