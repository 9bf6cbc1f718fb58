"""A training run's records besides its checkpoints: the log file and TensorBoard events.

The package logs through the standard `logging` module, to the `bahdanau` logger (`LOGGER`; each
module to a child of it, ``bahdanau.training.loop``, ...); the command line puts its records on
the console, and `TrainLog` appends them to the run folder's ``train.log`` (a line per record,
each with its time (`LogFormatter`), and at each start header lines naming the command line
and the versions it ran with). `TensorBoardLog` writes what `train_run` passes
to its `scalars` callback, and alignment images, as TensorBoard event files:

    board = TensorBoardLog("runs/my-run/tensorboard")
    train(model, examples, cfg, ..., scalars=board.scalars)
    board.close()

TensorBoard is an optional extra (`pip install 'bahdanau[tensorboard]'`), imported only when a
`TensorBoardLog` is made; `import bahdanau` never loads it. Alignment images are matplotlib
heat maps (`bahdanau.plot.plot_alignment`) with the plot extra, else the plain weight matrix as
a grayscale image.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from typing_extensions import Self

from bahdanau.errors import InputError

__all__ = ["LOGGER", "LogFormatter", "TensorBoardLog", "TrainLog", "require_tensorboard"]


LOGGER = logging.getLogger("bahdanau")     # the package's logger; each module logs to a child
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class LogFormatter(logging.Formatter):
    """One line per record: its time, the level when it is not INFO, and the message, as in
    ``2026-01-31 12:00:00 step 100 | loss 5.1234 | ...`` or ``... WARNING: ...``; the console
    and ``train.log`` both use it."""

    def __init__(self) -> None:
        super().__init__(datefmt=TIME_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname}: "
        return f"{self.formatTime(record, self.datefmt)} {level}{record.getMessage()}"


class _RunLogFile(logging.FileHandler):
    """``train.log``'s handler: a record that cannot be written (a full disk, a file-size limit)
    raises, where it was logged, one `OSError` naming the file, instead of `logging`'s
    "--- Logging error ---" traceback on stderr per record and a run that trains on without
    its log; once failed, it writes nothing more (the run is stopping)."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:   # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.failed = True
        raise OSError(error.errno, f"writing {self.baseFilename} failed: "
                                   f"{error.strerror or error}: the run stops here, its "
                                   "checkpoints kept (free the space and run the same command "
                                   "to continue)") from None

    def close(self) -> None:
        """Close the file; what a failed write left in its buffer is dropped."""
        try:
            super().close()
        except OSError:
            pass


class TrainLog:
    """The run's ``train.log``: what the `bahdanau` logger logs while it is open, a line per
    record, each with its time (`LogFormatter`).

    Records logged before `open` names the file (while the run's folder is checked) are held
    and written after the header, so the file holds everything logged by a start that trains;
    a start that ends before `open` (an error, nothing to do) leaves no trace in the file. Use it
    as a context manager: the logger's handlers are removed, and the file closed, on leaving;
    an exception that leaves it (a divergence, a dead loader worker) is the file's last line.
    A record that cannot be written (a full disk) raises one `OSError` naming the file where it
    was logged, which stops the run there with its checkpoints as they were.
    """

    def __init__(self) -> None:
        # holds what is logged until open() gives it the file (a flush with no target keeps it)
        self._held: logging.handlers.MemoryHandler | None = logging.handlers.MemoryHandler(
            capacity=1 << 30, flushLevel=logging.CRITICAL + 1)
        self._file: _RunLogFile | None = None
        LOGGER.addHandler(self._held)
        self._level = LOGGER.level       # the file takes INFO records whatever the console shows
        if LOGGER.getEffectiveLevel() > logging.INFO:
            LOGGER.setLevel(logging.INFO)

    def open(self, path: str | os.PathLike[str], command: str,
             versions: Mapping[str, Any] | None = None) -> None:
        """Append from now on to `path` (created if missing): first the header lines (``#
        COMMAND`` and, given `versions`, ``# versions {JSON}``), then the records held so far."""
        file = self._file = _RunLogFile(path, mode="a", encoding="utf-8")
        file.setFormatter(LogFormatter())
        header = [f"# {command}"] + ([] if versions is None else
                                     [f"# versions {json.dumps(dict(versions))}"])
        for line in header:
            file.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO,
                                               "levelname": "INFO", "name": LOGGER.name}))
        if self._held is not None:
            self._held.setTarget(file)
            self._held.flush()
            self._drop_held()
        LOGGER.addHandler(file)

    def _drop_held(self) -> None:
        if self._held is not None:
            LOGGER.removeHandler(self._held)
            self._held.setTarget(None)
            self._held.buffer.clear()
            self._held = None

    def close(self) -> None:
        """Stop logging to the file, and close it (what was held and not written is dropped);
        the logger's level is as it was."""
        self._drop_held()
        LOGGER.setLevel(self._level)
        if self._file is not None:
            LOGGER.removeHandler(self._file)
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        """Close the file, after writing into it the exception that stops the run, if one
        left the block (not a KeyboardInterrupt), as an ERROR record with its time: its
        message on one line, with its type unless it is an `InputError` or `OSError` (what the
        command line shows as its ``bahdanau: error:`` line). The record goes to the file
        alone, not through the logger to the console, where the command line prints the
        error itself, once; a caller of `bahdanau.jobs.run_train_job` gets the exception."""
        if isinstance(error, Exception) and self._file is not None and not self._file.failed:
            message = " ".join(str(error).split("\n"))
            if not isinstance(error, (InputError, OSError)):
                message = f"{type(error).__name__}: {message}"
            try:
                self._file.handle(LOGGER.makeRecord(LOGGER.name, logging.ERROR, "", 0,
                                                    message, (), None))
            except OSError:
                pass                         # the file cannot take it: `error` says enough
        self.close()


def require_tensorboard() -> Any:
    """torch's `SummaryWriter` class, which needs the tensorboard package.

    Raises:
        InputError: tensorboard is not installed (one line, with the install command).
    """
    try:
        # tensorboard itself first: torch.utils.tensorboard may be cached from an earlier import
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise InputError("TensorBoard logs need the tensorboard package: pip install "
                         "'bahdanau[tensorboard]'") from None
    return SummaryWriter


class TensorBoardLog:
    """Scalars and alignment images of one run, as TensorBoard event files in `folder`.

    Args:
        folder: where the event files go (`tensorboard --logdir` it, or its parent).
        purge_step: a resumed run's step: events that an earlier start wrote from this step
            on (after its last checkpoint) are dropped, so the curves do not fold back.
        tags: tag renames for `scalars`, e.g. {"dev/ppl": "dev/perplexity"} (`train_run`
            passes each dev score as "dev/NAME").
    Raises:
        InputError: tensorboard is not installed.
    """

    def __init__(self, folder: str | os.PathLike[str], *, purge_step: int | None = None,
                 tags: Mapping[str, str] | None = None) -> None:
        writer = require_tensorboard()
        self.folder = Path(folder)
        self.tags = dict(tags or {})
        self._writer = writer(str(self.folder), purge_step=purge_step, flush_secs=30)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write each value under its tag at `step`: `train_run`'s `scalars` callback."""
        for tag, value in values.items():
            self._writer.add_scalar(self.tags.get(tag, tag), float(value), step)

    def alignment(self, step: int, weights: torch.Tensor, src_tokens: Sequence[str],
                  tgt_tokens: Sequence[str], tag: str = "dev/alignment", *,
                  title: str | None = None) -> None:
        """Write a (T, S) attention matrix as an image at `step`: a labelled heat map under
        `title` with matplotlib installed, else the matrix itself in grayscale (white: weight
        1); either way at most `bahdanau.plot.MAX_CELLS` rows and columns (the first ones)."""
        from bahdanau.plot import MAX_CELLS, PlotDependencyError, plot_alignment

        try:
            figure = plot_alignment(weights, src_tokens, tgt_tokens, title=title)
        except PlotDependencyError:
            matrix = torch.as_tensor(weights, dtype=torch.float32)[:MAX_CELLS, :MAX_CELLS]
            matrix = matrix.cpu().clamp(0, 1)
            self._writer.add_image(tag, matrix[None], step, dataformats="CHW")
        else:
            self._writer.add_figure(tag, figure, step)      # closes the figure

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
