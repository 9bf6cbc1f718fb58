"""Plots render to files a reader without the paper can read, with bounded images; bad inputs
raise."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch

pytest.importorskip("matplotlib")

from bahdanau.errors import InputError  # noqa: E402
from bahdanau.evaluate import LengthBucket  # noqa: E402
from bahdanau.plot import (  # noqa: E402
    MAX_CELLS,
    MAX_IMAGE_PIXELS,
    plot_alignment,
    plot_bleu_by_length,
)

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) from the PNG header: the IHDR chunk follows the 8-byte signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def _parts(fig):
    """The heat map's axes, its image and the colour bar's axes of an alignment figure."""
    [ax] = [a for a in fig.axes if a.images]
    [image] = ax.images
    assert image.colorbar is not None and image.colorbar.ax in fig.axes
    return ax, image, image.colorbar.ax


def test_alignment_png_has_labels_title_and_a_fixed_colour_bar(tmp_path) -> None:
    weights = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), -1)
    path = tmp_path / "a.png"
    fig = plot_alignment(weights, ["a", "b", "c", "d"], ["x", "y", "</s>"], path,
                         title="model.pt (step 7)\n“a b c d”")
    ax, image, bar = _parts(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y", "</s>"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("source words", "generated target words")
    assert fig.get_suptitle() == "model.pt (step 7)\n“a b c d”"
    assert image.get_clim() == (0.0, 1.0)
    assert "attention weight" in bar.get_ylabel()
    assert bar.get_ylim() == (0.0, 1.0)                     # the bar's scale is the image's
    assert image.get_array().shape == (3, 4)
    width, height = png_size(path)
    assert 0 < width <= MAX_IMAGE_PIXELS and 0 < height <= MAX_IMAGE_PIXELS


def test_uniform_attention_reads_as_uniform_and_pale() -> None:
    """The scale is 0..1 whatever the weights: 1/12 everywhere gives one pale colour, the colour
    of 1/12 on the bar (an autoscaled map would stretch these weights over its whole range)."""
    fig = plot_alignment(torch.full((5, 12), 1 / 12), list("abcdefghijkl"), list("vwxyz"))
    _, image, _ = _parts(fig)
    colours = image.to_rgba(image.get_array())
    assert image.get_clim() == (0.0, 1.0)
    assert (colours == colours[0, 0]).all()
    expected = image.cmap(1 / 12)
    assert colours[0, 0] == pytest.approx(expected)
    assert sum(expected[:3]) / 3 > 0.7                                  # near white, not black


def test_the_quickstart_names_the_colours_the_plot_draws() -> None:
    """Notebook 01 says which colour weight 0 and weight 1 get; the plot draws them so: a
    weight of 0 and one of 1 side by side, their lightness read from the drawn image (the
    notebook said white for 1, the reverse of the map)."""
    notebook = Path(__file__).parents[2] / "examples" / "01_quickstart.ipynb"
    text = " ".join("".join(cell["source"]).replace("\n", " ")
                    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]
                    if cell["cell_type"] == "markdown")
    said = re.findall(r"near (white|black) is weight ([01])", text)
    assert sorted(weight for _, weight in said) == ["0", "1"], said
    _, image, _ = _parts(plot_alignment(torch.tensor([[0.0, 1.0]]), ["a", "b"], ["x"]))
    drawn = image.to_rgba(image.get_array())[0]                  # (2, 4): weight 0, weight 1
    for colour, weight in said:
        lightness = float(sum(drawn[int(weight)][:3]) / 3)
        assert lightness > 0.7 if colour == "white" else lightness < 0.3, (colour, weight)


def test_long_hypothesis_and_sentence_are_capped_and_said(tmp_path) -> None:
    """A hypothesis that ran to max_len (101 rows) over a 1,000-word sentence with long tokens
    and a long title: the first MAX_CELLS rows and columns are drawn, the title says so, and
    the image stays within MAX_IMAGE_PIXELS."""
    weights = torch.softmax(torch.randn(101, 1000), -1)
    src = [f"source-word-number-{j}" for j in range(1000)]
    tgt = [f"t{i}" for i in range(100)] + ["</s>"]
    path = tmp_path / "long.png"
    fig = plot_alignment(weights, src, tgt, path, title="x" * 500 + "\n" + "a line\n" * 20)
    ax, image, _ = _parts(fig)
    assert image.get_array().shape == (MAX_CELLS, MAX_CELLS)
    assert len(ax.get_xticklabels()) == len(ax.get_yticklabels()) == MAX_CELLS
    assert all(len(t.get_text()) <= 16 for t in ax.get_xticklabels())
    title = fig.get_suptitle()
    assert (f"showing the first {MAX_CELLS} of 101 target words and first {MAX_CELLS} of 1000 "
            "source words") in title
    assert title.count("\n") == 3                         # 3 lines of the title, then the note
    width, height = png_size(path)
    assert width <= MAX_IMAGE_PIXELS and height <= MAX_IMAGE_PIXELS


def test_only_rows_capped(tmp_path) -> None:
    fig = plot_alignment(torch.ones(80, 1), ["a"], [f"t{i}" for i in range(80)],
                         max_cells=20)
    assert fig.get_suptitle() == "showing the first 20 of 80 target words"
    assert _parts(fig)[1].get_array().shape == (20, 1)


def test_alignment_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"shape \(3, 4\), expected \(2, 4\)"):
        plot_alignment(torch.zeros(3, 4), ["a", "b", "c", "d"], ["x", "y"])
    with pytest.raises(InputError, match="empty"):
        plot_alignment(torch.zeros(0, 2), ["a", "b"], [])
    for bad in (0, MAX_CELLS + 1, 2.0, True):
        with pytest.raises(InputError, match="max_cells"):
            plot_alignment(torch.zeros(1, 1), ["a"], ["x"], max_cells=bad)


def test_bleu_by_length_plot(tmp_path) -> None:
    buckets = [LengthBucket(0, 10, 5, 30.0), LengthBucket(10, 20, 3, 25.0),
               LengthBucket(20, None, 0, None)]
    path = tmp_path / "b.png"
    fig = plot_bleu_by_length({"RNNsearch": buckets, "RNNencdec": buckets[:2]}, path)
    assert path.read_bytes()[:8] == PNG
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["RNNsearch", "RNNencdec"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["RNNsearch", "RNNencdec"]
    assert ax.get_xlabel() == "source sentence length (tokens)" and ax.get_ylabel() == "BLEU"
    assert ax.get_title() == "BLEU by source sentence length"
    # one test set: each bucket's span and count under it; the empty bucket is left out
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0-9\n5 sentences",
                                                            "10-19\n3 sentences"]
    assert ax.get_ylim()[0] == 0
    width, height = png_size(path)
    assert width <= MAX_IMAGE_PIXELS and height <= MAX_IMAGE_PIXELS
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_bleu_by_length({})


def test_bleu_by_length_counts_per_point_when_systems_differ() -> None:
    fig = plot_bleu_by_length({"a": [LengthBucket(0, 10, 5, 30.0)],
                               "b": [LengthBucket(0, 10, 4, 20.0), LengthBucket(10, None, 2, 9.0)]})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0-9", "10+"]
    assert sorted(t.get_text() for t in ax.texts) == ["n=2", "n=4", "n=5"]
