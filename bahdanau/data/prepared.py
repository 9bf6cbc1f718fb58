"""`PreparedCorpus`: a folder written by `bahdanau.data.prepare_corpus`, read through memory maps.

`PreparedCorpus(folder)` opens one read-only: a `Sequence[Example]` that
`bahdanau.training.setup_run` takes like the list `encode_pairs` returns, with the same examples
in the same order (so the same batches for the same seed), while the operating system shares
the arrays' pages between the processes that read them.

Opening checks the folder whole before any sentence is read: the manifest (every field typed,
its own digest), the arrays' shapes and types, the offsets, that the tokenizer matches the
vocabularies, that a corpus said to be the shipped Multi30k was prepared from its files, and
last the digest of every file of the format (`bahdanau.data.manifest.verify_digest`). The ids
themselves (inside the vocabulary; never a pad, bos or eos id inside a sentence) were checked
by `check_ids` before `prepare_corpus` sealed the folder, so a folder whose digest matches is
not read a second time for them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from bahdanau._checks import check_optional_positive_int, check_path, describe
from bahdanau._folders import LINES_FILE, SRC_VOCAB_FILE, TGT_VOCAB_FILE, ids_file, offsets_file
from bahdanau.config import BOS_ID, EOS_ID, PAD_ID
from bahdanau.data.batching import Example
from bahdanau.data.manifest import MANIFEST, SIDES, check_shipped, read_manifest, verify_digest
from bahdanau.data.sentencepiece import check_vocabs
from bahdanau.data.tokenizers import load_tokenizer
from bahdanau.data.vocab import SPECIALS, Vocab
from bahdanau.errors import InputError

__all__ = ["PreparedCorpus", "check_ids", "open_written"]

_INSIDE = (PAD_ID, BOS_ID, EOS_ID)   # ids that never stand inside a sentence
_CHECK_IDS = 1 << 24                 # ids checked at a time


class PreparedCorpus(Sequence[Example]):
    """A prepared corpus, read through memory maps: item i is the `Example` of kept pair i.

    Opening checks the folder whole (module docstring), the digest included, but keeps no
    sentence in memory; items are read from the maps when asked for.

    Args:
        folder: a folder written by `prepare_corpus`.
        max_len: keep only pairs with at most this many tokens a side (None: all), as
            `encode_pairs` does.
    Attributes:
        manifest: the folder's manifest (inputs, options, counts).
        tokenizer, src_vocab, tgt_vocab: what the corpus was encoded with.
    Raises:
        InputError: a missing folder or file, a damaged manifest or array, a version this code
            does not read (an earlier one without a digest: prepare again), a file or field
            changed since `prepare_corpus` wrote it (the digest; it sealed ids checked by
            `check_ids`), a tokenizer that does not match the vocabularies,
            or a `shipped` key on other files; each names the file.
    """

    def __init__(self, folder: str | os.PathLike[str], *, max_len: int | None = None) -> None:
        self._open(check_path("folder", folder), max_len, verify=True)

    def _open(self, folder: Path, max_len: int | None, *, verify: bool) -> None:
        """Open and check `folder`; `verify`: against its digest too (False only where this
        process wrote or verified the folder: `prepare_corpus`, a pickled corpus)."""
        check_optional_positive_int("max_len", max_len)
        self.folder, self.max_len = folder, max_len
        self.manifest = read_manifest(self.folder)
        self.src_vocab = Vocab.load(self._file(SRC_VOCAB_FILE))
        self.tgt_vocab = Vocab.load(self._file(TGT_VOCAB_FILE))
        self.tokenizer = load_tokenizer(self.folder)
        check_vocabs(self.tokenizer, self.src_vocab, self.tgt_vocab)
        pairs = self.manifest["counts"]["pairs"]
        self._ids, self._offsets = [], []
        for side, vocab, vocab_file, tokens, size in zip(
                SIDES, (self.src_vocab, self.tgt_vocab), (SRC_VOCAB_FILE, TGT_VOCAB_FILE),
                self.manifest["tokens"], self.manifest["vocab_sizes"], strict=True):
            if size != len(vocab):
                raise InputError(f"{self.folder / vocab_file} holds {len(vocab)} "
                                 f"entries; {MANIFEST} says {size}: the folder is damaged")
            offsets = self._array(offsets_file(side), (pairs + 1,), np.int64)
            if offsets[0] != 0 or offsets[-1] != tokens or (pairs and np.diff(offsets).min() < 1):
                raise InputError(f"{self.folder / offsets_file(side)} is damaged: sentence "
                                 f"offsets must start at 0, increase and end at {tokens}")
            self._ids.append(self._array(ids_file(side), (tokens,), None))
            self._offsets.append(offsets)
        self._lines = self._array(LINES_FILE, (pairs,), np.int64)
        check_shipped(self.manifest["shipped"], self.manifest["inputs"],
                      f"{self.folder / MANIFEST}: shipped")
        if verify:
            verify_digest(self.folder, self.manifest)
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
        return open_written, (self.folder, self.max_len)

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


def open_written(folder: Path, max_len: int | None) -> PreparedCorpus:
    """A `PreparedCorpus` of a folder this process has just written or verified (a pickled
    corpus reopened in a loader worker): checked, but its files are not hashed again."""
    corpus = PreparedCorpus.__new__(PreparedCorpus)
    corpus._open(folder, max_len, verify=False)
    return corpus


def check_ids(folder: Path, vocab_sizes: Sequence[int]) -> None:
    """`prepare_corpus`'s check of the ids it wrote into `folder`, before it seals them: each
    inside its side's vocabulary (`vocab_sizes`), no pad, bos or eos id inside a sentence.
    Opening a sealed folder does not read the ids again: a folder whose digest matches passed
    this check when it was written.

    Raises:
        InputError: naming the file, the id and the sentence.
    """
    for side, size in zip(SIDES, vocab_sizes, strict=True):
        path = folder / ids_file(side)
        _check_ids(path, np.load(path, mmap_mode="r"),
                   np.load(folder / offsets_file(side), mmap_mode="r"), size)


def _check_ids(path: Path, ids: np.ndarray, offsets: np.ndarray, vocab_size: int) -> None:
    """Refuse an id outside the vocabulary, or a pad, bos or eos id inside a sentence (where
    `collate` puts none), naming the file and the pair; vectorised, a block at a time."""
    for start in range(0, len(ids), _CHECK_IDS):
        block = ids[start:start + _CHECK_IDS]
        if int(block.max()) >= vocab_size:
            raise InputError(f"{path} holds id {int(block.max())}, outside its vocabulary of "
                             f"{vocab_size}")
        if int(block.min()) <= max(_INSIDE):
            inside = np.flatnonzero(np.isin(block, _INSIDE))
            if len(inside):
                at = start + int(inside[0])
                pair = int(np.searchsorted(offsets, at, side="right")) - 1
                name = SPECIALS[int(ids[at])]
                raise InputError(f"{path} holds the special id {int(ids[at])} ({name}) inside "
                                 f"sentence {pair}: the folder is damaged")


def _ragged(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start_i, start_i + 1, ..., start_i + length_i - 1 of every i, end to end."""
    total = int(lengths.sum())
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(total)
