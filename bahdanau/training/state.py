"""A training run's state as checkpoints keep it: `TrainState`, RNG states, payload and restore.

`checkpoint_payload` builds a checkpoint of the current format (docs/checkpoint-format.md) from
the live training objects, and `restore` puts one back into them, refusing a checkpoint whose
model config, vocabularies, weights or optimizer state do not fit, and returns the stored
`TrainState`: everything the loop needs, besides the objects that keep their own state, to
continue exactly after a restart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from bahdanau._about import versions
from bahdanau._checks import is_finite_number, is_int
from bahdanau.checkpoint.files import FORMAT_VERSION, parse_section, upgrade_payload
from bahdanau.checkpoint.payload import check_weights, stored_parts
from bahdanau.config import DictConfig, ModelConfig, TrainConfig
from bahdanau.data.tokenizers import (
    Tokenizer,
    tokenizer_to_payload,
)
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.training.ema import WeightEMA


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel / LossModule wrappers."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def rng_state() -> dict[str, Any]:
    """torch, CUDA, Python and NumPy global RNG states as checkpoint-safe values."""
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=True)
    assert isinstance(numpy_state, tuple)   # the legacy form: the global generator is MT19937
    kind, keys, pos, has_gauss, cached = numpy_state
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

    `bahdanau.training` keeps one in its `TrainRun`, updates it after every step and evaluation,
    saves it whole in every checkpoint and gets it back whole from `restore`. The batch order is
    a function of (seed, epoch), so (`epoch`, `position`) is the place in the data, counted in
    the batches of the whole run whatever the number of processes (`bahdanau.training.BatchPlan`);
    a loop that iterates a one-process `BucketBatchSampler` itself resumes it with
    `sampler.load_state_dict({"epoch": state.epoch, "position": state.position})`.
    """

    step: int = 0                      # optimizer steps taken
    epoch: int = 0                     # epoch of the next batch (0-based)
    position: int = 0                  # batches of `epoch` already trained on
    best_metric: float | None = None   # best early-stopping metric so far (config.improves)
    best_step: int | None = None       # the step it was measured at
    bad_evals: int = 0                 # evaluations since the last improvement
    elapsed_s: float = 0.0             # training time so far, resumed runs included
    examples_digest: str | None = None  # sha256 of the training examples' ids (None: unknown)
    lr_decays: int = 0                 # decays of the plateau schedule (schedules)
    processes: int = 1                 # processes (DDP world size) that took the last step
    run_id: str | None = None          # a run's own random id, from its first setup on (None:
                                       # saved before runs had one); averaging checks it

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
        for name in ("examples_digest", "run_id"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise InputError(f"TrainState.{name} must be a str or None, got "
                                 f"{getattr(self, name)!r}")
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
    """A checkpoint of the current format (docs/checkpoint-format.md), with the RNG states and
    the versions record of what wrote it (`bahdanau._about.versions`: package, torch, Python,
    git commit, host, the model's device).

    Args:
        model: the model, with its `.config` (DDP / LossModule wrappers are removed).
        src_vocab, tgt_vocab: its vocabularies.
        optimizer, scaler: stored when given (for resuming).
        train_config: the run's `TrainConfig`, or None.
        train_state: the loop's `TrainState`, or None (e.g. weights to translate with).
        extra: more checkpoint-safe entries of the caller's, stored under "extra".
        tokenizer: the tokenizer the model is trained with, stored as the `tokenizer` section
            (`tokenizer_to_payload`); None: no such section.
        ema: the moving average of the weights (`WeightEMA`), stored as the `ema`
            section; None: no such section.
    Returns:
        A dict that `save_checkpoint` accepts.
    Raises:
        InputError: the model has no `.config`, its vocabulary sizes or special ids differ
            from the vocabularies', or `tokenizer` is not one of bahdanau's tokenizers.
    """
    model = unwrap_model(model)
    config = model_config_of(model)
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
        "versions": versions(next(model.parameters()).device),
        **sections,
    }


def model_config_of(model: nn.Module) -> ModelConfig:
    """`model.config` (wrappers removed); InputError if there is none."""
    model = unwrap_model(model)
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


def _stored_state(payload: dict[str, Any]) -> TrainState | None:
    """The payload's `TrainState`, or None if it has none."""
    if payload["train_state"] is None:
        return None
    return parse_section(payload, "train_state", TrainState.from_dict)


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
    model = unwrap_model(model)
    config = model_config_of(model)
    stored_config, stored_src, stored_tgt = stored_parts(payload)
    if stored_config != config:
        raise InputError("checkpoint model config differs: "
                         + _config_difference(stored_config.to_dict(), config.to_dict()))
    for name, stored, given in (("src_vocab", stored_src, src_vocab),
                                ("tgt_vocab", stored_tgt, tgt_vocab)):
        if given is not None and stored != given:
            raise InputError("checkpoint vocabulary differs: "
                             + _vocab_difference(name, stored, given))
    state = _stored_state(payload)
    check_weights(payload["model"], model)
    stored_ema = payload.get("ema") if ema is not None else None
    if stored_ema is not None:
        check_weights(stored_ema, model, "ema")
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
