"""The one door for reading checkpoints: a file, a run folder or a model folder, as typed parts.

    checkpoint = read_checkpoint("runs/default")      # its best.pt, else its latest checkpoint
    checkpoint.config, checkpoint.src_vocab, checkpoint.tokenizer, checkpoint.run.report
    model = checkpoint.model()                        # eval mode, the weights it translates with

`read_checkpoint` finds what a path stands for (`find_checkpoint`: a checkpoint file; a run
folder's ``checkpoints/best.pt``, else its latest; a folder of one of the `FOLDER_KINDS`, today
a model folder of ``bahdanau release``), reads it, upgrades an old format once
(`bahdanau.checkpoint.files.upgrade_payload`), parses and checks the model config, the
vocabularies and the tokenizer, and hands back a `Checkpoint`; every error is one line that
starts with the path. Every command and library call that reads a checkpoint comes through
here: `bahdanau.load` (translate, evaluate, score, plot, export), averaging and ensembles
(`bahdanau.checkpoint.read_members`), ``bahdanau release``, ``train --init-from`` and a resumed
run. `load_checkpoint` gives the raw payload of a file or a folder, as stored.

Another kind of folder that holds one model in files of its own is one more `FolderKind` in
`FOLDER_KINDS`: how to recognise it, and a reader that gives a payload of the current format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bahdanau._checks import JSON_ERRORS, check_path, check_type, describe, resolve_device
from bahdanau._files import restore_replaced
from bahdanau.checkpoint.files import (
    load_checkpoint_file,
    named,
    read_payload,
    upgrade_payload,
)
from bahdanau.checkpoint.manager import CheckpointManager, checkpoints_folder
from bahdanau.checkpoint.payload import (
    check_built_vocabs,
    parse_tokenizer,
    stored_parts,
    translation_weights,
)
from bahdanau.checkpoint.release import is_release, read_release
from bahdanau.checkpoint.sections import (
    BUILD,
    EMA,
    EXTRA,
    MODEL,
    RUN,
    TRAIN_CONFIG,
    TRAIN_STATE,
    VERSIONS,
)
from bahdanau.config import ModelConfig
from bahdanau.data.tokenizers import Tokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.model_folder import WEIGHTS, check_weights, model_skeleton
from bahdanau.models import build_model
from bahdanau.parts import Blueprint, blueprint

__all__ = ["FOLDER_KINDS", "RUN_REPORT", "Checkpoint", "FolderKind", "RunRecord",
           "checkpoint_of", "find_checkpoint", "load_checkpoint", "model_from_checkpoint",
           "read_checkpoint"]

RUN_REPORT = "metrics.json"       # a run folder's test report (``bahdanau train`` writes it)


@dataclass(frozen=True)
class FolderKind:
    """A kind of folder that holds one model's checkpoint in files of its own."""

    name: str                                        # what a message calls it
    holds: Callable[[Path], bool]                    # whether a folder is of this kind
    read: Callable[[Path], dict[str, Any]]           # its payload, of the current format


FOLDER_KINDS: tuple[FolderKind, ...] = (FolderKind("model folder", is_release, read_release),)


def folder_kind(path: Path) -> FolderKind | None:
    """The kind of `path` among `FOLDER_KINDS`, or None (a file, a run folder, nothing)."""
    return next((kind for kind in FOLDER_KINDS if kind.holds(path)), None)


def find_checkpoint(path: str | os.PathLike[str], name: str = "checkpoint") -> Path:
    """The checkpoint file or folder that `path` stands for.

    Args:
        path: a checkpoint file, a folder of `FOLDER_KINDS` (a model folder of ``bahdanau
            release``; itself), or a training output folder: its ``checkpoints`` subfolder (or
            the folder itself, if it has none) gives ``best.pt``, else the latest numbered
            checkpoint.
        name: what to call `path` in the message (e.g. "--checkpoint").
    Returns:
        The file, or the folder.
    Raises:
        InputError: no such file, a file that cannot be read, or a folder without checkpoints.
    """
    p = check_path(name, path)
    restore_replaced(p)                  # a model folder left aside by a dead writer
    if folder_kind(p) is not None:
        return p
    if p.is_dir():
        manager = CheckpointManager(checkpoints_folder(p))
        found = manager.best() or manager.latest()
        if found is None and (p / WEIGHTS).is_file():
            raise InputError(f"{name} {path}: a model folder without its manifest.json")
        if found is None:
            raise InputError(f"{name} {path}: no checkpoint in this folder (a run keeps its "
                             "own in checkpoints/, best.pt and step_N.pt, saving one every "
                             "--save-every updates and when it stops)")
        return found
    if not p.exists():
        raise InputError(f"{name} {path}: no such file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{name} {path}: not readable")
    return p


def load_checkpoint(path: str | os.PathLike[str], *,
                    map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The payload of a checkpoint file or of a folder of `FOLDER_KINDS`, as stored.

    Args:
        path: the file (`bahdanau.checkpoint.files.load_checkpoint_file` checks its digest), or
            a model folder (``bahdanau release``), which
            `bahdanau.checkpoint.release.read_release` reads and checks.
        map_location: where a file's tensors go (a model folder's stay on the CPU).
    Returns:
        The payload without its `digest` entry, in the format it was stored in (a model
        folder's is of the current format); `read_checkpoint` upgrades and parses it.
    Raises:
        FileNotFoundError: no such file.
        InputError: as those two readers say (the file is named first).
    """
    path = check_path("path", path)
    restore_replaced(path)                       # a model folder left aside by a dead writer
    kind = folder_kind(path)
    if kind is not None:
        return kind.read(path)
    return load_checkpoint_file(path, map_location=map_location)


@dataclass(frozen=True)
class RunRecord:
    """What a checkpoint says of the training run it comes from (None where it does not say).

    A run's own checkpoint (in ``RUN/checkpoints/``) gives its run's id, options, data digest
    and folder, and the folder's test report; an average keeps its members' record as its `RUN`
    section (`bahdanau.checkpoint.average_checkpoints`), a model folder its run id.
    """

    run_id: str | None = None              # TrainState.run_id
    folder: str | None = None              # the run folder (``bahdanau train --out``)
    options: dict[str, Any] | None = None  # the options it was trained with (extra["options"])
    examples_digest: str | None = None     # SHA-256 of its training examples' ids
    report: dict[str, Any] | None = None   # its test report (metrics.json: its final weights')

    def to_dict(self) -> dict[str, Any]:
        """The record as a checkpoint's `RUN` section."""
        return {"run_id": self.run_id, "folder": self.folder, "options": self.options,
                "examples_digest": self.examples_digest, "report": self.report}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """The record of a `RUN` section; InputError naming the entry of another type."""
        for key, kinds in (("run_id", str), ("folder", str), ("options", dict),
                           ("examples_digest", str), ("report", dict)):
            if not isinstance(data.get(key), (kinds, type(None))):
                raise InputError(f"checkpoint {RUN}[{key!r}] is a "
                                 f"{type(data.get(key)).__name__}, not a {kinds.__name__} or None")
        return cls(**{key: data.get(key) for key in cls.__dataclass_fields__})


def _report(folder: Path) -> dict[str, Any] | None:
    """The run folder's test report (``metrics.json``), or None for none or an unreadable one."""
    try:
        data = json.loads((folder / RUN_REPORT).read_text(encoding="utf-8"))
    except (OSError, *JSON_ERRORS):
        return None
    return data if isinstance(data, dict) else None


def run_record(payload: dict[str, Any], path: Path | None) -> RunRecord:
    """The `RunRecord` of a payload of the current format read from `path` (None: in memory)."""
    section = payload.get(RUN)
    if section is not None:
        if not isinstance(section, dict):
            raise InputError(f"checkpoint {RUN} is a {type(section).__name__}, not a dict")
        return RunRecord.from_dict(section)
    state = payload[TRAIN_STATE] if isinstance(payload[TRAIN_STATE], dict) else {}
    extra = payload[EXTRA] if isinstance(payload[EXTRA], dict) else {}
    run_id = state.get("run_id", extra.get("run_id") if "release" in extra else None)
    folder = None
    if path is not None and path.is_file() and path.parent.name == "checkpoints":
        folder = path.parent.parent
    digest = state.get("examples_digest")
    return RunRecord(run_id=run_id if isinstance(run_id, str) else None,
                     folder=None if folder is None else str(folder),
                     options=extra.get("options") if isinstance(extra.get("options"), dict)
                     else None,
                     examples_digest=digest if isinstance(digest, str) else None,
                     report=None if folder is None else _report(folder))


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read through the door: where it came from, and its parts, parsed.

    The model config, vocabularies and tokenizer are parsed and checked against each other;
    the weights are checked against the config when they are taken (`translation_weights`,
    `model`); the training sections stay as stored (the training side parses them).
    """

    path: Path | None               # the file or folder read; None for a payload in memory
    kind: str                       # "checkpoint file", a `FolderKind`'s name, or "payload"
    payload: dict[str, Any]         # every section, in the current format
    model_config: ModelConfig | None  # None: a model assembled from parts (`blueprint`)
    src_vocab: Vocab
    tgt_vocab: Vocab
    tokenizer: Tokenizer
    run: RunRecord
    blueprint: Blueprint | None = None  # how a model assembled from parts is built again

    @property
    def config(self) -> ModelConfig:
        """The `ModelConfig` of a model built from one (a preset's).

        Raises:
            InputError: the model was assembled from parts and has none (one line, the path
                first): what needs a ModelConfig (``train --init-from``, resuming) takes a
                model built from a preset.
        """
        if self.model_config is None:
            raise _no_config(self.path, "this takes a model built from a preset "
                                        "(bahdanau.presets)")
        return self.model_config

    def skeleton(self) -> nn.Module:
        """The model on the meta device (`model_skeleton`): names and shapes, no memory."""
        if self.blueprint is not None:
            return model_skeleton(self.blueprint.build)
        config = self.config
        return model_skeleton(lambda: build_model(config))

    @property
    def weights(self) -> dict[str, Tensor]:
        """The trained weights (the `MODEL` section), unchecked."""
        return self.payload[MODEL]

    @property
    def ema(self) -> dict[str, Tensor] | None:
        """The moving average of the weights (the `EMA` section), or None."""
        return self.payload.get(EMA)

    @property
    def train_state(self) -> dict[str, Any] | None:
        """The `TRAIN_STATE` section (`TrainState.to_dict()`), or None (it does not resume)."""
        return self.payload[TRAIN_STATE]

    @property
    def train_config(self) -> dict[str, Any] | None:
        """The `TRAIN_CONFIG` section (`TrainConfig.to_dict()`), or None."""
        return self.payload[TRAIN_CONFIG]

    @property
    def step(self) -> int | None:
        """The training update it was saved at, or None where it records none."""
        state = self.train_state
        step = state.get("step") if isinstance(state, dict) else None
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    @property
    def versions(self) -> dict[str, Any] | None:
        """What wrote it (`VERSIONS`), or None."""
        record = self.payload.get(VERSIONS)
        return record if isinstance(record, dict) else None

    def translation_weights(self, *, ema: bool = True) -> tuple[str, dict[str, Tensor]]:
        """(section, weights) it translates with (`EMA` when it has one and `ema`, else
        `MODEL`), checked against its config on the meta device (nothing is allocated).

        Raises:
            InputError: `ema` is not a bool, or the weights do not fit the config or are not
                finite (path first).
        """
        check_type("ema", ema, bool, "True or False")
        with named(self.path):
            section, weights = translation_weights(self.payload, ema=ema)
            check_weights(weights, self.skeleton(),
                          "checkpoint" if section == MODEL else f"checkpoint {section}")
        return section, weights

    def model(self, *, device: str | torch.device = "cpu", ema: bool = True) -> nn.Module:
        """The model (eval mode) with the weights it translates with (`translation_weights`)."""
        device = resolve_device(device)
        _, weights = self.translation_weights(ema=ema)
        with named(self.path):
            model = (self.blueprint.build() if self.blueprint is not None
                     else build_model(self.config))
        model.load_state_dict(weights)
        return model.to(device).eval()


def _no_config(path: Path | None, why: str) -> InputError:
    """A model assembled from parts refused where a ModelConfig is needed, and `why`."""
    return InputError(f"{path or 'checkpoint'}: holds a model assembled from parts (its "
                      f"config.json records them), which has no ModelConfig: {why}; load it "
                      "in Python with bahdanau.load or Translator.from_pretrained")


def _parts(payload: dict[str, Any], path: Path | None, kind: str, trust: Trust,
           needs_config: str | None = None) -> Checkpoint:
    """The `Checkpoint` of a payload of the current format (errors named by the caller); the
    classes of a model assembled from parts are found as `trust` allows
    (`bahdanau.parts.blueprint`) and its vocabularies checked against its skeleton, unless
    the caller `needs_config` (then it is refused, saying why, before any class is found)."""
    config, src_vocab, tgt_vocab = stored_parts(payload)
    plan = None
    if config is None and needs_config is not None:
        raise _no_config(path, needs_config)
    if config is None:
        plan = blueprint(payload[BUILD], trust_code=trust[0], parts=trust[1])
        check_built_vocabs(model_skeleton(plan.build), src_vocab, tgt_vocab)
    return Checkpoint(path, kind, payload, config, src_vocab, tgt_vocab,
                      parse_tokenizer(payload), run_record(payload, path), plan)


Trust = tuple[bool, Mapping[str, type] | None]     # (trust_code, parts): see `read_checkpoint`


def read_checkpoint(source: str | os.PathLike[str], *, name: str = "checkpoint",
                    map_location: str | torch.device = "cpu", trust_code: bool = False,
                    parts: Mapping[str, type] | None = None,
                    needs_config: str | None = None) -> Checkpoint:
    """Read a checkpoint file, a run folder's checkpoint or a model folder, once.

    Args:
        source: a checkpoint file (formats 1 and 2), a training output folder (its best, else
            its latest checkpoint: `find_checkpoint`) or a folder of `FOLDER_KINDS`.
        name: what to call `source` when nothing is there (e.g. "--init-from").
        map_location: where a file's tensors go.
        trust_code: a model assembled from parts (`Translator.save_pretrained`) may name
            classes outside bahdanau (an attention of the user's own): import them. Without
            it, or `parts`, such a checkpoint is refused before anything is imported.
        parts: the classes outside bahdanau by import path (``{"my_module:MyAttention":
            MyAttention}``), taken as given (`bahdanau.parts.blueprint`).
        needs_config: why the caller needs a `ModelConfig` ("train --init-from builds ..."):
            a model assembled from parts is then refused in one line saying so, before any
            class it names is looked up (where trust would not help).
    Returns:
        The `Checkpoint`: the payload upgraded to the current format (once), the model config
        (or the `Blueprint` of a model assembled from parts), vocabularies and tokenizer
        parsed and checked, the run it comes from.
    Raises:
        InputError: nothing there, a damaged or malformed checkpoint, a format newer than this
            bahdanau reads, a model config that its vocabularies contradict, a tokenizer that
            does not load: one line starting with the path.
    """
    path = find_checkpoint(source, name)
    kind = folder_kind(path)
    with named(path):
        payload = (kind.read(path) if kind is not None
                   else read_payload(path, map_location=map_location))
        return _parts(payload, path, "checkpoint file" if kind is None else kind.name,
                      (trust_code, parts), needs_config)


def checkpoint_of(payload: dict[str, Any], *, trust_code: bool = False,
                  parts: Mapping[str, type] | None = None) -> Checkpoint:
    """The `Checkpoint` of a payload in memory (any format: upgraded here, once).

    Raises:
        InputError: as `read_checkpoint` (without a path).
    """
    if not isinstance(payload, dict):
        raise InputError(f"a checkpoint payload is a dict, got {describe(payload)}")
    return _parts(upgrade_payload(payload), None, "payload", (trust_code, parts))


def model_from_checkpoint(checkpoint: str | os.PathLike[str] | dict[str, Any] | Checkpoint, *,
                          device: str | torch.device = "cpu", ema: bool = True,
                          trust_code: bool = False, parts: Mapping[str, type] | None = None
                          ) -> tuple[nn.Module, Vocab, Vocab]:
    """Rebuild the model (eval mode) and its vocabularies from a checkpoint.

    Reads formats 1 and 2 (docs/checkpoint-format.md). The weights are those the checkpoint
    translates with (`translation_weights`): its `ema` section when it has one, else `model`.

    Args:
        checkpoint: a checkpoint file, run folder or model folder (`read_checkpoint`), a
            payload from `load_checkpoint`, or a `Checkpoint` read already.
        device: where the model goes.
        ema: False takes the trained weights (`model`) even where there are EMA weights.
        trust_code, parts: as for `read_checkpoint` (a model assembled from parts).
    Returns:
        (model, src_vocab, tgt_vocab).
    Raises:
        InputError: not a checkpoint this code reads, a damaged file, a malformed section, its
            model config and vocabularies disagree (sizes or special ids; both values are
            named), or its weights do not fit its config (checked before the model is built)
            or are not finite. The message starts with the file when `checkpoint` is a path.
    """
    device = resolve_device(device)
    if isinstance(checkpoint, Checkpoint):
        read = checkpoint
    elif isinstance(checkpoint, dict):
        read = checkpoint_of(checkpoint, trust_code=trust_code, parts=parts)
    elif isinstance(checkpoint, (str, os.PathLike)):
        read = read_checkpoint(checkpoint, trust_code=trust_code, parts=parts)
    else:
        raise InputError(f"checkpoint must be a file path or a payload dict, "
                         f"got {describe(checkpoint)}")
    return read.model(device=device, ema=ema), read.src_vocab, read.tgt_vocab
