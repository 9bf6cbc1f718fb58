"""Checkpoints: atomic files, a keep-last-N-and-best manager, and exact-resume payloads.

A checkpoint is a plain dict saved with `torch.save` and read back with
`torch.load(weights_only=True)`, so it may only hold tensors, numbers, strings, None, bools and
dicts/lists/tuples of them: configs, vocabularies and the `TrainState` are stored through their
`to_dict()`, RNG states as tensors. `checkpoint_payload` builds such a dict from the training
objects, `restore` puts it back into live objects (refusing a checkpoint whose model config or
vocabularies differ from the ones given) and returns the `TrainState`, and
`model_from_checkpoint` rebuilds a model for translation. Every file is written atomically
(a temporary file beside it, then `os.replace`).

Format 2 (`FORMAT_VERSION`), the payload's keys:

    format        2
    model         the model's state_dict()
    model_config  ModelConfig.to_dict(); its sizes and special ids are the vocabularies'
    src_vocab     Vocab.to_dict() of the source vocabulary
    tgt_vocab     Vocab.to_dict() of the target vocabulary
    train_config  TrainConfig.to_dict(), or None
    train_state   TrainState.to_dict() (step, epoch and batch position, best metric and its
                  step, evaluations without improvement, training time, learning-rate decays
                  of the plateau schedule, processes), or None; fields added later
                  (`lr_decays`, `processes`) are absent from the files of earlier versions and
                  read as their defaults
    optimizer     the optimizer's state_dict(), or None
    scaler        the fp16 GradScaler's state_dict(), or None
    rng           rng_state(): torch, CUDA, Python and NumPy generators
    extra         the caller's own checkpoint-safe entries (checkpoints of earlier versions
                  may hold the CLI's tokenizer settings in extra["tokenizer"])

and five optional sections (see "Room to grow"), absent from files of earlier versions:

    optimizer_class  the optimizer's class name ("Adadelta"), or None: `restore` refuses to put
                     the state of one optimizer type into another
    digest           {"algorithm": "sha256", "value": hex digest} of every other section,
                     added by `save_checkpoint` to the file it writes
    tokenizer        the tokenizer the model was trained with, as
                     `bahdanau.data.tokenizer_to_payload` stores it: {"name": "default",
                     "lowercase", "joiners"}, {"name": "whitespace"} or {"name":
                     "sentencepiece", "model": uint8 tensor of the model's bytes}. Read it
                     with `tokenizer_of`, which falls back to extra["tokenizer"], then to
                     DefaultTokenizer(), for checkpoints without it
    ema              the exponential moving average of the weights kept during training
                     (`TrainConfig.ema_decay`, `bahdanau.ema.WeightEMA`), a state_dict like
                     `model`. What translates (`model_from_checkpoint`, `bahdanau.load`, the
                     command line, averaging, ensembles) takes these weights when they are
                     there (`translation_weights`); `model` keeps the trained weights that
                     `restore` resumes from
    best_n           [{"step": int, "metric": float}, ...]: the best evaluations so far, best
                     first, whose numbered checkpoints `CheckpointManager` keeps; written by a
                     manager with keep_best > 1 (`TrainConfig.keep_best`), and read back by
                     `CheckpointManager.best_n` (averaging the best N checkpoints)

Damage. `load_checkpoint` recomputes the digest of what it read and refuses a file whose
contents do not match it (a flipped bit in a tensor's bytes, which `torch.load` does not
notice); it returns the payload without the `digest` entry. Files without a digest, written by
earlier versions, load unchecked. The digest is SHA-256 over a walk of the payload, the
`digest` entry left out, in which every value adds a header line (UTF-8, ending in a newline)
and what follows it:

    tensor           "tensor {dtype} {shape}" (e.g. "tensor torch.float32 (2, 3)"), then its
                     elements' raw bytes in row-major order (any dtype, through a uint8 view)
    dict             "dict {len}", then the key and the value of each entry, in insertion order
    list, tuple      "list {len}" or "tuple {len}" (torch.Size too), then the items
    anything else    "{type name} {repr}" (None, bool, int, float, str, torch.dtype, device)

Beyond the digest, `model_from_checkpoint`, `restore` and `bahdanau.train.setup_run` check a
payload whole before they change anything: the format and sections, the model config,
vocabularies and train state parse, the weights fit the model (every key, every shape) and are
finite, the optimizer state is of the given optimizer's type. Each failure is a one-line
`InputError` that names the file first when it was given as a path.

Room to grow. A later addition that a reader may ignore is a new top-level key (an optional
section), absent from checkpoints that do not have it, and leaves `format` at 2: readers take
the keys above and ignore any other (a reader older than the `ema` section translates with
the trained weights). `format` goes up only for a change that a reader of the older format would
misread; a reader refuses a format newer than its own with a one-line error.

A checkpoint made by averaging others (`bahdanau.averaging.average_checkpoints`) is of the same
format, with the averaged weights as `model`, no `ema`, and None for `train_config`,
`train_state`, `optimizer`, `scaler` and `rng`: it translates, but does not resume.

Format 1, written before the training state had a section of its own, is still read everywhere
through `upgrade_payload`: its top-level step, epoch, sampler position, best metric, bad
evaluations and training time become the `train_state`. Its train_config holds `max_len`, a
removed field, which `TrainConfig.from_dict` drops.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bahdanau._checks import check_path, describe, is_finite_number, is_int, resolve_device
from bahdanau._files import atomic_write
from bahdanau.config import DictConfig, ModelConfig, TrainConfig
from bahdanau.data.sentencepiece import SentencePieceTokenizer, check_vocabs
from bahdanau.data.tokenizers import (
    DefaultTokenizer,
    Tokenizer,
    tokenizer_from_payload,
    tokenizer_to_payload,
)
from bahdanau.data.vocab import Vocab
from bahdanau.ema import WeightEMA
from bahdanau.errors import InputError
from bahdanau.models import build_model

__all__ = [
    "FORMAT_VERSION",
    "CheckpointManager",
    "TrainState",
    "check_members",
    "checkpoint_payload",
    "checkpoints_folder",
    "find_checkpoint",
    "load_checkpoint",
    "model_from_checkpoint",
    "read_members",
    "restore",
    "save_checkpoint",
    "tokenizer_of",
    "translation_weights",
    "upgrade_payload",
]

FORMAT_VERSION = 2
_SECTIONS = ("model", "model_config", "src_vocab", "tgt_vocab", "train_config", "train_state",
             "optimizer", "scaler", "rng", "extra")   # the keys of format 2, besides "format"
_PRIMITIVES = (bool, int, float, str, type(None))
_BULKY = ("model", "ema", "optimizer", "scaler", "rng")   # not kept of the first member


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
    """Add `obj` to `hasher` as the module docstring's digest walk says."""
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


def _digest(payload: dict[str, Any]) -> dict[str, str]:
    """The `digest` section of `payload`: SHA-256 over every other section."""
    hasher = hashlib.sha256()
    _feed(hasher, {key: value for key, value in payload.items() if key != "digest"})
    return {"algorithm": "sha256", "value": hasher.hexdigest()}


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Save `payload` atomically: a crash leaves either the old file or the new one, whole.

    The file also holds the payload's `digest` (see the module docstring), which replaces any
    `digest` entry of `payload`; `payload` itself is not changed.

    Raises:
        InputError: `path` is not a path or is a directory, or the payload holds something
            `load_checkpoint` could not read back (the entry is named); nothing is written then.
    """
    path = check_path("path", path)
    if not isinstance(payload, dict):
        raise InputError(f"payload must be a dict, got {describe(payload)}")
    _check_payload(payload, "payload")
    stored = {**payload, "digest": _digest(payload)}
    atomic_write(path, lambda f: torch.save(stored, f))


def load_checkpoint(path: str | os.PathLike[str], *,
                    map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with `torch.load(weights_only=True)` and check its digest.

    Args:
        path: the file.
        map_location: where the tensors go.
    Returns:
        The payload, without its `digest` entry. A file without one (written by an earlier
        version) loads unchecked.
    Raises:
        FileNotFoundError: no such file.
        InputError: `path` is not a path, or the file is truncated, corrupt, not a checkpoint
            dict, or damaged: its contents do not match the digest stored in it (the file is
            named first).
    """
    path = check_path("path", path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        detail = str(err).split(". ")[0].splitlines()[0] if str(err) else ""
        raise InputError(f"{path}: not a readable checkpoint, corrupt or truncated "
                         f"({type(err).__name__}: {detail})") from None
    if not isinstance(payload, dict):
        raise InputError(f"{path}: checkpoint holds a {type(payload).__name__}, not a dict")
    if "digest" in payload:
        stored = payload.pop("digest")
        if not (isinstance(stored, dict) and set(stored) == {"algorithm", "value"}
                and stored["algorithm"] == "sha256"):
            raise InputError(f"{path}: damaged checkpoint: its digest entry is not "
                             "{'algorithm': 'sha256', 'value': <hex digest>}")
        if stored != _digest(payload):
            raise InputError(f"{path}: damaged checkpoint: its contents do not match the digest "
                             "stored in it")
    return payload


class CheckpointManager:
    """Numbered checkpoints in one directory: keeps the last `keep_last` and the best.

    Files are ``step_00001000.pt`` (one per saved step) and ``best.pt``, a byte copy of the
    checkpoint with the highest metric so far (higher is better, e.g. dev BLEU); ``best.json``
    records that metric and step so a resumed run keeps comparing against it. With
    `keep_best` > 1 the numbered checkpoints of the `keep_best` best evaluations are kept too,
    whatever their age, and each checkpoint saved records that ranking in its `best_n` section
    (see the module docstring), from which `best_n` reads it back. Each save first
    removes the temporary files of these names that a process killed while writing left behind;
    no other file in the directory is touched. Only one process should save into a directory.

    A save writes in an order that a crash at any point cannot break: the numbered file, then
    ``best.pt``, then ``best.json`` (each atomically, and durable before the next), then the
    deletion of older numbered files. So ``best.json`` never names a step that ``best.pt`` does
    not hold, and a run resumed after a crash finishes the interrupted save with
    `complete_save`. A damaged or missing ``best.json`` beside a ``best.pt`` is read back from
    ``best.pt``'s train state (and rewritten by `complete_save`).

    Args:
        directory: where the files go; created if missing.
        keep_last: numbered checkpoints kept (older ones are deleted after each save); >= 1.
        keep_best: numbered checkpoints of the best evaluations also kept; >= 1. With 1 (the
            default) ``best.pt`` alone keeps the best, and no `best_n` section is written.
    Raises:
        InputError: `keep_last` or `keep_best` < 1, or a damaged ``best.json`` that ``best.pt``
            cannot rebuild (the file and the problem are named).
    """

    _STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
    _TEMP_FILE = re.compile(r"^\.(step_\d+\.pt|best\.pt|best\.json)\..+\.tmp$")  # atomic_write's

    def __init__(self, directory: str | os.PathLike[str], *, keep_last: int = 3,
                 keep_best: int = 1) -> None:
        for name, value in (("keep_last", keep_last), ("keep_best", keep_best)):
            if not is_int(value) or value < 1:
                raise InputError(f"{name} must be a positive int, got {value!r}")
        self.directory = check_path("directory", directory)
        self.keep_last, self.keep_best = keep_last, keep_best
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self._recorded: tuple[float, int] | None = None   # what best.json holds, if it is sound
        self._ranking: list[tuple[int, float]] | None = None   # best_n(), read when first needed
        self._read_best()

    def _read_best(self) -> None:
        """Set the best metric and step from ``best.json``, or from ``best.pt`` if it is damaged."""
        info, best = self.directory / "best.json", self.directory / "best.pt"
        try:
            data = json.loads(info.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if not best.is_file():
                return   # nothing recorded yet
            problem = "missing beside best.pt"
        except (OSError, ValueError) as err:   # JSON and UTF-8 decoding errors are ValueErrors
            problem = f"unreadable ({type(err).__name__})"
        else:
            if (isinstance(data, dict) and set(data) == {"metric", "step"}
                    and is_finite_number(data["metric"]) and is_int(data["step"])
                    and data["step"] >= 0):
                self.best_metric, self.best_step = float(data["metric"]), data["step"]
                self._recorded = (self.best_metric, self.best_step)
                return
            problem = 'not {"metric": number, "step": int}'
        try:
            state = _stored_state(upgrade_payload(load_checkpoint(best)))
        except (FileNotFoundError, InputError) as err:
            raise InputError(f"{info}: {problem}, and best.pt cannot rebuild it: {err}") from None
        if state is None or state.best_step is None or not is_finite_number(state.best_metric):
            raise InputError(f"{info}: {problem}, and best.pt records no best metric and step "
                             "to rebuild it from")
        self.best_metric, self.best_step = float(state.best_metric), state.best_step

    def _numbered(self) -> list[tuple[int, Path]]:
        """(step, path) of the numbered checkpoint files, lowest step first."""
        if not self.directory.is_dir():
            return []
        found = []
        for p in self.directory.iterdir():
            match = self._STEP_FILE.match(p.name)
            if match:
                found.append((int(match.group(1)), p))
        return sorted(found)

    def path_for(self, step: int) -> Path:
        """Path of the numbered checkpoint of `step`."""
        return self.directory / f"step_{step:08d}.pt"

    def checkpoints(self) -> list[Path]:
        """Numbered checkpoint files, oldest step first."""
        return [p for _, p in self._numbered()]

    def latest(self) -> Path | None:
        """The checkpoint with the highest step, or None."""
        files = self.checkpoints()
        return files[-1] if files else None

    def best(self) -> Path | None:
        """``best.pt`` if a metric has been recorded, else None."""
        path = self.directory / "best.pt"
        return path if path.is_file() else None

    def best_n(self) -> list[tuple[int, float]]:
        """The best evaluations as (step, metric), best first (ties: the earlier step first).

        Read once from the latest numbered checkpoint's `best_n` section, and kept up to date
        by `save`; a directory whose checkpoints have no such section (saved with
        `keep_best` 1, or by an earlier version) gives the one best of ``best.json``.

        Raises:
            InputError: the latest checkpoint cannot be read or its `best_n` is malformed.
        """
        if self._ranking is None:
            latest, section = self.latest(), None
            if latest is not None:
                with _named(latest):
                    section = _parse_best_n(load_checkpoint(latest).get("best_n"))
            if section is None:
                section = [] if self.best_step is None else [(self.best_step, self.best_metric)]
            self._ranking = section
        return list(self._ranking)

    def best_checkpoints(self, n: int) -> list[Path]:
        """The files of the `n` best evaluations, best first: their numbered checkpoints, or
        ``best.pt`` for the best one when its numbered file is gone.

        Raises:
            InputError: fewer than `n` evaluations are ranked (the run kept fewer: train with
                `keep_best` >= n), or the checkpoint of one of them is gone.
        """
        ranking = self.best_n()
        if len(ranking) < n:
            raise InputError(f"{self.directory} ranks {len(ranking)} evaluated checkpoint"
                             f"{'s' if len(ranking) != 1 else ''}, not {n}: train with "
                             f"--keep-best {n} (keep_best={n}) to keep the {n} best")
        files = []
        for rank, (step, metric) in enumerate(ranking[:n]):
            path = self.path_for(step)
            if not path.is_file() and step == self.best_step and self.best() is not None:
                path = self.directory / "best.pt"
            if not path.is_file():
                raise InputError(f"{self.path_for(step)}: no such file; it held the "
                                 f"evaluation ranked {rank + 1} (step {step}, metric {metric:g})")
            files.append(path)
        return files

    def would_keep(self, metric: float) -> bool:
        """Whether a checkpoint with this metric would rank among the `keep_best` best (with
        `keep_best` 1: whether it beats the best so far)."""
        if self.keep_best == 1:
            return self.best_metric is None or metric > self.best_metric
        ranking = self.best_n()
        return len(ranking) < self.keep_best or metric > ranking[self.keep_best - 1][1]

    def save(self, step: int, payload: dict[str, Any], *, metric: float | None = None) -> Path:
        """Write the checkpoint of `step`; also as ``best.pt`` if `metric` beats the best so far.

        Then the numbered checkpoints older than the last `keep_last` are deleted (never the
        one just written, nor, with `keep_best` > 1, those of the `keep_best` best evaluations).
        See the class docstring for the order of the writes.

        Args:
            step: the training step, which names the file.
            payload: the checkpoint, e.g. from `checkpoint_payload`. With `keep_best` > 1 the
                file also holds the ranking of the best evaluations, this one's included, as
                its `best_n` section (which replaces any of `payload`'s).
            metric: this step's validation metric (higher is better), or None.
        Returns:
            The path of the numbered checkpoint.
        Raises:
            InputError: a negative step, or a payload `save_checkpoint` refuses.
        """
        if not is_int(step) or step < 0:
            raise InputError(f"step must be a non-negative int, got {step!r}")
        if self.directory.is_dir():  # temporary files left by a run killed mid-write
            for stale in self.directory.iterdir():
                if self._TEMP_FILE.match(stale.name):
                    stale.unlink(missing_ok=True)
        kept: set[int] = set()
        if self.keep_best > 1:
            ranking = [(s, m) for s, m in self.best_n() if s != step]
            if metric is not None:
                ranking.append((step, float(metric)))
            ranking = sorted(ranking, key=lambda entry: (-entry[1], entry[0]))[:self.keep_best]
            payload = {**payload, "best_n": [{"step": s, "metric": m} for s, m in ranking]}
            kept = {s for s, _ in ranking}
        path = self.path_for(step)
        save_checkpoint(path, payload)
        if self.keep_best > 1:
            self._ranking = ranking
        else:
            self._ranking = None          # best_n() reads the files again if asked
        if metric is not None and (self.best_metric is None or metric > self.best_metric):
            self._record_best(path, float(metric), step)
        for old_step, old in self._numbered()[:-self.keep_last]:
            if old_step < step and old_step not in kept:
                old.unlink(missing_ok=True)
        return path

    def complete_save(self, path: str | os.PathLike[str], state: TrainState) -> None:
        """Finish what a crash left undone of the save of `path`, the checkpoint resumed from.

        If `state` (the train state stored in `path`) is its own best (its `best_step` is its
        `step`) but that step is not the recorded best, the crash came between the numbered
        file and ``best.json``: `path` is copied to ``best.pt`` and ``best.json`` written.
        Otherwise a ``best.json`` that was read back from ``best.pt`` is rewritten.
        `bahdanau.train.setup_run` calls this when it resumes.

        Args:
            path: the numbered checkpoint resumed from, e.g. `latest()`.
            state: its `TrainState`, e.g. from `restore`.
        """
        if (state.best_step == state.step and is_finite_number(state.best_metric)
                and self.best_step != state.step):
            self._record_best(Path(path), float(state.best_metric), state.step)
        elif self.best_step is not None and self._recorded != (self.best_metric, self.best_step):
            self._write_best_json(self.best_metric, self.best_step)

    def _record_best(self, path: Path, metric: float, step: int) -> None:
        """Copy `path` to ``best.pt`` (durable), then record `metric` and `step` in best.json."""
        with open(path, "rb") as source:
            atomic_write(self.directory / "best.pt",
                          lambda f: shutil.copyfileobj(source, f, 1 << 22))
        self._write_best_json(metric, step)

    def _write_best_json(self, metric: float, step: int) -> None:
        info = json.dumps({"metric": metric, "step": step}).encode()
        atomic_write(self.directory / "best.json", lambda f: f.write(info))
        self.best_metric, self.best_step = metric, step
        self._recorded = (metric, step)


def _parse_best_n(section: Any) -> list[tuple[int, float]] | None:
    """A `best_n` section as (step, metric) pairs; None for a checkpoint without one."""
    if section is None:
        return None
    entries = section if isinstance(section, list) else [None]
    for entry in entries:
        if not (isinstance(entry, dict) and set(entry) == {"step", "metric"}
                and is_int(entry["step"]) and entry["step"] >= 0
                and is_finite_number(entry["metric"])):
            raise InputError(f'checkpoint best_n is malformed: it must be a list of '
                             f'{{"step": int, "metric": number}}, got {describe(section)}')
    return [(entry["step"], float(entry["metric"])) for entry in entries]


# ----------------------------------------------------------------------------------------------
# Payloads


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel / LossModule wrappers."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def rng_state() -> dict[str, Any]:
    """torch, CUDA, Python and NumPy global RNG states as checkpoint-safe values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class TrainState(DictConfig):
    """Where a training run is: what its loop needs, besides the objects that keep their own
    state (weights, optimizer, GradScaler, RNGs), to continue exactly after a restart.

    `bahdanau.train` keeps one in its `TrainRun`, updates it after every step and evaluation,
    saves it whole in every checkpoint and gets it back whole from `restore`. The batch order is
    a function of (seed, epoch), so (`epoch`, `position`) is the place in the data, counted in
    the batches of the whole run whatever the number of processes (`bahdanau.train.BatchPlan`);
    a loop that iterates a one-process `BucketBatchSampler` itself resumes it with
    `sampler.load_state_dict({"epoch": state.epoch, "position": state.position})`.
    """

    step: int = 0                      # optimizer steps taken
    epoch: int = 0                     # epoch of the next batch (0-based)
    position: int = 0                  # batches of `epoch` already trained on
    best_metric: float | None = None   # best validation metric so far (higher is better)
    best_step: int | None = None       # the step it was measured at
    bad_evals: int = 0                 # evaluations since the last improvement
    elapsed_s: float = 0.0             # training time so far, resumed runs included
    examples_digest: str | None = None  # sha256 of the training examples' ids (None: unknown)
    lr_decays: int = 0                 # decays of the plateau schedule (bahdanau.schedules)
    processes: int = 1                 # processes (DDP world size) that took the last step

    def __post_init__(self) -> None:
        for name in ("step", "epoch", "position", "bad_evals", "lr_decays"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise InputError(f"TrainState.{name} must be an int >= 0, got {value!r}")
        if not is_int(self.processes) or self.processes < 1:
            raise InputError(f"TrainState.processes must be an int >= 1, got {self.processes!r}")
        if self.best_step is not None and not (is_int(self.best_step) and self.best_step >= 0):
            raise InputError(f"TrainState.best_step must be an int >= 0 or None, got "
                             f"{self.best_step!r}")
        metric = self.best_metric
        if metric is not None and (isinstance(metric, bool)
                                   or not isinstance(metric, (int, float))):
            raise InputError(f"TrainState.best_metric must be a number or None, got {metric!r}")
        if self.examples_digest is not None and not isinstance(self.examples_digest, str):
            raise InputError(f"TrainState.examples_digest must be a str or None, got "
                             f"{self.examples_digest!r}")
        if not (is_finite_number(self.elapsed_s) and self.elapsed_s >= 0):
            raise InputError(f"TrainState.elapsed_s must be a finite number >= 0, got "
                             f"{self.elapsed_s!r}")


def checkpoint_payload(model: nn.Module, *, src_vocab: Vocab, tgt_vocab: Vocab,
                       optimizer: torch.optim.Optimizer | None = None,
                       scaler: torch.amp.GradScaler | None = None,
                       train_config: TrainConfig | None = None,
                       train_state: TrainState | None = None,
                       extra: dict[str, Any] | None = None,
                       tokenizer: Tokenizer | None = None,
                       ema: WeightEMA | None = None) -> dict[str, Any]:
    """A checkpoint of the current format (see the module docstring), with the RNG states.

    Args:
        model: the model, with its `.config` (DDP / LossModule wrappers are removed).
        src_vocab, tgt_vocab: its vocabularies.
        optimizer, scaler: stored when given (for resuming).
        train_config: the run's `TrainConfig`, or None.
        train_state: the loop's `TrainState`, or None (e.g. weights to translate with).
        extra: more checkpoint-safe entries of the caller's, stored under "extra".
        tokenizer: the tokenizer the model is trained with, stored as the `tokenizer` section
            (`tokenizer_to_payload`); None: no such section.
        ema: the moving average of the weights (`bahdanau.ema.WeightEMA`), stored as the `ema`
            section; None: no such section.
    Returns:
        A dict that `save_checkpoint` accepts.
    Raises:
        InputError: the model has no `.config`, its vocabulary sizes or special ids differ
            from the vocabularies', or `tokenizer` is not one of bahdanau's tokenizers.
    """
    model = _unwrap(model)
    config = _config_of(model)
    config.check_vocabs(src_vocab, tgt_vocab)
    sections = {} if tokenizer is None else {"tokenizer": tokenizer_to_payload(tokenizer)}
    if ema is not None:
        sections["ema"] = ema.state_dict()
    return {
        "format": FORMAT_VERSION,
        "model": model.state_dict(),
        "model_config": config.to_dict(),
        "src_vocab": src_vocab.to_dict(),
        "tgt_vocab": tgt_vocab.to_dict(),
        "train_config": train_config.to_dict() if train_config is not None else None,
        "train_state": train_state.to_dict() if train_state is not None else None,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "extra": dict(extra or {}),
        **sections,
    }


def upgrade_payload(payload: Any) -> dict[str, Any]:
    """`payload` in the layout of the current format; a format-1 payload is converted.

    Keys that the current format does not define (optional sections of a later version) are
    kept as they are. `restore` and `model_from_checkpoint` call this; a loop that reads a
    payload itself should too.

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
    version = payload.get("format")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InputError(f"not a bahdanau checkpoint: its 'format' is {version!r}, not a "
                         "format number")
    if version > FORMAT_VERSION:
        raise InputError(f"checkpoint format {version} is newer than this bahdanau reads "
                         f"(formats 1 to {FORMAT_VERSION}); upgrade bahdanau to load it")
    if version == 1:
        payload = _from_format_1(payload)
    missing = [key for key in _SECTIONS if key not in payload]
    if missing:
        raise InputError(f"checkpoint of format {version} lacks {missing}")
    return payload


def _from_format_1(old: dict[str, Any]) -> dict[str, Any]:
    """The format-2 payload holding what a format-1 payload holds."""
    missing = [k for k in ("model", "model_config", "src_vocab", "tgt_vocab", "step", "epoch")
               if k not in old]
    if missing:
        raise InputError(f"checkpoint of format 1 lacks {missing}")
    try:
        sampler = old.get("sampler") or {"epoch": old["epoch"], "position": 0}
        state = TrainState(step=int(old["step"]), epoch=int(sampler["epoch"]),
                           position=int(sampler["position"]), best_metric=old.get("best_metric"),
                           bad_evals=int(old.get("bad_evals", 0)),
                           elapsed_s=float(old.get("elapsed_s", 0.0)))
    except (TypeError, ValueError, KeyError) as err:   # InputError is a ValueError
        raise InputError(f"checkpoint of format 1 has a malformed training position: "
                         f"{type(err).__name__}: {err}") from None
    moved = {"format", "step", "epoch", "sampler", "best_metric", "bad_evals", "elapsed_s"}
    return {
        **{k: v for k, v in old.items() if k not in moved},
        "format": FORMAT_VERSION,
        "train_config": old.get("train_config"),
        "train_state": state.to_dict(),
        **{k: old.get(k) for k in ("optimizer", "scaler", "rng")},
        "extra": old.get("extra") or {},
    }


def _config_of(model: nn.Module) -> ModelConfig:
    """`model.config` (wrappers removed); InputError if there is none."""
    model = _unwrap(model)
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise InputError(f"{type(model).__name__} has no .config (a ModelConfig), which "
                         "checkpoints store to rebuild the model")
    return config


def _vocab_difference(name: str, stored: Vocab, given: Vocab) -> str:
    if len(stored) != len(given):
        return f"{name}: checkpoint has {len(stored)} entries, given vocabulary has {len(given)}"
    for i, (a, b) in enumerate(zip(stored.specials + tuple(stored.tokens),
                                   given.specials + tuple(given.tokens), strict=True)):
        if a != b:
            return f"{name}: id {i} is {a!r} in the checkpoint but {b!r} in the given vocabulary"
    return f"{name}: differs"


def _config_difference(stored: dict[str, Any], given: dict[str, Any]) -> str:
    keys = sorted(set(stored) | set(given))
    diffs = [f"{k}: checkpoint {stored.get(k)!r} vs given {given.get(k)!r}"
             for k in keys if stored.get(k) != given.get(k)]
    return "; ".join(diffs)


@contextmanager
def _named(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Put `path` in front of the message of an InputError raised inside (if not already)."""
    try:
        yield
    except InputError as err:
        prefix = f"{Path(path)}: " if path is not None else ""
        if str(err).startswith(prefix):
            raise
        raise InputError(f"{prefix}{err}") from None


def _parse(payload: dict[str, Any], section: str, parse: Callable[[dict[str, Any]], Any]) -> Any:
    """`parse(payload[section])`; a dict that it refuses is an InputError naming the section."""
    data = payload[section]
    if not isinstance(data, dict):
        raise InputError(f"checkpoint {section} is a {type(data).__name__}, not a dict")
    try:
        return parse(data)
    except (TypeError, ValueError) as err:   # InputError is a ValueError
        raise InputError(f"checkpoint {section} is malformed: {err}") from None


def _stored_state(payload: dict[str, Any]) -> TrainState | None:
    """The payload's `TrainState`, or None if it has none."""
    if payload["train_state"] is None:
        return None
    return _parse(payload, "train_state", TrainState.from_dict)


def _stored_parts(payload: dict[str, Any]) -> tuple[ModelConfig, Vocab, Vocab]:
    """The payload's model config and vocabularies, checked against each other."""
    config = _parse(payload, "model_config", ModelConfig.from_dict)
    src_vocab = _parse(payload, "src_vocab", Vocab.from_dict)
    tgt_vocab = _parse(payload, "tgt_vocab", Vocab.from_dict)
    try:
        config.check_vocabs(src_vocab, tgt_vocab)
    except ValueError as err:
        raise InputError(f"checkpoint is inconsistent: {err}") from None
    return config, src_vocab, tgt_vocab


def _check_weights(stored: Any, model: nn.Module, section: str = "model") -> None:
    """Refuse stored weights (the payload's `section`: "model" or "ema") that
    `model.load_state_dict` would refuse or that are not finite.

    Checked before loading because `load_state_dict` copies the weights that fit before it
    raises for the ones that do not.
    """
    if not isinstance(stored, dict):
        raise InputError(f"checkpoint {section} is a {type(stored).__name__}, not a state_dict")
    what = "checkpoint" if section == "model" else f"checkpoint {section}"
    expected = model.state_dict()
    for key, ours in expected.items():
        if key not in stored:
            raise InputError(f"{what} weights do not fit the model: {key!r} is missing")
        theirs = stored[key]
        if not isinstance(theirs, Tensor):
            raise InputError(f"{what} weights do not fit the model: {key!r} is a "
                             f"{type(theirs).__name__}, not a tensor")
        if theirs.shape != ours.shape:
            raise InputError(f"{what} weights do not fit the model: {key!r} has shape "
                             f"{tuple(theirs.shape)}, the model's has {tuple(ours.shape)}")
    for key in stored:
        if key not in expected:
            raise InputError(f"{what} weights do not fit the model: {key!r} is not one of "
                             "its weights")
    for key, tensor in stored.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InputError(f"{what} weight {key!r} holds NaN or inf")


def _check_optimizer(payload: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer state that `optimizer.load_state_dict` would take wrongly or refuse."""
    given = type(optimizer).__name__
    stored_class = payload.get("optimizer_class")   # None in checkpoints of earlier versions
    if stored_class is not None and stored_class != given:
        raise InputError(f"checkpoint optimizer state is of {stored_class}, the given optimizer "
                         f"is {given}")
    stored = payload["optimizer"]
    groups = stored.get("param_groups") if isinstance(stored, dict) else None
    if not (isinstance(groups, list) and isinstance(stored.get("state"), dict) and all(
            isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)):
        raise InputError("checkpoint optimizer is not an optimizer's state_dict")
    theirs = [len(g["params"]) for g in groups]
    ours = [len(g["params"]) for g in optimizer.param_groups]
    if theirs != ours:
        raise InputError(f"checkpoint optimizer state has parameter groups of sizes {theirs}, "
                         f"the given {given} has {ours}")


def restore(payload: dict[str, Any], model: nn.Module,
            optimizer: torch.optim.Optimizer | None = None, *,
            scaler: torch.amp.GradScaler | None = None, src_vocab: Vocab | None = None,
            tgt_vocab: Vocab | None = None, restore_rng: bool = True,
            ema: WeightEMA | None = None) -> TrainState | None:
    """Load a checkpoint payload (format 1 or 2) into live objects.

    Everything is checked before anything changes: the stored model config against
    `model.config` and against the stored vocabularies, the stored vocabularies against the
    given ones, the train state, the weights (and, with `ema`, the `ema` section's) against the
    model (keys, shapes, NaN/inf) and the optimizer state against `optimizer` (its type, where
    the checkpoint records it).

    Args:
        payload: the checkpoint dict, e.g. from `load_checkpoint`.
        model: receives the weights (wrappers are removed); needs `.config`.
        optimizer, scaler: receive their states when given (and stored).
        src_vocab, tgt_vocab: expected vocabularies; None skips the check.
        restore_rng: also restore the global torch/CUDA/Python/NumPy RNG states.
        ema: a `WeightEMA` of `model`: receives the `ema` section, or, from a checkpoint
            without one, starts again from the restored weights.
    Returns:
        The stored `TrainState`, whole; None if the checkpoint has none.
    Raises:
        InputError: the model config or a vocabulary differs (what differs is named), the stored
            config and vocabularies disagree, a section is malformed, the weights do not fit the
            model or are not finite, the optimizer state is another optimizer's, or the payload
            is not a checkpoint this code reads.
    """
    payload = upgrade_payload(payload)
    model = _unwrap(model)
    config = _config_of(model)
    stored_config, stored_src, stored_tgt = _stored_parts(payload)
    if stored_config != config:
        raise InputError("checkpoint model config differs: "
                         + _config_difference(stored_config.to_dict(), config.to_dict()))
    for name, stored, given in (("src_vocab", stored_src, src_vocab),
                                ("tgt_vocab", stored_tgt, tgt_vocab)):
        if given is not None and stored != given:
            raise InputError("checkpoint vocabulary differs: "
                             + _vocab_difference(name, stored, given))
    state = _stored_state(payload)
    _check_weights(payload["model"], model)
    stored_ema = payload.get("ema") if ema is not None else None
    if stored_ema is not None:
        _check_weights(stored_ema, model, "ema")
    if optimizer is not None and payload["optimizer"] is not None:
        _check_optimizer(payload, optimizer)
    model.load_state_dict(payload["model"])
    if ema is not None:
        ema.load_state_dict(stored_ema if stored_ema is not None else model.state_dict())
    if optimizer is not None and payload["optimizer"] is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if scaler is not None and payload["scaler"] is not None:
        scaler.load_state_dict(payload["scaler"])
    if restore_rng and payload["rng"] is not None:
        set_rng_state(payload["rng"])
    return state


def model_from_checkpoint(checkpoint: str | os.PathLike[str] | dict[str, Any], *,
                          device: str | torch.device = "cpu", ema: bool = True
                          ) -> tuple[nn.Module, Vocab, Vocab]:
    """Rebuild the model (eval mode) and its vocabularies from a checkpoint file or payload.

    Reads formats 1 and 2 (see the module docstring). The weights are those the checkpoint
    translates with (`translation_weights`): its `ema` section when it has one, else `model`.

    Args:
        checkpoint: a checkpoint file, or a payload from `load_checkpoint`.
        device: where the model goes.
        ema: False takes the trained weights (`model`) even where there are EMA weights.
    Returns:
        (model, src_vocab, tgt_vocab).
    Raises:
        FileNotFoundError: no such file.
        InputError: not a checkpoint this code reads, a damaged file, a malformed section, its
            model config and vocabularies disagree (sizes or special ids; both values are
            named), or its weights do not fit its config or are not finite. The message starts
            with the file when `checkpoint` is a path.
    """
    device = resolve_device(device)
    if not isinstance(checkpoint, (dict, str, os.PathLike)):
        raise InputError(f"checkpoint must be a file path or a payload dict, "
                         f"got {describe(checkpoint)}")
    path = None if isinstance(checkpoint, dict) else checkpoint
    with _named(path):
        payload = upgrade_payload(checkpoint if path is None else load_checkpoint(path))
        config, src_vocab, tgt_vocab = _stored_parts(payload)
        model = build_model(config)
        section, weights = translation_weights(payload, ema=ema)
        _check_weights(weights, model, section)
    model.load_state_dict(weights)
    return model.to(device).eval(), src_vocab, tgt_vocab


def translation_weights(payload: dict[str, Any], *, ema: bool = True
                        ) -> tuple[str, dict[str, Tensor]]:
    """The weights a checkpoint translates with: its `ema` section (the moving average of
    training, `bahdanau.ema`) when it has one and `ema` is True, else its `model` section.

    Args:
        payload: a checkpoint dict of the current format (`upgrade_payload`).
        ema: False always takes `model`.
    Returns:
        (the section's name, its state_dict), unchecked.
    """
    if ema and payload.get("ema") is not None:
        return "ema", payload["ema"]
    return "model", payload["model"]


def tokenizer_of(payload: dict[str, Any]) -> Tokenizer:
    """The tokenizer that a checkpoint's model was trained with.

    The payload's `tokenizer` section; for a checkpoint without one (written by an earlier
    version, or without a tokenizer given), a `DefaultTokenizer` with the settings that the
    command line kept in extra["tokenizer"] ("lowercase", "joiners"; missing ones take their
    defaults), else `DefaultTokenizer()`. A SentencePiece tokenizer is checked against both
    stored vocabularies.

    Args:
        payload: a checkpoint dict (format 1 or 2), e.g. from `load_checkpoint`.
    Returns:
        The tokenizer.
    Raises:
        InputError: the section (or extra["tokenizer"]) is malformed or names a tokenizer that
            bahdanau does not store, its SentencePiece model does not load (or sentencepiece is
            not installed), or a stored vocabulary holds a word that is not a piece of that
            model; one line each.
    """
    payload = upgrade_payload(payload)
    section, data = _tokenizer_data(payload)
    if data is None:
        return DefaultTokenizer()
    try:
        tokenizer = tokenizer_from_payload(data)
    except InputError as err:
        raise InputError(f"checkpoint {section}: {err}") from None
    if isinstance(tokenizer, SentencePieceTokenizer):
        src_vocab = _parse(payload, "src_vocab", Vocab.from_dict)
        tgt_vocab = _parse(payload, "tgt_vocab", Vocab.from_dict)
        try:
            check_vocabs(tokenizer, src_vocab, tgt_vocab)
        except InputError as err:
            raise InputError(f"checkpoint {section} does not fit its vocabularies: {err}"
                             ) from None
    return tokenizer


def _tokenizer_data(payload: dict[str, Any]) -> tuple[str, Any]:
    """(where, what) a payload stores of its tokenizer, as `tokenizer_of` reads it: the
    `tokenizer` section, else extra["tokenizer"] with the missing default settings filled in;
    None for neither (`DefaultTokenizer()`)."""
    data = payload.get("tokenizer")
    if data is not None:
        return "tokenizer", data
    extra = payload["extra"] if isinstance(payload["extra"], dict) else {}
    data = extra.get("tokenizer")
    if isinstance(data, dict) and data.get("name", "default") == "default":
        data = {"lowercase": False, "joiners": "prefix", **data, "name": "default"}
    return "extra['tokenizer']", data


def _tokenizer_summary(payload: dict[str, Any]) -> tuple[Any, str]:
    """A payload's tokenizer as a comparable value and a short description."""
    data = _tokenizer_data(payload)[1]
    if data is None:
        data = tokenizer_to_payload(DefaultTokenizer())
    if not isinstance(data, dict):
        return data, repr(data)
    model = data.get("model")
    if isinstance(model, Tensor):        # SentencePiece: compared by its bytes
        return ({**data, "model": bytes(model.cpu().numpy())},
                f"{data.get('name')}, a {model.numel()}-byte model")
    settings = ", ".join(f"{k}={v!r}" for k, v in data.items() if k != "name")
    return data, f"{data.get('name')}{f' ({settings})' if settings else ''}"


def check_members(members: list[tuple[Path, dict[str, Any]]], *, same_config: bool) -> None:
    """Refuse checkpoints that cannot be averaged or ensembled together.

    Every member must have the first one's vocabularies and tokenizer (an ensemble's models
    read the same source ids and vote on the same target ids); members to be averaged must also
    have its model config (the same weights, element for element).

    Args:
        members: (file, payload of the current format) pairs, at least one.
        same_config: also require the first member's model config (averaging).
    Raises:
        InputError: a payload that is inconsistent in itself, or a member that differs from the
            first: one line naming its file, what differs and the first file.
    """
    first_path, first = members[0]
    with _named(first_path):
        config, src_vocab, tgt_vocab = _stored_parts(first)
    tokenizer, described = _tokenizer_summary(first)
    for path, payload in members[1:]:
        with _named(path):
            other_config, other_src, other_tgt = _stored_parts(payload)
        if same_config and other_config != config:
            diff = [f"{k}={v!r} vs {config.to_dict()[k]!r}"
                    for k, v in other_config.to_dict().items() if v != config.to_dict()[k]]
            raise InputError(f"{path}: its model config differs from {first_path}'s "
                             f"({'; '.join(diff)}): only checkpoints of one model can be "
                             "averaged")
        for side, ours, theirs in (("source", src_vocab, other_src),
                                   ("target", tgt_vocab, other_tgt)):
            if ours != theirs:
                raise InputError(f"{path}: its {side} vocabulary ({len(theirs)} entries) "
                                 f"differs from {first_path}'s ({len(ours)} entries): the "
                                 "checkpoints must share their vocabularies")
        other, other_described = _tokenizer_summary(payload)
        if other != tokenizer:
            raise InputError(f"{path}: its tokenizer ({other_described}) differs from "
                             f"{first_path}'s ({described}): the checkpoints must share their "
                             "tokenizer")


def read_members(paths: Sequence[Path], *, same_config: bool
                 ) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The checkpoints to average or ensemble, each with its payload (current format), read one
    at a time; each after the first is checked against it (`check_members`) before it comes.

    Args:
        paths: the members' files.
        same_config: as for `check_members` (averaging).
    Raises:
        InputError: a damaged or malformed file (named first), or a member that `check_members`
            refuses.
    """
    first: dict[str, Any] | None = None      # the first member without its weights and states
    for path in paths:
        with _named(path):
            payload = upgrade_payload(load_checkpoint(path))
        if first is None:
            first = {k: v for k, v in payload.items() if k not in _BULKY}
        else:
            check_members([(paths[0], first), (path, payload)], same_config=same_config)
        yield path, payload
        del payload                          # before the next member is read


def checkpoints_folder(folder: Path) -> Path:
    """Where a training output folder keeps its checkpoints: its ``checkpoints`` subfolder, or
    the folder itself if it has none (a folder of checkpoints)."""
    return folder / "checkpoints" if (folder / "checkpoints").is_dir() else folder


def find_checkpoint(path: str | os.PathLike[str], name: str = "checkpoint") -> Path:
    """The checkpoint file that `path` stands for.

    Args:
        path: a checkpoint file, or a training output folder: its ``checkpoints`` subfolder
            (or the folder itself, if it has none) gives ``best.pt``, else the latest
            numbered checkpoint.
        name: what to call `path` in the message (e.g. "--checkpoint").
    Returns:
        The file.
    Raises:
        InputError: no such file, a file that cannot be read, or a folder without checkpoints.
    """
    p = check_path(name, path)
    if p.is_dir():
        manager = CheckpointManager(checkpoints_folder(p))
        found = manager.best() or manager.latest()
        if found is None:
            raise InputError(f"{name} {path}: no checkpoint in this folder")
        return found
    if not p.exists():
        raise InputError(f"{name} {path}: no such file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{name} {path}: not readable")
    return p
