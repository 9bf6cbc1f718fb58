"""`bahdanau train` under torchrun: two gloo processes on the CPU train one run, rank 0 alone
writes the run folder, SIGTERM stops both at the same step with one checkpoint, and the run
resumes in one process with twice the accumulation, ending with the weights that one process
with that accumulation trains from the start (and, finished, one process with it leaves the
run as it is)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from training_fixtures import logged, write_multi30k_slice

from bahdanau.cli import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.distributed.is_available()
                       or not torch.distributed.is_gloo_available(),
                       reason="torch.distributed with gloo is not available"),
]

# Token batches of uneven sentence counts: the gradient of an update shared by two processes
# must be its summed loss over all its sentences, not the mean of the processes' averages.
BASE = ["--preset", "tiny", "--beam-size", "1", "--max-len", "5", "--threads", "1",
        "--log-every", "1", "--max-tokens", "150", "--save-every", "100000"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "-m", "bahdanau"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-src", str(data / "tr.en"), "--train-tgt", str(data / "tr.fr"),
            "--test-src", str(data / "te.en"), "--test-tgt", str(data / "te.fr"), *BASE,
            "--out", str(out), *extra]


def _checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def test_torchrun_trains_one_run_and_resumes_in_one_process(tmp_path, capsys) -> None:
    data = write_multi30k_slice(tmp_path, 120, 10)
    out = tmp_path / "two"
    done = subprocess.run([*TORCHRUN, *_argv(data, out, "--max-steps", "2")],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # Rank 0 alone logs, writes the run folder and scores the test set.
    assert done.stderr.count("trained 2 updates") == done.stderr.count("BLEU without") == 1
    assert "2 processes x accumulation 1 = 2 batches per update" in done.stderr
    assert _checkpoints(out) == ["step_00000002.pt"]
    assert _load(out / "checkpoints" / "step_00000002.pt")["train_state"]["processes"] == 2
    log = logged((out / "train.log").read_text())
    assert sum(line.startswith("# bahdanau train") for line in log) == 1
    assert "trained 2 updates" in "\n".join(log)
    assert (out / "metrics.json").is_file() and (out / "options.json").is_file()
    # Finished, it is left as it is by one process asked for the same updates.
    capsys.readouterr()
    assert main(_argv(data, out, "--max-steps", "2", "--accumulation", "2")) == 0
    assert logged(capsys.readouterr().err)[0].startswith("nothing to do: the run in")

    # SIGTERM to torchrun reaches both processes; they agree on one step and rank 0 saves it.
    proc = subprocess.Popen([*TORCHRUN, *_argv(data, out, "--max-steps", "100000")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + 240
    for line in proc.stderr:
        if logged(line) and logged(line)[0].startswith("step 5 "):
            break
        assert time.monotonic() < deadline, "training did not resume"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert err.count("stopped by SIGTERM") == 1, err[-3000:]
    stopped = [name for name in _checkpoints(out) if name != "step_00000002.pt"]
    assert len(stopped) == 1
    step = _load(out / "checkpoints" / stopped[0])["train_state"]["step"]
    assert step >= 5

    # One process resumes only with the accumulation that keeps 2 batches per update.
    resume = _argv(data, out, "--max-steps", str(step + 2))
    capsys.readouterr()
    assert main(resume) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "with 1 process, use accumulation 2" in error
    assert main([*resume, "--accumulation", "2"]) == 0
    alone = tmp_path / "one"
    assert main(_argv(data, alone, "--max-steps", str(step + 2), "--accumulation", "2")) == 0
    name = f"step_{step + 2:08d}.pt"
    resumed, straight = (_load(o / "checkpoints" / name)["model"] for o in (out, alone))
    for key, value in straight.items():
        assert torch.allclose(resumed[key], value, rtol=1e-4, atol=1e-6), key
