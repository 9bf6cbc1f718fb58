"""Plots of the paper's figures: alignment heat maps (Figure 3) and BLEU by length (Figure 2).

matplotlib is an optional extra (`pip install 'bahdanau[plot]'`), imported only when a function
here is called; `import bahdanau` never loads it.
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
        fig.savefig(f, format=suffix, dpi=150)


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


def plot_alignment(weights: torch.Tensor | Sequence[Sequence[float]], src_tokens: Sequence[str],
                   tgt_tokens: Sequence[str], path: str | os.PathLike[str] | None = None, *,
                   title: str | None = None) -> Any:
    """Alignment heat map: source words on the x axis, target words on the y axis, grayscale.

    Args:
        weights: (T, S) attention weights a_ij, row i for target token i.
        src_tokens: the S source tokens (for `DefaultTokenizer` tokens, map
            `DefaultTokenizer.display` over them first to drop the joiner mark).
        tgt_tokens: the T target tokens (include "</s>" for the eos row of a hypothesis).
        path: if given, the figure is saved there (format from the suffix: png, pdf, svg).
        title: optional title.
    Returns:
        The matplotlib Figure.
    Raises:
        InputError: the weights' shape does not match the token lists.
        PlotDependencyError: matplotlib is not installed.
    """
    matrix = torch.as_tensor(weights, dtype=torch.float64).cpu()
    if matrix.dim() != 2 or tuple(matrix.shape) != (len(tgt_tokens), len(src_tokens)):
        raise InputError(f"weights have shape {tuple(matrix.shape)}, expected "
                         f"({len(tgt_tokens)}, {len(src_tokens)}) for the target x source tokens")
    if path is not None:
        check_image_path(path)
    plt = _pyplot()
    rows, cols = matrix.shape
    fig, ax = plt.subplots(figsize=(max(3.0, 0.45 * cols + 1.5), max(3.0, 0.45 * rows + 1.2)))
    ax.imshow(matrix.numpy(), cmap="gray", vmin=0.0, vmax=1.0, aspect="equal")
    ax.set_xticks(range(cols), labels=list(src_tokens), rotation=90)
    ax.set_yticks(range(rows), labels=list(tgt_tokens))
    ax.xaxis.tick_top()
    if title:
        ax.set_title(title, pad=12)
    fig.tight_layout()
    if path is not None:
        _save(fig, path)
    return fig


def plot_bleu_by_length(systems: Mapping[str, Sequence[LengthBucket]],
                        path: str | os.PathLike[str] | None = None, *,
                        title: str = "BLEU by source sentence length") -> Any:
    """Figure 2: one line per system, BLEU against the source-length bucket.

    Args:
        systems: name -> buckets from `bahdanau.evaluate.bleu_by_length`.
        path: if given, the figure is saved there.
        title: the title.
    Returns:
        The matplotlib Figure.
    """
    if not systems:
        raise InputError("systems is empty: nothing to plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for name, buckets in systems.items():
        points = [((b.low + (b.high if b.high is not None else b.low + 10)) / 2, b.bleu)
                  for b in buckets if b.bleu is not None]
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
    ax.set_xlabel("source sentence length (tokens, bucket centre)")
    ax.set_ylabel("BLEU")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    if path is not None:
        _save(fig, path)
    return fig
