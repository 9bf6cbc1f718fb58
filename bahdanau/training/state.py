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
from bahdanau._checks import check_count, describe, is_finite_number, is_int
from bahdanau.checkpoint.files import FORMAT_VERSION, parse_section
from bahdanau.checkpoint.reader import Checkpoint, checkpoint_of
from bahdanau.checkpoint.sections import (
    EMA,
    EXTRA,
    FORMAT,
    MODEL,
    MODEL_CONFIG,
    OPTIMIZER,
    OPTIMIZER_CLASS,
    RNG,
    RNG_BY_RANK,
    SCALER,
    SRC_VOCAB,
    TGT_VOCAB,
    TOKENIZER,
    TRAIN_CONFIG,
    TRAIN_STATE,
    VERSIONS,
)
from bahdanau.config import DictConfig, ModelConfig, TrainConfig
from bahdanau.data.tokenizers import (
    Tokenizer,
    tokenizer_to_payload,
)
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.model_folder import check_weights
from bahdanau.training.ema import WeightEMA
from bahdanau.training.stored_states import check_optimizer_state, check_scaler_state


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


def set_rng_state(state: dict[str, Any], *, own_device_only: bool = False) -> None:
    """Inverse of `rng_state` (the CUDA states of the devices this machine has).

    Args:
        state: what `rng_state` returned.
        own_device_only: restore the CUDA state of the current device alone: for one of several
            processes (each its own GPU) resuming the states it saved, where setting every
            device's would start a CUDA context on every GPU in every process.
    """
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached"]))
    if "cuda" not in state or not torch.cuda.is_available():
        return
    cuda = list(enumerate(state["cuda"][:torch.cuda.device_count()]))
    if own_device_only:
        cuda = [(device, s) for device, s in cuda if device == torch.cuda.current_device()]
    for device, cuda_state in cuda:
        torch.cuda.set_rng_state(cuda_state, device)


_MT_WORDS, _WORD = 624, 2**32       # the Mersenne Twister's state: 624 words of 32 bits


def _check_words(value: Any, where: str, dtype: torch.dtype, length: int, high: int) -> None:
    """`value` is a 1-D `dtype` tensor of `length` values in [0, high)."""
    if not (isinstance(value, torch.Tensor) and value.dtype == dtype
            and tuple(value.shape) == (length,)):
        got = (f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor)
               else describe(value))
        raise InputError(f"{where} must be a {dtype} tensor of shape ({length},), got {got}")
    if length and not (int(value.min()) >= 0 and int(value.max()) < high):
        raise InputError(f"{where} holds values outside [0, {high})")


def check_rng_state(state: Any, where: str = "rng") -> None:
    """Refuse a stored `rng_state` that `set_rng_state` would refuse with a traceback or take
    wrongly: each generator's state by type and length (torch's a uint8 tensor of
    `torch.get_rng_state`'s length that torch accepts, Python's 625 words with its position
    last, NumPy's MT19937 keys, position and cached gaussian, CUDA's a list of uint8 tensors,
    each of `torch.cuda.get_rng_state`'s length where CUDA is available).

    Args:
        state: the stored value.
        where: what a message calls it ("rng", "rng_by_rank[1]").
    Raises:
        InputError: one line naming the entry.
    """
    where = f"checkpoint {where}"
    if not (isinstance(state, dict) and {"torch", "python", "numpy"} <= set(state)
            <= {"torch", "python", "numpy", "cuda"}):
        raise InputError(f"{where} must hold the states of 'torch', 'python', 'numpy' (and "
                         f"'cuda'), got {describe(state)}")
    current = torch.get_rng_state()
    _check_words(state["torch"], f"{where}['torch']", torch.uint8, current.numel(), 256)
    try:                               # what torch checks of its generator's fields
        torch.set_rng_state(state["torch"])
    except RuntimeError as err:
        raise InputError(f"{where}['torch'] is not a torch generator state: {err}") from None
    finally:
        torch.set_rng_state(current)
    py, npy = state["python"], state["numpy"]
    if not (isinstance(py, dict) and set(py) == {"version", "state", "gauss"}
            and py["version"] == random.getstate()[0]
            and (py["gauss"] is None or is_finite_number(py["gauss"]))):
        raise InputError(f"{where}['python'] must be {{'version': {random.getstate()[0]}, "
                         f"'state': ..., 'gauss': None or a number}}, got {describe(py)}")
    _check_words(py["state"], f"{where}['python']['state']", torch.int64, _MT_WORDS + 1, _WORD)
    if int(py["state"][-1]) > _MT_WORDS:
        raise InputError(f"{where}['python']['state'] ends with the position "
                         f"{int(py['state'][-1])}, which must be <= {_MT_WORDS}")
    if not (isinstance(npy, dict) and set(npy) == {"kind", "keys", "pos", "has_gauss", "cached"}
            and npy["kind"] == "MT19937" and is_int(npy["pos"]) and 0 <= npy["pos"] <= _MT_WORDS
            and npy["has_gauss"] in (0, 1) and is_finite_number(npy["cached"])):
        raise InputError(f"{where}['numpy'] must be {{'kind': 'MT19937', 'keys', 'pos' in [0, "
                         f"{_MT_WORDS}], 'has_gauss' 0 or 1, 'cached' a number}}, got "
                         f"{describe(npy)}")
    _check_words(npy["keys"], f"{where}['numpy']['keys']", torch.int64, _MT_WORDS, _WORD)
    cuda = state.get("cuda", [])
    if not (isinstance(cuda, (list, tuple)) and all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1
            for t in cuda)):
        raise InputError(f"{where}['cuda'] must be a list of uint8 tensors, one per device")
    if cuda and torch.cuda.is_available():   # else `set_rng_state` ignores them
        length = torch.cuda.get_rng_state().numel()    # every device's generator: the same
        for device, t in enumerate(cuda):
            if t.numel() != length:
                raise InputError(f"{where}['cuda'][{device}] holds {t.numel()} bytes; a CUDA "
                                 f"generator state holds {length}")


def process_rng(payload: dict[str, Any], rank: int) -> tuple[dict[str, Any] | None, str]:
    """The RNG states that the process of `rank` resumes with, and the section they come from:
    those it saved (the payload's `rng_by_rank`, written by a run of several processes, as
    "rng_by_rank[RANK]"), else rank 0's ("rng")."""
    by_rank = payload.get(RNG_BY_RANK)
    if by_rank is not None and not isinstance(by_rank, list):
        raise InputError(f"checkpoint rng_by_rank must be a list, one entry per process, got "
                         f"{describe(by_rank)}")
    if by_rank is not None and rank < len(by_rank):
        return by_rank[rank], f"rng_by_rank[{rank}]"
    return payload[RNG], RNG


def rng_streams_notes(payload: dict[str, Any] | None, processes: int) -> list[str]:
    """What a resume from `payload` (None: a new run) with `processes` processes says when the
    checkpoint does not hold the random states of exactly that many: the ranks without their
    own take rank 0's, so random draws (dropout) differ from an uninterrupted run's."""
    if payload is None or payload[RNG] is None:
        return []
    by_rank = payload.get(RNG_BY_RANK)
    stored = len(by_rank) if isinstance(by_rank, list) else 1
    if stored == processes:
        return []
    return [f"the checkpoint holds the random states of {stored} process"
            f"{'es' if stored != 1 else ''}, this run has {processes}: the dropout streams "
            "(every random draw) change from those of an uninterrupted run"]


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
            check_count(f"TrainState.{name}", getattr(self, name))
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
                       ema: WeightEMA | None = None,
                       rng_by_rank: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
        rng_by_rank: under torch.distributed, every process's `rng_state()` in rank order
            (`bahdanau.training.distributed.gather`), stored as the `rng_by_rank` section so
            that each process resumes its own random draws (`process_rng`); None: no such
            section (`rng` is this process's).
    Returns:
        A dict that `save_checkpoint` accepts.
    Raises:
        InputError: the model has no `.config`, its vocabulary sizes or special ids differ
            from the vocabularies', or `tokenizer` is not one of bahdanau's tokenizers.
    """
    model = unwrap_model(model)
    config = model_config_of(model)
    config.check_vocabs(src_vocab, tgt_vocab)
    sections: dict[str, Any] = ({} if tokenizer is None
                                else {TOKENIZER: tokenizer_to_payload(tokenizer)})
    if ema is not None:
        sections[EMA] = ema.state_dict()
    if rng_by_rank is not None:
        sections[RNG_BY_RANK] = rng_by_rank
    return {
        FORMAT: FORMAT_VERSION,
        MODEL: model.state_dict(),
        MODEL_CONFIG: config.to_dict(),
        SRC_VOCAB: src_vocab.to_dict(),
        TGT_VOCAB: tgt_vocab.to_dict(),
        TRAIN_CONFIG: train_config.to_dict() if train_config is not None else None,
        TRAIN_STATE: train_state.to_dict() if train_state is not None else None,
        OPTIMIZER: optimizer.state_dict() if optimizer is not None else None,
        OPTIMIZER_CLASS: type(optimizer).__name__ if optimizer is not None else None,
        SCALER: scaler.state_dict() if scaler is not None else None,
        RNG: rng_by_rank[0] if rng_by_rank is not None else rng_state(),
        EXTRA: dict(extra or {}),
        VERSIONS: versions(next(model.parameters()).device),
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
    if payload[TRAIN_STATE] is None:
        return None
    return parse_section(payload, TRAIN_STATE, TrainState.from_dict)


def restore(payload: dict[str, Any] | Checkpoint, model: nn.Module,
            optimizer: torch.optim.Optimizer | None = None, *,
            scaler: torch.amp.GradScaler | None = None, src_vocab: Vocab | None = None,
            tgt_vocab: Vocab | None = None, restore_rng: bool = True,
            ema: WeightEMA | None = None, rank: int = 0) -> TrainState | None:
    """Load a checkpoint payload (format 1 or 2) into live objects.

    Everything is checked before anything changes: the stored model config against
    `model.config` and against the stored vocabularies, the stored vocabularies against the
    given ones, the train state, the weights (and, with `ema`, the `ema` section's) against the
    model (keys, shapes, NaN/inf), the optimizer state against `optimizer` (its type, where
    the checkpoint records it, and every state tensor's shape, dtype and finiteness against its
    parameter: `check_optimizer_state`), the GradScaler state (`check_scaler_state`) and the
    RNG states (`check_rng_state`).

    Args:
        payload: the checkpoint dict (e.g. from `load_checkpoint`), upgraded here, or a
            `bahdanau.checkpoint.Checkpoint` read through the door (upgraded when it was read).
        model: receives the weights (wrappers are removed); needs `.config`.
        optimizer, scaler: receive their states when given (and stored).
        src_vocab, tgt_vocab: expected vocabularies; None skips the check.
        restore_rng: also restore the global torch/CUDA/Python/NumPy RNG states.
        ema: a `WeightEMA` of `model`: receives the `ema` section, or, from a checkpoint
            without one, starts again from the restored weights.
        rank: this process's rank under torch.distributed: it restores the RNG states it
            saved (`process_rng`).
    Returns:
        The stored `TrainState`, whole; None if the checkpoint has none.
    Raises:
        InputError: the model config or a vocabulary differs (what differs is named), the stored
            config and vocabularies disagree, a section is malformed, the weights do not fit the
            model or are not finite, the optimizer state is another optimizer's or does not fit
            its parameters or is not finite, the GradScaler or RNG states are malformed, or the
            payload is not a checkpoint this code reads.
    """
    checkpoint = payload if isinstance(payload, Checkpoint) else checkpoint_of(payload)
    payload = checkpoint.payload
    model = unwrap_model(model)
    config = model_config_of(model)
    stored_config, stored_src, stored_tgt = (checkpoint.config, checkpoint.src_vocab,
                                             checkpoint.tgt_vocab)
    if stored_config != config:
        raise InputError("checkpoint model config differs: "
                         + _config_difference(stored_config.to_dict(), config.to_dict()))
    for name, stored, given in (("src_vocab", stored_src, src_vocab),
                                ("tgt_vocab", stored_tgt, tgt_vocab)):
        if given is not None and stored != given:
            raise InputError("checkpoint vocabulary differs: "
                             + _vocab_difference(name, stored, given))
    state = _stored_state(payload)
    check_weights(payload[MODEL], model)
    stored_ema = payload.get(EMA) if ema is not None else None
    if stored_ema is not None:
        check_weights(stored_ema, model, f"checkpoint {EMA}")
    if optimizer is not None and payload[OPTIMIZER] is not None:
        check_optimizer_state(payload, optimizer)
    if scaler is not None and payload[SCALER] is not None:
        check_scaler_state(payload[SCALER])
    rng, rng_section = process_rng(payload, rank) if restore_rng else (None, "")
    if rng is not None:
        check_rng_state(rng, rng_section)
    model.load_state_dict(payload[MODEL])
    if ema is not None:
        ema.load_state_dict(stored_ema if stored_ema is not None else model.state_dict())
    if optimizer is not None and payload[OPTIMIZER] is not None:
        optimizer.load_state_dict(payload[OPTIMIZER])
    if scaler is not None and payload[SCALER] is not None:
        scaler.load_state_dict(payload[SCALER])
    if rng is not None:       # a process's own states (rng_by_rank): its own GPU's alone
        set_rng_state(rng, own_device_only=rng_section != RNG)
    return state
