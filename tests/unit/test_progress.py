"""Progress bars (bahdanau/_progress.py): on stderr when it is a terminal or when asked, never
on stdout, off with --no-progress or without tqdm; and the long loops that draw them.

A terminal is faked by a StringIO whose isatty() is True; tqdm draws into it as into a tty. The
streams are replaced in each test's body: pytest puts its capturing streams back between a
fixture's setup and the test.
"""

from __future__ import annotations

import io
import os
import sys
import threading

import pytest
from training_fixtures import TINY_VOCAB, tiny_model

from bahdanau import WhitespaceTokenizer, save_checkpoint
from bahdanau._progress import Bar, progress_bar, progress_shown, show_progress
from bahdanau.checkpoint.averaging import average_checkpoints
from bahdanau.cli import main
from bahdanau.data.corpus import prepare_corpus
from bahdanau.evaluate import score_corpus, translate_corpus
from bahdanau.search import BeamSearch
from bahdanau.training.state import checkpoint_payload

tqdm = pytest.importorskip("tqdm", reason="progress bars need the progress extra (tqdm)")

VOCAB = TINY_VOCAB
SENTENCES = ["w1 w2 w3", "w4", "w5 w6", "w7 w8 w9 w10"] * 3


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def default_switch():
    """Each test starts with the switch at its default (bars when stderr is a terminal)."""
    previous = show_progress(None)
    yield
    show_progress(previous)


def on_terminal(monkeypatch) -> tuple[Terminal, io.StringIO]:
    """stderr becomes a terminal and stdout a plain stream: (stderr, stdout). Called in the
    test itself, after pytest has put its own capturing streams in place."""
    stderr, stdout = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", stdout)
    return stderr, stdout


def _translate() -> list[str]:
    return [t.text for t in translate_corpus(
        tiny_model(), SENTENCES, VOCAB, VOCAB, WhitespaceTokenizer(),
        search=BeamSearch(beam_size=1, max_len=4), batch_size=5)]


def test_a_terminal_shows_the_bar_on_stderr_only(monkeypatch) -> None:
    terminal, stdout = on_terminal(monkeypatch)
    texts = _translate()
    drawn = terminal.getvalue()
    assert "translating" in drawn and f"/{len(SENTENCES)} " in drawn   # of 12 sentences
    assert stdout.getvalue() == ""                       # nothing on stdout
    show_progress(False)                                 # --no-progress
    terminal.truncate(0)
    assert _translate() == texts and terminal.getvalue() == ""


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch) -> None:
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    assert not progress_shown()
    _translate()
    assert plain.getvalue() == ""
    show_progress(True)                                  # asked for: drawn on any stderr
    _translate()
    assert "translating" in plain.getvalue()


def test_without_tqdm_there_is_no_bar_and_no_error(monkeypatch) -> None:
    terminal, _ = on_terminal(monkeypatch)
    monkeypatch.setitem(sys.modules, "tqdm", None)       # not installed
    assert not progress_shown()
    assert isinstance(progress_bar("x", total=3), Bar)
    _translate()
    assert terminal.getvalue() == ""


def test_prepare_counts_the_bytes_of_both_files(monkeypatch, tmp_path) -> None:
    terminal, _ = on_terminal(monkeypatch)
    src, tgt = tmp_path / "a.en", tmp_path / "a.fr"
    src.write_text("w1 w2\n" * 50, encoding="utf-8")
    tgt.write_text("w3\n" * 50, encoding="utf-8")
    prepare_corpus(src, tgt, tmp_path / "prepared", workers=1, log=lambda line: None)
    drawn = terminal.getvalue()
    total = src.stat().st_size + tgt.stat().st_size           # 300 + 150 bytes
    assert total == 450 and "preparing" in drawn and "/450 [" in drawn


def test_average_counts_the_checkpoints(monkeypatch, tmp_path) -> None:
    paths = []
    for seed in range(3):
        paths.append(tmp_path / f"{seed}.pt")
        save_checkpoint(paths[-1], checkpoint_payload(tiny_model(seed), src_vocab=VOCAB,
                                                      tgt_vocab=VOCAB))
    terminal, _ = on_terminal(monkeypatch)
    average_checkpoints(paths)
    assert "averaging" in terminal.getvalue() and "/3 " in terminal.getvalue()


def test_translate_command_bar_and_no_progress(monkeypatch, tmp_path) -> None:
    checkpoint, source = tmp_path / "m.pt", tmp_path / "in.txt"
    save_checkpoint(checkpoint, checkpoint_payload(tiny_model(), src_vocab=VOCAB,
                                                   tgt_vocab=VOCAB,
                                                   tokenizer=WhitespaceTokenizer()))
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(source),
            "--beam-size", "1", "--max-len", "4", "--threads", "1", "--device", "cpu"]
    terminal, stdout = on_terminal(monkeypatch)
    assert main(argv) == 0
    out = stdout.getvalue().splitlines()
    assert len(out) == len(SENTENCES)                    # stdout: the translations alone
    drawn = terminal.getvalue()
    size = tqdm.tqdm.format_sizeof(source.stat().st_size)       # a bar over the file's bytes
    assert "translating" in drawn and f"/{size} [" in drawn
    terminal, stdout = on_terminal(monkeypatch)
    assert main([*argv, "--no-progress"]) == 0
    assert stdout.getvalue().splitlines() == out and terminal.getvalue() == ""


class _Recorder(Bar):
    """A bar that records each advance, and how many lines stdout held at that moment."""

    def __init__(self, stdout: io.StringIO) -> None:
        self.stdout, self.updates = stdout, []

    def update(self, n: float = 1) -> None:
        if n:
            self.updates.append((n, self.stdout.getvalue().count("\n")))


def test_translate_command_prints_and_advances_the_bar_batch_by_batch(monkeypatch,
                                                                       tmp_path) -> None:
    """12 lines, --batch-size 5: one window of 3 batches; the bar moves once per batch, by
    that batch's share of the file's bytes, and when it first moves some translations, but
    not all, are already printed (a window used to print all at once, the bar after it)."""
    checkpoint, source = tmp_path / "m.pt", tmp_path / "in.txt"
    save_checkpoint(checkpoint, checkpoint_payload(tiny_model(), src_vocab=VOCAB,
                                                   tgt_vocab=VOCAB,
                                                   tokenizer=WhitespaceTokenizer()))
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    terminal, stdout = on_terminal(monkeypatch)
    bar = _Recorder(stdout)
    monkeypatch.setattr("bahdanau.cli.commands.progress_bar", lambda *args, **kwargs: bar)
    assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(source),
                 "--beam-size", "1", "--max-len", "4", "--batch-size", "5", "--threads", "1",
                 "--device", "cpu"]) == 0
    size = source.stat().st_size
    assert [n for n, _ in bar.updates] == pytest.approx([size * 5 / 12, size * 5 / 12,
                                                        size * 2 / 12])
    printed = [lines for _, lines in bar.updates]
    assert 1 <= printed[0] < len(SENTENCES) and printed[-1] == len(SENTENCES)
    assert printed == sorted(printed)


def test_translate_command_counts_the_lines_of_a_fifo(monkeypatch, tmp_path) -> None:
    """A FIFO as --input has no size: its bar counts lines, as stdin's does."""
    checkpoint, fifo = tmp_path / "m.pt", tmp_path / "in.fifo"
    save_checkpoint(checkpoint, checkpoint_payload(tiny_model(), src_vocab=VOCAB,
                                                   tgt_vocab=VOCAB,
                                                   tokenizer=WhitespaceTokenizer()))
    os.mkfifo(fifo)
    text = "\n".join(SENTENCES) + "\n"
    writer = threading.Thread(target=fifo.write_text, args=(text,), kwargs={"encoding": "utf-8"})
    terminal, stdout = on_terminal(monkeypatch)
    writer.start()
    try:
        assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(fifo),
                     "--beam-size", "1", "--max-len", "4", "--threads", "1",
                     "--device", "cpu"]) == 0
    finally:
        writer.join(timeout=60)
    assert len(stdout.getvalue().splitlines()) == len(SENTENCES)
    drawn = terminal.getvalue()
    assert "translating" in drawn and "lines [" in drawn and "B/s" not in drawn, drawn


def test_score_counts_the_sentences_and_the_command_keeps_stdout_for_scores(
        monkeypatch, tmp_path) -> None:
    terminal, stdout = on_terminal(monkeypatch)
    model = tiny_model()
    scores = score_corpus(model, SENTENCES, SENTENCES[::-1], VOCAB, VOCAB,
                          WhitespaceTokenizer(), batch_size=5)
    drawn = terminal.getvalue()
    assert "scoring" in drawn and f"/{len(SENTENCES)} " in drawn and stdout.getvalue() == ""
    terminal.truncate(0)
    assert score_corpus(model, SENTENCES, SENTENCES[::-1], VOCAB, VOCAB, WhitespaceTokenizer(),
                        batch_size=5, progress=None) == scores
    assert terminal.getvalue() == ""
    checkpoint, src, tgt = tmp_path / "m.pt", tmp_path / "s.txt", tmp_path / "t.txt"
    save_checkpoint(checkpoint, checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=VOCAB,
                                                   tokenizer=WhitespaceTokenizer()))
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(SENTENCES[::-1]) + "\n", encoding="utf-8")
    argv = ["score", "--checkpoint", str(checkpoint), "--src", str(src), "--tgt", str(tgt),
            "--threads", "1", "--device", "cpu"]
    terminal, stdout = on_terminal(monkeypatch)
    assert main(argv) == 0
    assert "scoring" in terminal.getvalue()
    assert len(stdout.getvalue().splitlines()) == len(SENTENCES)     # the scores alone
    terminal, stdout = on_terminal(monkeypatch)
    assert main([*argv, "--no-progress"]) == 0 and terminal.getvalue() == ""
