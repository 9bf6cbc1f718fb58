"""Checkpoints: atomic files, a keep-last-N-and-best manager, and exact-resume payloads.

A checkpoint is a plain dict saved with `torch.save` and read back with
`torch.load(weights_only=True)`, so it may only hold tensors, numbers, strings, None, bools and
dicts/lists/tuples of them: configs and vocabularies are stored through their `to_dict()`, RNG
states as tensors, the sampler position as ints. `checkpoint_payload` builds such a dict from the
training objects and `restore` puts it back, refusing a checkpoint whose model config or
vocabularies differ from the ones given.
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bahdanau.config import ModelConfig
from bahdanau.data import Vocab
from bahdanau.models import build_model

__all__ = [
    "CheckpointManager",
    "checkpoint_payload",
    "load_checkpoint",
    "model_from_checkpoint",
    "restore",
    "save_checkpoint",
]

FORMAT_VERSION = 1
_PRIMITIVES = (bool, int, float, str, type(None))


def _check_payload(obj: Any, where: str) -> None:
    """Raise ValueError naming the first entry that `torch.load(weights_only=True)` would refuse."""
    if isinstance(obj, (Tensor, torch.Size, torch.dtype, torch.device, *_PRIMITIVES)):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, _PRIMITIVES):
                raise ValueError(f"checkpoint key {where}[{key!r}] must be a str or number")
            _check_payload(value, f"{where}[{key!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _check_payload(value, f"{where}[{i}]")
        return
    raise ValueError(
        f"checkpoint entry {where} is a {type(obj).__name__}; only tensors, numbers, strings, "
        "None and dicts/lists of them can be stored (use to_dict() for configs and vocabularies)"
    )


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. directories cannot be opened on Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write via `write(file)` to a temporary file beside `path`, fsync it, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Save `payload` atomically: a crash leaves either the old file or the new one, whole.

    Raises:
        ValueError: the payload holds something `load_checkpoint` could not read back (the entry
            is named); nothing is written then.
    """
    if not isinstance(payload, dict):
        raise ValueError(f"payload must be a dict, got {type(payload).__name__}")
    _check_payload(payload, "payload")
    _atomic_write(Path(path), lambda f: torch.save(payload, f))


def load_checkpoint(path: str | os.PathLike[str], *,
                    map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with `torch.load(weights_only=True)`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is truncated, corrupt or not a checkpoint dict (the file is named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        detail = str(err).split(". ")[0].splitlines()[0] if str(err) else ""
        raise ValueError(f"{path}: not a readable checkpoint, corrupt or truncated "
                         f"({type(err).__name__}: {detail})") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: checkpoint holds a {type(payload).__name__}, not a dict")
    return payload


class CheckpointManager:
    """Numbered checkpoints in one directory: keeps the last `keep_last` and the best.

    Files are ``step_00001000.pt`` (one per saved step) and ``best.pt``, a copy of the
    checkpoint with the highest metric so far (higher is better, e.g. dev BLEU); ``best.json``
    records that metric and step so a resumed run keeps comparing against it. Each save first
    removes temporary files that a process killed while writing left behind. Only one process
    should save into a directory.

    Args:
        directory: where the files go; created if missing.
        keep_last: numbered checkpoints kept (older ones are deleted after each save); >= 1.
    """

    _STEP_FILE = re.compile(r"^step_(\d+)\.pt$")

    def __init__(self, directory: str | os.PathLike[str], *, keep_last: int = 3) -> None:
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be a positive int, got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.best_metric: float | None = None
        self.best_step: int | None = None
        info = self.directory / "best.json"
        if info.is_file():
            data = json.loads(info.read_text(encoding="utf-8"))
            self.best_metric, self.best_step = data["metric"], data["step"]

    def path_for(self, step: int) -> Path:
        """Path of the numbered checkpoint of `step`."""
        return self.directory / f"step_{step:08d}.pt"

    def checkpoints(self) -> list[Path]:
        """Numbered checkpoint files, oldest step first."""
        if not self.directory.is_dir():
            return []
        found = []
        for p in self.directory.iterdir():
            match = self._STEP_FILE.match(p.name)
            if match:
                found.append((int(match.group(1)), p))
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """The checkpoint with the highest step, or None."""
        files = self.checkpoints()
        return files[-1] if files else None

    def best(self) -> Path | None:
        """``best.pt`` if a metric has been recorded, else None."""
        path = self.directory / "best.pt"
        return path if path.is_file() else None

    def save(self, step: int, payload: dict[str, Any], *, metric: float | None = None) -> Path:
        """Write the checkpoint of `step`; also as ``best.pt`` if `metric` beats the best so far.

        Returns:
            The path of the numbered checkpoint.
        """
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if self.directory.is_dir():  # temporary files left by a run killed mid-write
            for stale in self.directory.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
        path = self.path_for(step)
        save_checkpoint(path, payload)
        if metric is not None and (self.best_metric is None or metric > self.best_metric):
            save_checkpoint(self.directory / "best.pt", payload)
            info = json.dumps({"metric": float(metric), "step": step}).encode()
            _atomic_write(self.directory / "best.json", lambda f: f.write(info))
            self.best_metric, self.best_step = float(metric), step
        for old in self.checkpoints()[:-self.keep_last]:
            old.unlink(missing_ok=True)
        return path


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


def checkpoint_payload(model: nn.Module, optimizer: torch.optim.Optimizer | None, *,
                       model_config: ModelConfig | None, train_config: Any, src_vocab: Vocab,
                       tgt_vocab: Vocab, step: int, epoch: int,
                       sampler_state: dict[str, int] | None, best_metric: float | None,
                       scaler: torch.amp.GradScaler | None = None, bad_evals: int = 0,
                       elapsed_s: float = 0.0, extra: dict[str, Any] | None = None
                       ) -> dict[str, Any]:
    """Everything needed to rebuild the model and resume training exactly.

    Args:
        model: the model (DDP / LossModule wrappers are removed).
        optimizer: its optimizer, or None to store weights only.
        model_config: the `ModelConfig`; None uses `model.config`.
        train_config: a `TrainConfig` (anything with `to_dict()`), or None.
        src_vocab, tgt_vocab: the vocabularies.
        step: optimizer steps taken; epoch: current epoch.
        sampler_state: `BucketBatchSampler.state_dict()`, or None.
        best_metric: best validation metric so far, or None.
        scaler: the fp16 GradScaler, if any.
        bad_evals: evaluations since the last improvement (for early stopping).
        elapsed_s: training time so far (for a time budget).
        extra: more checkpoint-safe entries, stored under "extra".
    Returns:
        A dict that `save_checkpoint` accepts.
    """
    model = _unwrap(model)
    if model_config is None:
        model_config = getattr(model, "config", None)
    if model_config is None:
        raise ValueError("model_config is None and the model has no .config")
    return {
        "format": FORMAT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "model_config": model_config.to_dict(),
        "train_config": train_config.to_dict() if train_config is not None else None,
        "src_vocab": src_vocab.to_dict(),
        "tgt_vocab": tgt_vocab.to_dict(),
        "step": int(step),
        "epoch": int(epoch),
        "sampler": dict(sampler_state) if sampler_state is not None else None,
        "best_metric": None if best_metric is None else float(best_metric),
        "bad_evals": int(bad_evals),
        "elapsed_s": float(elapsed_s),
        "rng": rng_state(),
        "extra": extra or {},
    }


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


def restore(payload: dict[str, Any], model: nn.Module,
            optimizer: torch.optim.Optimizer | None = None, *, sampler: Any = None,
            scaler: torch.amp.GradScaler | None = None, model_config: ModelConfig | None = None,
            src_vocab: Vocab | None = None, tgt_vocab: Vocab | None = None,
            restore_rng: bool = True) -> dict[str, Any]:
    """Load a payload from `checkpoint_payload` into live objects.

    The model config and vocabularies are checked first, and nothing is changed if they differ.

    Args:
        payload: the checkpoint dict.
        model: receives the weights (wrappers are removed).
        optimizer, sampler, scaler: receive their states when given (and stored).
        model_config: expected config; None uses `model.config` (skipped if that is None too).
        src_vocab, tgt_vocab: expected vocabularies; None skips the check.
        restore_rng: also restore the global torch/CUDA/Python/NumPy RNG states.
    Returns:
        The training position: {"step", "epoch", "best_metric", "bad_evals", "elapsed_s",
        "extra"}.
    Raises:
        ValueError: the model config or a vocabulary differs (what differs is named), or the
            payload is not a checkpoint of this format.
    """
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"not a bahdanau checkpoint of format {FORMAT_VERSION} (format {got!r})")
    model = _unwrap(model)
    if model_config is None:
        model_config = getattr(model, "config", None)
    if model_config is not None and payload["model_config"] != model_config.to_dict():
        raise ValueError("checkpoint model config differs: "
                         + _config_difference(payload["model_config"], model_config.to_dict()))
    for name, given in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if given is not None:
            stored = Vocab.from_dict(payload[name])
            if stored != given:
                raise ValueError("checkpoint vocabulary differs: "
                                 + _vocab_difference(name, stored, given))
    model.load_state_dict(payload["model"])
    if optimizer is not None and payload.get("optimizer") is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if scaler is not None and payload.get("scaler") is not None:
        scaler.load_state_dict(payload["scaler"])
    if sampler is not None and payload.get("sampler") is not None:
        sampler.load_state_dict(payload["sampler"])
    if restore_rng and "rng" in payload:
        set_rng_state(payload["rng"])
    return {k: payload.get(k) for k in ("step", "epoch", "best_metric", "bad_evals",
                                        "elapsed_s", "extra")}


def model_from_checkpoint(checkpoint: str | os.PathLike[str] | dict[str, Any], *,
                          device: str | torch.device = "cpu"
                          ) -> tuple[nn.Module, Vocab, Vocab]:
    """Rebuild the model (eval mode) and its vocabularies from a checkpoint file or payload.

    Returns:
        (model, src_vocab, tgt_vocab).
    """
    payload = checkpoint if isinstance(checkpoint, dict) else load_checkpoint(checkpoint)
    model = build_model(ModelConfig.from_dict(payload["model_config"]))
    model.load_state_dict(payload["model"])
    return (model.to(device).eval(), Vocab.from_dict(payload["src_vocab"]),
            Vocab.from_dict(payload["tgt_vocab"]))
