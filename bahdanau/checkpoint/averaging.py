"""Checkpoint averaging: one model whose weights are the mean of several checkpoints' weights.

    paths = select_checkpoints(["runs/big"], last=4)     # or best=4, or a list of files
    save_checkpoint("runs/big/average.pt", average_checkpoints(paths))

Averaging the last few checkpoints of a run (or those of its best dev evaluations, kept with
`TrainConfig.keep_best`) gives weights that usually translate a little better than any one of
them, at no training cost (Junczys-Dowmunt et al. 2016; Vaswani et al. 2017). The average of each
weight is taken over the members in float64 and cast back to the weight's dtype, so averaging one
checkpoint gives its weights unchanged. Each member contributes the weights it translates with:
its `ema` section when it has one, else `model` (`bahdanau.checkpoint.translation_weights`).

The members must come from one run: checkpoints of separately trained models (another seed,
other data) have weights that do not correspond unit for unit, and their mean translates worse
than either. Every checkpoint a run saves holds the run's id (`TrainState.run_id`), and members
of two runs are refused unless `allow_different_runs`; a member saved before runs had an id
(no id) is taken unchecked.

The result is a checkpoint like any other for `bahdanau.load`, `model_from_checkpoint` and the
command line (translate, evaluate, plot): the averaged weights as `model`, the members' model
config, vocabularies and tokenizer, and no training state (it does not resume); its
extra["averaged_from"] lists the members' files, steps and run ids, and its `RUN` section keeps
what the members say of their run (`bahdanau.checkpoint.reader.RunRecord`: its id, folder,
options, data digest and test report, where they agree), which the model card of a release
of the average shows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bahdanau._about import versions
from bahdanau._checks import check_path, describe, is_int
from bahdanau._files import repeated_file, restore_replaced
from bahdanau._progress import tracked
from bahdanau.checkpoint.files import FORMAT_VERSION, load_checkpoint_file, named
from bahdanau.checkpoint.manager import CheckpointManager, checkpoints_folder
from bahdanau.checkpoint.payload import tokenizer_data
from bahdanau.checkpoint.reader import Checkpoint, RunRecord, folder_kind, read_checkpoint
from bahdanau.checkpoint.sections import (
    EXTRA,
    FORMAT,
    MODEL,
    MODEL_CONFIG,
    RUN,
    SRC_VOCAB,
    STOPPED,
    TGT_VOCAB,
    TOKENIZER,
    TRAIN_CONFIG,
    TRAINING,
    VERSIONS,
)
from bahdanau.data.tokenizers import (
    DefaultTokenizer,
    comparable_payload,
    tokenizer_to_payload,
)
from bahdanau.errors import InputError

__all__ = ["average_checkpoints", "check_members", "read_members", "select_checkpoints"]

_LOG = logging.getLogger(__name__)


def select_checkpoints(paths: Sequence[str | os.PathLike[str]], *, last: int | None = None,
                       best: int | None = None) -> list[Path]:
    """The checkpoint files that ``bahdanau average --checkpoint PATH... [--last N | --best N]``
    averages.

    Args:
        paths: checkpoint files or model folders (``bahdanau release``); with `last` or
            `best`, one training output folder instead
            (``bahdanau train --out``, whose ``checkpoints`` subfolder is used, or a folder of
            checkpoints).
        last: the folder's last `last` numbered checkpoints (highest steps) that the run
            saved on its schedule or at its end; those saved because it was interrupted (a
            signal, a dead loader worker: `CheckpointManager.save`'s `stopped`) are left
            out, and a log line names them.
        best: the checkpoints of the folder's `best` best dev evaluations
            (`CheckpointManager.best_checkpoints`; a run keeps them with `keep_best` >= `best`).
    Returns:
        The files: as given; the last ones oldest first; the best ones best first.
    Raises:
        InputError: both `last` and `best`, a count < 1, `last`/`best` without exactly one
            folder, a folder without them, a missing file, or fewer checkpoints than asked for.
    """
    if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Sequence) or not paths:
        raise InputError(f"paths must be a non-empty list of paths, got {describe(paths)}")
    files = [check_path("checkpoint", p) for p in paths]
    for path in files:
        restore_replaced(path)           # a model folder left aside by a dead writer
    if last is not None and best is not None:
        raise InputError("give --last N or --best N, not both")
    count = last if last is not None else best
    if count is None:
        for path in files:
            if path.is_dir() and folder_kind(path) is None:      # a model folder is one
                raise InputError(f"--checkpoint {path} is a folder: give --last N or --best N "
                                 "to pick its checkpoints, or name checkpoint files")
            if not (path.is_file() or folder_kind(path) is not None):
                raise InputError(f"--checkpoint {path}: no such file")
        return files
    flag = "--last" if last is not None else "--best"
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError(f"{flag} must be an int >= 1, got {count!r}")
    if len(files) != 1 or not files[0].is_dir():
        raise InputError(f"{flag} picks checkpoints from one training output folder; got "
                         f"{', '.join(map(str, files))}")
    folder = checkpoints_folder(files[0])
    manager = CheckpointManager(folder)
    if best is not None:
        return manager.best_checkpoints(best)
    return _last_scheduled(manager.checkpoints(), count, folder)


def _last_scheduled(numbered: list[Path], count: int, folder: Path) -> list[Path]:
    """The last `count` of the `numbered` checkpoints (oldest first) that their run saved on
    its schedule or at its end, oldest first: those saved because the run was interrupted (a
    `STOPPED` section: Ctrl-C a few updates after a scheduled save) would weigh the average
    towards one moment of the run. Only the run's last `keep_last` saves (its latest
    checkpoint's `TrainConfig.keep_last`) are taken: an older file is there because it ranks
    among the best evaluations (`keep_best`), from another moment of the run. What it leaves
    out is logged."""
    taken: list[Path] = []
    left_out: list[str] = []
    window = len(numbered)
    for age, path in enumerate(reversed(numbered)):
        if len(taken) == count or age == window:
            break
        with named(path):
            payload = load_checkpoint_file(path)
        if age == 0:
            window = _keep_last(payload, window)
        stopped = payload.get(STOPPED)                     # a top-level section, any format
        if stopped is None:
            taken.append(path)
        else:
            left_out.append(f"{path.name} ({stopped})")
    if len(taken) < count:
        also = (f" saved on the run's schedule and {len(left_out)} saved when the run was "
                "interrupted, which --last leaves out" if left_out else "")
        why = (f"its last {window} saves, --keep-last {window}; the older checkpoints "
               f"({len(numbered) - window}) are kept as its best evaluations, which --best N "
               "averages" if window < len(numbered) else "a run keeps its last --keep-last")
        raise InputError(f"{folder} holds {len(taken)} numbered checkpoints{also}, not the "
                         f"{count} of --last {count} ({why})")
    if left_out:
        _LOG.info(f"--last {count} leaves out {', '.join(reversed(left_out))}: saved when the "
                  "run was interrupted, off its schedule (name them to average them)")
    return taken[::-1]


def _keep_last(payload: dict[str, Any], files: int) -> int:
    """How many of a run's newest numbered checkpoints are its last saves: its `keep_last`
    (from the latest checkpoint's training config), or every one of the `files` when the
    checkpoint records none."""
    config = payload.get(TRAIN_CONFIG)
    keep_last = config.get("keep_last") if isinstance(config, dict) else None
    return min(keep_last, files) if is_int(keep_last) and keep_last >= 1 else files


def average_checkpoints(paths: Sequence[str | os.PathLike[str]], *,
                        allow_different_runs: bool = False) -> dict[str, Any]:
    """The checkpoint whose weights are the element-wise mean of the members' weights.

    Members are read one at a time (one member's payload and a float64 sum are in memory at
    once). Floating-point weights are summed in float64, divided by the number of members and
    cast back to the first member's dtypes; other tensors are the first member's.

    Args:
        paths: the members' checkpoint files (formats 1 and 2) or model folders, each once.
        allow_different_runs: average members of different runs (their `TrainState.run_id`
            differs) too.
    Returns:
        A payload for `save_checkpoint` (docs/checkpoint-format.md).
    Raises:
        InputError: no paths, a member that does not exist, a file listed twice, a damaged
            or malformed member, weights that do not fit the model config or are not finite,
            a member whose model config, vocabularies or tokenizer differ from the first's, or
            (without
            `allow_different_runs`) a member of another run than an earlier member (one line
            naming both files).
    """
    if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Sequence) or not paths:
        raise InputError(f"paths must be a non-empty list of checkpoint files, got "
                         f"{describe(paths)}")
    files = [check_path("checkpoint", p) for p in paths]
    twice = repeated_file(files)
    if twice is not None:
        raise InputError(f"{twice[0]} is listed twice (also as {twice[1]}): average each "
                         "checkpoint once")
    first: Checkpoint | None = None   # the result takes its config, vocabularies, tokenizer
    dtypes: dict[str, torch.dtype] = {}
    total: dict[str, Tensor] = {}
    members: list[dict[str, Any]] = []
    runs: list[RunRecord] = []
    for checkpoint in tracked(read_members(files, same_config=True), "averaging",
                              total=len(files), unit="checkpoints"):
        path = checkpoint.path
        run_id = _run_id(checkpoint)
        if not allow_different_runs:
            _check_same_run(path, run_id, members)
        section, weights = checkpoint.translation_weights()
        if first is None:
            first = checkpoint
        for key, value in weights.items():
            dtypes.setdefault(key, value.dtype)
            if not value.is_floating_point():
                total.setdefault(key, value.clone())
            elif key in total:
                total[key] += value.double()
            else:
                total[key] = value.to(torch.float64, copy=True)
        members.append({"file": str(path), "weights": section, "step": checkpoint.step,
                        "run_id": run_id})
        runs.append(checkpoint.run)
        del checkpoint, weights
    assert first is not None                 # files is not empty
    averaged = {key: (value / len(files)).to(dtypes[key]) if value.is_floating_point() else value
                for key, value in total.items()}
    tokenizer = tokenizer_data(first.payload)[1]
    return {
        FORMAT: FORMAT_VERSION,
        MODEL: averaged,
        **{k: first.payload[k] for k in (MODEL_CONFIG, SRC_VOCAB, TGT_VOCAB)},
        **dict.fromkeys(TRAINING),
        EXTRA: {"averaged_from": members},
        VERSIONS: versions(),
        RUN: _shared_run(runs).to_dict(),
        **({} if tokenizer is None else {TOKENIZER: tokenizer}),
    }


def _shared_run(runs: list[RunRecord]) -> RunRecord:
    """What the members' records say alike of their run (None where they differ or are
    silent): for members of one run, its id, folder, options, data digest and test report."""
    shared = {}
    for key in RunRecord.__dataclass_fields__:
        values = [getattr(run, key) for run in runs]
        shared[key] = values[0] if all(v == values[0] for v in values) else None
    return RunRecord(**shared)


def _run_id(checkpoint: Checkpoint) -> str | None:
    """The run id a member's train state records, or a model folder's manifest (which
    `read_release` gives as extra["run_id"]); None for none (an earlier version's, or an
    average's)."""
    state, extra = checkpoint.train_state, checkpoint.payload[EXTRA]
    run_id = state.get("run_id") if isinstance(state, dict) else None
    if run_id is None and isinstance(extra, dict) and "release" in extra:
        run_id = extra.get("run_id")
    if run_id is not None and not isinstance(run_id, str):
        raise InputError(f"{checkpoint.path}: checkpoint train_state run_id is a "
                         f"{type(run_id).__name__}, not a str")
    return run_id


def _check_same_run(path: Path | None, run_id: str | None, members: list[dict[str, Any]]) -> None:
    """Refuse a member of another run than an earlier member (members without a run id are
    taken unchecked)."""
    other = next((m for m in members if m["run_id"] not in (None, run_id)), None)
    if other is not None and run_id is not None:
        raise InputError(f"{path} and {other['file']} come from different runs (run ids "
                         f"{run_id[:8]}... and {other['run_id'][:8]}...): averaging separately "
                         "trained models gives weights that translate worse than either; "
                         "average one run's checkpoints, or pass --allow-different-runs "
                         "(allow_different_runs=True) if you mean it")


def _tokenizer_summary(payload: dict[str, Any]) -> tuple[Any, str]:
    """A payload's tokenizer as a comparable value and a short description."""
    data = tokenizer_data(payload)[1]
    if data is None:
        data = tokenizer_to_payload(DefaultTokenizer())
    if not isinstance(data, dict):
        return data, repr(data)
    model = data.get("model")
    if isinstance(model, Tensor):        # SentencePiece
        return comparable_payload(data), f"{data.get('name')}, a {model.numel()}-byte model"
    settings = ", ".join(f"{k}={v!r}" for k, v in data.items() if k != "name")
    return data, f"{data.get('name')}{f' ({settings})' if settings else ''}"


def check_members(members: list[Checkpoint], *, same_config: bool) -> None:
    """Refuse checkpoints that cannot be averaged or ensembled together.

    Every member must have the first one's vocabularies and tokenizer (an ensemble's models
    read the same source ids and vote on the same target ids); members to be averaged must also
    have its model config (the same weights, element for element).

    Args:
        members: checkpoints read through the door (`read_checkpoint`), at least one.
        same_config: also require the first member's model config (averaging).
    Raises:
        InputError: a member that differs from the first: one line naming its file, what
            differs and the first file.
    """
    first = members[0]
    tokenizer, described = _tokenizer_summary(first.payload)
    for member in members[1:]:
        path, first_path = member.path, first.path
        if same_config and member.config != first.config:
            ours, theirs = first.config.to_dict(), member.config.to_dict()
            diff = [f"{k}={v!r} vs {ours[k]!r}" for k, v in theirs.items() if v != ours[k]]
            raise InputError(f"{path}: its model config differs from {first_path}'s "
                             f"({'; '.join(diff)}): only checkpoints of one model can be "
                             "averaged")
        for side, ours_vocab, theirs_vocab in (("source", first.src_vocab, member.src_vocab),
                                               ("target", first.tgt_vocab, member.tgt_vocab)):
            if ours_vocab != theirs_vocab:
                raise InputError(f"{path}: its {side} vocabulary ({len(theirs_vocab)} entries) "
                                 f"differs from {first_path}'s ({len(ours_vocab)} entries): the "
                                 "checkpoints must share their vocabularies")
        other, other_described = _tokenizer_summary(member.payload)
        if other != tokenizer:
            raise InputError(f"{path}: its tokenizer ({other_described}) differs from "
                             f"{first_path}'s ({described}): the checkpoints must share their "
                             "tokenizer")


def read_members(paths: Sequence[Path], *, same_config: bool, trust_code: bool = False,
                 parts: Mapping[str, type] | None = None) -> Iterator[Checkpoint]:
    """The checkpoints to average or ensemble, read through the door (`read_checkpoint`) one
    at a time; each after the first is checked against it (`check_members`) before it comes.

    Args:
        paths: the members' files or folders.
        same_config: as for `check_members` (averaging: a model assembled from parts, which
            has no ModelConfig, is refused in one line; average such weights in Python).
        trust_code, parts: as for `read_checkpoint` (models assembled from parts).
    Raises:
        InputError: a damaged or malformed file (named first), or a member that `check_members`
            refuses.
    """
    first: Checkpoint | None = None     # the first member without its weights and states
    for path in paths:
        checkpoint = read_checkpoint(path, trust_code=trust_code, parts=parts, needs_config=(
            "an average is a checkpoint of one ModelConfig, its members'" if same_config
            else None))
        if first is None:
            first = replace(checkpoint, payload={k: v for k, v in checkpoint.payload.items()
                                                 if k in (TOKENIZER, EXTRA)})
        else:
            check_members([first, checkpoint], same_config=same_config)
        yield checkpoint
        del checkpoint                       # before the next member is read
