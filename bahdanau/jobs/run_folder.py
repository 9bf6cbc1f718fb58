"""A run folder (``--out``): one run's options, checkpoints and results, and who may write them.

``options.json`` records the options the run was started with (`stored_options` reads them
back to resume it; ``bahdanau train --config RUN/options.json`` trains the same run again),
``checkpoints/`` its checkpoints, and the result files beside them. Earlier versions wrote the
same JSON record as ``config.yaml`` (`OLD_RUN_CONFIG`): it is read where ``options.json`` is
missing, and a resumed run replaces it with ``options.json``. JSON, not YAML: the core reads and
writes it with the standard library, and ``--config`` reads it without the yaml extra (PyYAML),
which a ``config.yaml`` would need; not ``config.json``, the model config of a model folder
(`bahdanau.checkpoint.release`), a file of other contents. `locked` holds the
folder while a run trains in it, and `remove_run` deletes a run for ``--overwrite``, moving its
files out of the way first so that the folder never mixes two runs. The files of `RUN_FILES`
and the lock belong to the run, as the files of a model folder (`bahdanau release`), of a
prepared corpus (`bahdanau prepare`) and of an exported folder (`bahdanau export`) belong to
it: `run_file_owner` names the owner of such a path, which the other commands refuse to write
(`bahdanau.jobs.files.check_outputs`, `bahdanau.jobs.files.check_output_folder`). A run goes
beside other files, never into a folder of another kind or inside one (`check_run_out`, by
`bahdanau._folders.check_folder_to_write`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from bahdanau._checks import JSON_ERRORS
from bahdanau._files import exclusive_lock
from bahdanau._folders import Kind, check_folder_to_write, enclosing_kind
from bahdanau.checkpoint.manager import CheckpointManager
from bahdanau.checkpoint.reader import RUN_REPORT
from bahdanau.errors import InputError
from bahdanau.jobs.options import TrainOptions

RUN_CONFIG = "options.json"     # a run folder's options
OLD_RUN_CONFIG = "config.yaml"  # the same JSON record, as earlier versions named it
RUN_FILES = ("checkpoints", RUN_CONFIG, OLD_RUN_CONFIG, RUN_REPORT, "test.hyp.txt",
             "alignment.png", "train.log", "tensorboard", "dev")
RUN_LOCK = ".lock"              # held by `locked` while a run trains in the folder
_RECORD_BYTES = 1 << 20         # an options.json larger than this is no run's record


def stored_options(out: Path, o: TrainOptions) -> dict[str, Any] | None:
    """The options of the run `out` holds, to resume it; None when a new run starts there.

    Raises:
        InputError: `out` is a file or a folder of another kind (`check_run_out`), its
            options.json is damaged, or it holds a run and neither resuming (the default) nor
            --overwrite was asked for.
    """
    check_run_out(out)
    config = run_config(out)
    if not holds_run(out):
        return None
    foreign = foreign_run_file(out)
    if foreign is not None:
        raise InputError(f"--out {out} holds {foreign}, which is not a run's: move it out or "
                         "choose another --out")
    if o.overwrite:
        return None
    if not o.resume:
        raise InputError(f"--out {out} holds a run: resume it (without --no-resume), start "
                         "over with --overwrite (deleting it), or choose another --out")
    if not config.is_file():
        return None                  # checkpoints of an earlier version: train() checks them
    try:
        stored = json.loads(config.read_text(encoding="utf-8"))
    except JSON_ERRORS as err:
        raise InputError(f"{config} is damaged ({err}); it records the run's options") from None
    if not isinstance(stored, dict):
        raise InputError(f"{config} is damaged: it holds a {type(stored).__name__}, not options")
    return stored


def run_config(out: Path) -> Path:
    """The file of `out` that records its run's options: ``options.json``, or where it is
    missing, the ``config.yaml`` of an earlier version. Never raises."""
    config = out / RUN_CONFIG
    try:
        return out / OLD_RUN_CONFIG if not config.is_file() and (
            out / OLD_RUN_CONFIG).is_file() else config
    except OSError:
        return config


def foreign_run_file(out: Path) -> str | None:
    """The first of a run's names in `out` that holds what is not the run's: an options.json
    or config.yaml that is no run's record (a project's own config.yaml), or a file in
    ``checkpoints/`` that `CheckpointManager` does not write (--overwrite would delete it with
    the run, resuming would read it). None when there is none. Never raises."""
    try:
        for name in (RUN_CONFIG, OLD_RUN_CONFIG):
            if (out / name).is_file() and not _is_record(out / name):
                return name
        checkpoints = out / "checkpoints"
        if checkpoints.is_dir():
            for path in sorted(checkpoints.iterdir()):
                if not CheckpointManager.writes_or_writing(path.name) or not path.is_file():
                    return f"checkpoints/{path.name}"
    except OSError:
        pass
    return None


def holds_run(out: Path) -> bool:
    """`out` holds a run to resume or overwrite (`train --out`): its options.json or
    config.yaml (a damaged one too: `stored_options` says so) or checkpoints."""
    manager = CheckpointManager(out / "checkpoints")
    return run_config(out).is_file() or bool(manager.latest() or manager.best())


def is_run_folder(folder: Path) -> bool:
    """`folder` is a bahdanau run folder, as far as its names and small files show: it has
    numbered checkpoints in ``checkpoints/``, or an options.json (an earlier version's
    config.yaml) that is a run's record (`_is_record`; `run_train_job` writes it before the
    first update); a project's own config.yaml is not one, nor is a bare ``.lock`` (other
    tools, pytest's temporary folders among them, leave files of that name). Never raises (an
    unreadable folder is no run)."""
    try:
        checkpoints = folder / "checkpoints"
        if checkpoints.is_dir() and any(CheckpointManager.writes(p.name) and p.suffix == ".pt"
                                        for p in checkpoints.iterdir()):
            return True
    except OSError:
        return False
    return _is_record(run_config(folder))


def _is_record(config: Path) -> bool:
    """`config` is a run's record of its options: a small JSON object most of whose keys are
    `TrainOptions`'. Never raises."""
    try:
        if not config.is_file() or config.stat().st_size > _RECORD_BYTES:
            return False
        record = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, *JSON_ERRORS):
        return False
    if not isinstance(record, dict):
        return False
    return 2 * len(_record_keys().intersection(record)) > len(record)


@cache
def _record_keys() -> frozenset[str]:
    """The keys of a run's options.json: the recorded options and ``versions``."""
    return frozenset({*TrainOptions().to_record(), "versions"})


def run_file_owner(path: Path) -> str | None:
    """What owns `path` (an absolute path, symlinks resolved), in words for a message ("the
    run in RUN", "the model folder M", "the prepared corpus P", "the exported folder E"), or
    None.

    A run (`is_run_folder`) owns its `RUN_FILES` (everything under ``checkpoints/``), its
    lock, and in a folder of checkpoints (``CheckpointManager``'s, without a run around it) the
    numbered files, ``best.pt`` and ``best.json``: overwriting one loses the run's best model,
    makes it unresumable, or makes its records lie. A model folder, a prepared corpus and an
    exported folder (`bahdanau._folders.enclosing_kind`, by their manifests) own everything in
    them: their manifests list each file's SHA-256, which a changed file no longer matches, and
    their readers take no file of another's. Never raises.
    """
    for folder in path.parents:
        inside = path.relative_to(folder).parts
        if inside[0] in (*RUN_FILES, RUN_LOCK) and is_run_folder(folder):
            return f"the run in {folder}"
    enclosing = enclosing_kind(path)
    if enclosing is not None:
        kind, folder = enclosing
        return kind.the(folder)
    folder = path.parent
    try:
        if CheckpointManager.writes(path.name) and folder.is_dir() and any(
                CheckpointManager.writes(p.name) for p in folder.iterdir()):
            return f"the run in {folder}"
    except OSError:
        pass
    return None


def check_run_out(out: Path) -> None:
    """Refuse, before any work, a train --out that is a file, a model folder, a prepared
    corpus or an exported folder, or lies inside one (`bahdanau._folders.check_folder_to_write`
    with train's rule: a run's files go beside other files, never into a folder of another
    kind), nor into the files of another run (``RUN/checkpoints``, ``RUN/dev``: `run_file_owner`),
    where its --overwrite would remove what it took for its own."""
    check_folder_to_write(out, Kind.RUN, name=f"--out {out}", beside_other_files=True)
    owner = run_file_owner(Path(os.path.realpath(out)))
    if owner is not None:
        raise InputError(f"--out {out} is inside {owner}: writing a run there would damage it; "
                         "choose a folder outside it")


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Create `out` and hold a lock on it while inside: a second `train` into the same folder
    is refused instead of mixing two runs' checkpoints."""
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out / RUN_LOCK, f"--out {out} is in use by another bahdanau train; wait "
                                       "for it to finish or choose another --out"):
        yield


def remove_run(out: Path) -> None:
    """Delete the run in `out` (--overwrite): its files are first moved out of the way, so the
    folder never mixes two runs; files of the user's own are kept."""
    trash = out / ".overwritten"
    if trash.exists():
        shutil.rmtree(trash)                       # left by an earlier --overwrite that died
    trash.mkdir()
    for name in RUN_FILES:                         # checkpoints first: a crash in between
        if (out / name).exists():                  # leaves no checkpoint of the old run
            os.replace(out / name, trash / name)
    shutil.rmtree(trash)
