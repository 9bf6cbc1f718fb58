"""`torch.export` programs as data: archives with nothing pickled, and the weights they hold.

``torch.export.load`` trusts its file: it unpickles some members of a ``.pt2`` archive (the
sample inputs, weights of tensor subclasses, custom and opaque objects, legacy formats), and
its JSON graph is code too (shape expressions go to ``sympy.sympify``, which evaluates them;
guards are Python source; call targets are looked up by name anywhere under ``torch``).
No archive someone else wrote is given to it here. `program_bytes` writes a program's archive
without sample inputs and checks, by `check_archive`, that nothing in it is pickled, so that
the folder holds no pickle for anyone; `archive_weights` reads back only the raw tensor bytes
and the JSON table of their names, dtypes and shapes, checked, from which a program is rebuilt
by tracing the model's own code (`bahdanau.serving.load_exported`).
"""

from __future__ import annotations

import copy
import io
import json
import math
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from bahdanau._checks import JSON_ERRORS
from bahdanau.errors import InputError

__all__ = ["archive_weights", "check_archive", "program_bytes"]

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
    by `check_archive`.

    Raises:
        InputError: this torch stores something of the program pickled (a tensor subclass, a
            custom object), which `check_archive` refuses.
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
                         "holds no pickle)") from None
    return data


def check_archive(data: bytes, what: str) -> None:
    """Refuse a ``.pt2`` archive with a member other than those of a program with nothing
    pickled (the JSON graph and tensor tables, raw tensor bytes, the version records, empty
    sample inputs), or whose members read differently to Python's zip reader, naming `what`.

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
                         "it could run code where the archive is loaded, so it is refused")
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
    except (*JSON_ERRORS, KeyError, TypeError):
        entries = None
    if not isinstance(entries, dict):
        raise InputError(f"{what}: {table} is not a table of tensors")
    return entries


# The dtypes weights are stored in (torch.export's ScalarType codes).
_DTYPES = {6: torch.float16, 7: torch.float32, 8: torch.float64, 13: torch.bfloat16}


def archive_weights(data: bytes, what: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a ``.pt2`` archive's bytes (`check_archive`'s rule first), by their names
    in the program: each read from its raw bytes by the JSON table's dtype, sizes, strides and
    offset, every one checked. Nothing else of the archive is read.

    Raises:
        InputError: `check_archive` refuses it, or an entry of the table does not describe a
            float tensor within its bytes (one line naming `what` and the entry).
    """
    what = str(what)
    check_archive(data, what)
    reader = torch._C.PyTorchFileReader(io.BytesIO(data))
    table = _TABLES["data/weights/"]
    weights = {}
    for name, entry in _table(reader.get_record(table), what, table).items():
        meta = entry.get("tensor_meta")
        try:
            dtype = _DTYPES[meta["dtype"]]
            sizes, strides = ([_int(d) for d in meta[key]] for key in ("sizes", "strides"))
            offset = _int(meta["storage_offset"])
            raw = reader.get_record("data/weights/" + entry["path_name"])
            flat = (torch.frombuffer(bytearray(raw), dtype=dtype) if raw
                    else torch.empty(0, dtype=dtype))
            if len(sizes) != len(strides) or min([offset, *sizes, *strides], default=0) < 0:
                raise ValueError
            last = offset + sum((n - 1) * st for n, st in zip(sizes, strides, strict=True))
            if 0 in sizes:
                last = -1
            if (last >= flat.numel() or offset + math.prod(sizes) > flat.numel()
                    or flat.numel() * flat.element_size() != len(raw)):
                raise ValueError        # beyond its bytes, or more elements than its bytes hold
            weights[name] = flat.as_strided(sizes, strides, offset).clone()
        except (KeyError, TypeError, ValueError, RuntimeError):
            raise InputError(f"{what}: {table} describes {name!r} as no float tensor within "
                             "its bytes") from None
    return weights


def _int(value: object) -> int:
    """A size, stride or offset of the table (``{"as_int": n}``)."""
    if not (isinstance(value, dict) and set(value) == {"as_int"}
            and type(value["as_int"]) is int):
        raise ValueError
    return value["as_int"]


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else type(err).__name__
