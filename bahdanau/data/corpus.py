"""Prepared corpora: parallel text tokenised and encoded once, kept as memory-mapped arrays.

`prepare_corpus` (``bahdanau prepare``) streams two line-aligned files (plain or gzip, any
size; never a whole file in memory), tokenises them in several processes, filters pairs, builds
the vocabularies (or takes given ones) and writes a folder::

    manifest.json                  format and version, the inputs (bytes, SHA-256), the options,
                                   the counts (lines read, pairs kept, pairs filtered and why)
    src_vocab.json, tgt_vocab.json `Vocab.save`
    tokenizer.json (+ its model)   `bahdanau.data.save_tokenizer`
    src.ids.npy, tgt.ids.npy       the kept sentences' ids end to end: uint16, or uint32 when a
                                   vocabulary has more than 65,536 entries
    src.offsets.npy, tgt.offsets.npy   int64, one more than the pairs: sentence i is
                                   ids[offsets[i]:offsets[i + 1]]
    lines.npy                      int64: the 0-based input line of each kept pair

The folder is written under a temporary name beside `out` and renamed when whole, so a crash
never leaves something that passes for a prepared corpus. Running again on the same inputs
with the same options reuses it.

`PreparedCorpus(folder)` opens one read-only through memory maps: a `Sequence[Example]` that
`bahdanau.training.setup_run` takes like the list `encode_pairs` returns, with the same examples
in the same order (so the same batches for the same seed), while the operating system shares
the arrays' pages between the processes that read them.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from bahdanau._checks import (
    check_optional_positive_int,
    check_path,
    check_tokenizer,
    check_type,
    describe,
    is_int,
    usable_cores,
)
from bahdanau._files import atomic_write, fsync_dir, fsync_file
from bahdanau._progress import progress_bar
from bahdanau.data.batching import Example
from bahdanau.data.sentencepiece import SentencePieceTokenizer, check_vocabs
from bahdanau.data.text import iter_lines
from bahdanau.data.tokenizers import (
    DefaultTokenizer,
    Tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_to_payload,
)
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError

__all__ = ["FORMAT", "VERSION", "PreparedCorpus", "TrainSentencePiece", "prepare_corpus"]

FORMAT = "bahdanau prepared corpus"
VERSION = 1
MANIFEST = "manifest.json"
CHUNK_PAIRS = 20_000        # pairs a worker tokenises at a time
_COPY_IDS = 1 << 24         # ids remapped at a time when the arrays are written
_SIDES = ("src", "tgt")


@dataclass(frozen=True)
class TrainSentencePiece:
    """Ask `prepare_corpus` for a SentencePiece model trained on the corpus itself: one model
    for both sides, on at most `max_sentences` sentences sampled from each side."""

    model_type: Literal["bpe", "unigram"] = "unigram"
    vocab_size: int = 8000
    max_sentences: int = 1_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model_type not in ("bpe", "unigram"):
            raise InputError(f"model_type must be 'bpe' or 'unigram', got {self.model_type!r}")
        for name in ("vocab_size", "max_sentences"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InputError(f"{name} must be a positive int, got {value!r}")


# ----------------------------------------------------------------------------------------------
# Reading and encoding


def _pairs(src: Path, tgt: Path, bar: Any) -> Iterator[tuple[str, str]]:
    """The lines of two files in lockstep, the bytes read counted on `bar`; InputError when one
    ends before the other."""
    read = 0
    with src.open("rb") as fs, tgt.open("rb") as ft:
        lines = itertools.zip_longest(iter_lines(fs, str(src)), iter_lines(ft, str(tgt)))
        for number, (s, t) in enumerate(lines, 1):
            if s is None or t is None:
                short, long = (src, tgt) if s is None else (tgt, src)
                raise InputError(f"{short} has {number - 1} lines but {long} has more: the files "
                                 "are not line-aligned")
            yield s, t
            if number % CHUNK_PAIRS == 0:
                read, before = fs.tell() + ft.tell(), read
                bar.update(read - before)


def _chunks(pairs: Iterator[tuple[str, str]]) -> Iterator[tuple[list[str], list[str]]]:
    while chunk := list(itertools.islice(pairs, CHUNK_PAIRS)):
        yield [s for s, _ in chunk], [t for _, t in chunk]


_worker_tokenizer: Tokenizer | None = None


def _set_worker_tokenizer(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_chunk(chunk: tuple[list[str], list[str]]) -> tuple[Any, Any]:
    """Tokenise a chunk in a worker: per side, the chunk's own word list, its ids in that list
    (uint32) and the sentence lengths. Words become corpus-wide ids in the main process."""
    assert _worker_tokenizer is not None   # set first by _set_worker_tokenizer, in every worker
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


def _encoded(chunks: Iterator[tuple[list[str], list[str]]], tokenizer: Tokenizer,
             workers: int) -> Iterator[tuple[Any, Any]]:
    if workers == 1:
        _set_worker_tokenizer(tokenizer)
        yield from map(_encode_chunk, chunks)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    with context.Pool(workers, initializer=_set_worker_tokenizer, initargs=(tokenizer,)) as pool:
        pending: collections.deque[Any] = collections.deque()
        for chunk in chunks:        # at most 2 chunks a worker in flight: memory stays bounded
            pending.append(pool.apply_async(_encode_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


class _Side:
    """One side's corpus-wide word ids, counts and the kept sentences' ids and lengths, the ids
    spooled to a file (they become the final array once the vocabulary is known)."""

    def __init__(self, spool: Path) -> None:
        self.words: dict[str, int] = {}
        self.counts = np.zeros(0, dtype=np.int64)
        self.lengths: list[np.ndarray] = []
        self.spool_path = spool
        self.spool = spool.open("wb")

    def add(self, encoded: tuple[list[str], np.ndarray, np.ndarray], keep: np.ndarray) -> None:
        chunk_words, local_ids, lengths = encoded
        to_global = np.fromiter((self.words.setdefault(w, len(self.words)) for w in chunk_words),
                                dtype=np.uint32, count=len(chunk_words))
        ids = to_global[local_ids][np.repeat(keep, lengths)]
        counts = np.bincount(ids, minlength=len(self.words))
        counts[:len(self.counts)] += self.counts
        self.counts = counts
        self.lengths.append(lengths[keep])
        self.spool.write(ids.tobytes())

    def word_counts(self) -> dict[str, int]:
        return dict(zip(self.words, self.counts.tolist(), strict=True))

    def write(self, folder: Path, side: str, vocab: Vocab) -> int:
        """Write `{side}.ids.npy` (the spooled ids through `vocab`) and `{side}.offsets.npy`;
        returns the number of tokens."""
        self.spool.close()
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        _save(folder / f"{side}.offsets.npy", offsets)
        lookup = np.fromiter((vocab.token_to_id(w) for w in self.words), dtype=np.uint32,
                             count=len(self.words))
        spooled: np.ndarray | list[int] = (
            np.memmap(self.spool_path, dtype=np.uint32, mode="r") if offsets[-1] else [])
        ids = np.lib.format.open_memmap(folder / f"{side}.ids.npy", mode="w+",
                                        dtype=_id_dtype(vocab), shape=(int(offsets[-1]),))
        for start in range(0, len(ids), _COPY_IDS):
            ids[start:start + _COPY_IDS] = lookup[spooled[start:start + _COPY_IDS]]
        ids.flush()
        del ids, spooled
        fsync_file(folder / f"{side}.ids.npy")
        self.spool_path.unlink()
        return int(offsets[-1])


def _save(path: Path, array: np.ndarray) -> None:
    """`np.save`, durably (the folder is renamed into place only when every file is on disk)."""
    atomic_write(path, lambda f: np.save(f, array))


def _id_dtype(vocab: Vocab) -> type:
    return np.uint16 if len(vocab) <= 1 << 16 else np.uint32


def _sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            hasher.update(block)
    return hasher.hexdigest()


# ----------------------------------------------------------------------------------------------
# prepare


def prepare_corpus(src_path: str | os.PathLike[str], tgt_path: str | os.PathLike[str],
                   out: str | os.PathLike[str], *,
                   tokenizer: Tokenizer | TrainSentencePiece | None = None,
                   vocab_size: int | None = 10000, src_vocab: Vocab | None = None,
                   tgt_vocab: Vocab | None = None, max_len: int | None = None,
                   max_ratio: float | None = None, strict: bool = False,
                   workers: int | None = None, overwrite: bool = False,
                   shipped: dict[str, str] | None = None,
                   log: Callable[[str], None] | None = None) -> PreparedCorpus:
    """Tokenise, filter and encode a parallel corpus into a prepared folder (module docstring).

    A pair is dropped, and counted in the manifest, when a side has no token (an empty or
    blank line), when a side has more than `max_len` tokens, or when the longer side has more
    than `max_ratio` times the tokens of the shorter. The vocabularies count the kept pairs.

    Args:
        src_path, tgt_path: line-aligned UTF-8 text files, plain or gzip.
        out: the folder to write. If it holds a prepared corpus of the same inputs (by SHA-256)
            and options, that one is reused; another prepared corpus is replaced only with
            `overwrite`; a folder of other files is never touched.
        tokenizer: a tokenizer instance (default `DefaultTokenizer()`), e.g. a
            `SentencePieceTokenizer` loaded from one's own model, or `TrainSentencePiece(...)`
            to train one on these files.
        vocab_size: most frequent words kept per side when the vocabularies are built (None:
            all); for a SentencePiece tokenizer, leave it at or above its piece count.
        src_vocab, tgt_vocab: vocabularies to use instead of building them (both or neither).
        max_len: drop pairs with a side longer than this many tokens (None: keep all).
        max_ratio: drop pairs whose longer side has more than this many times the tokens of
            the shorter (None: keep all).
        strict: an empty side is an error (naming the file and line) instead of a dropped pair.
        workers: tokenising processes (default: the usable cores, at most 8).
        overwrite: replace a prepared corpus of other inputs or options in `out`.
        shipped: recorded in the manifest for a corpus shipped with the package ({"corpus":
            "multi30k", "src_lang": ..., "tgt_lang": ...}): training finds its dev and test sets.
        log: called with what it did (default: this module's logger, at INFO).
    Returns:
        The prepared corpus, opened.
    Raises:
        InputError: a bad argument; files that are not line-aligned, not UTF-8 or damaged gzip
            (named, with the line); an empty side with `strict`; no pair left; `out` holding
            something that may not be replaced. Nothing is written in `out` then.
    """
    src, tgt, out = (check_path(n, p) for n, p in (("src_path", src_path),
                                                   ("tgt_path", tgt_path), ("out", out)))
    tokenizer = DefaultTokenizer() if tokenizer is None else tokenizer
    _check_arguments(src, tgt, tokenizer, vocab_size, src_vocab, tgt_vocab, max_len, max_ratio)
    workers, log = _workers(workers), log or logging.getLogger(__name__).info
    existing, start = _existing_corpus(out), time.perf_counter()
    options = {"tokenizer": _describe_tokenizer(tokenizer), "vocab_size": vocab_size,
               "src_vocab": _vocab_sha256(src_vocab), "tgt_vocab": _vocab_sha256(tgt_vocab),
               "max_len": max_len, "max_ratio": max_ratio, "strict": strict}
    inputs = [{"file": p.name, "bytes": p.stat().st_size, "sha256": _sha256(p)}
              for p in (src, tgt)]
    if existing and existing["inputs"] == inputs and existing["options"] == options:
        log(f"{out} is up to date (same inputs and options): reusing it")
        return PreparedCorpus(out)
    if existing is not None and not overwrite:
        raise InputError(f"{out} holds {_described(existing)}: replace it with overwrite "
                         "(--overwrite) or choose another folder")

    if isinstance(tokenizer, TrainSentencePiece):
        log(f"training a SentencePiece {tokenizer.model_type} model of {tokenizer.vocab_size} "
            f"pieces on at most {tokenizer.max_sentences:,} sentences per side")
        tokenizer = _train_sentencepiece(src, tgt, tokenizer)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)        # left by a process killed while writing
    partial.mkdir(parents=True)
    try:
        manifest = _write(partial, src, tgt, tokenizer, vocab_size, src_vocab, tgt_vocab,
                          max_len, max_ratio, strict, workers)
        manifest.update(format=FORMAT, version=VERSION, inputs=inputs, options=options,
                        shipped=shipped, seconds=round(time.perf_counter() - start, 1))
        text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
        atomic_write(partial / MANIFEST, lambda f: f.write(text.encode("utf-8")))
        _replace(out, partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log(_summary(out, manifest))
    return PreparedCorpus(out)


def _described(existing: dict[str, Any]) -> str:
    """What `_existing_corpus` found, as a message says it ({} for a damaged manifest)."""
    return ("a prepared corpus of other inputs or options" if existing
            else "a damaged prepared corpus")


def _summary(out: Path, manifest: dict[str, Any]) -> str:
    """The line that says what `prepare_corpus` kept and dropped."""
    counts = manifest["counts"]
    return (f"prepared {out}: {counts['pairs']:,} pairs kept of {counts['lines']:,} lines "
            f"({counts['empty']:,} with an empty side, {counts['too_long']:,} too long, "
            f"{counts['ratio']:,} over the length ratio); vocabularies "
            f"{manifest['vocab_sizes'][0]:,} / {manifest['vocab_sizes'][1]:,}; "
            f"{manifest['seconds']:.1f} s")


def _check_arguments(src: Path, tgt: Path, tokenizer: Tokenizer | TrainSentencePiece,
                     vocab_size: int | None, src_vocab: Vocab | None, tgt_vocab: Vocab | None,
                     max_len: int | None, max_ratio: float | None) -> None:
    """`prepare_corpus`'s checks of its arguments, before any work."""
    if not isinstance(tokenizer, TrainSentencePiece):
        check_tokenizer("tokenizer", tokenizer)
    if (src_vocab is None) != (tgt_vocab is None):
        raise InputError("give both src_vocab and tgt_vocab, or neither")
    for name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if vocab is not None:
            check_type(name, vocab, Vocab, "a Vocab or None")
    check_optional_positive_int("vocab_size", vocab_size)
    check_optional_positive_int("max_len", max_len)
    if max_ratio is not None and (isinstance(max_ratio, bool) or not isinstance(
            max_ratio, (int, float)) or not 1 <= max_ratio < float("inf")):
        raise InputError(f"max_ratio must be a number >= 1 or None, got {max_ratio!r}")
    for path, what in ((src, "src_path"), (tgt, "tgt_path")):
        if not path.is_file():
            raise InputError(f"{what} {path}: " + ("is a folder, not a file" if path.is_dir()
                                                   else "no such file"))


def _workers(workers: int | None) -> int:
    if workers is None:
        return max(1, min(usable_cores(), 8))
    if not is_int(workers) or workers < 1:
        raise InputError(f"workers must be a positive int or None, got {workers!r}")
    return workers


def _describe_tokenizer(tokenizer: Tokenizer | TrainSentencePiece) -> dict[str, Any]:
    """What identifies the tokenizer in the manifest (a SentencePiece model by its SHA-256)."""
    if isinstance(tokenizer, TrainSentencePiece):
        return {"name": "sentencepiece", "train": asdict(tokenizer)}
    payload = tokenizer_to_payload(tokenizer)
    return {key: (hashlib.sha256(value.numpy().tobytes()).hexdigest()
                  if hasattr(value, "numpy") else value) for key, value in payload.items()}


def _vocab_sha256(vocab: Vocab | None) -> str | None:
    if vocab is None:
        return None
    return hashlib.sha256(json.dumps(vocab.to_dict(), ensure_ascii=False).encode()).hexdigest()


def _existing_corpus(out: Path) -> dict[str, Any] | None:
    """The manifest of the prepared corpus in `out` ({} if it is damaged), None if `out` is
    missing or empty. Raises when `out` is a file or a folder of other files: never replaced."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise InputError(f"{out} is a file, not a folder for a prepared corpus")
    if not (out / MANIFEST).is_file():
        if any(out.iterdir()):
            raise InputError(f"{out} holds files but no prepared corpus ({MANIFEST}): choose "
                             "another folder; nothing there is replaced")
        return None
    try:
        return _read_manifest(out)
    except InputError:
        return {}


def _replace(out: Path, partial: Path) -> None:
    """Put the finished folder `partial` at `out`, moving an old corpus there aside first
    (it is deleted only once the new one is in place)."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(partial, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old)


def _train_sentencepiece(src: Path, tgt: Path, spec: TrainSentencePiece) -> Tokenizer:
    def lines(path: Path) -> Iterator[str]:
        with path.open("rb") as f:
            yield from (line for line in iter_lines(f, str(path)) if line.strip())
    return SentencePieceTokenizer.train(
        itertools.chain(itertools.islice(lines(src), spec.max_sentences),
                        itertools.islice(lines(tgt), spec.max_sentences)),
        vocab_size=spec.vocab_size, model_type=spec.model_type,
        max_sentences=2 * spec.max_sentences, seed=spec.seed)


def _write(folder: Path, src: Path, tgt: Path, tokenizer: Tokenizer, vocab_size: int | None,
           src_vocab: Vocab | None, tgt_vocab: Vocab | None, max_len: int | None,
           max_ratio: float | None, strict: bool, workers: int) -> dict[str, Any]:
    """Stream, encode and filter the pairs into `folder`, the bytes read counted on a progress
    bar; the manifest's counts."""
    bar = progress_bar("preparing", total=src.stat().st_size + tgt.stat().st_size, unit="B",
                       unit_scale=True)
    sides = [_Side(folder / f".{side}.spool") for side in _SIDES]
    kept_lines: list[np.ndarray] = []
    counts = {"lines": 0, "pairs": 0, "empty": 0, "too_long": 0, "ratio": 0}
    try:
        for encoded in _encoded(_chunks(_pairs(src, tgt, bar)), tokenizer, workers):
            n_src, n_tgt = encoded[0][2], encoded[1][2]
            empty = (n_src == 0) | (n_tgt == 0)
            if strict and empty.any():
                first = int(np.argmax(empty))
                path = src if n_src[first] == 0 else tgt
                raise InputError(f"{path}: line {counts['lines'] + first + 1} is empty "
                                 "(strict: every line needs a sentence)")
            longer, shorter = np.maximum(n_src, n_tgt), np.minimum(n_src, n_tgt)
            too_long = ~empty & (longer > max_len if max_len is not None else False)
            ratio = ~empty & ~too_long & (longer > max_ratio * shorter
                                          if max_ratio is not None else False)
            keep = ~(empty | too_long | ratio)
            for side, side_encoded in zip(sides, encoded, strict=True):
                side.add(side_encoded, keep)
            kept_lines.append(counts["lines"] + np.flatnonzero(keep))
            counts["lines"] += len(keep)
            counts["empty"] += int(empty.sum())
            counts["too_long"] += int(too_long.sum())
            counts["ratio"] += int(ratio.sum())
        counts["pairs"] = sum(len(k) for k in kept_lines)
        if counts["pairs"] == 0:
            raise InputError(f"no pair of {src} and {tgt} is left after filtering "
                             f"({counts['lines']} lines)")
        if src_vocab is None or tgt_vocab is None:
            src_vocab, tgt_vocab = (Vocab.from_counts(side.word_counts(), vocab_size)
                                    for side in sides)
        check_vocabs(tokenizer, src_vocab, tgt_vocab)
        tokens = [side.write(folder, name, vocab)
                  for side, name, vocab in zip(sides, _SIDES, (src_vocab, tgt_vocab),
                                               strict=True)]
    finally:
        bar.close()
        for side in sides:
            side.spool.close()
    _save(folder / "lines.npy", np.concatenate(kept_lines))
    src_vocab.save(folder / "src_vocab.json")
    tgt_vocab.save(folder / "tgt_vocab.json")
    save_tokenizer(tokenizer, folder)
    return {"counts": counts, "tokens": tokens, "vocab_sizes": [len(src_vocab), len(tgt_vocab)]}


# ----------------------------------------------------------------------------------------------
# Reading a prepared corpus


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not folder.is_dir():
        raise InputError(f"{folder}: " + ("not a folder" if folder.exists() else "no such folder")
                         + "; make a prepared corpus with bahdanau prepare")
    if not path.is_file():
        raise InputError(f"{folder} is not a prepared corpus (no {MANIFEST}); make one with "
                         "bahdanau prepare")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path} is damaged ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError(f"{path} is not the manifest of a prepared corpus")
    if manifest.get("version") != VERSION:
        raise InputError(f"{folder} is a prepared corpus of version {manifest.get('version')!r}; "
                         f"this bahdanau reads version {VERSION}: prepare it again")
    for key in ("inputs", "options", "counts", "vocab_sizes"):
        if key not in manifest:
            raise InputError(f"{path} is damaged: no {key!r}")
    return manifest


class PreparedCorpus(Sequence[Example]):
    """A prepared corpus, read through memory maps: item i is the `Example` of kept pair i.

    Opening checks the folder whole (manifest, format version, arrays, their sizes and ids)
    but reads no sentence; items are read from the maps when asked for.

    Args:
        folder: a folder written by `prepare_corpus`.
        max_len: keep only pairs with at most this many tokens a side (None: all), as
            `encode_pairs` does.
    Attributes:
        manifest: the folder's manifest (inputs, options, counts).
        tokenizer, src_vocab, tgt_vocab: what the corpus was encoded with.
    Raises:
        InputError: a missing folder or file, a damaged manifest or array, a version this code
            does not read, ids outside a vocabulary, or a tokenizer that does not match the
            vocabularies; each names the file.
    """

    def __init__(self, folder: str | os.PathLike[str], *, max_len: int | None = None) -> None:
        self.folder = check_path("folder", folder)
        check_optional_positive_int("max_len", max_len)
        self.max_len = max_len
        self.manifest = _read_manifest(self.folder)
        self.src_vocab = Vocab.load(self._file("src_vocab.json"))
        self.tgt_vocab = Vocab.load(self._file("tgt_vocab.json"))
        self.tokenizer = load_tokenizer(self.folder)
        check_vocabs(self.tokenizer, self.src_vocab, self.tgt_vocab)
        pairs = self.manifest["counts"]["pairs"]
        self._ids, self._offsets = [], []
        for side, vocab in zip(_SIDES, (self.src_vocab, self.tgt_vocab), strict=True):
            offsets = self._array(f"{side}.offsets.npy", (pairs + 1,), np.int64)
            if offsets[0] != 0 or (pairs and np.diff(offsets).min() < 1):
                raise InputError(f"{self.folder / f'{side}.offsets.npy'} is damaged: sentence "
                                 "offsets must start at 0 and increase")
            ids = self._array(f"{side}.ids.npy", (int(offsets[-1]),), None)
            if len(ids) and int(ids.max()) >= len(vocab):
                raise InputError(f"{self.folder / f'{side}.ids.npy'} holds id {int(ids.max())}, "
                                 f"outside its vocabulary of {len(vocab)}")
            self._ids.append(ids)
            self._offsets.append(offsets)
        self._lines = self._array("lines.npy", (pairs,), np.int64)
        self._rows: np.ndarray | None = None      # the pairs kept by max_len (None: all)
        if max_len is not None:
            longest = np.maximum(*(np.diff(o) for o in self._offsets))
            self._rows = np.flatnonzero(longest <= max_len)

    def _file(self, name: str) -> Path:
        path = self.folder / name
        if not path.is_file():
            raise InputError(f"{self.folder} is damaged: {name} is missing")
        return path

    def _array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        path = self._file(name)
        try:
            array = np.load(path, mmap_mode="r")
        except (ValueError, OSError, EOFError) as err:
            raise InputError(f"{path} is damaged ({' '.join(str(err).split())})") from None
        kinds = (np.dtype(np.uint16), np.dtype(np.uint32)) if dtype is None else (np.dtype(dtype),)
        if array.shape != shape or array.dtype not in kinds:
            raise InputError(f"{path} is damaged: {array.dtype} {array.shape}, expected "
                             f"{' or '.join(map(str, kinds))} {shape}")
        return array

    def __len__(self) -> int:
        return len(self._lines) if self._rows is None else len(self._rows)

    @overload
    def __getitem__(self, i: int) -> Example: ...
    @overload
    def __getitem__(self, i: slice) -> list[Example]: ...

    def __getitem__(self, i: int | slice) -> Example | list[Example]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise InputError(f"a PreparedCorpus index must be an int, got {describe(i)}")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pair {i} is outside the corpus of {n} pairs")
        row = int(i) % n if self._rows is None else int(self._rows[i])
        (src, tgt), (so, to) = self._ids, self._offsets
        return Example(int(self._lines[row]), src[so[row]:so[row + 1]].tolist(),
                       tgt[to[row]:to[row + 1]].tolist())

    def __iter__(self) -> Iterator[Example]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"PreparedCorpus({str(self.folder)!r}, pairs={len(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its folder (a process started with "spawn" maps the files again)."""
        return _reopen, (self.folder, self.max_len)

    @property
    def lengths(self) -> np.ndarray:
        """(N, 2) int64: each pair's source length and target length + 1, the padded lengths
        `collate` gives it (what `BucketBatchSampler` batches by); a new array each call."""
        lengths = np.empty((len(self), 2), dtype=np.int64)
        for column, offsets in enumerate(self._offsets):
            lengths[:, column] = np.diff(offsets) if self._rows is None else (
                offsets[self._rows + 1] - offsets[self._rows])
        lengths[:, 1] += 1
        return lengths

    def digest(self) -> str:
        """`bahdanau.training.examples_digest` of the examples, computed from the arrays (so a run
        resumed on the in-memory examples of the same data sees the same digest)."""
        hasher = hashlib.sha256()
        rows = np.arange(len(self)) if self._rows is None else self._rows
        for start in range(0, len(rows), 1 << 18):
            hasher.update(self._records(rows[start:start + (1 << 18)]).tobytes())
        return hasher.hexdigest()

    def _records(self, rows: np.ndarray) -> np.ndarray:
        """[len(src), *src, len(tgt), *tgt] of each row, end to end, as int64."""
        starts = [offsets[rows] for offsets in self._offsets]
        lengths = [offsets[rows + 1] - s for offsets, s in zip(self._offsets, starts,
                                                                strict=True)]
        per_row = lengths[0] + lengths[1] + 2
        out = np.empty(int(per_row.sum()), dtype=np.int64)
        begin = np.cumsum(per_row) - per_row              # where each row's record starts
        at = begin
        for ids, start, length in zip(self._ids, starts, lengths, strict=True):
            out[at] = length
            out[_ragged(at + 1, length)] = ids[_ragged(start, length)]
            at = at + 1 + length
        return out


def _reopen(folder: Path, max_len: int | None) -> PreparedCorpus:
    return PreparedCorpus(folder, max_len=max_len)


def _ragged(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start_i, start_i + 1, ..., start_i + length_i - 1 of every i, end to end."""
    total = int(lengths.sum())
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(total)
