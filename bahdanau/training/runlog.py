"""A training run's records besides its checkpoints: the log file and TensorBoard events.

`TrainLog` is the `log` that `bahdanau train` hands to `bahdanau.training.train_run`: every line is
printed and also appended to the run folder's ``train.log`` (flushed line by line, a header line
per start naming the command line and the time). `TensorBoardLog` writes what `train_run` passes
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

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch
from typing_extensions import Self

from bahdanau.errors import InputError

__all__ = ["TensorBoardLog", "TrainLog", "require_tensorboard"]


class TrainLog:
    """Prints lines and, once `open` has named the log file, appends them to it too.

    Lines said before `open` (while the run's folder is checked) are kept and written after the
    header, so the file holds everything printed by a start that trains; a start that ends
    before `open` (an error, nothing to do) leaves no trace in the file. Use it as a context
    manager to close the file.
    """

    def __init__(self) -> None:
        self._held: list[str] = []
        self._file: IO[str] | None = None

    def __call__(self, line: str) -> None:
        """Print `line` (flushed) and log it."""
        print(line, flush=True)
        if self._file is None:
            self._held.append(line)
        else:
            _write(self._file, line)

    def open(self, path: str | os.PathLike[str], command: str) -> None:
        """Append from now on to `path` (created if missing): first a header line with the time
        and `command`, then the lines held so far."""
        file = self._file = open(path, "a", encoding="utf-8")
        _write(file, f"# {time.strftime('%Y-%m-%d %H:%M:%S %z')}: {command}")
        for line in self._held:
            _write(file, line)
        self._held.clear()

    def close(self) -> None:
        """Close the file (lines said afterwards are only printed)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write(file: IO[str], line: str) -> None:
    file.write(line + "\n")
    file.flush()


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
        tags: tag renames for `scalars`, e.g. {"dev/metric": "dev/bleu"} when the validation
            metric is BLEU.
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
                  tgt_tokens: Sequence[str], tag: str = "dev/alignment") -> None:
        """Write a (T, S) attention matrix as an image at `step`: a labelled heat map with
        matplotlib installed, else the matrix itself in grayscale (white: weight 1)."""
        from bahdanau.plot import PlotDependencyError, plot_alignment

        try:
            figure = plot_alignment(weights, src_tokens, tgt_tokens)
        except PlotDependencyError:
            matrix = torch.as_tensor(weights, dtype=torch.float32).cpu().clamp(0, 1)
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
