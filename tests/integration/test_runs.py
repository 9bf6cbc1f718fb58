"""Run folders never lose work: resume rules, --overwrite, finished runs, signals, test sets.

The command line on a tiny model trained on 50 Multi30k pairs; each test checks what the run
folder holds afterwards against what the user asked for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from training_fixtures import interrupt_after, logged, write_multi30k_slice

from bahdanau import InputError, TrainConfig, Vocab, build_model, presets
from bahdanau.cli import main
from bahdanau.data import DefaultTokenizer, encode_pairs, read_lines
from bahdanau.jobs import train_job
from bahdanau.jobs.report import score_translations
from bahdanau.training import setup_run, train
from bahdanau.training.threads import AdaptiveThreads

BASE = ["--preset", "tiny", "--time-budget", "0", "--beam-size", "1", "--max-len", "5",
        "--threads", "1", "--log-every", "1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    write_multi30k_slice(root, 50, 10)
    return root


def _argv(data: Path, out: Path, *extra: str, test: bool = True) -> list[str]:
    files = ["--train-src", str(data / "tr.en"), "--train-tgt", str(data / "tr.fr")]
    if test:
        files += ["--test-src", str(data / "te.en"), "--test-tgt", str(data / "te.fr")]
    return ["train", *files, *BASE, "--out", str(out), *extra]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _stored_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["train_state"]["step"]


def test_rerunning_a_finished_run_does_nothing(data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "2", "--save-every", "1")) == 0
    before = _files(out)
    capsys.readouterr()
    assert main(_argv(data, out, "--max-steps", "2", "--save-every", "1")) == 0
    said = logged(capsys.readouterr().err)
    assert said[0].startswith("nothing to do") and "step 2" in said[0]
    assert _files(out) == before


def test_the_test_set_is_decoded_at_the_chosen_thread_count_not_at_one_on_trial(
        data, tmp_path, monkeypatch) -> None:
    """Without --threads the updates try thread counts (`AdaptiveThreads`); a run that ends
    during a trial decodes its test set at the count chosen, not at the one on trial."""
    threads = [0]                                   # what the run has set, as torch would
    tuner = AdaptiveThreads(2, trial=1, warm_up=1, hold=4, log=lambda line: None,
                            set_threads=lambda n: threads.__setitem__(0, n))
    monkeypatch.setattr(train_job, "thread_tuner", lambda o, device: tuner)
    during: list[int] = []

    def scored(*args, **kwargs):
        during.append(threads[0])
        return score_translations(*args, **kwargs)

    monkeypatch.setattr(train_job, "score_translations", scored)
    argv = _argv(data, tmp_path / "run", "--max-steps", "2")
    at = argv.index("--threads")
    del argv[at:at + 2]
    assert main(argv) == 0       # update 1 warms up, update 2 measures 2 threads, then 1 on trial
    assert tuner.trials == 1 and during == [2]


def test_a_finished_run_is_left_alone_unless_asked_for_more(data, tmp_path, capsys) -> None:
    """A run that reached its --max-steps: the same command, or one without its limit, leaves
    it as it is (one line, status 0; the default job's length is no longer taken); a changed
    option that trains no further is one error line; a larger limit continues it."""
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "2", "--save-every", "1")) == 0
    before = _files(out)
    capsys.readouterr()
    for argv in (_argv(data, out, "--max-steps", "2", "--save-every", "1"),
                 _argv(data, out, "--save-every", "1")):             # its limit left out
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert logged(err) == [f"nothing to do: the run in {out} finished at step 2 "
                               "(--max-steps 2); raise its limit to train on, or score it "
                               "with bahdanau evaluate"], err
        assert _files(out) == before
    for changed, said in ((["--max-steps", "1"], "--max-steps 2 -> 1"),
                          (["--max-steps", "2", "--lr", "0.5"], "--lr default -> 0.5")):
        assert main(_argv(data, out, "--save-every", "1", *changed)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("bahdanau: error: the run in "), err
        assert said in err and "give a larger --max-steps" in err and "--overwrite" in err
        assert _files(out) == before
    assert main(_argv(data, out, "--max-steps", "3", "--save-every", "1")) == 0
    err = capsys.readouterr().err
    assert "changed on resume: --max-steps 2 -> 3" in err and "trained 3 updates" in err
    assert _stored_step(out / "checkpoints" / "step_00000003.pt") == 3


def test_an_interrupted_run_resumes_to_its_own_limit(data, tmp_path, capsys,
                                                     monkeypatch) -> None:
    """`bahdanau train --out RUN` with no limit resumes an interrupted --max-steps run to its
    own limit: not for another length, and with no limit asked of the user's own corpus."""
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        interrupt_after(patched, 1)
        assert main(_argv(data, out, "--max-steps", "3")) == 128 + signal.SIGINT
    assert "stopped by SIGINT at step 1" in capsys.readouterr().err
    assert main(_argv(data, out)) == 0
    err = capsys.readouterr().err
    assert "trained 3 updates" in err and "changed on resume" not in err
    assert json.loads((out / "options.json").read_text())["max_steps"] == 3


def test_resume_applies_and_records_changed_options(data, tmp_path, capsys) -> None:
    """A new learning rate and step limit take effect on resume, are logged, and are what the
    next checkpoint and options.json record; the optimizer really uses the new rate."""
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "2", "--lr", "0.001")) == 0
    capsys.readouterr()
    assert main(_argv(data, out, "--max-steps", "4", "--lr", "0.0005")) == 0
    said = capsys.readouterr().err
    assert "changed on resume: --lr 0.001 -> 0.0005" in said
    assert "changed on resume: --max-steps 2 -> 4" in said and "trained 4 updates" in said
    payload = torch.load(out / "checkpoints" / "step_00000004.pt", weights_only=True)
    assert payload["train_config"]["lr"] == 0.0005
    assert {g["lr"] for g in payload["optimizer"]["param_groups"]} == {0.0005}
    assert json.loads((out / "options.json").read_text())["lr"] == 0.0005


def test_optimisation_and_dropout_options_reach_the_run(data, tmp_path, capsys) -> None:
    """Label smoothing, token batches, accumulation, the schedule and the dropout placements
    go from the command line into the run's TrainConfig and ModelConfig; on resume the
    schedule may change, the accumulation (in one process) and the dropout may not."""
    out = tmp_path / "run"
    options = ["--label-smoothing", "0.2", "--max-tokens", "120", "--accumulation", "2",
               "--schedule", "inverse_sqrt", "--warmup-steps", "4", "--min-lr", "0.0001",
               "--dropout-rnn-inputs", "0.2", "--dropout-deep-output", "0.3"]
    assert main(_argv(data, out, "--max-steps", "2", *options, test=False)) == 0
    payload = torch.load(out / "checkpoints" / "step_00000002.pt", weights_only=True)
    assert {k: payload["train_config"][k] for k in (
        "label_smoothing", "max_tokens", "accumulation", "schedule", "warmup_steps", "min_lr")
            } == {"label_smoothing": 0.2, "max_tokens": 120, "accumulation": 2,
                  "schedule": "inverse_sqrt", "warmup_steps": 4, "min_lr": 1e-4}
    assert (payload["model_config"]["dropout_rnn_inputs"],
            payload["model_config"]["dropout_deep_output"]) == (0.2, 0.3)
    assert payload["train_state"]["position"] == 4                  # 2 updates of 2 batches
    assert [g["lr"] for g in payload["optimizer"]["param_groups"]] == [pytest.approx(5e-4)]
    capsys.readouterr()
    before = _files(out)
    fewer = [*options[:4], "--accumulation", "1", *options[6:]]
    assert main(_argv(data, out, "--max-steps", "3", *fewer, test=False)) == 2
    assert "use accumulation 2" in capsys.readouterr().err and _files(out) == before
    resumed = [*options[:6], "--schedule", "constant", *options[8:10], *options[12:]]  # no --min-lr
    assert main(_argv(data, out, "--max-steps", "3", *resumed, "--threads", "2",
                      test=False)) == 0
    said = capsys.readouterr().err
    assert "changed on resume: --threads 1 -> 2" in said
    assert "changed on resume: --schedule 'inverse_sqrt' -> 'constant'" in said
    payload = torch.load(out / "checkpoints" / "step_00000003.pt", weights_only=True)
    assert payload["train_state"]["position"] == 6
    assert [g["lr"] for g in payload["optimizer"]["param_groups"]] == [pytest.approx(7.5e-4)]
    before = _files(out)
    changed = [*resumed[:-2], "--dropout-deep-output", "0.1"]
    assert main(_argv(data, out, "--max-steps", "4", *changed, test=False)) == 2
    assert "--dropout-deep-output" in capsys.readouterr().err and _files(out) == before


def test_no_resume_refuses_and_overwrite_replaces_the_run(data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "3", "--save-every", "1")) == 0
    (out / "my-notes.txt").write_text("kept")
    before = _files(out)
    assert main(_argv(data, out, "--max-steps", "1", "--no-resume")) == 2
    assert "holds a run" in capsys.readouterr().err and _files(out) == before
    assert main(_argv(data, out, "--max-steps", "1", "--overwrite", "--seed", "5")) == 0
    names = sorted(p.name for p in (out / "checkpoints").glob("step_*.pt"))
    assert names == ["step_00000001.pt"]                    # nothing of the old run is left
    assert json.loads((out / "options.json").read_text())["seed"] == 5
    assert (out / "my-notes.txt").read_text() == "kept"
    assert not (out / ".overwritten").exists()


def test_own_corpus_without_test_set_is_not_scored(data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "1", test=False)) == 0
    said = logged(capsys.readouterr().err)
    assert said[0].startswith("machine: cpu") and said[2].startswith("no test set")
    assert not (out / "metrics.json").exists() and (out / "checkpoints").is_dir()


@pytest.mark.parametrize(("world_size", "error"), [
    ("2", "WORLD_SIZE is 2 but RANK, MASTER_ADDR, MASTER_PORT not set: start the processes "
          "with torchrun"),
    ("abc", "WORLD_SIZE must be an integer >= 1 (processes in all), got 'abc'")])
def test_several_processes_need_torchrun(monkeypatch, tmp_path, capsys, world_size,
                                         error) -> None:
    for variable in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    assert main(["train", "--out", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    assert capsys.readouterr().err == f"bahdanau: error: {error}\n"
    assert not (tmp_path / "run").exists()


def test_resume_refuses_other_data_in_the_same_files(data, tmp_path, capsys) -> None:
    """Same file names, other contents (the target lines shifted by one, the vocabulary
    unchanged): the resume is refused; moving the same files elsewhere is not."""
    own = tmp_path / "data"
    own.mkdir()
    for name in ("tr.en", "tr.fr", "te.en", "te.fr"):
        (own / name).write_bytes((data / name).read_bytes())
    out = tmp_path / "run"
    assert main(_argv(own, out, "--max-steps", "1")) == 0
    before = _files(out)
    lines = (own / "tr.fr").read_text().splitlines()
    (own / "tr.fr").write_text("\n".join(lines[1:] + lines[:1]) + "\n")
    capsys.readouterr()
    assert main(_argv(own, out, "--max-steps", "2")) == 2
    err = capsys.readouterr().err
    assert "training examples differ" in err and err.count("\n") == 1
    assert _files(out) == before
    assert main(_argv(data, out, "--max-steps", "2")) == 0       # the same data, moved
    assert "trained 2 updates" in capsys.readouterr().err


def test_a_second_train_into_the_same_folder_is_refused(data, tmp_path, capsys) -> None:
    import fcntl

    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".lock", "a") as held:                   # another process's run
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(_argv(data, out, "--max-steps", "1")) == 2
    assert "in use by another bahdanau train" in capsys.readouterr().err
    assert not (out / "checkpoints").exists() and not (out / "options.json").exists()


def test_overwrite_keeps_a_folder_without_a_run(data, tmp_path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "model.bin").write_text("the user's own")
    assert main(_argv(data, out, "--max-steps", "1", "--overwrite")) == 0
    assert (out / "checkpoints" / "model.bin").read_text() == "the user's own"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_saves_a_checkpoint_and_the_run_resumes(data, tmp_path, sig) -> None:
    """SIGTERM / SIGINT during training: the step finishes, a checkpoint is saved, the exit
    status is 128 + the signal, and the same command continues from that step."""
    out = tmp_path / "run"
    argv = _argv(data, out, "--max-steps", "100000", "--save-every", "100000")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bahdanau", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    for line in proc.stderr:                                 # wait until a few steps ran
        if logged(line) and logged(line)[0].startswith("step 3 "):
            break
        assert time.monotonic() < deadline, "training did not start"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert f"stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err
    [saved] = sorted((out / "checkpoints").glob("step_*.pt"))
    step = _stored_step(saved)
    assert step >= 3
    resumed = subprocess.run([sys.executable, "-m", "bahdanau",
                              *_argv(data, out, "--max-steps", str(step + 2))],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {saved} at step {step}" in resumed.stderr
    assert f"trained {step + 2} updates" in resumed.stderr


def _interrupted_after(delay: float, argv: list[str]) -> subprocess.CompletedProcess:
    """`python -m bahdanau ARGV`, sent SIGINT `delay` seconds after it was started (stdin an
    open pipe, which a translate waits on)."""
    proc = subprocess.Popen([sys.executable, "-m", "bahdanau", *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("delay", [0.2, 0.5, 1.0])
def test_ctrl_c_while_train_starts_is_one_line(data, tmp_path, delay) -> None:
    """Ctrl-C while `bahdanau train` starts (importing torch, reading, building: before the
    loop's own handler) gave a KeyboardInterrupt traceback of some thirty lines, or an
    ImportError from a C extension cut in its initialisation: it is one line and status 130
    whenever it comes."""
    out = tmp_path / "run"
    child = _interrupted_after(delay, _argv(data, out, "--max-steps", "100000", "--quiet"))
    assert child.returncode == 130, child.stderr
    assert child.stderr.count("\n") <= 2 and "Traceback" not in child.stderr, child.stderr
    assert "bahdanau: interrupted" in child.stderr or "stopped by SIGINT" in child.stderr


@pytest.mark.parametrize("delay", [0.5, 1.5])
def test_ctrl_c_while_translate_starts_is_one_line(data, tmp_path, delay) -> None:
    """The same for another command: translate, interrupted while it imports or loads the
    model, or as it waits on stdin."""
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "1", "--quiet", test=False)) == 0
    child = _interrupted_after(delay, ["translate", "--checkpoint", str(out), "--quiet"])
    assert child.returncode == 130, child.stderr
    assert child.stderr == "bahdanau: interrupted\n"


def test_importing_the_library_leaves_sigint_alone() -> None:
    """Only the command's own process gets the start-up handler: a program that imports
    bahdanau keeps Python's KeyboardInterrupt. The child sets that handler itself first: a
    process started in the background inherits SIGINT ignored, and Python then leaves it so."""
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "import bahdanau, bahdanau.cli; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
    assert child.stdout == "True\n", child.stderr


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def test_a_run_config_reproduces_the_run(data, tmp_path, capsys) -> None:
    """`--config RUN/options.json --out NEW` trains the same weights; flags override the file.
    An optional number turned off (no moving average) is recorded as null, and a null in the
    file turns it off again rather than leaving it to its default."""
    first = tmp_path / "first"
    assert main(_argv(data, first, "--max-steps", "2", "--lr", "0.003", "--ema-decay", "none",
                      test=False)) == 0
    again = tmp_path / "again"
    assert main(["train", "--config", str(first / "options.json"), "--out", str(again)]) == 0
    [a], [b] = (sorted((d / "checkpoints").glob("step_*.pt")) for d in (first, again))
    assert a.name == b.name == "step_00000002.pt"
    assert all(torch.equal(x, y) for x, y in zip(_weights(a).values(), _weights(b).values(),
                                                  strict=True))
    assert (again / "options.json").read_text() == (first / "options.json").read_text()
    assert json.loads((again / "options.json").read_text())["ema_decay"] is None
    assert "ema" not in torch.load(b, weights_only=True)
    longer = tmp_path / "longer"
    assert main(["train", "--config", str(first / "options.json"), "--out", str(longer),
                 "--max-steps", "3"]) == 0
    assert json.loads((longer / "options.json").read_text())["max_steps"] == 3


def _yaml_config(data, tmp_path) -> Path:
    config = tmp_path / "run.yaml"
    config.write_text(f"# a run\ntrain_src: {data / 'tr.en'}\ntrain-tgt: {data / 'tr.fr'}\n"
                      "preset: tiny\nmax_steps: 1\ntime_budget: 0\nlr: 1e-3\nthreads: 1\n")
    return config


def test_yaml_config(data, tmp_path) -> None:
    pytest.importorskip("yaml", reason="reading YAML needs PyYAML (the yaml extra)")
    config = _yaml_config(data, tmp_path)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    stored = json.loads((tmp_path / "run" / "options.json").read_text())
    assert stored["lr"] == 0.001 and stored["preset"] == "tiny"


def test_yaml_config_without_pyyaml_is_one_line(data, tmp_path, capsys, monkeypatch) -> None:
    config = _yaml_config(data, tmp_path)
    monkeypatch.setitem(sys.modules, "yaml", None)           # PyYAML not installed
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs PyYAML" in err and "bahdanau[yaml]" in err
    assert not (tmp_path / "other").exists()


# ----------------------------------------------------------------------------- the API


@pytest.fixture(scope="module")
def examples(data):
    pairs = list(zip(read_lines(data / "tr.en"), read_lines(data / "tr.fr"), strict=True))
    tok = DefaultTokenizer()
    src = Vocab.build(tok.tokenize(s) for s, _ in pairs)
    tgt = Vocab.build(tok.tokenize(t) for _, t in pairs)
    return encode_pairs(pairs, src, tgt, tok), src, tgt


def _model(src: Vocab, tgt: Vocab):
    torch.manual_seed(0)
    return build_model(presets.tiny(len(src), len(tgt)))


def test_api_refuses_a_best_without_numbered_checkpoints(examples, tmp_path) -> None:
    """A folder whose numbered checkpoints were deleted keeps an old best.pt: a new run there
    would be judged against it (and leave it as "best"), so it is refused."""
    exs, src, tgt = examples
    cfg = TrainConfig(batch_size=10, max_steps=2, eval_every=1, log_every=1)
    train(_model(src, tgt), exs, cfg, src_vocab=src, tgt_vocab=tgt, checkpoint_dir=tmp_path,
          validate=lambda m: 1.0, log=lambda _: None)
    for step in tmp_path.glob("step_*.pt"):
        step.unlink()
    before = _files(tmp_path)
    with pytest.raises(InputError, match="best.pt but no numbered checkpoint"):
        setup_run(_model(src, tgt), exs, cfg, src_vocab=src, tgt_vocab=tgt,
                  checkpoint_dir=tmp_path)
    assert _files(tmp_path) == before


def test_api_resume_applies_lr_and_refuses_fixed_fields(examples, tmp_path) -> None:
    exs, src, tgt = examples
    cfg = TrainConfig(optimizer="adam", lr=1e-3, batch_size=10, max_steps=2, log_every=1)
    train(_model(src, tgt), exs, cfg, src_vocab=src, tgt_vocab=tgt, checkpoint_dir=tmp_path,
          log=lambda _: None)
    before = _files(tmp_path)
    for change in ({"optimizer": "adadelta"}, {"batch_size": 12}, {"seed": 9},
                   {"max_tokens": 300}, {"bucket": 3}):
        changed = TrainConfig(**{**cfg.to_dict(), **change})
        with pytest.raises(InputError, match=next(iter(change))):
            setup_run(_model(src, tgt), exs, changed, src_vocab=src, tgt_vocab=tgt,
                      checkpoint_dir=tmp_path)
        assert _files(tmp_path) == before
    faster = TrainConfig(**{**cfg.to_dict(), "lr": 5e-4, "max_steps": 3, "clip_norm": 2.0})
    run = setup_run(_model(src, tgt), exs, faster, src_vocab=src, tgt_vocab=tgt,
                    checkpoint_dir=tmp_path)
    assert run.resume_changes == ["lr: 0.001 -> 0.0005", "clip_norm: 1.0 -> 2.0",
                                  "max_steps: 2 -> 3"]
    assert [g["lr"] for g in run.optimizer.param_groups] == [5e-4]


def test_api_refuses_a_validate_that_returns_nan(examples, tmp_path) -> None:
    """A nan dev score would never be beaten: best.pt would stay the first model for good."""
    exs, src, tgt = examples
    cfg = TrainConfig(batch_size=10, max_steps=2, eval_every=1, log_every=1)
    with pytest.raises(InputError, match="validate returned nan"):
        train(_model(src, tgt), exs, cfg, src_vocab=src, tgt_vocab=tgt,
              validate=lambda m: float("nan"), log=lambda _: None)
