"""The command line on a tiny model: train, translate, evaluate, plot (bad inputs: in
test_bad_inputs.py; run folders, resumes and signals: in test_runs.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bahdanau.cli import main
from bahdanau.datasets import multi30k_files, read_lines


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    en = read_lines(multi30k_files("train", "en"))[:120]
    fr = read_lines(multi30k_files("train", "fr"))[:120]
    for name, lines in (("tr.en", en[:100]), ("tr.fr", fr[:100]), ("te.en", en[100:]),
                        ("te.fr", fr[100:])):
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def trained(files):
    out = files / "run"
    argv = ["train", "--train-src", str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"),
            "--dev-src", str(files / "te.en"), "--dev-tgt", str(files / "te.fr"),
            "--test-src", str(files / "te.en"), "--test-tgt", str(files / "te.fr"),
            "--preset", "tiny", "--max-steps", "6", "--time-budget", "0", "--out", str(out),
            "--eval-every", "3", "--save-every", "3", "--beam-size", "2", "--max-len", "8",
            "--threads", "1"]
    assert main(argv) == 0
    return out


def test_train_writes_outputs(trained) -> None:
    metrics = json.loads((trained / "metrics.json").read_text())
    assert metrics["sentences"] == 20 and metrics["updates"] == 6
    assert "tok:13a" in metrics["bleu_signature"]
    assert len((trained / "test.hyp.txt").read_text().splitlines()) == 20
    assert (trained / "alignment.png").read_bytes()[:4] == b"\x89PNG"
    assert (trained / "checkpoints" / "best.pt").is_file()


def test_resume_continues_from_checkpoint(trained, files, capsys) -> None:
    argv = ["train", "--train-src", str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"),
            "--test-src", str(files / "te.en"), "--test-tgt", str(files / "te.fr"),
            "--dev-src", str(files / "te.en"), "--dev-tgt", str(files / "te.fr"),
            "--eval-every", "3",
            "--preset", "tiny", "--max-steps", "8", "--time-budget", "0", "--out", str(trained),
            "--beam-size", "1", "--max-len", "5", "--threads", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "trained 8 updates" in out


def test_translate_evaluate_plot(trained, files, capsys, tmp_path) -> None:
    align = tmp_path / "al.jsonl"
    assert main(["translate", "--checkpoint", str(trained), "--input", str(files / "te.en"),
                 "--beam-size", "2", "--max-len", "6", "--alignments", str(align)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 20
    record = json.loads(align.read_text().splitlines()[0])
    assert len(record["weights"]) == len(record["target"])
    assert len(record["weights"][0]) == len(record["source"])
    assert main(["translate", "--checkpoint", str(trained), "--input", str(files / "te.en"),
                 "--beam-size", "3", "--n-best", "2", "--max-len", "4"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 40
    scores = tmp_path / "s.json"
    assert main(["evaluate", "--checkpoint", str(trained), "--src", str(files / "te.en"),
                 "--ref", str(files / "te.fr"), "--beam-size", "1", "--max-len", "6",
                 "--json", str(scores)]) == 0
    assert json.loads(scores.read_text())["sentences"] == 20
    image = tmp_path / "p.png"
    assert main(["plot", "--checkpoint", str(trained), "--input", str(files / "te.en"),
                 "--line", "3", "--output", str(image), "--max-len", "6"]) == 0
    assert image.read_bytes()[:4] == b"\x89PNG"


def test_help_and_bad_option() -> None:
    for sub in ([], ["train"], ["translate"], ["evaluate"], ["plot"]):
        out = subprocess.run([sys.executable, "-m", "bahdanau", *sub, "--help"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "usage: bahdanau" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "bahdanau", "train", "--bogus"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "unrecognized arguments: --bogus" in bad.stderr and "Traceback" not in bad.stderr
