"""`bahdanau prepare` runs as a real job: signals and a killed worker end it with one line and
nothing left behind (no worker alive, no lock), one process at a time writes a folder, stale
temporary folders of dead processes are cleaned, and a destination that cannot be replaced is
refused before any work.

The process tests run `bahdanau prepare` in a child process whose tokenizer sleeps on every
line (and whose chunks are 10 pairs), so that it is still tokenising, in two workers, when the
test signals it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from training_fixtures import logged, write_multi30k_slice

from bahdanau.cli import main
from bahdanau.data import PreparedCorpus, TrainSentencePiece, prepare_corpus
from bahdanau.data import corpus as corpus_module
from bahdanau.errors import InputError

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="finds worker processes through /proc (Linux)")

ROOT = Path(__file__).resolve().parents[2]
# `bahdanau prepare ARGV...`, its tokenizer sleeping SECONDS a line: python -c SLOW SECONDS ARGV
SLOW = """
import sys, time
import bahdanau.data.corpus
from bahdanau.cli import main
from bahdanau.data import DefaultTokenizer
bahdanau.data.corpus.CHUNK_PAIRS = 10
tokenize = DefaultTokenizer.tokenize
def slow(self, line):
    time.sleep(float(sys.argv[1]))
    return tokenize(self, line)
DefaultTokenizer.tokenize = slow
sys.exit(main(sys.argv[2:]))
"""
TIMEOUT = 60          # seconds a stopped prepare may take to end (it takes about one)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_multi30k_slice(tmp_path_factory.mktemp("jobs"), 200, 0)


def _prepare_args(files: Path, out: Path) -> list[str]:
    return ["prepare", "--train-src", str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"),
            "--out", str(out), "--workers", "2", "--vocab-size", "300"]


def _start(files: Path, out: Path, seconds: float, *more: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", SLOW, str(seconds),
                             *_prepare_args(files, out), *more],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _workers(pid: int) -> list[int]:
    """The pids of the child processes of `pid` that run what it runs (its forked workers)."""
    mine = Path(f"/proc/{pid}/cmdline").read_bytes()
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and (stat.parent / "cmdline").read_bytes() == mine:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue                          # a process that ended while we looked
    return found


def _busy_workers(proc: subprocess.Popen[str], n: int = 2) -> list[int]:
    """Wait until `proc` has `n` workers, and a little more (they are then tokenising)."""
    deadline = time.monotonic() + TIMEOUT
    while len(workers := _workers(proc.pid)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)
    time.sleep(0.5)
    return workers


def _ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """`proc`'s exit status and stderr; fails (killing it) when it does not end in time."""
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"prepare did not end within {TIMEOUT} s: it hangs")
    return proc.returncode, err


def _nothing_left(root: Path, *keep: str) -> None:
    assert sorted(p.name for p in root.iterdir()) == sorted(keep)


def _running(pids: list[int], wait: float = 5.0) -> list[int]:
    """Those of `pids` still running after up to `wait` seconds (a zombie has ended: it only
    waits to be reaped). A worker killed with its parent dies a moment after it, when the
    kernel's signal reaches it, which a busy machine may delay."""
    deadline = time.monotonic() + wait
    while (running := _alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running


def _alive(pids: list[int]) -> list[int]:
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            running.append(pid)
    return running


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("victim, sig", [(0, signal.SIGKILL), (1, signal.SIGSEGV)])
def test_a_worker_killed_is_an_error_naming_it(files, tmp_path, victim, sig) -> None:
    """A worker killed (the out-of-memory killer's SIGKILL, a crash's SIGSEGV), whichever: one
    line naming it, the other worker ended too, nothing left, the folder free again."""
    out = tmp_path / "out"
    proc = _start(files, out, 0.05)
    workers = _busy_workers(proc)
    os.kill(workers[victim], sig)
    code, err = _ended(proc)
    assert code == 2
    hint = " (the out-of-memory killer sends SIGKILL)" if sig == signal.SIGKILL else ""
    assert err == (f"bahdanau: error: tokenising worker {workers[victim]} died (killed by "
                   f"{signal.Signals(sig).name}){hint}: nothing was written\n")
    assert _running(workers) == []
    _nothing_left(tmp_path)                             # no out, no partial folder, no lock
    assert main(_prepare_args(files, out)) == 0 and len(PreparedCorpus(out)) == 200


@pytest.mark.parametrize("sig, group", [(signal.SIGTERM, False), (signal.SIGTERM, True),
                                        (signal.SIGINT, True), (signal.SIGHUP, False),
                                        (signal.SIGHUP, True)])
def test_signals_stop_prepare_with_one_line(files, tmp_path, sig, group) -> None:
    """SIGTERM to the main process (a job scheduler), to the whole group, Ctrl-C (SIGINT to
    the group), or SIGHUP (a closed terminal: to the main process, or to the group): one line,
    exit 128 + the signal, no worker traceback, no worker left, nothing left."""
    out = tmp_path / "out"
    proc = _start(files, out, 0.05)
    workers = _busy_workers(proc)
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    code, err = _ended(proc)
    assert code == 128 + sig
    assert err == (f"bahdanau: prepare stopped by {signal.Signals(sig).name}: nothing was "
                   f"written in {out}\n")
    assert _running(workers) == []
    _nothing_left(tmp_path)


def test_sighup_leaves_the_corpus_being_replaced_as_it_was(files, tmp_path) -> None:
    """A closed terminal during `prepare --overwrite`: the old corpus byte for byte, the lock
    released (a next prepare runs), no worker left."""
    out = tmp_path / "out"
    assert main([*_prepare_args(files, out), "--max-len", "30"]) == 0
    before = _snapshot(tmp_path)
    proc = _start(files, out, 0.05, "--overwrite")
    workers = _busy_workers(proc)
    os.kill(proc.pid, signal.SIGHUP)
    code, err = _ended(proc)
    assert (code, err) == (128 + signal.SIGHUP, f"bahdanau: prepare stopped by SIGHUP: nothing "
                                                f"was written in {out}\n")
    assert _running(workers) == [] and _snapshot(tmp_path) == before
    assert main([*_prepare_args(files, out), "--overwrite"]) == 0
    assert PreparedCorpus(out).manifest["options"]["max_len"] is None


def test_repeated_sigints_never_hang(files, tmp_path) -> None:
    """Ctrl-C pressed again and again while prepare stops, several runs over: each ends with
    the one line of the first, no worker left, nothing left."""
    for run in range(3):
        out = tmp_path / str(run) / "out"
        proc = _start(files, out, 0.05)
        workers = _busy_workers(proc)
        for pause in (0.0, 0.01, 0.05, 0.2):
            time.sleep(pause)
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:                  # it has ended already
                break
        code, err = _ended(proc)
        assert (code, err) == (130, f"bahdanau: prepare stopped by SIGINT: nothing was "
                                    f"written in {out}\n"), run
        assert _running(workers) == []
        _nothing_left(out.parent)


def test_workers_die_with_a_killed_prepare(files, tmp_path) -> None:
    """SIGKILL of the main process (which nothing can catch): its workers end with it, so
    the lock they inherited is free, and the next prepare removes the partial folder."""
    out = tmp_path / "out"
    proc = _start(files, out, 0.05)
    workers = _busy_workers(proc)
    os.kill(proc.pid, signal.SIGKILL)
    code, _ = _ended(proc)               # its stderr ends when the workers, holding it, have
    assert code == -signal.SIGKILL and _running(workers) == []
    assert main(_prepare_args(files, out)) == 0 and len(PreparedCorpus(out)) == 200
    _nothing_left(tmp_path, "out")


def test_a_second_prepare_into_one_folder_is_refused_while_the_first_runs(files, tmp_path,
                                                                          capsys) -> None:
    out = tmp_path / "out"
    first = _start(files, out, 0.01)
    _busy_workers(first)
    assert main(_prepare_args(files, out)) == 2
    assert capsys.readouterr().err == (f"bahdanau: error: {out} is being prepared by another "
                                       "process: wait for it to finish or choose another "
                                       "folder\n")
    code, err = _ended(first)
    assert code == 0 and len(logged(err)) == len(err.splitlines())   # its log lines alone
    assert logged(err)[-1].startswith(f"prepared {out}: 200 pairs kept")
    assert len(PreparedCorpus(out)) == 200                 # the first one's, whole
    _nothing_left(tmp_path, "out")
    assert main(_prepare_args(files, out)) == 0          # free again: reused
    assert "up to date" in capsys.readouterr().err            # a log line, on stderr


def test_stale_partial_folders_of_dead_processes_are_removed(files, tmp_path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = [tmp_path / f".out.partial-{dead_pid}", tmp_path / f".out.old-{dead_pid}"]
        kept = [tmp_path / f".out.partial-{alive.pid}", tmp_path / f".other.partial-{dead_pid}"]
        for folder in stale + kept:
            folder.mkdir()
            (folder / "src.ids.npy").write_bytes(b"\0" * 1000)
        prepare_corpus(files / "tr.en", files / "tr.fr", tmp_path / "out", workers=1)
        assert [p.exists() for p in stale + kept] == [False, False, True, True]
    finally:
        alive.kill()
        alive.wait()


@pytest.fixture
def no_work(monkeypatch):
    """Training a SentencePiece model or tokenising fails the test: a refusal must come first."""
    def work(*args, **kwargs):
        raise AssertionError("the work started before the destination was checked")

    monkeypatch.setattr(corpus_module, "_train_sentencepiece", work)
    monkeypatch.setattr(corpus_module, "_write", work)


def _refused(files: Path, out: Path | str, *fragments: str) -> None:
    with pytest.raises(InputError) as err:
        prepare_corpus(files / "tr.en", files / "tr.fr", out, workers=1,
                       tokenizer=TrainSentencePiece(vocab_size=100))
    message = str(err.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def test_destinations_that_cannot_be_replaced_are_refused_before_any_work(
        files, tmp_path, monkeypatch, no_work) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    _refused(files, ".", "is the current folder or holds it")
    _refused(files, tmp_path, "is the current folder or holds it")
    monkeypatch.chdir(tmp_path / "sub")
    _refused(files, "..", "is the current folder or holds it")
    _refused(files, "/proc", "/proc is a mount point")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    _refused(files, tmp_path / "link", "is a symbolic link to", "gone, which does not exist")
    (tmp_path / "file").write_text("x")
    _refused(files, tmp_path / "file" / "out", "cannot be created:", "file is a file")
    _refused(files, "/proc/prepared", "cannot write /proc/prepared")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link", "sub"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_parent_is_refused_before_any_work(files, tmp_path, no_work) -> None:
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    try:
        _refused(files, parent / "out", "cannot write", "Permission denied")
    finally:
        parent.chmod(0o755)


def test_a_link_to_a_folder_is_followed(files, tmp_path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    corpus = prepare_corpus(files / "tr.en", files / "tr.fr", tmp_path / "link", workers=1)
    assert (tmp_path / "link").is_symlink() and len(PreparedCorpus(tmp_path / "real")) == 200
    assert len(corpus) == 200


def test_the_lock_refuses_a_second_holder_and_removes_its_file(tmp_path) -> None:
    """`exclusive_lock`, shared by train's run folder and prepare: a second holder (here a
    second open file in this process, as flock locks an open file) is refused with the given
    line; with `remove`, the file goes when the first lets go, and a lock taken on the deleted
    file (by a process that opened it just before) does not hold the new one."""
    import fcntl

    from bahdanau._files import exclusive_lock

    path = tmp_path / ".out.lock"
    with exclusive_lock(path, "busy", remove=True):
        with pytest.raises(InputError, match="^busy$"), exclusive_lock(path, "busy"):
            pass
        late = open(path, "a")                   # opened before the first holder deletes it
    assert not path.exists()
    fcntl.flock(late, fcntl.LOCK_EX | fcntl.LOCK_NB)       # a lock on the deleted file
    with exclusive_lock(path, "busy", remove=True):        # not the same file: not refused
        assert path.exists()
    late.close()
