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

`bahdanau.data.prepared.PreparedCorpus` opens one (re-exported here). Where the folder goes is
checked and held by `bahdanau._folders.check_folder_to_write` (it replaces only a prepared
corpus), `bahdanau._files.check_destination` and `bahdanau._files.held`, the
manifest and its digest are `bahdanau.data.manifest`'s, and the tokenising processes
`bahdanau.data.workers`'.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bahdanau._checks import (
    check_optional_positive_int,
    check_path,
    check_tokenizer,
    check_type,
    is_int,
    usable_cores,
)
from bahdanau._files import (
    atomic_write,
    check_destination,
    fsync_file,
    held,
    new_folder,
    sha256_file,
    write_failure,
)
from bahdanau._folders import (
    LINES_FILE,
    SRC_VOCAB_FILE,
    TGT_VOCAB_FILE,
    Kind,
    check_folder_to_write,
    ids_file,
    offsets_file,
)
from bahdanau._progress import progress_bar
from bahdanau.data.batching import refuse_specials, special_token
from bahdanau.data.manifest import (
    FORMAT,
    SIDES,
    VERSION,
    check_shipped,
    read_manifest,
    seal,
)
from bahdanau.data.prepared import PreparedCorpus, check_ids, open_written
from bahdanau.data.sentencepiece import SentencePieceTokenizer, check_vocabs
from bahdanau.data.text import iter_lines
from bahdanau.data.tokenizers import (
    DefaultTokenizer,
    Tokenizer,
    save_tokenizer,
    tokenizer_to_payload,
)
from bahdanau.data.vocab import SPECIALS, Vocab
from bahdanau.data.workers import Chunk, stop_on_signals, tokenised
from bahdanau.errors import InputError

__all__ = ["FORMAT", "VERSION", "PreparedCorpus", "TrainSentencePiece", "prepare_corpus"]

CHUNK_PAIRS = 20_000        # pairs a worker tokenises at a time
_COPY_IDS = 1 << 24         # ids remapped at a time when the arrays are written


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


def _chunks(pairs: Iterator[tuple[str, str]]) -> Iterator[Chunk]:
    while chunk := list(itertools.islice(pairs, CHUNK_PAIRS)):
        yield [s for s, _ in chunk], [t for _, t in chunk]


class _Side:
    """One side's corpus-wide word ids, counts and the kept sentences' ids and lengths, the ids
    spooled to a file (they become the final array once the vocabulary is known). `path` and
    `specials` (the vocabulary's) name the input file and line of a pad, bos or eos token."""

    def __init__(self, spool: Path, path: Path, side: str, specials: Sequence[str]) -> None:
        self.path, self.side, self.specials = path, side, specials
        self.words: dict[str, int] = {}
        self.counts = np.zeros(0, dtype=np.int64)
        self.lengths: list[np.ndarray] = []
        self.spool_path = spool
        self.spool = spool.open("wb")

    def add(self, encoded: tuple[list[str], np.ndarray, np.ndarray], keep: np.ndarray,
            first_line: int) -> None:
        """Add a chunk of sentences (the first at 0-based input line `first_line`), refusing a
        special token in any of them, kept or not, before anything is written in `out`."""
        chunk_words, local_ids, lengths = encoded
        self._refuse_specials(chunk_words, local_ids, lengths, first_line)
        to_global = np.fromiter((self.words.setdefault(w, len(self.words)) for w in chunk_words),
                                dtype=np.uint32, count=len(chunk_words))
        ids = to_global[local_ids][np.repeat(keep, lengths)]
        counts = np.bincount(ids, minlength=len(self.words))
        counts[:len(self.counts)] += self.counts
        self.counts = counts
        self.lengths.append(lengths[keep])
        with _writing(self.spool_path):
            self.spool.write(ids.tobytes())

    def _refuse_specials(self, chunk_words: list[str], local_ids: np.ndarray,
                         lengths: np.ndarray, first_line: int) -> None:
        """`refuse_specials` of the first sentence of the chunk holding a special token (a
        tokenizer of the user's own may give one), naming its file and line."""
        special = special_token(chunk_words, self.specials)
        if special is None:
            return
        at = int(np.flatnonzero(local_ids == chunk_words.index(special))[0])
        ends = np.cumsum(lengths)
        line = int(np.searchsorted(ends, at, side="right"))
        tokens = [chunk_words[i] for i in local_ids[ends[line] - lengths[line]:ends[line]]]
        refuse_specials(tokens, self.specials, f"{self.path}: line {first_line + line + 1}",
                        self.side)

    def close(self) -> None:
        """Close the spool (its last buffered ids written)."""
        with _writing(self.spool_path):
            self.spool.close()

    def word_counts(self) -> dict[str, int]:
        return dict(zip(self.words, self.counts.tolist(), strict=True))

    def write(self, folder: Path, side: str, vocab: Vocab) -> int:
        """Write the side's ids (the spooled ids through `vocab`, `ids_file`) and sentence
        offsets (`offsets_file`); returns the number of tokens."""
        self.close()
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        _save(folder / offsets_file(side), offsets)
        lookup = np.fromiter((vocab.token_to_id(w) for w in self.words), dtype=np.uint32,
                             count=len(self.words))
        spooled: np.ndarray | list[int] = (
            np.memmap(self.spool_path, dtype=np.uint32, mode="r") if offsets[-1] else [])
        path = folder / ids_file(side)
        with _writing(path):
            ids = np.lib.format.open_memmap(path, mode="w+",
                                            dtype=_id_dtype(vocab), shape=(int(offsets[-1]),))
            for start in range(0, len(ids), _COPY_IDS):
                ids[start:start + _COPY_IDS] = lookup[spooled[start:start + _COPY_IDS]]
            ids.flush()
            del ids, spooled
            fsync_file(path)
        self.spool_path.unlink()
        return int(offsets[-1])


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A write of `path` outside `atomic_file` (the spooled ids, the memory-mapped id arrays):
    a system error (a full disk, a file-size limit) is one line naming the file, as every
    write's is (`bahdanau._files.write_failure`)."""
    try:
        yield
    except OSError as err:
        raise write_failure(path, err, kept=False) from None


def _save(path: Path, array: np.ndarray) -> None:
    """`np.save`, durably (the folder is renamed into place only when every file is on disk)."""
    atomic_write(path, lambda f: np.save(f, array))


def _id_dtype(vocab: Vocab) -> type:
    return np.uint16 if len(vocab) <= 1 << 16 else np.uint32


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
            `overwrite`; a folder of another kind (a model folder, an exported folder) or of
            other files is never touched, whatever `overwrite`
            (`bahdanau._folders.check_folder_to_write`).
        tokenizer: a tokenizer instance (default `DefaultTokenizer()`), e.g. a
            `SentencePieceTokenizer` loaded from one's own model, or `TrainSentencePiece(...)`
            to train one on these files.
        vocab_size: most frequent words kept per side when the vocabularies are built (None:
            all); with a SentencePiece tokenizer, None or at least its piece count (a smaller
            one is refused: the pieces left out would become <unk>).
        src_vocab, tgt_vocab: vocabularies to use instead of building them (both or neither).
        max_len: drop pairs with a side longer than this many tokens (None: keep all).
        max_ratio: drop pairs whose longer side has more than this many times the tokens of
            the shorter (None: keep all).
        strict: an empty side is an error (naming the file and line) instead of a dropped pair.
        workers: tokenising processes (default: the usable cores, at most 8).
        overwrite: replace a prepared corpus of other inputs or options in `out`, or a damaged
            one (a True or False, never a string).
        shipped: recorded in the manifest for a corpus shipped with the package ({"corpus":
            "multi30k", "src_lang": ..., "tgt_lang": ...}): training finds its dev and test sets.
            The inputs must be that corpus's training files of those languages.
        log: called with what it did (default: this module's logger, at INFO).
    Returns:
        The prepared corpus, opened.
    Raises:
        InputError: a bad argument; files that are not line-aligned, not UTF-8 or damaged gzip
            (named, with the line); an empty side with `strict`; no pair left; `out` holding
            something that may not be replaced, being prepared by another process, or a place
            that cannot be replaced (`bahdanau._files.check_destination`: refused before any
            work); a tokenising worker that died. Nothing is written in `out` then.
        Stopped: SIGINT, SIGTERM or SIGHUP (`bahdanau.data.workers.Stopped`): the workers
            killed, the partial folder removed, the lock released; one during the swap only
            once it is done.
    """
    src, tgt, out = (check_path(n, p) for n, p in (("src_path", src_path),
                                                   ("tgt_path", tgt_path), ("out", out)))
    tokenizer = DefaultTokenizer() if tokenizer is None else tokenizer
    _check_arguments(src, tgt, tokenizer, vocab_size, src_vocab, tgt_vocab, max_len, max_ratio,
                     strict, overwrite)
    workers, log = _workers(workers), log or logging.getLogger(__name__).info
    folder, start = check_destination(out, "a prepared corpus"), time.perf_counter()
    check_folder_to_write(folder, Kind.PREPARED, name=str(out))   # again once `held`
    options = {"tokenizer": _describe_tokenizer(tokenizer), "vocab_size": vocab_size,
               "src_vocab": _vocab_sha256(src_vocab), "tgt_vocab": _vocab_sha256(tgt_vocab),
               "max_len": max_len, "max_ratio": max_ratio, "strict": strict}
    busy = (f"{out} is being prepared by another process: wait for it to finish or choose "
            "another folder")
    with stop_on_signals(), held(folder, busy):      # a stop releases the lock too
        inputs = _inputs(src, tgt, shipped)          # hashing a large corpus takes seconds
        if (reused := _reuse(folder, out, inputs, options, overwrite, log)) is not None:
            return reused
        if isinstance(tokenizer, TrainSentencePiece):
            tokenizer = _train_sentencepiece(src, tgt, tokenizer, log)
        with new_folder(folder) as partial:
            manifest = _write(partial, src, tgt, tokenizer, vocab_size, src_vocab, tgt_vocab,
                              max_len, max_ratio, strict, workers)
            manifest.update(format=FORMAT, version=VERSION, inputs=inputs, options=options,
                            shipped=shipped, seconds=round(time.perf_counter() - start, 1))
            manifest = seal(partial, manifest)
        log(_summary(out, manifest))
        return open_written(folder, None)


def _reuse(folder: Path, out: Path, inputs: list[dict[str, Any]], options: dict[str, Any],
           overwrite: bool, log: Callable[[str], None]) -> PreparedCorpus | None:
    """The prepared corpus in `folder` when it is of these inputs and options and whole (its
    digest checked); None when a new one is to be written there.

    Raises:
        InputError: `folder` holds another prepared corpus or a damaged one and `overwrite`
            is False, or a folder of another kind or of other files (never replaced).
    """
    existing = _existing_corpus(folder, out)
    if existing is None:
        return None
    damage = existing if isinstance(existing, str) else ""
    if (isinstance(existing, dict) and existing["inputs"] == inputs
            and existing["options"] == options):
        try:
            corpus = PreparedCorpus(folder)
        except InputError as err:
            damage = str(err)
        else:
            log(f"{out} is up to date (same inputs and options, digest checked): reusing it")
            return corpus
    if not overwrite:
        what = (f"a damaged prepared corpus ({damage})" if damage
                else "a prepared corpus of other inputs or options")
        raise InputError(f"{out} holds {what}: replace it with overwrite (--overwrite) or "
                         "choose another folder")
    if damage:
        log(f"{out} holds a damaged prepared corpus: preparing it again")
    return None


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
                     max_len: int | None, max_ratio: float | None, strict: bool,
                     overwrite: bool) -> None:
    """`prepare_corpus`'s checks of its arguments, before any work."""
    check_type("strict", strict, bool, "True or False")
    check_type("overwrite", overwrite, bool, "True or False")
    if not isinstance(tokenizer, TrainSentencePiece):
        check_tokenizer("tokenizer", tokenizer)
    if (src_vocab is None) != (tgt_vocab is None):
        raise InputError("give both src_vocab and tgt_vocab, or neither")
    for name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if vocab is not None:
            check_type(name, vocab, Vocab, "a Vocab or None")
    check_optional_positive_int("vocab_size", vocab_size)
    pieces = _piece_words(tokenizer)
    if pieces is not None and vocab_size is not None and vocab_size < pieces and (
            src_vocab is None):
        raise InputError(f"vocab_size {vocab_size} is below the {pieces:,} pieces of the "
                         "SentencePiece model: the pieces left out would become <unk>; keep "
                         "every piece (vocab_size None, or no --vocab-size) or train a smaller "
                         "model")
    check_optional_positive_int("max_len", max_len)
    if max_ratio is not None and (isinstance(max_ratio, bool) or not isinstance(
            max_ratio, (int, float)) or not 1 <= max_ratio < float("inf")):
        raise InputError(f"max_ratio must be a number >= 1 or None, got {max_ratio!r}")
    for path, what in ((src, "src_path"), (tgt, "tgt_path")):
        if not path.is_file():
            raise InputError(f"{what} {path}: " + ("is a folder, not a file" if path.is_dir()
                                                   else "no such file"))


def _inputs(src: Path, tgt: Path, shipped: object) -> list[dict[str, Any]]:
    """What identifies the input files in the manifest; `shipped` checked against them."""
    inputs = [{"file": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)}
              for p in (src, tgt)]
    check_shipped(shipped, inputs, "shipped")
    return inputs


def _piece_words(tokenizer: Tokenizer | TrainSentencePiece) -> int | None:
    """The words a SentencePiece tokenizer can give (its pieces but "<unk>"), None for others."""
    if isinstance(tokenizer, TrainSentencePiece):
        return tokenizer.vocab_size - 1
    if isinstance(tokenizer, SentencePieceTokenizer):
        return sum(piece not in SPECIALS for piece in tokenizer.pieces)
    return None


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


def _existing_corpus(folder: Path, out: Path) -> dict[str, Any] | str | None:
    """The manifest of the prepared corpus in `folder` (or why it cannot be read: a damaged
    one), None if it is missing or empty. Raises when it is a file, a folder of another kind
    (a model folder, an exported folder, a run) or of other files: never replaced
    (`bahdanau._folders.check_folder_to_write`, naming it as `out`)."""
    if not check_folder_to_write(folder, Kind.PREPARED, name=str(out)):
        return None
    try:
        return read_manifest(folder)
    except InputError as err:
        return str(err)


def _train_sentencepiece(src: Path, tgt: Path, spec: TrainSentencePiece,
                         log: Callable[[str], None]) -> Tokenizer:
    log(f"training a SentencePiece {spec.model_type} model of {spec.vocab_size} pieces on at "
        f"most {spec.max_sentences:,} sentences per side")

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
    specials = [SPECIALS if vocab is None else vocab.specials for vocab in (src_vocab, tgt_vocab)]
    sides = [_Side(folder / f".{side}.spool", path, what, side_specials)
             for side, path, what, side_specials in zip(SIDES, (src, tgt), ("source", "target"),
                                                        specials, strict=True)]
    chunks = tokenised(_chunks(_pairs(src, tgt, bar)), tokenizer, workers)
    kept_lines: list[np.ndarray] = []
    counts = {"lines": 0, "pairs": 0, "empty": 0, "too_long": 0, "ratio": 0}
    try:
        for encoded in chunks:
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
                side.add(side_encoded, keep, counts["lines"])
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
                  for side, name, vocab in zip(sides, SIDES, (src_vocab, tgt_vocab),
                                               strict=True)]
    finally:
        chunks.close()                   # stops the workers at once when something raised
        bar.close()
        for side in sides:
            side.close()
    _save(folder / LINES_FILE, np.concatenate(kept_lines))
    src_vocab.save(folder / SRC_VOCAB_FILE)
    tgt_vocab.save(folder / TGT_VOCAB_FILE)
    save_tokenizer(tokenizer, folder)
    check_ids(folder, [len(src_vocab), len(tgt_vocab)])    # before sealing: opening relies on it
    return {"counts": counts, "tokens": tokens, "vocab_sizes": [len(src_vocab), len(tgt_vocab)]}
