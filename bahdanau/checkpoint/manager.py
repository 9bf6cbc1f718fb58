"""A run's checkpoint folder: numbered checkpoints, the last N and the best kept, and lookup.

`CheckpointManager` writes ``step_00001000.pt`` files and ``best.pt`` (with ``best.json``) into
one folder; `bahdanau.checkpoint.reader.find_checkpoint` turns a training output folder into
the checkpoint it stands for (its best, else its latest).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Protocol

from bahdanau._checks import JSON_ERRORS, check_path, describe, is_finite_number, is_int
from bahdanau._files import atomic_write, fsync_dir
from bahdanau.checkpoint.files import load_checkpoint_file, named, read_payload, save_checkpoint
from bahdanau.checkpoint.sections import BEST_N, STOPPED, TRAIN_STATE
from bahdanau.config import UNNAMED_METRIC, improves
from bahdanau.errors import InputError


class SavedState(Protocol):
    """What `CheckpointManager.complete_save` reads of a run's state (`TrainState` has it)."""

    step: int
    best_step: int | None
    best_metric: float | None


class CheckpointManager:
    """Numbered checkpoints in one directory: keeps the last `keep_last` and the best.

    Files are ``step_00001000.pt`` (one per saved step) and ``best.pt``, a hard link to (where
    links fail, a copy of) the checkpoint with the best metric so far (the highest BLEU or chrF,
    the lowest perplexity: `bahdanau.config.improves`), which outlives the numbered file's
    deletion; ``best.json`` records that metric, its step and its name so a resumed run keeps
    comparing against it. With
    `keep_best` > 1 the numbered checkpoints of the `keep_best` best evaluations are kept too,
    whatever their age, and each checkpoint saved records that ranking in its `best_n` section
    (docs/checkpoint-format.md), from which `best_n` reads it back. Each save first
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
        metric_name: the name of the metric that ranks the checkpoints ("bleu", "chrf",
            "ppl": see `bahdanau.config.TrainConfig.early_stopping_metric`); None: the one
            ``best.json`` names (one that names none, written before metrics had names, is
            BLEU's: `bahdanau.config.UNNAMED_METRIC`).
    Raises:
        InputError: `keep_last` or `keep_best` < 1, a damaged ``best.json`` that ``best.pt``
            cannot rebuild (the file and the problem are named), or one that names another
            metric than `metric_name`.
    """

    _STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
    _TEMP_FILE = re.compile(r"^\.(step_\d+\.pt|best\.pt|best\.json)\..+\.tmp$")  # atomic_write's

    def __init__(self, directory: str | os.PathLike[str], *, keep_last: int = 3,
                 keep_best: int = 1, metric_name: str | None = None) -> None:
        for name, value in (("keep_last", keep_last), ("keep_best", keep_best)):
            if not is_int(value) or value < 1:
                raise InputError(f"{name} must be a positive int, got {value!r}")
        self.directory = check_path("directory", directory)
        self.keep_last, self.keep_best = keep_last, keep_best
        self.metric_name = metric_name
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
        except (OSError, *JSON_ERRORS) as err:   # JSON_ERRORS: decoding, nested too deeply
            problem = f"unreadable ({type(err).__name__})"
        else:
            if (isinstance(data, dict) and set(data) in ({"metric", "step"},
                                                         {"metric", "step", "name"})
                    and _is_evaluation(data["step"], data["metric"])
                    and isinstance(data.get("name", ""), str)):
                self._check_name(data.get("name"))
                self.best_metric, self.best_step = float(data["metric"]), data["step"]
                self._recorded = (self.best_metric, self.best_step)
                return
            problem = 'not {"metric": number, "step": int}'
        try:
            state = read_payload(best)[TRAIN_STATE]
        except (FileNotFoundError, InputError) as err:
            raise InputError(f"{info}: {problem}, and best.pt cannot rebuild it: {err}") from None
        recorded: dict[str, Any] = state if isinstance(state, dict) else {}
        step: Any = recorded.get("best_step")
        metric: Any = recorded.get("best_metric")
        if not _is_evaluation(step, metric):
            raise InputError(f"{info}: {problem}, and best.pt records no best metric and step "
                             "to rebuild it from")
        self.best_metric, self.best_step = float(metric), step

    def _check_name(self, recorded: str | None) -> None:
        """Take the metric ``best.json`` names (none: BLEU, the only one when it was written),
        or refuse it when it is not this one's."""
        recorded = UNNAMED_METRIC if recorded is None else recorded
        if recorded == self.metric_name:
            return
        if self.metric_name is not None:
            raise InputError(f"{self.directory / 'best.json'}: the run ranks its checkpoints "
                             f"by {recorded}, not {self.metric_name}; a resumed run keeps its "
                             "early-stopping metric")
        self.metric_name = recorded

    def _ranked(self, ranking: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """(step, metric) pairs best first (ties: the earlier step first)."""
        sign = 1 if improves(self.metric_name, 1.0, 0.0) else -1
        return sorted(ranking, key=lambda entry: (-sign * entry[1], entry[0]))

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

    @classmethod
    def writes(cls, name: str) -> bool:
        """Whether a manager writes files of this name: numbered checkpoints, ``best.pt`` and
        ``best.json`` (what the commands that write outputs keep their hands off)."""
        return bool(cls._STEP_FILE.match(name)) or name in ("best.pt", "best.json")

    @classmethod
    def writes_or_writing(cls, name: str) -> bool:
        """`writes`, or one of those files being written (``atomic_write``'s temporary file)."""
        return cls.writes(name) or bool(cls._TEMP_FILE.match(name))

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
                with named(latest):
                    section = _parse_best_n(load_checkpoint_file(latest).get(BEST_N))
            if section is None:
                section = ([] if self.best_step is None or self.best_metric is None
                           else [(self.best_step, self.best_metric)])
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
        `keep_best` 1: whether it beats the best so far).

        Raises:
            InputError: `metric` is not a finite number.
        """
        _check_metric(metric)
        if self.keep_best == 1:
            return improves(self.metric_name, metric, self.best_metric)
        ranking = self.best_n()
        return (len(ranking) < self.keep_best
                or improves(self.metric_name, metric, ranking[self.keep_best - 1][1]))

    def save(self, step: int, payload: dict[str, Any], *, metric: float | None = None,
             stopped: str | None = None) -> Path:
        """Write the checkpoint of `step`; also as ``best.pt`` if `metric` beats the best so far.

        Then the numbered checkpoints older than the last `keep_last` are deleted (never the
        one just written, nor, with `keep_best` > 1, those of the `keep_best` best evaluations).
        See the class docstring for the order of the writes.

        Args:
            step: the training step, which names the file.
            payload: the checkpoint, e.g. from `checkpoint_payload`. With `keep_best` > 1 the
                file also holds the ranking of the best evaluations, this one's included, as
                its `best_n` section (which replaces any of `payload`'s).
            metric: this step's validation metric (of the manager's `metric_name`), or None.
            stopped: why a run that was interrupted (a signal, a dead loader worker) saves
                this step off its schedule ("sigint", "sigterm", "sighup", "loader"), or
                None: written as the file's `STOPPED` section, by which averaging the last
                checkpoints (`bahdanau.checkpoint.select_checkpoints`) leaves it out.
        Returns:
            The path of the numbered checkpoint.
        Raises:
            InputError: a negative step, a metric that is not a finite number (NaN would
                stay the best forever), or a payload `save_checkpoint` refuses.
        """
        if not is_int(step) or step < 0:
            raise InputError(f"step must be a non-negative int, got {step!r}")
        if metric is not None:
            _check_metric(metric)
        if self.directory.is_dir():  # temporary files left by a run killed mid-write
            for stale in self.directory.iterdir():
                if self._TEMP_FILE.match(stale.name):
                    stale.unlink(missing_ok=True)
        kept: set[int] = set()
        if self.keep_best > 1:
            ranking = [(s, m) for s, m in self.best_n() if s != step]
            if metric is not None:
                ranking.append((step, float(metric)))
            ranking = self._ranked(ranking)[:self.keep_best]
            payload = {**payload, BEST_N: [{"step": s, "metric": m} for s, m in ranking]}
            kept = {s for s, _ in ranking}
        if stopped is not None:
            payload = {**payload, STOPPED: stopped}
        path = self.path_for(step)
        save_checkpoint(path, payload)
        if self.keep_best > 1:
            self._ranking = ranking
        else:
            self._ranking = None          # best_n() reads the files again if asked
        if metric is not None and improves(self.metric_name, metric, self.best_metric):
            self._record_best(path, float(metric), step)
        for old_step, old in self._numbered()[:-self.keep_last]:
            if old_step < step and old_step not in kept:
                old.unlink(missing_ok=True)
        return path

    def complete_save(self, path: str | os.PathLike[str], state: SavedState) -> None:
        """Finish what a crash left undone of the save of `path`, the checkpoint resumed from.

        If `state` (the train state stored in `path`) is its own best (its `best_step` is its
        `step`) but that step is not the recorded best, the crash came between the numbered
        file and ``best.json``: ``best.pt`` is made `path` and ``best.json`` written.
        Otherwise a ``best.json`` that was read back from ``best.pt`` is rewritten.
        `bahdanau.training.setup_run` calls this when it resumes.

        Args:
            path: the numbered checkpoint resumed from, e.g. `latest()`.
            state: its train state (`bahdanau.training.TrainState`, e.g. from `restore`).
        """
        if (state.best_step == state.step and is_finite_number(state.best_metric)
                and self.best_step != state.step):
            self._record_best(Path(path), float(state.best_metric), state.step)
        elif (self.best_step is not None and self.best_metric is not None
              and self._recorded != (self.best_metric, self.best_step)):
            self._write_best_json(self.best_metric, self.best_step)

    def _record_best(self, path: Path, metric: float, step: int) -> None:
        """Make ``best.pt`` the file `path` (durable), then record `metric` and `step` in
        best.json.

        ``best.pt`` is a hard link to the numbered file: no second copy on disk, and it
        outlives the numbered file's deletion by `keep_last`. Where links fail (a file system
        without them), it is a copy. Either way it replaces the old ``best.pt`` atomically.
        """
        best = self.directory / "best.pt"
        temp = self.directory / f".best.pt.{secrets.token_hex(8)}.tmp"   # a _TEMP_FILE name
        try:
            if not (best.is_file() and best.samefile(path)):   # else linked before a crash
                os.link(path, temp)           # (a rename onto the same file does nothing)
                os.replace(temp, best)
            fsync_dir(self.directory)
        except OSError:
            temp.unlink(missing_ok=True)
            with open(path, "rb") as source:
                atomic_write(best, lambda f: shutil.copyfileobj(source, f, 1 << 22))
        self._write_best_json(metric, step)

    def _write_best_json(self, metric: float, step: int) -> None:
        name = {} if self.metric_name is None else {"name": self.metric_name}
        info = json.dumps({"metric": metric, "step": step, **name}).encode()
        atomic_write(self.directory / "best.json", lambda f: f.write(info))
        self.best_metric, self.best_step = metric, step
        self._recorded = (metric, step)


def _is_evaluation(step: object, metric: object) -> bool:
    """An evaluation as a run folder records it: its step (an int >= 0) and a finite metric
    (best.json, a `best_n` entry, a train state's best)."""
    return is_int(step) and step >= 0 and is_finite_number(metric)


def _parse_best_n(section: Any) -> list[tuple[int, float]] | None:
    """A `best_n` section as (step, metric) pairs; None for a checkpoint without one."""
    if section is None:
        return None
    entries: list[Any] = section if isinstance(section, list) else [None]
    for entry in entries:
        if not (isinstance(entry, dict) and set(entry) == {"step", "metric"}
                and _is_evaluation(entry["step"], entry["metric"])):
            raise InputError(f'checkpoint best_n is malformed: it must be a list of '
                             f'{{"step": int, "metric": number}}, got {describe(section)}')
    return [(entry["step"], float(entry["metric"])) for entry in entries]


def _check_metric(metric: object) -> None:
    if not is_finite_number(metric):
        raise InputError(f"metric must be a finite number, got {metric!r}")


def checkpoints_folder(folder: Path) -> Path:
    """Where a training output folder keeps its checkpoints: its ``checkpoints`` subfolder, or
    the folder itself if it has none (a folder of checkpoints)."""
    return folder / "checkpoints" if (folder / "checkpoints").is_dir() else folder
