"""Training's progress on the console: a bar that moves on a terminal (a pseudo-terminal here,
as a user's shell gives), and nothing of it off a terminal, with --no-progress, or in train.log.

The runs are a tiny model on 40 Multi30k pairs; the moving bar's run is bounded by time (a
few seconds), so the bar, drawn at most twice a second, is drawn several times on any machine.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from training_fixtures import write_multi30k_slice

from bahdanau._progress import show_progress
from bahdanau.cli import main

pytest.importorskip("tqdm", reason="progress bars need the progress extra (tqdm)")

# What only a drawn bar writes: tqdm's carriage returns and block characters, its rate.
BAR_MARKS = ("\r", "\u2588", "updates/s", "s/updates", "training:")


def _train_argv(files: Path, out: Path, *flags: str) -> list[str]:
    return ["train", "--train-src", str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"),
            "--preset", "tiny", "--threads", "1", "--device", "cpu", "--out", str(out),
            "--train-batch-size", "8", *flags]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("progress")
    write_multi30k_slice(root, 40, 0)
    return root


def _read_terminal(master: int, child: subprocess.Popen, deadline: float) -> str:
    """Everything the child writes to the terminal `master` until it exits (or `deadline`)."""
    chunks = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:                      # the child closed its side: all is read
                break
            if not chunk:
                break
            chunks.append(chunk)
        elif child.poll() is not None:
            break
    return b"".join(chunks).decode("utf-8", errors="replace")


def test_the_training_bar_moves_on_a_terminal(files, tmp_path) -> None:
    """stderr a terminal: a bar over the run's updates (--max-steps), drawn with the loss, the
    target tok/s and the time left, whose count moves several times while the run trains; the
    log lines are whole lines; train.log holds none of the bar."""
    out = tmp_path / "run"
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "-m", "bahdanau",
         *_train_argv(files, out, "--max-steps", "1000000", "--time-budget", "0.05")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    try:
        drawn = _read_terminal(master, child, time.monotonic() + 240)
        assert child.wait(timeout=60) == 0, drawn
    finally:
        child.kill()
        os.close(master)
    frames = [frame for frame in re.split(r"[\r\n]", drawn) if "training:" in frame]
    counts = {int(n) for n in re.findall(r"training:.*?\| *(\d+)/1000000 \[", drawn)}
    assert len(counts) >= 3, frames                      # the counter moved, and moved again
    assert any(re.search(r"loss \d+\.\d{3}, \d+ tgt tok/s", f) for f in frames), frames
    assert any(re.search(r"\[\d\d:\d\d<[\d:]+,", f) for f in frames), frames   # time left
    assert "preparing the run: building the model" in drawn       # before the first update
    logged = [line for line in drawn.replace("\r\n", "\n").split("\n")
              if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line.split("\r")[-1])]
    assert any("data: 40 training pairs" in line for line in logged)
    text = (out / "train.log").read_text(encoding="utf-8")
    assert "stopped by max_time" in text and not any(mark in text for mark in BAR_MARKS)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_off_a_terminal_with_no_progress_or_in_train_log(files, tmp_path,
                                                                 monkeypatch) -> None:
    """The same kind of run draws nothing of a bar when stderr is no terminal (a pipe, a file)
    or with --no-progress on one, and its train.log holds none either; on a terminal, the
    same run draws it (so the checks above can fail)."""
    previous = show_progress(None)
    try:
        runs = {}
        for name, stream, flags in (("plain", io.StringIO(), ()),
                                    ("no-progress", _Terminal(), ("--no-progress",)),
                                    ("terminal", _Terminal(), ())):
            monkeypatch.setattr(sys, "stderr", stream)
            assert main(_train_argv(files, tmp_path / name, "--max-epochs", "2",
                                    "--log-every", "1", *flags)) == 0
            runs[name] = stream.getvalue(), (tmp_path / name / "train.log").read_text()
    finally:
        show_progress(previous)
    [updates] = {int(n) for n in re.findall(r"trained (\d+) updates", runs["plain"][1])}
    assert updates >= 2                              # 2 epochs of 40 pairs, 8 at a time
    # on a terminal: a bar whose length is the run's, in updates (bounded by --max-epochs)
    assert "training:" in runs["terminal"][0] and f" {updates}/{updates} [" in runs["terminal"][0]
    for name, (console, log) in runs.items():
        assert f"step {updates} | epoch" in log, name
        assert not any(mark in log for mark in BAR_MARKS), name
        if name != "terminal":
            assert f"step {updates} | epoch" in console, name
            assert not any(mark in console for mark in BAR_MARKS), (name, console)


@pytest.mark.slow
def test_the_default_job_s_first_minute_shows_a_moving_bar(tmp_path) -> None:
    """`bahdanau train --out RUN`, the README's main job, on a terminal: the preparation's
    status, then a bar over the job's updates whose count moves several times within its first
    minutes; Ctrl-C then stops it as usual (status 130), its bar cleared."""
    out = tmp_path / "run"
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    child = subprocess.Popen([sys.executable, "-m", "bahdanau", "train", "--out", str(out)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=terminal)
    os.close(terminal)
    drawn, deadline = "", time.monotonic() + 300
    try:
        while time.monotonic() < deadline and child.poll() is None:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                drawn += os.read(master, 65536).decode("utf-8", errors="replace")
            if len(set(re.findall(r"training:.*?\| *(\d+)/\d+ \[", drawn))) >= 3:
                break
        child.send_signal(signal.SIGINT)
        drawn += _read_terminal(master, child, time.monotonic() + 120)
        status = child.wait(timeout=120)
    finally:
        child.kill()
        os.close(master)
    counts = {int(n) for n in re.findall(r"training:.*?\| *(\d+)/\d+ \[", drawn)}
    assert len(counts) >= 3, drawn[-2000:]                # the counter moved, and moved again
    assert "preparing the run" in drawn.split("training:")[0]     # before the first update
    assert status == 130, drawn[-2000:]
