"""Hard alignments: `bahdanau.alignments.argmax_alignment` and `translate --alignments-format
pharaoh` (``i-j`` pairs, source i and target j, 0-based, in target order)."""

from __future__ import annotations

import json

import pytest
import torch
from serving_fixtures import shared_checkpoint, trained_checkpoint
from training_fixtures import one_line_error

from bahdanau.alignments import argmax_alignment
from bahdanau.cli import main
from bahdanau.search import Hypothesis


def test_argmax_alignment_of_a_hand_built_matrix() -> None:
    # 4 target tokens + eos over 3 source tokens; row 2 ties between 0 and 2 (first wins), and
    # the eos row (which points at source 1) makes no pair.
    attention = torch.tensor([[0.1, 0.7, 0.2],
                              [0.6, 0.3, 0.1],
                              [0.4, 0.2, 0.4],
                              [0.0, 0.1, 0.9],
                              [0.2, 0.6, 0.2]])
    hyp = Hypothesis(tokens=[7, 8, 9, 10], log_prob=-1.0, score=-1.0, attention=attention)
    assert argmax_alignment(hyp) == [(1, 0), (0, 1), (0, 2), (2, 3)]
    empty = Hypothesis(tokens=[], log_prob=-1.0, score=-1.0, attention=attention[:1])
    assert argmax_alignment(empty) == []
    one_line_error(lambda: argmax_alignment(Hypothesis([4], -1.0, -1.0)), "RNNencdec")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return shared_checkpoint(tmp_path_factory)


def test_translate_writes_pharaoh_lines_that_match_the_json_weights(checkpoint, tmp_path,
                                                                    capsys) -> None:
    src = tmp_path / "in.en"
    src.write_text("A man is riding a bicycle.\n\nTwo dogs play in the snow.\n", encoding="utf-8")
    common = ["translate", "--checkpoint", str(checkpoint), "--input", str(src),
              "--beam-size", "2", "--max-len", "10", "--alignments"]
    assert main([*common, str(tmp_path / "a.jsonl")]) == 0
    assert main([*common, str(tmp_path / "a.txt"), "--alignments-format", "pharaoh"]) == 0
    capsys.readouterr()
    records = [json.loads(r) for r in (tmp_path / "a.jsonl").read_text().splitlines()]
    lines = (tmp_path / "a.txt").read_text().split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == len(records) == 3
    assert lines[1] == ""                                  # an empty input line: no pairs
    for record, line in zip(records, lines, strict=False):
        weights = record["weights"] or []
        want = [f"{max(range(len(row)), key=row.__getitem__)}-{j}"
                for j, row in enumerate(weights[:-1])]      # the eos row makes no pair
        assert line.split() == want
        for pair in want:                                  # indices into the token lists
            i, j = map(int, pair.split("-"))
            assert i < len(record["source"]) and j < len(record["target"]) - 1


def test_pharaoh_needs_alignments_and_attention(checkpoint, tmp_path, capsys) -> None:
    src = tmp_path / "in.en"
    src.write_text("A man.\n", encoding="utf-8")
    base = ["translate", "--checkpoint", str(checkpoint), "--input", str(src)]
    assert main([*base, "--alignments-format", "pharaoh"]) == 2
    assert "it needs --alignments FILE" in capsys.readouterr().err
    encdec = trained_checkpoint(tmp_path / "encdec.pt", pairs=50, steps=1, arch="rnnencdec")
    out = tmp_path / "a.txt"
    assert main(["translate", "--checkpoint", str(encdec), "--input", str(src),
                 "--alignments", str(out), "--alignments-format", "pharaoh"]) == 2
    assert "needs attention weights" in capsys.readouterr().err and not out.exists()
