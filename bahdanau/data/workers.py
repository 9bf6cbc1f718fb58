"""The tokenising workers of `bahdanau.data.prepare_corpus`, and how a prepare run stops.

`tokenised` hands chunks of lines to worker processes and yields their results in order. The
pool is supervised here, in the main thread, with no pool library: each worker has its own
pipe and is given a chunk only when it has none (so neither side ever waits on a full pipe
the other is not reading), and the main process waits on that pipe together with every
worker's sentinel (`multiprocessing.connection.wait`). So a worker that dies (the
out-of-memory killer's SIGKILL) is seen at once, whoever it was, and is an `InputError`
naming it: there is no shared queue whose lock a dead worker could hold, no feeder or manager
thread to join, no future to wait on (what hangs `concurrent.futures.ProcessPoolExecutor`
when a worker dies while it reads the call queue; `multiprocessing.Pool` replaces a dead
worker and waits forever for its lost result). Ending the pool is SIGKILL and reaping, which
cannot hang: a worker holds nothing that needs saving.

Workers die with the main process whatever ends it, SIGKILL included: on Linux the kernel
kills them (`prctl(PR_SET_PDEATHSIG, SIGKILL)`, set first thing in each worker), elsewhere a
thread in each worker waits for the main process to end and exits then (`_die_with_parent`).
A worker left alive would hold the lock of the folder being written (inherited by fork) and
keep every later prepare out of it.

`stop_on_signals` turns SIGINT, SIGTERM and SIGHUP (`bahdanau._files.STOP_SIGNALS`: Ctrl-C, a
scheduler, a closed terminal) into `Stopped` in the main process; later ones are ignored
until the stop is done, so it is never cut in two. The workers ignore SIGINT (Ctrl-C reaches
the whole process group: the main process stops them) and die quietly of SIGTERM and SIGHUP,
so a stopped prepare prints no worker tracebacks.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from bahdanau._files import STOP_SIGNALS, handling_signals, signals_held
from bahdanau.data.tokenizers import Tokenizer, sides
from bahdanau.errors import InputError

__all__ = ["Stopped", "ignore_stop_signals", "stop_on_signals", "tokenised"]

Chunk = tuple[list[str], list[str]]       # the source and target lines of up to CHUNK_PAIRS pairs
Encoded = tuple[Any, Any]                 # per side: (the chunk's words, their ids, lengths)

_PR_SET_PDEATHSIG = 1                     # <linux/prctl.h>
_REAP_SECONDS = 10                        # a worker that ended (or was killed) is reaped within


class Stopped(KeyboardInterrupt):
    """A prepare run stopped by SIGINT, SIGTERM or SIGHUP (`signum`); what it had written is
    removed."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, the first of SIGINT, SIGTERM and SIGHUP raises `Stopped` in the main
    thread; later ones are ignored until the block is left, so the stop (workers killed, the
    partial folder removed, the lock released) runs to its end. Elsewhere than the main
    thread: no change, as handlers can only be set there."""
    def stop(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    with handling_signals(STOP_SIGNALS, stop):
        yield


def ignore_stop_signals() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP from now on (in the main thread; elsewhere: no change):
    for a process that ends because of a `Stopped`, so a later signal cannot cut short its one
    line. Never for a library call: the caller's Ctrl-C would be gone."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


_worker_tokenizer: Tokenizer | None = None


def _set_tokenizer(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def encode_chunk(chunk: Chunk) -> Encoded:
    """Tokenise a chunk: per side, the chunk's own word list, its ids in that list (uint32)
    and the sentence lengths. Words become corpus-wide ids in the main process. A blank line
    has no tokens, whatever the tokenizer (a character tokenizer would make its spaces some)."""
    assert _worker_tokenizer is not None   # set first by _set_tokenizer, in every worker
    encoded = []
    for lines, side in zip(chunk, sides(_worker_tokenizer), strict=True):
        tokenize = side.tokenize
        words: dict[str, int] = {}
        ids: list[int] = []
        lengths = np.empty(len(lines), dtype=np.int64)
        for i, line in enumerate(lines):
            tokens = tokenize(line) if line.strip() else []
            lengths[i] = len(tokens)
            ids.extend([words.setdefault(t, len(words)) for t in tokens])
        encoded.append((list(words), np.asarray(ids, dtype=np.uint32), lengths))
    return encoded[0], encoded[1]


def tokenised(chunks: Iterator[Chunk], tokenizer: Tokenizer,
              workers: int) -> Generator[Encoded, None, None]:
    """`encode_chunk` of each chunk, in order, computed by `workers` processes (1: here).

    One chunk a worker is in flight (the next is sent as soon as its result is in, before the
    caller gets that result), so memory stays bounded. However the generator ends (the last
    chunk, an exception, `close()`), every worker has been killed and reaped when it returns.

    Raises:
        InputError: a worker died, naming it and how.
        Exception: what `tokenizer` raised in a worker.
    """
    if workers == 1:
        _set_tokenizer(tokenizer)
        yield from map(encode_chunk, chunks)
        return
    pool: list[tuple[BaseProcess, Connection]] = []
    try:
        with signals_held():                   # a stop waits until every worker is known
            for _ in range(workers):
                pool.append(_start(tokenizer))
        busy: deque[int] = deque()             # the workers with a chunk, in chunk order
        for index, chunk in zip(range(workers), chunks, strict=False):
            _send(pool, index, chunk)
            busy.append(index)
        while busy:
            index = busy.popleft()
            result = _receive(pool, index)
            if (following := next(chunks, None)) is not None:
                _send(pool, index, following)
                busy.append(index)
            yield result
    finally:
        with signals_held():                   # the stop itself is never cut in two
            _end(pool)


def _start(tokenizer: Tokenizer) -> tuple[BaseProcess, Connection]:
    """A started worker and the main process's end of its pipe."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context: Any = multiprocessing.get_context(method)
    mine, theirs = context.Pipe()
    process = context.Process(target=_work, args=(theirs, tokenizer, os.getpid()),
                              daemon=True, name="bahdanau-tokenising")
    process.start()
    theirs.close()                # only the worker holds its end: its death is EOF here
    return process, mine


def _send(pool: list[tuple[BaseProcess, Connection]], index: int, chunk: Chunk) -> None:
    process, conn = pool[index]
    try:
        conn.send(chunk)
    except OSError:                            # the worker's end is closed: it died
        raise _died(pool, process) from None


def _receive(pool: list[tuple[BaseProcess, Connection]], index: int) -> Encoded:
    """Worker `index`'s result, waiting for it or for any worker to die."""
    process, conn = pool[index]
    sentinels = {p.sentinel: p for p, _ in pool}
    ready = wait([conn, *sentinels])
    dead = [sentinels[s] for s in ready if isinstance(s, int) and s in sentinels]
    if dead:
        raise _died(pool, dead[0])
    try:
        ok, result = conn.recv()
    except (EOFError, OSError):
        raise _died(pool, process) from None
    if not ok:
        raise result
    return result


def _end(pool: list[tuple[BaseProcess, Connection]]) -> None:
    """Kill and reap the workers (those that ended already are only reaped); close the pipes."""
    for process, _ in pool:
        if process.exitcode is None:
            process.kill()
    for process, conn in pool:
        process.join(_REAP_SECONDS)
        conn.close()


def _died(pool: list[tuple[BaseProcess, Connection]], dead: BaseProcess) -> InputError:
    """The error of worker `dead` having died (the others are ended first), naming it."""
    dead.join(_REAP_SECONDS)                   # it ended (its pipe or sentinel says so)
    code = dead.exitcode
    _end(pool)
    if code is None:
        how = "it stopped answering"
    elif code >= 0:
        how = f"exit code {code}"
    else:
        how = f"killed by {_signal_name(-code)}"
    hint = " (the out-of-memory killer sends SIGKILL)" if code == -signal.SIGKILL else ""
    return InputError(f"tokenising worker {dead.pid} died ({how}){hint}: nothing was written")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ------------------------------------------------------------------ in a worker


def _work(conn: Connection, tokenizer: Tokenizer, parent: int) -> None:
    """A worker's life: tokenise each chunk received on `conn` and send back (True, result),
    or (False, the exception the tokenizer raised); end when the main process does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)         # the main process stops the pool
    for sig in STOP_SIGNALS:
        if sig != signal.SIGINT:
            signal.signal(sig, signal.SIG_DFL)           # not the handler inherited by fork
    _die_with_parent(parent)
    _set_tokenizer(tokenizer)
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[bool, Any] = (True, encode_chunk(chunk))
        except Exception as err:
            reply = (False, err)
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        except Exception as err:                         # an exception that does not pickle
            conn.send((False, RuntimeError(f"tokenising failed: {err!r}")))


def _die_with_parent(parent: int) -> None:
    """Make this worker end when process `parent` (the one that started it) ends, however.

    Linux: `prctl(PR_SET_PDEATHSIG, SIGKILL)`, so the kernel kills the worker the moment the
    main process dies, even of SIGKILL, even while the worker is busy; no thread, no polling.
    (It fires when the thread that started the worker ends: `tokenised` starts and ends its
    workers in the thread that consumes it.) Elsewhere, or should prctl fail: a daemon thread
    that waits on the parent's sentinel (`multiprocessing.parent_process()`, ready when the
    parent has ended on every platform and start method) and then exits the process.
    """
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
            if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:               # it died before prctl took effect
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    watched = multiprocessing.parent_process()
    if watched is None:
        return

    def watch() -> None:
        watched.join()
        os._exit(1)

    threading.Thread(target=watch, name="bahdanau-parent-watch", daemon=True).start()
