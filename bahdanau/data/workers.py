"""The tokenising workers of `bahdanau.data.prepare_corpus`, and how a prepare run stops.

`tokenised` hands chunks of lines to a pool of processes and yields their results in order.
A worker that dies (the out-of-memory killer's SIGKILL) is an `InputError` naming it, never a
hang: a `concurrent.futures.ProcessPoolExecutor` notices the death. `stop_on_signals` turns
SIGINT and SIGTERM into `Stopped` in the main process; the workers ignore SIGINT (Ctrl-C
reaches the whole process group: the main process stops them) and die quietly of SIGTERM, so
a stopped prepare prints no worker tracebacks. `signals_held` defers them across a step that
must not be cut in two (the renames that put a prepared folder in place).
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from bahdanau._files import STOP_SIGNALS, handling_signals
from bahdanau.data.tokenizers import Tokenizer
from bahdanau.errors import InputError

__all__ = ["Stopped", "stop_on_signals", "tokenised"]

Chunk = tuple[list[str], list[str]]       # the source and target lines of up to CHUNK_PAIRS pairs
Encoded = tuple[Any, Any]                 # per side: (the chunk's words, their ids, lengths)



class Stopped(KeyboardInterrupt):
    """A prepare run stopped by SIGINT or SIGTERM (`signum`); what it had written is removed."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise `Stopped` in the main thread (elsewhere: no
    change, as handlers can only be set there)."""
    def stop(signum: int, frame: Any) -> None:
        for sig, handler in previous.items():            # a second signal acts as usual
            signal.signal(sig, handler)
        raise Stopped(signum)

    with handling_signals(STOP_SIGNALS, stop) as previous:
        yield


_worker_tokenizer: Tokenizer | None = None


def _set_tokenizer(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _start_worker(tokenizer: Tokenizer) -> None:
    _set_tokenizer(tokenizer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)         # the main process stops the pool
    signal.signal(signal.SIGTERM, signal.SIG_DFL)        # not the handler inherited by fork


def encode_chunk(chunk: Chunk) -> Encoded:
    """Tokenise a chunk: per side, the chunk's own word list, its ids in that list (uint32)
    and the sentence lengths. Words become corpus-wide ids in the main process."""
    assert _worker_tokenizer is not None   # set first by _set_tokenizer, in every worker
    tokenize = _worker_tokenizer.tokenize
    sides = []
    for lines in chunk:
        words: dict[str, int] = {}
        ids: list[int] = []
        lengths = np.empty(len(lines), dtype=np.int64)
        for i, line in enumerate(lines):
            tokens = tokenize(line)
            lengths[i] = len(tokens)
            ids.extend([words.setdefault(t, len(words)) for t in tokens])
        sides.append((list(words), np.asarray(ids, dtype=np.uint32), lengths))
    return sides[0], sides[1]


def tokenised(chunks: Iterator[Chunk], tokenizer: Tokenizer,
              workers: int) -> Generator[Encoded, None, None]:
    """`encode_chunk` of each chunk, in order, computed by `workers` processes (1: here).

    At most two chunks a worker are in flight, so memory stays bounded. When the consumer
    stops early (an exception, `close()`), the workers are killed at once.

    Raises:
        InputError: a worker died, naming it and how.
    """
    if workers == 1:
        _set_tokenizer(tokenizer)
        yield from map(encode_chunk, chunks)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_start_worker, initargs=(tokenizer,))
    before = set(multiprocessing.active_children())
    processes: set[BaseProcess] = set()
    pending: deque[Future[Encoded]] = deque()
    try:
        for chunk in chunks:
            pending.append(pool.submit(encode_chunk, chunk))
            processes.update(set(multiprocessing.active_children()) - before)
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        pool.shutdown(wait=True)            # the pool ends the others: every exit code is known
        raise _died(processes) from None
    finally:
        if pending:                                      # stopped early: no waiting for them
            for process in processes:
                process.kill()
        pool.shutdown(wait=True, cancel_futures=True)


def _died(processes: set[BaseProcess]) -> InputError:
    """The error of a pool broken by a dead worker, naming it. The pool stops the others with
    SIGTERM, so a worker ended otherwise is the one that died first."""
    dead = sorted((p for p in processes if p.exitcode not in (None, 0)),
                  key=lambda p: p.exitcode == -signal.SIGTERM)
    if not dead:
        return InputError("a tokenising worker died: nothing was written")
    worker, code = dead[0], dead[0].exitcode
    assert code is not None
    how = f"exit code {code}" if code > 0 else f"killed by {_signal_name(-code)}"
    hint = " (the out-of-memory killer sends SIGKILL)" if code == -signal.SIGKILL else ""
    return InputError(f"tokenising worker {worker.pid} died ({how}){hint}: nothing was written")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
