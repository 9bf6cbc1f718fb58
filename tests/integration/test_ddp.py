"""Two CPU processes (gloo) train with DistributedDataParallel and keep identical weights, and
a run with dropout resumed from its checkpoint ends with the weights of an uninterrupted one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("_ddp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GLOO = pytest.mark.skipif(not torch.distributed.is_available()
                          or not torch.distributed.is_gloo_available(),
                          reason="torch.distributed with gloo is not available")


def _run_worker(out: Path, *mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(WORKER), str(out), str(_free_port()), *mode],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@GLOO
def test_ddp_two_processes_identical_weights(tmp_path) -> None:
    _run_worker(tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["step"] == ranks[1]["step"] == 12
    for key, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][key]), key
    # Each rank trained on half the data of each epoch, and the shared weights improved.
    assert ranks[0]["final"] < ranks[0]["initial"] - 0.1
    # Only rank 0 logs and saves.
    assert ranks[0]["lines"] and not ranks[1]["lines"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000012.pt"]
    # One update of 4 uneven batches, 2 per process: the gradient of the update's summed loss
    # over its 11 sentences, as one process gets it on one batch of them all (float64).
    step = torch.load(tmp_path / "float64.pt", weights_only=True)
    assert step["change"].keys() == step["gradient"].keys()
    for name, gradient in step["gradient"].items():
        assert torch.allclose(step["change"][name], gradient, rtol=1e-12, atol=1e-15), name
    assert any(g.abs().max() > 1e-6 for g in step["gradient"].values())
    # train_step's loss and token count are the whole update's, summed over the processes
    (loss_sum, n_tokens), (whole_loss, whole_tokens) = step["stats"], step["whole"]
    assert n_tokens == whole_tokens and loss_sum == pytest.approx(whole_loss, rel=1e-12)


@GLOO
def test_ddp_resume_with_dropout_is_exact(tmp_path) -> None:
    """Each process resumes its own random draws (dropout masks): rank 0's state restored on
    both would give rank 1 other masks, and other weights, from the resumed step on."""
    _run_worker(tmp_path, "resume")
    ranks = [torch.load(tmp_path / f"resume{r}.pt", weights_only=True) for r in range(2)]
    for weights in ranks:
        for key, value in weights["straight"].items():
            assert torch.equal(weights["resumed"][key], value), key
    payload = torch.load(tmp_path / "resumed" / "step_00000008.pt", weights_only=True)
    streams = [state["torch"] for state in payload["rng_by_rank"]]
    assert len(streams) == 2 and not torch.equal(*streams)   # the ranks drew differently
    # one rank's infinite loss skips the update on both, which keep the same weights
    assert [(r["skipped"], r["unchanged"]) for r in ranks] == [(True, True), (True, True)]
