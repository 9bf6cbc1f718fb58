"""What a training run records and assumes: train.log, TensorBoard events, the device and thread
defaults, the default job's length, and run folders written under the old defaults.

The command line on a tiny model trained on 50 Multi30k pairs, as in test_runs.py.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from training_fixtures import TIMESTAMP, logged, one_line_error, write_multi30k_slice

import bahdanau
from bahdanau import InputError, load_checkpoint
from bahdanau._checks import default_device, default_threads
from bahdanau.cli import main
from bahdanau.jobs.options import DEFAULT_EPOCHS, TrainOptions, TranslateOptions
from bahdanau.jobs.resolve import beam_search, machine, thread_tuner
from bahdanau.jobs.resume import resume_changes, resumed_options
from bahdanau.training import precision

BASE = ["--preset", "tiny", "--beam-size", "1", "--max-len", "5", "--threads", "1",
        "--log-every", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run-logs")
    write_multi30k_slice(root, 50, 10)
    return root


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-src", str(data / "tr.en"), "--train-tgt", str(data / "tr.fr"),
            "--test-src", str(data / "te.en"), "--test-tgt", str(data / "te.fr"), *BASE,
            "--out", str(out), *extra]


def _starts(log: Path) -> list[tuple[list[str], list[str]]]:
    """train.log as (header lines, other lines) per start, without the times; every line must
    start with one."""
    text = log.read_text(encoding="utf-8")
    assert all(TIMESTAMP.match(line) for line in text.splitlines()), text
    starts: list[tuple[list[str], list[str]]] = []
    for line in logged(text):
        if line.startswith("# "):
            if not starts or starts[-1][1]:
                starts.append(([], []))
            starts[-1][0].append(line)
        else:
            starts[-1][1].append(line)
    return starts


# ----------------------------------------------------------------------------- train.log


def test_train_log_holds_what_was_logged_and_appends(data, tmp_path, capsys) -> None:
    """Each start appends a header (the command line, the versions) and then what it logged
    on the console, every line with its time; nothing of the log goes to stdout."""
    out = tmp_path / "run"
    first = _argv(data, out, "--max-steps", "2")
    assert main(first) == 0
    said = capsys.readouterr()
    assert said.out == ""
    shown = [logged(said.err)]
    assert len(shown[0]) == len(said.err.splitlines())        # every console line is timed
    assert main(_argv(data, out, "--max-steps", "3")) == 0
    shown.append(logged(capsys.readouterr().err))
    starts = _starts(out / "train.log")
    assert [lines for _, lines in starts] == shown
    assert starts[0][0][0] == "# bahdanau train " + " ".join(first[1:])
    assert "--max-steps 3" in starts[1][0][0] and shown[1][2].startswith("resumed from")
    assert any(line.startswith("step 3 | epoch") for line in shown[1])
    assert main(_argv(data, out, "--max-steps", "1", "--overwrite")) == 0   # a new run: a
    [(header, lines)] = _starts(out / "train.log")                          # new log
    assert "--overwrite" in header[0] and lines == logged(capsys.readouterr().err)


def test_the_first_line_says_how_many_threads_and_the_precision(data, tmp_path, capsys,
                                                                monkeypatch) -> None:
    """The machine, its threads and the precision lead the log: --threads fixes the count, and
    without it the run starts on the usable cores and follows the machine's load
    (`AdaptiveThreads`); --amp auto says what it picked and why."""
    assert main(_argv(data, tmp_path / "fixed", "--max-steps", "1")) == 0
    assert logged(capsys.readouterr().err)[0] == "machine: cpu, 1 thread; float32 (--amp none)"
    argv = _argv(data, tmp_path / "auto", "--max-steps", "1")
    at = argv.index("--threads")
    assert main(argv[:at] + argv[at + 2:]) == 0
    first = logged(capsys.readouterr().err)[0]
    assert first.startswith(f"machine: cpu, {default_threads()} threads at first, then as many "
                            "as measure fastest") or first.startswith("machine: cpu, 1 thread;")
    monkeypatch.setattr(precision, "bf16_unit", lambda device: "cpu-avx512_bf16")
    assert main(_argv(data, tmp_path / "amp", "--max-steps", "1", "--amp", "auto")) == 0
    assert logged(capsys.readouterr().err)[0] == (
        "machine: cpu, 1 thread; float32 (--amp auto; bf16 on cpu-avx512_bf16 measured slower)")


def test_train_log_outside_the_command_line(tmp_path, capsys) -> None:
    """`TrainLog` writes the package's INFO records to the file even where nobody configured
    logging (a script calling `run_train_job`), holds what came before `open`, and shows
    nothing on the console."""
    import logging

    from bahdanau.training.runlog import LOGGER, TrainLog

    before = LOGGER.level
    with TrainLog() as log:
        logging.getLogger("bahdanau.jobs").info("held")
        log.open(tmp_path / "train.log", "my-script", versions={"bahdanau": "x"})
        logging.getLogger("bahdanau.training").info("after")
    logging.getLogger("bahdanau.training").info("not in the file: it is closed")
    assert _starts(tmp_path / "train.log") == [(["# my-script", '# versions {"bahdanau": "x"}'],
                                                ["held", "after"])]
    assert capsys.readouterr().err == "" and LOGGER.level == before


class _FullDisk:
    """train.log's stream once the disk is full: the write of the record holding `at` and every
    one after it fail with ENOSPC."""

    def __init__(self, stream, at: str) -> None:
        self.stream, self.at, self.full = stream, at, False

    def write(self, text: str) -> int:
        self.full = self.full or self.at in text
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def test_a_full_disk_stops_the_run_at_its_log_line(data, tmp_path, capsys,
                                                   monkeypatch) -> None:
    """train.log on a full disk gave one "--- Logging error ---" traceback per record while
    the run trained on, and failed only at the end: the first record that cannot be written
    stops the run there, in one line naming the file; the checkpoints saved before are
    kept, whole."""
    opened = logging.FileHandler._open

    def full_from_step_3(handler):
        stream = opened(handler)
        return _FullDisk(stream, "step 3 |") if handler.baseFilename.endswith("train.log") \
            else stream

    monkeypatch.setattr(logging.FileHandler, "_open", full_from_step_3)
    out = tmp_path / "run"
    code = main(_argv(data, out, "--max-steps", "8", "--save-every", "2", "--quiet"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"writing {out / 'train.log'} failed: No space left on device: the run stops here" \
        in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002.pt"]
    assert load_checkpoint(out / "checkpoints" / "step_00000002.pt")["train_state"]["step"] == 2
    assert not (out / "metrics.json").exists()
    assert "step 2 |" in (out / "train.log").read_text()


def test_a_file_size_limit_on_train_log_is_one_line(data, tmp_path) -> None:
    """The same under a real limit (RLIMIT_FSIZE, in a child process; Python ignores SIGXFSZ,
    so the write fails with EFBIG): train.log, nearly at the limit, fails first (the
    checkpoints are far smaller); one error line, no traceback, the run stopped before its
    last step and every checkpoint it wrote loads."""
    limit = 1 << 20
    out = tmp_path / "run"
    out.mkdir()
    (out / "train.log").write_text("# an earlier log\n" * ((limit - 1500) // 17))

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    child = subprocess.run(
        [sys.executable, "-m", "bahdanau", *_argv(data, out, "--max-steps", "40",
                                                  "--save-every", "2", "--quiet")],
        capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert child.returncode == 2, child.stderr
    assert child.stderr.count("\n") == 1 and "Traceback" not in child.stderr, child.stderr
    assert f"writing {out / 'train.log'} failed: File too large" in child.stderr
    checkpoints = sorted((out / "checkpoints").iterdir())
    assert checkpoints and "step_00000040.pt" not in {p.name for p in checkpoints}
    for path in checkpoints:
        load_checkpoint(path)
    assert not (out / "metrics.json").exists()


def _is_versions(record: dict, device: str = "cpu") -> bool:
    """A versions record of this process: the package, torch and Python versions, the host,
    the device, and the commit of the checkout the tests run from (when it is one)."""
    import platform
    import socket

    expected = {"bahdanau": bahdanau.__version__, "torch": torch.__version__,
                "python": platform.python_version(), "host": socket.gethostname(),
                "device": device}
    commit = record.get("git_commit")
    return ({k: v for k, v in record.items() if k != "git_commit"} == expected
            and (commit is None or len(commit) == 40))


def test_versions_are_recorded_everywhere(data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "1")) == 0
    [(header, _)] = _starts(out / "train.log")
    assert header[1].startswith("# versions ")
    record = json.loads(header[1].removeprefix("# versions "))
    assert _is_versions(record)
    assert json.loads((out / "options.json").read_text())["versions"] == record
    assert json.loads((out / "metrics.json").read_text())["versions"] == record
    assert load_checkpoint(out / "checkpoints" / "step_00000001.pt")["versions"] == record
    config = ["--config", str(out / "options.json")]       # a run's options.json reproduces it
    assert main(["train", *config, "--out", str(tmp_path / "again")]) == 0


def test_no_git_commit_without_git(monkeypatch) -> None:
    """Away from a checkout (or without git) the record simply has no commit."""
    import subprocess

    from bahdanau import _about

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    _about.git_commit.cache_clear()
    try:
        assert _about.git_commit() is None and "git_commit" not in _about.versions("cpu")
        assert _is_versions(_about.versions("cpu"))
    finally:
        _about.git_commit.cache_clear()


def test_verbose_shows_the_machine_the_checkpoints_read_and_the_dev_timings(
        data, tmp_path, capsys) -> None:
    """--verbose adds DEBUG lines: the device and threads a command resolved, each checkpoint
    file it reads, and how long each dev evaluation took; without it there are none."""
    out = tmp_path / "run"
    dev = ["--dev-src", str(data / "te.en"), "--dev-tgt", str(data / "te.fr")]
    assert main(_argv(data, out, "--max-steps", "2", "--eval-every", "2", *dev,
                      "--verbose")) == 0
    shown = logged(capsys.readouterr().err)
    assert "DEBUG: device cpu, 1 CPU threads" in shown
    [dev_line] = [line for line in shown if line.startswith("DEBUG: dev evaluation")]
    assert re.fullmatch(r"DEBUG: dev evaluation at step 2: \d+ sentences decoded in [\d.]+ s, "
                        r"scored and perplexity in [\d.]+ s", dev_line), dev_line
    checkpoint = out / "checkpoints" / "step_00000002.pt"
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(data / "te.en"),
            "--beam-size", "1", "--max-len", "4", "--threads", "1", "--device", "cpu"]
    assert main([*argv, "--verbose"]) == 0
    shown = logged(capsys.readouterr().err)
    assert "DEBUG: device cpu, 1 CPU threads" in shown
    assert any(line.startswith(f"DEBUG: reading the checkpoint {checkpoint} (") for line in shown)
    assert main(argv) == 0
    assert not any("DEBUG" in line for line in logged(capsys.readouterr().err))


def test_quiet_and_verbose_change_the_console_only(data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "1", "--quiet")) == 0
    said = capsys.readouterr()
    assert said.out == said.err == ""
    logged_lines = _starts(out / "train.log")[0][1]
    assert any(line.startswith("trained 1 updates") for line in logged_lines)
    assert main(_argv(data, out, "--max-steps", "2", "--verbose")) == 0
    shown = logged(capsys.readouterr().err)
    assert f"DEBUG: saved {out / 'checkpoints' / 'step_00000002.pt'}" in shown
    assert main(_argv(data, out, "--max-steps", "3")) == 0
    assert not any("DEBUG" in line for line in logged(capsys.readouterr().err))
    with pytest.raises(SystemExit) as exit_:                    # a usage error: one line
        main(["train", "--quiet", "--verbose"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_version_flag(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"bahdanau {bahdanau.__version__}\n"


# ----------------------------------------------------------------------------- dev evaluations


def _perplexity(checkpoint: Path, pairs: list[tuple[str, str]]) -> float:
    """exp of the mean loss per target token (eos included) of `pairs`, each sentence scored
    alone by the model's teacher-forced logits in float64: the dev perplexity, worked out
    without the batches or the loss the run uses."""
    from bahdanau import DefaultTokenizer, model_from_checkpoint

    model, src_vocab, tgt_vocab = model_from_checkpoint(checkpoint)
    tokenizer, total, tokens = DefaultTokenizer(), 0.0, 0
    with torch.no_grad():
        for source, target in pairs:
            src = torch.tensor([src_vocab.encode(tokenizer.tokenize(source))])
            y = tgt_vocab.encode(tokenizer.tokenize(target))
            logits = model(src, torch.tensor([src.shape[1]]), torch.tensor([[tgt_vocab.bos_id,
                                                                               *y]]))
            log_probs = logits[0].double().log_softmax(-1)           # (T, V)
            gold = torch.tensor([*y, tgt_vocab.eos_id])
            total -= float(log_probs[torch.arange(len(gold)), gold].sum())
            tokens += len(gold)
    return math.exp(total / tokens)


def test_dev_perplexity_and_translations_per_evaluation(data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    dev = ["--dev-src", str(data / "te.en"), "--dev-tgt", str(data / "te.fr")]
    assert main(_argv(data, out, "--max-steps", "4", "--eval-every", "2", "--save-every", "2",
                      "--early-stopping-metric", "ppl", *dev)) == 0
    pairs = list(zip((data / "te.en").read_text().splitlines(),
                     (data / "te.fr").read_text().splitlines(), strict=True))
    dev_lines = [line for line in logged(capsys.readouterr().err) if " | dev " in line]
    assert [line.split(" | ")[0] for line in dev_lines] == ["step 2", "step 4"]
    best = json.loads((out / "checkpoints" / "best.json").read_text())
    assert best["name"] == "ppl"
    expected = _perplexity(out / "checkpoints" / f"step_{best['step']:08d}.pt", pairs)
    assert best["metric"] == pytest.approx(expected, rel=1e-5)
    assert f"ppl {expected:.2f} | best ppl" in dev_lines[best["step"] // 2 - 1]
    for step in (2, 4):                    # one file per evaluation, a line per dev sentence
        hyps = (out / "dev" / f"step_{step:08d}.hyp").read_text(encoding="utf-8")
        assert len(hyps.splitlines()) == len(pairs) == 10


# ----------------------------------------------------------------------------- TensorBoard


def test_tensorboard_writes_scalars_and_alignments(data, tmp_path, monkeypatch) -> None:
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    from bahdanau.training.runlog import TensorBoardLog

    titles = []
    drawn = TensorBoardLog.alignment

    def alignment(self, step, *args, title=None, **kwargs):
        titles.append((step, title))
        drawn(self, step, *args, title=title, **kwargs)

    monkeypatch.setattr(TensorBoardLog, "alignment", alignment)
    out = tmp_path / "run"
    dev = ["--dev-src", str(data / "te.en"), "--dev-tgt", str(data / "te.fr")]
    assert main(_argv(data, out, "--max-steps", "4", "--eval-every", "2", *dev,
                      "--tensorboard")) == 0
    # each image is titled as the plot of the run's test sentence: the run, its step, the
    # sentence
    assert [step for step, _ in titles] == [2, 4]
    for step, title in titles:
        first, sentence = title.splitlines()
        assert first == f"{out}, step {step}" and sentence.strip("\u201c\u201d") in (
            data / "te.en").read_text(encoding="utf-8").splitlines()
    events = accumulator.EventAccumulator(str(out / "tensorboard"),
                                          size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    expected = {"train/loss", "train/ppl", "train/lr", "train/grad_norm",
                "train/tgt_tokens_per_s", "dev/bleu", "dev/chrf", "dev/ppl", "test/bleu",
                "test/chrf"}
    assert expected <= set(tags["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx([1e-3] * 4)
    assert [e.step for e in events.Scalars("dev/bleu")] == [2, 4]
    assert [e.step for e in events.Scalars("dev/ppl")] == [2, 4]
    metrics = json.loads((out / "metrics.json").read_text())
    [test_bleu] = events.Scalars("test/bleu")
    assert (test_bleu.step, test_bleu.value) == (4, pytest.approx(metrics["bleu"]))
    assert tags["images"] == ["dev/alignment"]
    assert [e.step for e in events.Images("dev/alignment")] == [2, 4]


def test_alignment_image_without_matplotlib(tmp_path, monkeypatch) -> None:
    """Without matplotlib the alignment is the weight matrix itself, one pixel a weight."""
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    from bahdanau import plot
    from bahdanau.training.runlog import TensorBoardLog

    def missing():
        raise plot.PlotDependencyError("plots need matplotlib")

    monkeypatch.setattr(plot, "_pyplot", missing)
    weights = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]])         # (T=3, S=2)
    long = torch.full((plot.MAX_CELLS + 7, plot.MAX_CELLS + 2), 0.5)     # capped as a plot is
    with TensorBoardLog(tmp_path) as board:
        board.alignment(3, weights, ["a", "b"], ["x", "y", "</s>"])
        board.alignment(4, long, ["a"] * long.shape[1], ["x"] * long.shape[0])
    events = accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    small, capped = events.Images("dev/alignment")
    assert (small.step, small.width, small.height) == (3, 2, 3)
    assert (capped.step, capped.width, capped.height) == (4, plot.MAX_CELLS, plot.MAX_CELLS)


def test_alignment_image_has_the_title(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    from bahdanau.training.runlog import TensorBoardLog

    figures = []
    with TensorBoardLog(tmp_path) as board:
        board._writer.add_figure = lambda tag, figure, step: figures.append(figure)
        board.alignment(3, torch.tensor([[0.5, 0.5], [1.0, 0.0]]), ["a", "b"], ["x", "</s>"],
                        title="runs/x, step 3\n\u201ca b\u201d")
    [figure] = figures
    assert figure._suptitle.get_text() == "runs/x, step 3\n\u201ca b\u201d"


def test_tensorboard_missing_is_one_error_line(data, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)          # not installed
    out = tmp_path / "run"
    assert main(_argv(data, out, "--max-steps", "1", "--tensorboard")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'bahdanau[tensorboard]'" in err
    assert not out.exists()


# ----------------------------------------------------------------------------- defaults


def test_device_defaults_to_cuda_when_available(monkeypatch) -> None:
    assert TrainOptions().device == TranslateOptions(checkpoint=("x",)).device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == "cpu"
    assert machine(TranslateOptions(checkpoint=("x",), threads=1)) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == "cuda"
    assert machine(TrainOptions(threads=1)) == torch.device("cuda")   # nothing touches it
    assert machine(TrainOptions(threads=1, device="cpu")) == torch.device("cpu")


def test_threads_default_to_the_cores_per_local_process(monkeypatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_threads() == 8
    for local, threads in (("3", 2), ("8", 1), ("16", 1), ("", 8)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert default_threads() == threads
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        with pytest.raises(InputError, match="LOCAL_WORLD_SIZE"):
            default_threads()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    before = torch.get_num_threads()
    try:
        machine(TranslateOptions(checkpoint=("x",), device="cpu"))
        assert torch.get_num_threads() == 2
        machine(TranslateOptions(checkpoint=("x",), device="cpu", threads=3))   # given: kept
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_is_the_default_of_one_process_and_the_most_it_adapts_to(
        monkeypatch) -> None:
    """OMP_NUM_THREADS, where set, is the default count of a machine's one process, at most
    its cores; under torchrun's several processes a machine's cores are shared as before (its
    own OMP_NUM_THREADS=1 cannot be told from a user's); a bad value is one line. A run or a
    decoding command without --threads adapts up to that count."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for omp, threads in (("3", 3), (" 1 ", 1), ("8", 8), ("64", 8), ("", 8)):
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
        assert default_threads() == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    for local, threads in (("1", 3), ("2", 4), ("8", 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert default_threads() == threads
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    for bad in ("0", "two", "-1", "1.5", "4,2"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert one_line_error(default_threads) == (
            f"OMP_NUM_THREADS must be a positive integer (torch CPU threads), got {bad!r}: "
            "unset it, or give --threads N")
    cpu = torch.device("cpu")
    for options in (TrainOptions(device="cpu"), TranslateOptions(checkpoint=("x",),
                                                                 device="cpu")):
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        machine(options)
        tuner = thread_tuner(options, cpu)
        assert tuner is not None and tuner.most == 3
        assert beam_search(options, threads=tuner).observe == tuner.observe   # fed each step
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        machine(options)
        assert torch.get_num_threads() == 1 and thread_tuner(options, cpu) is None


def test_under_torchrun_each_process_takes_its_own_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    for device in ("auto", "cuda"):
        assert machine(TrainOptions(threads=1, device=device)) == torch.device("cuda", 1)
    assert chosen == [torch.device("cuda", 1)] * 2
    assert machine(TrainOptions(threads=1, device="cpu")) == torch.device("cpu")
    one_line_error(lambda: machine(TrainOptions(threads=1, device="cuda:0")),
                   "--device cuda:0: under torchrun each process trains on cuda:LOCAL_RANK")
    monkeypatch.setenv("LOCAL_RANK", "2")                        # torchrun started too many
    one_line_error(lambda: machine(TrainOptions(threads=1)), "no CUDA device 2")
    monkeypatch.setenv("WORLD_SIZE", "x")
    one_line_error(lambda: machine(TrainOptions(threads=1)),
                   "WORLD_SIZE must be an integer >= 1 (processes in all), got 'x'")


# ----------------------------------------------------------------------------- limits


def test_the_default_job_is_bounded_by_epochs() -> None:
    assert DEFAULT_EPOCHS == 5
    assert TrainOptions().limits == {"max_steps": None, "max_epochs": 5, "max_time_s": None}
    assert TrainOptions(time_budget=0).limits["max_epochs"] == 5      # 0: no time limit
    assert TrainOptions(src_lang="fr", tgt_lang="en").limits["max_epochs"] == 5


@pytest.mark.parametrize(("given", "limits"), [
    ({"max_steps": 7}, {"max_steps": 7, "max_epochs": None, "max_time_s": None}),
    ({"max_epochs": 2}, {"max_steps": None, "max_epochs": 2, "max_time_s": None}),
    ({"time_budget": 1.5}, {"max_steps": None, "max_epochs": None, "max_time_s": 90.0}),
    ({"max_steps": 3, "time_budget": 2}, {"max_steps": 3, "max_epochs": None,
                                          "max_time_s": 120}),
])
def test_limits_given_win(given, limits) -> None:
    assert TrainOptions.from_mapping(given).limits == limits
    own = TrainOptions.from_mapping({"train_src": "a", "train_tgt": "b", **given})
    assert own.limits == limits


@pytest.mark.parametrize("own", [{"train_src": "a", "train_tgt": "b"}, {"data": "prepared"}])
def test_own_corpus_needs_a_limit(own) -> None:
    for time_budget in (None, 0):
        with pytest.raises(InputError, match="--max-steps, --max-epochs or a non-zero "
                                             "--time-budget"):
            TrainOptions(**own, time_budget=time_budget).limits  # noqa: B018


# ----------------------------------------------------------------------------- old run folders

OLD_DEFAULTS = {"time_budget": 12.0, "threads": 2, "device": "cpu"}    # before epochs and auto


def test_an_option_no_longer_given_resumes_at_its_default() -> None:
    without_layer_norm = TrainOptions.from_mapping({"layer_norm": False})   # as runs then were
    assert "--threads 2 -> default" in resume_changes(OLD_DEFAULTS, without_layer_norm)


def test_a_resumed_run_keeps_its_time_budget() -> None:
    own = {"train_src": "a", "train_tgt": "b"}
    assert resumed_options(OLD_DEFAULTS, TrainOptions(**own)).limits["max_time_s"] == 720.0
    assert resumed_options(OLD_DEFAULTS, TrainOptions()).limits == {
        "max_steps": None, "max_epochs": None, "max_time_s": 720.0}     # not 5 epochs
    given = TrainOptions.from_mapping({**own, "time_budget": 0, "max_steps": 9})  # applied
    assert resumed_options(OLD_DEFAULTS, given) is given
    assert resumed_options({"time_budget": None}, TrainOptions()).limits["max_epochs"] == 5


def test_a_run_folder_of_the_old_defaults_resumes(data, tmp_path, capsys) -> None:
    """A config.yaml (as earlier versions named the record) written when --time-budget
    defaulted to 12 minutes, --threads to 2 and --device to cpu (and without --tensorboard):
    the same kind of command resumes it, the run keeps its 12 minutes, the new device and
    thread defaults are applied and logged, and options.json replaces the old file."""
    out = tmp_path / "run"
    argv = ["train", "--train-src", str(data / "tr.en"), "--train-tgt", str(data / "tr.fr"),
            "--preset", "tiny", "--log-every", "1", "--out", str(out)]
    assert main([*argv, "--max-steps", "1", "--time-budget", "12", "--threads", "2",
                 "--device", "cpu"]) == 0
    config = json.loads((out / "options.json").read_text())
    assert {k: config[k] for k in OLD_DEFAULTS} == OLD_DEFAULTS
    config.pop("tensorboard")
    (out / "options.json").unlink()
    (out / "config.yaml").write_text(json.dumps(config, indent=2) + "\n")
    capsys.readouterr()
    assert main([*argv, "--max-steps", "2"]) == 0
    said = capsys.readouterr().err
    assert "resumed from" in said and "trained 2 updates" in said
    assert "--time-budget" not in said and "changed on resume: --device 'cpu' -> 'auto'" in said
    stored = json.loads((out / "options.json").read_text())
    assert stored["time_budget"] == 12.0 and stored["max_steps"] == 2
    assert not (out / "config.yaml").exists()
    payload = torch.load(out / "checkpoints" / "step_00000002.pt", weights_only=True)
    assert payload["train_config"]["max_time_s"] == 720.0


def test_the_default_job_keeps_a_moving_average_from_where_a_run_without_one_resumes(
        data, tmp_path, capsys) -> None:
    """The job's weights are a moving average (decay 0.998): a run begun with --ema-decay none
    (as every default job was before) resumes with it, says so, and its average starts at the
    resumed weights; its checkpoints before hold none."""
    out = tmp_path / "run"
    argv = ["train", "--train-src", str(data / "tr.en"), "--train-tgt", str(data / "tr.fr"),
            *BASE, "--save-every", "1", "--time-budget", "0", "--out", str(out)]
    assert main([*argv, "--max-steps", "1", "--ema-decay", "none"]) == 0
    capsys.readouterr()
    assert main([*argv, "--max-steps", "2"]) == 0
    assert "changed on resume: --ema-decay none -> 0.998" in capsys.readouterr().err
    folder = out / "checkpoints"
    before, after = (torch.load(folder / f"step_{s:08d}.pt", weights_only=True) for s in (1, 2))
    assert "ema" not in before and before["train_config"]["ema_decay"] is None
    assert after["train_config"]["ema_decay"] == 0.998
    for key, start in before["model"].items():        # e = 0.998 w_1 + 0.002 w_2
        expected = 0.998 * start.double() + 0.002 * after["model"][key].double()
        torch.testing.assert_close(after["ema"][key].double(), expected, rtol=1e-6, atol=1e-7)
