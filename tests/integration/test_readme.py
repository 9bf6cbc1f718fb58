"""The README's quick-start example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bahdanau.jobs import TrainOptions
from bahdanau.jobs.options import DEFAULT_EPOCHS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_quick_start_runs(capsys) -> None:
    if not README.is_file():
        pytest.skip("README.md is not next to the tests (installed package)")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], str(README), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "80451000"                                  # the documented count
    assert "torch.Size([" in out[1]


def test_main_job_section_states_the_defaults() -> None:
    """The main job's length, its log file and TensorBoard, as the options define them."""
    if not README.is_file():
        pytest.skip("README.md is not next to the tests (installed package)")
    text = " ".join(README.read_text(encoding="utf-8").split())
    section = text.split("## Train and evaluate (the main job)")[1].split("## ")[0]
    assert TrainOptions().limits["max_epochs"] == DEFAULT_EPOCHS
    assert f"for {DEFAULT_EPOCHS} epochs" in section and "about 12 minutes" in section
    assert "`train.log`" in section and "--tensorboard" in section


def test_the_released_model_is_the_averaged_one() -> None:
    """The README released `--checkpoint runs/multi30k-avg`, which resolves to the run's best
    or last checkpoint, not the average the text before it made (`avg3.pt`)."""
    if not README.is_file():
        pytest.skip("README.md is not next to the tests (installed package)")
    text = README.read_text(encoding="utf-8")
    averaged = re.findall(r"bahdanau average .*--output (\S+)", text)
    released = re.findall(r"bahdanau release --checkpoint (\S+)", text)
    assert averaged and released and released[0] == averaged[0], (averaged, released)
