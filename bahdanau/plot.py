"""Plots of the paper's figures: alignment heat maps (Figure 3) and BLEU by length (Figure 2).

matplotlib is an optional extra (`pip install 'bahdanau[plot]'`), imported only when a function
here is called; `import bahdanau` never loads it.

Every plot is meant for a reader who has not read the paper: axes, a colour bar or a legend
saying what is drawn, and a title. An alignment plot draws at most `MAX_CELLS` target rows and
source columns (a hypothesis that runs to --max-len, a very long sentence) and says so in its
title, and its figure size is bounded, so an image never exceeds `MAX_IMAGE_PIXELS` on a side
whatever it is given: a plot of 1,000 x 1,000 cells could not be read, and once cost gigabytes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from bahdanau._files import atomic_file
from bahdanau.errors import InputError
from bahdanau.evaluate import LengthBucket

# Target rows and source columns an alignment plot draws; beyond them the first MAX_CELLS are
# drawn and the title says how many there were. 60 covers the paper's sentences (up to 50 words
# in training) with labels still legible at 1/4 inch a cell.
MAX_CELLS = 60
# Matplotlib's perceptually uniform map, reversed: weight 0 is near white and 1 near black, so
# a weight is ink (it prints in grey scale as it reads in colour), and the near-uniform
# attention of an untrained model reads as pale everywhere rather than as black.
COLORMAP = "magma_r"
DPI = 120
# The largest image side: the figure of MAX_CELLS x MAX_CELLS with its labels, title and colour
# bar is about 18.7 x 18.4 inches at worst (2,250 pixels at DPI); tests/unit/test_plot.py
# renders that case against this bound.
MAX_IMAGE_PIXELS = 2400
_MAX_LABEL_CHARS = 16        # a longer token is cut with an ellipsis, so the axes keep their room
_CHARS_PER_INCH = 11         # title characters a line holds at the default font size
_MAX_TITLE_LINES = 3         # of the caller's title; a cap note may follow
_LABEL_POINTS = 8            # tick label font size
_EDGE = 0.15                 # inches left blank at the figure's edges


class PlotDependencyError(ImportError):
    """matplotlib is missing."""


def _pyplot() -> Any:
    try:
        import matplotlib

        if not os.environ.get("DISPLAY") and not os.environ.get("MPLBACKEND"):
            matplotlib.use("Agg")                                 # headless: write files only
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotDependencyError(
            "plots need matplotlib: pip install 'bahdanau[plot]'") from exc
    return plt


def _save(fig: Any, path: str | os.PathLike[str]) -> None:
    """Save `fig` in the format of the suffix of `path`, through `atomic_file`: a file is
    replaced whole, a device or FIFO written into, never replaced."""
    suffix = Path(path).suffix.lstrip(".").lower() or None
    with atomic_file(Path(path)) as f:
        fig.savefig(f, format=suffix, dpi=DPI)


def check_image_path(path: str | os.PathLike[str]) -> None:
    """Refuse a file name whose suffix matplotlib cannot write (png, pdf, svg, jpg, ...).

    Raises:
        InputError: the suffix is not an image format matplotlib knows (the formats are listed).
        PlotDependencyError: matplotlib is not installed.
    """
    _pyplot()
    from matplotlib.figure import Figure

    suffix = Path(path).suffix.lstrip(".").lower()
    formats = Figure().canvas.get_supported_filetypes()
    if suffix not in formats:
        raise InputError(f"{path}: cannot write an image of type {suffix!r}; use one of "
                         f"{', '.join(sorted(formats))}")


def _shorten(text: str, limit: int, *, middle: bool = False) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis: at the end, or in the
    middle (a title line keeps both a path's start and its file name and step)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    if not middle:
        return text[: max(limit - 1, 1)] + "…"
    tail = (limit - 1) // 2
    return text[: limit - 1 - tail] + "…" + text[len(text) - tail:]


def _cap_note(rows: int, cols: int, shown_rows: int, shown_cols: int) -> str | None:
    """The title line that says which part of a capped matrix is drawn (None: all of it)."""
    cut = [f"first {shown} of {total} {what} words"
           for shown, total, what in ((shown_rows, rows, "target"), (shown_cols, cols, "source"))
           if shown < total]
    return f"showing the {' and '.join(cut)}" if cut else None


def plot_alignment(weights: torch.Tensor | Sequence[Sequence[float]], src_tokens: Sequence[str],
                   tgt_tokens: Sequence[str], path: str | os.PathLike[str] | None = None, *,
                   title: str | None = None, max_cells: int = MAX_CELLS) -> Any:
    """Alignment heat map as the paper's Figure 3: source words along the top (x axis), the
    generated target words down the side (y axis), one cell per weight a_ij.

    The colour scale is fixed to 0..1 (`COLORMAP`: near white for 0, near black for 1; a colour
    bar), so plots compare with each other and a uniform row reads as uniform. At most `max_cells`
    rows and columns are drawn (the first ones; the title says so), long tokens and title lines
    are shortened, and the figure is at most `MAX_IMAGE_PIXELS` on a side at `DPI`.

    Args:
        weights: (T, S) attention weights a_ij, row i for target token i.
        src_tokens: the S source tokens (for `DefaultTokenizer` tokens, map
            `DefaultTokenizer.display` over them first to drop the joiner mark).
        tgt_tokens: the T target tokens (include "</s>" for the eos row of a hypothesis).
        path: if given, the figure is saved there (format from the suffix: png, pdf, svg).
        title: optional title, one or more lines (say which model and sentence).
        max_cells: the most target rows, and source columns, drawn (1 to `MAX_CELLS`).
    Returns:
        The matplotlib Figure (close it with `matplotlib.pyplot.close` when done).
    Raises:
        InputError: the weights' shape does not match the token lists, the matrix is empty, or
            max_cells is outside 1..`MAX_CELLS`.
        PlotDependencyError: matplotlib is not installed.
    """
    matrix = torch.as_tensor(weights, dtype=torch.float64).cpu()
    if matrix.dim() != 2 or tuple(matrix.shape) != (len(tgt_tokens), len(src_tokens)):
        raise InputError(f"weights have shape {tuple(matrix.shape)}, expected "
                         f"({len(tgt_tokens)}, {len(src_tokens)}) for the target x source tokens")
    if matrix.numel() == 0:
        raise InputError(f"weights of shape {tuple(matrix.shape)} are empty: nothing to plot")
    if isinstance(max_cells, bool) or not isinstance(max_cells, int) or not (
            1 <= max_cells <= MAX_CELLS):
        raise InputError(f"max_cells must be an int in 1..{MAX_CELLS}, got {max_cells!r}")
    if path is not None:
        check_image_path(path)
    all_rows, all_cols = matrix.shape
    rows, cols = min(all_rows, max_cells), min(all_cols, max_cells)
    lines = [] if title is None else title.splitlines()[:_MAX_TITLE_LINES]
    note = _cap_note(all_rows, all_cols, rows, cols)
    x_labels = [_shorten(t, _MAX_LABEL_CHARS) for t in src_tokens[:cols]]
    y_labels = [_shorten(t, _MAX_LABEL_CHARS) for t in tgt_tokens[:rows]]
    title_lines = [*lines, *filter(None, [note])]
    fig, ax, bar_ax = _alignment_axes(rows, cols, _label_inches(x_labels),
                                      _label_inches(y_labels), len(title_lines))
    image = ax.imshow(matrix[:rows, :cols].numpy(), cmap=COLORMAP, vmin=0.0, vmax=1.0,
                      aspect="auto", interpolation="nearest")
    ax.set_xticks(range(cols), labels=x_labels, rotation=90)
    ax.set_yticks(range(rows), labels=y_labels)
    ax.tick_params(labelsize=_LABEL_POINTS, top=True, labeltop=True, bottom=False,
                   labelbottom=False)
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("source words")
    ax.set_ylabel("generated target words")
    bar = fig.colorbar(image, cax=bar_ax)
    bar.set_label("attention weight a_ij\n(each row sums to 1)", fontsize=9)
    width = int(fig.get_figwidth() * _CHARS_PER_INCH)
    fig.suptitle("\n".join(_shorten(line, width, middle=True) for line in title_lines),
                 fontsize=10, y=1 - _EDGE / fig.get_figheight(), va="top")
    if path is not None:
        _save(fig, path)
    return fig


def _label_inches(labels: Sequence[str]) -> float:
    """The width of the widest tick label, in inches (labels are at most _MAX_LABEL_CHARS)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    font, measure = FontProperties(size=_LABEL_POINTS), TextToPath()
    return max(measure.get_text_width_height_descent(label, font, ismath=False)[0]
               for label in labels) / 72


def _alignment_axes(rows: int, cols: int, x_labels: float, y_labels: float, title_lines: int
                    ) -> tuple[Any, Any, Any]:
    """A figure laid out in inches for `rows` x `cols` square cells (1/4 to 1/2 inch, larger
    for small matrices) under tick labels `x_labels` inches long and beside ones `y_labels`
    inches wide, a title of `title_lines` lines and a colour bar: (figure, heat-map axes,
    colour-bar axes). Every part is bounded, so the figure is within `MAX_IMAGE_PIXELS`."""
    cell = min(0.5, max(0.25, 8.0 / max(rows, cols)))
    grid_w, grid_h = cell * cols, cell * rows
    plot_h = max(grid_h, 2.0)                           # room for the colour bar's scale
    left = _EDGE + 0.35 + y_labels                      # axis label, tick labels
    top = _EDGE + 0.22 * title_lines + 0.4 + x_labels   # title, axis label, tick labels
    right = 0.2 + 0.2 + 1.1                             # gap, the bar, its ticks and label
    width = max(6.0, left + grid_w + right)             # a title line holds 60+ characters
    left += (width - left - grid_w - right) / 2         # a narrow grid sits in the middle
    height = top + plot_h + _EDGE
    width, height = (min(side, MAX_IMAGE_PIXELS / DPI) for side in (width, height))
    fig = _pyplot().figure(figsize=(width, height), dpi=DPI)
    bottom = height - top - grid_h                      # grid and bar share their top edge
    ax = fig.add_axes((left / width, bottom / height, grid_w / width, grid_h / height))
    bar_ax = fig.add_axes(((left + grid_w + 0.2) / width, (height - top - plot_h) / height,
                           0.2 / width, plot_h / height))
    return fig, ax, bar_ax


def _bucket_span(bucket: LengthBucket) -> str:
    """'10-19' for [10, 20), '50+' for the open last bucket."""
    return f"{bucket.low}+" if bucket.high is None else f"{bucket.low}-{bucket.high - 1}"


def plot_bleu_by_length(systems: Mapping[str, Sequence[LengthBucket]],
                        path: str | os.PathLike[str] | None = None, *,
                        title: str = "BLEU by source sentence length") -> Any:
    """Figure 2: one line per system, BLEU against the source-length bucket.

    The x axis names each bucket's span of source lengths and, where the systems agree (one
    test set), its number of sentences; where they do not, each point carries its own count.
    Empty buckets (BLEU None) are left out.

    Args:
        systems: name -> buckets from `bahdanau.evaluate.bleu_by_length`.
        path: if given, the figure is saved there.
        title: the title.
    Returns:
        The matplotlib Figure (close it with `matplotlib.pyplot.close` when done).
    Raises:
        InputError: systems is empty.
        PlotDependencyError: matplotlib is not installed.
    """
    if not systems:
        raise InputError("systems is empty: nothing to plot")
    if path is not None:
        check_image_path(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=DPI, layout="constrained")
    spans: dict[int, str] = {}
    counts: dict[int, set[int]] = {}
    for buckets in systems.values():
        for b in buckets:
            if b.bleu is not None:
                spans[b.low] = _bucket_span(b)
                counts.setdefault(b.low, set()).add(b.n_sentences)
    agree = all(len(c) == 1 for c in counts.values())
    for name, buckets in systems.items():
        shown = [b for b in buckets if b.bleu is not None]
        ax.plot([b.low for b in shown], [b.bleu for b in shown], marker="o", label=name)
        for b in [] if agree else shown:
            ax.annotate(f"n={b.n_sentences}", (b.low, b.bleu), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=7, color="0.35")
    ax.set_xticks(sorted(spans), labels=[
        spans[low] + (f"\n{next(iter(counts[low]))} sentences" if agree else "")
        for low in sorted(spans)], fontsize=8)
    ax.set_xlabel("source sentence length (tokens)")
    ax.set_ylabel("BLEU")
    ax.set_ylim(bottom=0)                  # heights compare as scores, not as differences
    ax.set_title(_shorten(title, int(7.0 * _CHARS_PER_INCH)))
    ax.grid(alpha=0.3)
    ax.legend(title="system")
    if path is not None:
        _save(fig, path)
    return fig
