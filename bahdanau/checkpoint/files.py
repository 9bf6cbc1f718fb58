"""The checkpoint file: its format, its digest, atomic save and checked load, and old formats.

A checkpoint is a plain dict saved with `torch.save` and read back with
`torch.load(weights_only=True)`; docs/checkpoint-format.md describes every section (named once,
in `bahdanau.checkpoint.sections`), the digest walk and the room to grow. `save_checkpoint`
writes one atomically with its digest, `load_checkpoint_file` checks the digest of what it read,
and `upgrade_payload` brings a payload of an older format to the current one; `read_payload`
does both, naming the file in every error, once per read. Everything else reads checkpoints
through the door, `bahdanau.checkpoint.reader`, which reads model folders and run folders too.
Every fix-up of an old format lives here: `upgrade_payload` (format 1's top-level training
position becomes the `train_state` section, and its train_config loses `max_len`) and
`complete_old_state` (what a format-1 state lacks that only the run can tell);
tests/unit/test_checkpoint_formats.py holds one test per fix-up.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from bahdanau._checks import check_path, describe
from bahdanau._files import atomic_write
from bahdanau.checkpoint.sections import (
    DIGEST,
    EXTRA,
    FORMAT,
    MODEL,
    MODEL_CONFIG,
    OPTIMIZER,
    REQUIRED,
    RNG,
    SCALER,
    SRC_VOCAB,
    TGT_VOCAB,
    TRAIN_CONFIG,
    TRAIN_STATE,
)
from bahdanau.errors import InputError

_LOG = logging.getLogger(__name__)

FORMAT_VERSION = 2
_PRIMITIVES = (bool, int, float, str, type(None))


def _check_payload(obj: Any, where: str) -> None:
    """Raise InputError naming the first entry that `torch.load(weights_only=True)` would refuse."""
    if isinstance(obj, (Tensor, torch.Size, torch.dtype, torch.device, *_PRIMITIVES)):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, _PRIMITIVES):
                raise InputError(f"checkpoint key {where}[{key!r}] must be a str or number")
            _check_payload(value, f"{where}[{key!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _check_payload(value, f"{where}[{i}]")
        return
    raise InputError(
        f"checkpoint entry {where} is a {type(obj).__name__}; only tensors, numbers, strings, "
        "None and dicts/lists of them can be stored (use to_dict() for configs and vocabularies)"
    )


def _feed(hasher: Any, obj: Any) -> None:
    """Add `obj` to `hasher` as docs/checkpoint-format.md's digest walk says."""
    if isinstance(obj, Tensor):
        hasher.update(f"tensor {obj.dtype} {tuple(obj.shape)}\n".encode())
        data = obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        hasher.update(data.numpy())
    elif isinstance(obj, dict):
        hasher.update(f"dict {len(obj)}\n".encode())
        for key, value in obj.items():
            _feed(hasher, key)
            _feed(hasher, value)
    elif isinstance(obj, (list, tuple)):
        hasher.update(f"{'list' if isinstance(obj, list) else 'tuple'} {len(obj)}\n".encode())
        for value in obj:
            _feed(hasher, value)
    else:
        hasher.update(f"{type(obj).__name__} {obj!r}\n".encode())


def payload_digest(payload: dict[str, Any]) -> dict[str, str]:
    """The `digest` section of `payload`: SHA-256 over every other section."""
    hasher = hashlib.sha256()
    _feed(hasher, {key: value for key, value in payload.items() if key != DIGEST})
    return {"algorithm": "sha256", "value": hasher.hexdigest()}


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Save `payload` atomically: a crash leaves either the old file or the new one, whole.

    The file also holds the payload's `digest` (docs/checkpoint-format.md), which replaces any
    `digest` entry of `payload`; `payload` itself is not changed.

    Raises:
        InputError: `path` is not a path or is a directory, or the payload holds something
            `load_checkpoint` could not read back (the entry is named); nothing is written then.
    """
    path = check_path("path", path)
    if not isinstance(payload, dict):
        raise InputError(f"payload must be a dict, got {describe(payload)}")
    _check_payload(payload, "payload")
    stored = {**payload, DIGEST: payload_digest(payload)}
    atomic_write(path, lambda f: torch.save(stored, f))


def load_checkpoint_file(path: str | os.PathLike[str], *,
                         map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint file with `torch.load(weights_only=True)` and check its digest.

    `bahdanau.checkpoint.load_checkpoint` reads a model folder too; this reads a file only.

    Args:
        path: the file.
        map_location: where the tensors go.
    Returns:
        The payload, as stored (not upgraded), without its `digest` entry. A file without one
        (written by an earlier version) loads unchecked.
    Raises:
        FileNotFoundError: no such file.
        InputError: `path` is not a path, or the file is truncated, corrupt, not a checkpoint
            dict, or damaged: its contents do not match the digest stored in it (the file is
            named first).
    """
    path = check_path("path", path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file {path}")
    _LOG.debug(f"reading the checkpoint {path} ({path.stat().st_size / 1e6:.1f} MB)")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        detail = str(err).split(". ")[0].splitlines()[0] if str(err) else ""
        raise InputError(f"{path}: not a readable checkpoint, corrupt or truncated "
                         f"({type(err).__name__}: {detail})") from None
    if not isinstance(payload, dict):
        raise InputError(f"{path}: checkpoint holds a {type(payload).__name__}, not a dict")
    if DIGEST in payload:
        stored = payload.pop(DIGEST)
        if not (isinstance(stored, dict) and set(stored) == {"algorithm", "value"}
                and stored["algorithm"] == "sha256"):
            raise InputError(f"{path}: damaged checkpoint: its digest entry is not "
                             "{'algorithm': 'sha256', 'value': <hex digest>}")
        if stored != payload_digest(payload):
            raise InputError(f"{path}: damaged checkpoint: its contents do not match the digest "
                             "stored in it")
    return payload


def read_payload(path: str | os.PathLike[str], *,
                 map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The payload of a checkpoint file in the current format: `load_checkpoint_file`, then
    `upgrade_payload` (once), every InputError starting with the file.

    Raises:
        FileNotFoundError, InputError: as those two say.
    """
    with named(path):
        return upgrade_payload(load_checkpoint_file(path, map_location=map_location))


def upgrade_payload(payload: Any) -> dict[str, Any]:
    """`payload` in the layout of the current format; a format-1 payload is converted.

    Keys that the current format does not define (optional sections of a later version) are
    kept as they are. Every read of a file calls this once (`read_payload`, through the door
    `bahdanau.checkpoint.reader`); `restore` and `model_from_checkpoint` call it for a payload
    given as a dict.

    Args:
        payload: a checkpoint dict, e.g. from `load_checkpoint`.
    Returns:
        A dict with every key of the current format.
    Raises:
        InputError: not a bahdanau checkpoint, a format newer than this code reads, or a
            required key missing (named); one line each.
    """
    if not isinstance(payload, dict):
        raise InputError(f"a checkpoint is a dict, got {type(payload).__name__}")
    version = payload.get(FORMAT)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InputError(f"not a bahdanau checkpoint: its 'format' is {version!r}, not a "
                         "format number")
    if version > FORMAT_VERSION:
        raise InputError(f"checkpoint format {version} is newer than this bahdanau reads "
                         f"(formats 1 to {FORMAT_VERSION}); upgrade bahdanau to load it")
    if version == 1:
        payload = _from_format_1(payload)
    missing = [key for key in REQUIRED if key not in payload]
    if missing:
        raise InputError(f"checkpoint of format {version} lacks {missing}")
    return payload


def _from_format_1(old: dict[str, Any]) -> dict[str, Any]:
    """The format-2 payload holding what a format-1 payload holds."""
    missing = [k for k in (MODEL, MODEL_CONFIG, SRC_VOCAB, TGT_VOCAB, "step", "epoch")
               if k not in old]
    if missing:
        raise InputError(f"checkpoint of format 1 lacks {missing}")
    try:
        sampler = old.get("sampler") or {"epoch": old["epoch"], "position": 0}
        state = {"step": int(old["step"]), "epoch": int(sampler["epoch"]),
                 "position": int(sampler["position"]), "best_metric": old.get("best_metric"),
                 "bad_evals": int(old.get("bad_evals", 0)),
                 "elapsed_s": float(old.get("elapsed_s", 0.0))}
    except (TypeError, ValueError, KeyError) as err:
        raise InputError(f"checkpoint of format 1 has a malformed training position: "
                         f"{type(err).__name__}: {err}") from None
    moved = {FORMAT, "step", "epoch", "sampler", "best_metric", "bad_evals", "elapsed_s"}
    return {
        **{k: v for k, v in old.items() if k not in moved},
        FORMAT: FORMAT_VERSION,
        TRAIN_CONFIG: _without_max_len(old.get(TRAIN_CONFIG)),
        TRAIN_STATE: state,   # the training side parses it (TrainState.from_dict)
        **{k: old.get(k) for k in (OPTIMIZER, SCALER, RNG)},
        EXTRA: old.get(EXTRA) or {},
    }


def _without_max_len(train_config: Any) -> Any:
    """Format 1's train_config without `max_len`, a field that was never read (the length
    filter is `encode_pairs`') and went with format 2."""
    if not isinstance(train_config, dict):
        return train_config                   # None, or malformed: TrainConfig.from_dict says
    return {k: v for k, v in train_config.items() if k != "max_len"}


@contextmanager
def named(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Put `path` in front of the message of an InputError raised inside (if not already)."""
    try:
        yield
    except InputError as err:
        prefix = f"{Path(path)}: " if path is not None else ""
        if str(err).startswith(prefix):
            raise
        raise InputError(f"{prefix}{err}") from None


def parse_section(payload: dict[str, Any], section: str,
                  parse: Callable[[dict[str, Any]], Any]) -> Any:
    """`parse(payload[section])`; a dict that it refuses is an InputError naming the section."""
    data = payload[section]
    if not isinstance(data, dict):
        raise InputError(f"checkpoint {section} is a {type(data).__name__}, not a dict")
    try:
        return parse(data)
    except (TypeError, ValueError) as err:   # InputError is a ValueError
        raise InputError(f"checkpoint {section} is malformed: {err}") from None


class OldState(Protocol):
    """The fields of a training state that `complete_old_state` completes (`TrainState`)."""

    epoch: int
    position: int
    best_metric: float | None
    best_step: int | None


def complete_old_state(state: OldState, *, recorded_best_step: int | None,
                       epoch_batches: Callable[[int], int]) -> None:
    """Fill in, in place, what a training state read from a format-1 checkpoint lacks and only
    the run can tell; a state of the current format is left as it is.

    * Format 1 kept the step of the best evaluation only in ``best.json``: a state with a best
      metric but no `best_step` takes `recorded_best_step` (`CheckpointManager.best_step`).
    * Format 1 saved the place after an epoch's last batch as that epoch's end: a `position` at
      or past the epoch's batch count becomes the next epoch's start.

    Args:
        state: the restored state, e.g. `bahdanau.training.TrainState`.
        recorded_best_step: the best step the run's folder records, or None.
        epoch_batches: the number of batches of an epoch (of the whole run's plan).
    """
    if state.best_step is None and state.best_metric is not None:
        state.best_step = recorded_best_step
    if state.position >= epoch_batches(state.epoch):
        state.epoch, state.position = state.epoch + 1, 0
