"""The README runs as written: its Python example, and every command it shows.

`test_readme_commands_run` runs each `bahdanau` command of the README in order, in a folder of
its own, as `bahdanau.cli.main` (the same code as the `bahdanau` executable), with small
arguments appended: the main job as a tiny model for 2 updates (the real one trains for 12
minutes), decoding with greedy search and short outputs. The installs and the test command are
what CI runs (`.ci/run`'s README phase runs them verbatim), which
`test_ci_runs_the_readme_s_set_up_commands` holds it to.
"""

from __future__ import annotations

import importlib.util
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from bahdanau.cli import main
from bahdanau.jobs import TrainOptions
from bahdanau.jobs.options import DEFAULT_EPOCHS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEFAULT_JOB = ROOT / "docs" / "default-job.md"
CI = ROOT / ".ci" / "run"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# What the test appends to the README's commands to run them in seconds.
SMALL = {"train": ["--preset", "tiny", "--max-steps", "2", "--time-budget", "0",
                   "--beam-size", "1", "--max-len", "5", "--threads", "1"],
         "translate": ["--beam-size", "1", "--max-len", "5", "--threads", "1"],
         "evaluate": ["--beam-size", "1", "--max-len", "5", "--threads", "1"],
         "plot": ["--max-len", "5", "--threads", "1"]}


def _blocks(info: str) -> list[str]:
    return [body for tag, body in FENCE.findall(README.read_text(encoding="utf-8"))
            if tag.strip() == info]


def _shell_lines() -> list[str]:
    """The README's shell commands: bash blocks, continuations joined, comments dropped, each
    `&&` list split into its commands."""
    lines = []
    for body in _blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            lines += [part.strip() for part in line.split("&&") if part.strip()]
    return lines


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
    """The main job's length and its log file as the options define them, in the README and
    its page; TensorBoard on the page."""
    if not README.is_file():
        pytest.skip("README.md is not next to the tests (installed package)")
    text = " ".join(README.read_text(encoding="utf-8").split())
    section = text.split("## Install and run the main job")[1].split("## ")[0]
    page = " ".join(DEFAULT_JOB.read_text(encoding="utf-8").split())
    assert TrainOptions().limits["max_epochs"] == DEFAULT_EPOCHS
    for words in (section, page):
        assert f"for {DEFAULT_EPOCHS} epochs" in words and "13 to 20 minutes" in words
        assert "`train.log`" in words and "`options.json`" in words
    assert "--tensorboard" in page


def test_the_released_model_is_the_averaged_one() -> None:
    """The README released `--checkpoint runs/multi30k-avg`, which resolves to the run's best
    or last checkpoint, not the average the text before it made (`avg3.pt`); the commands
    are on the default job's page now."""
    if not DEFAULT_JOB.is_file():
        pytest.skip("docs/ is not next to the tests (installed package)")
    text = DEFAULT_JOB.read_text(encoding="utf-8")
    averaged = re.findall(r"bahdanau average .*--output (\S+)", text)
    released = re.findall(r"bahdanau release --checkpoint (\S+)", text)
    assert averaged and released and released[0] == averaged[0], (averaged, released)


def test_readme_shows_only_commands_that_are_run() -> None:
    """Each shell command of the README is an install, the test command, or a `bahdanau`
    command (`test_readme_commands_run` runs those); the one line of the main job installs
    the CPU build of the torch that CI pins, then the package with extras that exist."""
    if not README.is_file():
        pytest.skip("README.md is not next to the tests (installed package)")
    lines = _shell_lines()
    others = [line for line in lines if not (
        line.startswith(("pip install ", "bahdanau ", "echo "))
        or line == "TRITON_INTERPRET=1 python -m pytest -q")]
    assert not others, others
    [one_line] = [body.strip() for body in _blocks("bash") if "bahdanau train" in body
                  and "pip install torch" in body]
    torch_install, package_install, train = one_line.split(" && ")
    pin = re.search(r'TORCH_PIN="([^"]+)"', CI.read_text()).group(1)
    assert torch_install == f"pip install {pin} --index-url {CPU_INDEX}"
    extras = re.fullmatch(r'pip install -e "\.\[([a-z,]+)\]"', package_install).group(1)
    table = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    declared = re.findall(r"^(\w+) = \[", table.split("\n[")[0], re.M)   # no tomllib on 3.10
    assert set(extras.split(",")) <= set(declared) and train == "bahdanau train"


def test_ci_runs_the_readme_s_set_up_commands() -> None:
    """CI's README phase runs the README's torch install and its test command as written."""
    if not README.is_file() or not CI.is_file():
        pytest.skip("README.md and .ci/run are not next to the tests (installed package)")
    [test_command] = [b.strip() for b in _blocks("bash") if "pytest" in b]
    assert test_command == 'pip install -e ".[test]" && TRITON_INTERPRET=1 python -m pytest -q'
    torch_install = next(line for line in _shell_lines() if line.startswith("pip install torch"))
    ci = [line.split("  #")[0].strip() for line in CI.read_text().splitlines()]
    start = next(i for i, line in enumerate(ci) if line.startswith('phase "README'))
    phase = ci[start:]
    assert torch_install in phase and test_command in phase


@pytest.mark.slow
def test_readme_commands_run(tmp_path, monkeypatch, capsys) -> None:
    """Every `bahdanau` command of the README, in order, with the files it names: the main job
    (small), then translate from a pipe, evaluate on the shipped test set, plot, --help, and the
    Python lines that load the trained run."""
    if not README.is_file():
        pytest.skip("README.md is not next to the tests (installed package)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bahdanau").symlink_to(ROOT / "bahdanau")     # the README's paths, from the root
    ran = []
    for line in _shell_lines():
        if line.startswith("pip install ") or "pytest" in line:
            continue
        stdin = None
        if line.startswith("echo "):
            echoed, line = (part.strip() for part in line.split("|"))
            stdin = shlex.split(echoed)[1] + "\n"
        argv = shlex.split(line)[1:]
        if argv[0] == "plot" and importlib.util.find_spec("matplotlib") is None:
            continue                                   # the plot extra is not installed
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        small = SMALL.get(argv[0], []) if "--help" not in argv else []
        try:
            code = main([*argv, *small])
        except SystemExit as exit_:                     # --help
            code = exit_.code
        said = capsys.readouterr()
        assert code == 0, (line, said.err)
        ran.append((argv[0], said.out))
    commands = [name for name, _ in ran]
    assert commands[:3] == ["train", "translate", "evaluate"] and commands[-1] == "train"
    assert len(ran[1][1].splitlines()) == 1                   # one translation, for one line
    assert "BLEU" in ran[2][1]
    assert (tmp_path / "runs" / "multi30k-en-fr" / "metrics.json").is_file()
    [code] = _blocks("python run-after-main-job")
    exec(compile(code, str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("[") and printed.count("\n") == 1
