"""Tiny random training data and models shared by the training and checkpoint tests.

Importable from any test module (`pythonpath = ["tests"]` in pyproject.toml).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from bahdanau.data import Example, Vocab, multi30k_files, read_lines
from bahdanau.errors import InputError
from bahdanau.models import RNNSearch, build_model
from bahdanau.presets import tiny

# 12 words and the 4 specials: the 16 entries a presets.tiny() model has per side
TINY_VOCAB = Vocab([f"w{i}" for i in range(12)])


def random_examples(n: int, seed: int = 0) -> list[Example]:
    """`n` examples of 1 to 6 random word ids (4..15) per side, for `presets.tiny()` models."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        s, t = torch.randint(1, 7, (2,), generator=g).tolist()
        out.append(Example(i, torch.randint(4, 16, (s,), generator=g).tolist(),
                           torch.randint(4, 16, (t,), generator=g).tolist()))
    return out


def tiny_model(seed: int = 0, **changes) -> RNNSearch:
    """`presets.tiny()` with `changes`, its weights drawn after `torch.manual_seed(seed)`."""
    torch.manual_seed(seed)
    return build_model(replace(tiny(), **changes))


def write_multi30k_slice(root: Path, n_train: int, n_test: int) -> Path:
    """`root` with tr.en/tr.fr (the first `n_train` shipped Multi30k training pairs) and
    te.en/te.fr (the `n_test` pairs after them), plain text, one sentence per line."""
    n = n_train + n_test
    en = read_lines(multi30k_files("train", "en"))[:n]
    fr = read_lines(multi30k_files("train", "fr"))[:n]
    for name, lines in (("tr.en", en[:n_train]), ("tr.fr", fr[:n_train]),
                        ("te.en", en[n_train:]), ("te.fr", fr[n_train:])):
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def one_line_error(call: Callable[[], Any], *fragments: str) -> str:
    """The message of the `InputError` that `call()` raises: one line, holding `fragments`."""
    with pytest.raises(InputError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


class _FailingFile:
    """A file whose writes raise `error` once more than `after` bytes were written."""

    def __init__(self, f, error: BaseException, after: int) -> None:
        self.f, self.error, self.after, self.written = f, error, after, 0

    def write(self, data) -> int:
        self.written += len(memoryview(data))
        if self.written > self.after:
            raise self.error
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def failing_writes(monkeypatch: pytest.MonkeyPatch, error: BaseException, *, after: int = 100,
                   name: str = "") -> None:
    """Make the temporary files that `bahdanau._files.atomic_file` writes fail with `error`
    after `after` bytes (a full disk, an I/O error, or Ctrl-C mid-write); with `name`, only
    those of the files whose name holds it."""
    real_fdopen = os.fdopen

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        f = real_fdopen(fd, *args, **kwargs)
        if name not in os.path.basename(os.readlink(f"/proc/self/fd/{fd}")):
            return f
        return _FailingFile(f, error, after)

    monkeypatch.setattr(os, "fdopen", fdopen)


TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")   # a log line's time


def unlogged(text: str) -> str:
    """`text` (what a command wrote on stderr) without its log lines: what it said apart from
    logging, such as its one error line."""
    return "".join(line for line in text.splitlines(keepends=True) if not TIMESTAMP.match(line))


def logged(text: str) -> list[str]:
    """The messages of the log lines in `text` (the console's or train.log's), without their
    times; lines without a time (a library's own warning on stderr) are left out."""
    return [line[match.end():] for line in text.splitlines()
            if (match := TIMESTAMP.match(line))]


def interrupt_after(monkeypatch, steps: int) -> None:
    """Training in this process gets SIGINT once `steps` more updates have run (as Ctrl-C
    would: the loop notes it, finishes the update and saves)."""
    import bahdanau.training.loop as loop

    done = []

    def step(run):
        stats = run_step(run)
        done.append(run.state.step)
        if len(done) == steps:
            run.signal = "sigint"
        return stats

    run_step = loop.run_step
    monkeypatch.setattr(loop, "run_step", step)
