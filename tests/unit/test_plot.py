"""Plots render to files; bad shapes raise."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("matplotlib")

from bahdanau.evaluate import LengthBucket  # noqa: E402
from bahdanau.plot import plot_alignment, plot_bleu_by_length  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def test_alignment_png(tmp_path) -> None:
    weights = torch.softmax(torch.randn(3, 4), -1)
    path = tmp_path / "a.png"
    fig = plot_alignment(weights, ["a", "b", "c", "d"], ["x", "y", "</s>"], path, title="t")
    assert path.read_bytes()[:8] == PNG
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y", "</s>"]


def test_alignment_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"shape \(3, 4\), expected \(2, 4\)"):
        plot_alignment(torch.zeros(3, 4), ["a", "b", "c", "d"], ["x", "y"])


def test_bleu_by_length_plot(tmp_path) -> None:
    buckets = [LengthBucket(0, 10, 5, 30.0), LengthBucket(10, 20, 3, 25.0),
               LengthBucket(20, None, 0, None)]
    path = tmp_path / "b.png"
    fig = plot_bleu_by_length({"RNNsearch": buckets, "RNNencdec": buckets[:2]}, path)
    assert path.read_bytes()[:8] == PNG
    assert len(fig.axes[0].lines) == 2
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_bleu_by_length({})
