"""The command line end to end on a tiny model: train with several checkpoints kept (and an EMA),
`bahdanau average --last/--best`, then translate and evaluate with the average and with an
ensemble."""

from __future__ import annotations

import json

import pytest
import torch
from training_fixtures import interrupt_after, logged, write_multi30k_slice

from bahdanau.checkpoint import load_checkpoint
from bahdanau.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("average")
    write_multi30k_slice(root, 50, 10)
    argv = ["train", "--train-src", str(root / "tr.en"), "--train-tgt", str(root / "tr.fr"),
            "--dev-src", str(root / "te.en"), "--dev-tgt", str(root / "te.fr"),
            "--preset", "tiny", "--max-steps", "8", "--time-budget", "0",
            "--out", str(root / "run"), "--eval-every", "2", "--save-every", "2",
            "--keep-last", "2", "--keep-best", "3", "--ema-decay", "0.9",
            "--train-batch-size", "16", "--max-len", "6", "--threads", "1"]
    assert main(argv) == 0
    return root


def test_train_keeps_the_last_and_the_best_with_their_ema(run) -> None:
    folder = run / "run" / "checkpoints"
    numbered = sorted(p.name for p in folder.glob("step_*.pt"))
    last = load_checkpoint(folder / "step_00000008.pt")
    ranked = [entry["step"] for entry in last["best_n"]]
    assert len(ranked) == 3
    assert set(numbered) == {f"step_{s:08d}.pt" for s in {6, 8, *ranked}}
    assert last["ema"].keys() == last["model"].keys()
    assert last["train_config"]["ema_decay"] == 0.9 and last["train_config"]["keep_best"] == 3


def test_average_last_and_best_then_translate(run, capsys) -> None:
    folder = run / "run" / "checkpoints"
    out = run / "last2.pt"
    assert main(["average", "--checkpoint", str(run / "run"), "--last", "2",
                 "--output", str(out)]) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    members = [load_checkpoint(folder / f"step_{s:08d}.pt")["ema"] for s in (6, 8)]
    averaged = load_checkpoint(out)
    for key, value in averaged["model"].items():
        expected = (members[0][key].double() + members[1][key].double()) / 2
        torch.testing.assert_close(value.double(), expected, rtol=2**-24, atol=0)
    best = run / "best3.pt"
    assert main(["average", "--checkpoint", str(run / "run"), "--best", "3",
                 "--output", str(best)]) == 0
    assert len(load_checkpoint(best)["extra"]["averaged_from"]) == 3
    capsys.readouterr()

    assert main(["translate", "--checkpoint", str(out), "--input", str(run / "te.en"),
                 "--beam-size", "2", "--max-len", "6"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 10
    assert main(["translate", "--checkpoint", str(out), str(run / "run"),
                 "--input", str(run / "te.en"), "--beam-size", "2", "--max-len", "6"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 10
    scores = run / "scores.json"
    assert main(["evaluate", "--checkpoint", str(out), str(best), "--src", str(run / "te.en"),
                 "--ref", str(run / "te.fr"), "--beam-size", "1", "--max-len", "6",
                 "--json", str(scores)]) == 0
    assert json.loads(scores.read_text())["sentences"] == 10


def test_average_refuses_what_it_cannot_do(run, capsys) -> None:
    folder = run / "run" / "checkpoints"
    latest = folder / "step_00000008.pt"
    before = latest.read_bytes()
    kept = len(list(folder.glob("step_*.pt")))
    cases = [
        (["--checkpoint", str(folder / "step_00000006.pt"), str(latest), "--output", str(latest)],
         f"--output {latest} is also --checkpoint {latest}: writing it would destroy it"),
        (["--checkpoint", str(run / "run"), "--last", "5", "--output", str(run / "x.pt")],
         f"holds 2 numbered checkpoints, not the 5 of --last 5 (its last 2 saves, --keep-last "
         f"2; the older checkpoints ({kept - 2}) are kept as its best evaluations"),
        (["--checkpoint", str(run / "run"), "--best", "4", "--output", str(run / "x.pt")],
         "ranks 3 evaluated checkpoints, not 4"),
        (["--checkpoint", str(run / "run"), "--output", str(run / "x.pt")],
         "is a folder: give --last N or --best N"),
        (["--checkpoint", str(run / "run"), "--last", "2", "--best", "2", "--output",
          str(run / "x.pt")], "give --last N or --best N, not both"),
    ]
    for argv, message in cases:
        assert main(["average", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert latest.read_bytes() == before and not (run / "x.pt").exists()


def test_average_last_leaves_out_the_checkpoints_of_an_interruption(tmp_path, capsys,
                                                                     monkeypatch) -> None:
    """Ctrl-C at step 3 of a run saving every 2 steps writes step 3, marked as such; resumed to
    step 6, `--last 3` averages steps 2, 4 and 6 (not 3, 4 and 6) and says what it left out."""
    write_multi30k_slice(tmp_path, 30, 5)
    argv = ["train", "--train-src", str(tmp_path / "tr.en"), "--train-tgt",
            str(tmp_path / "tr.fr"), "--preset", "tiny", "--max-steps", "6", "--time-budget",
            "0", "--save-every", "2", "--keep-last", "10", "--train-batch-size", "8",
            "--threads", "1", "--out", str(tmp_path / "run")]
    with monkeypatch.context() as patched:
        interrupt_after(patched, 3)
        assert main(argv) == 130
    assert main(argv) == 0
    folder = tmp_path / "run" / "checkpoints"
    saved = {int(p.stem[5:]): load_checkpoint(p) for p in folder.glob("step_*.pt")}
    assert {step: payload.get("stopped") for step, payload in saved.items()} == {
        2: None, 3: "sigint", 4: None, 6: None}
    capsys.readouterr()
    out = tmp_path / "last3.pt"
    assert main(["average", "--checkpoint", str(tmp_path / "run"), "--last", "3",
                 "--output", str(out)]) == 0
    assert [m["step"] for m in load_checkpoint(out)["extra"]["averaged_from"]] == [2, 4, 6]
    said = capsys.readouterr()
    assert logged(said.err) == ["--last 3 leaves out step_00000003.pt (sigint): saved when the "
                                "run was interrupted, off its schedule (name them to average "
                                "them)"]
    assert "step_00000003" not in said.out
    assert main(["average", "--checkpoint", str(tmp_path / "run"), "--last", "4",
                 "--output", str(tmp_path / "last4.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("holds 3 numbered checkpoints saved on the run's "
                                     "schedule and 1 saved when the run was interrupted") in err
