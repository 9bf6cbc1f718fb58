"""Examples and batches: encoded sentence pairs, padded batches, and the length-bucketed sampler.

    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tok, max_len=50)
    sampler = BucketBatchSampler(examples, batch_size=80, seed=1234)
    for positions in sampler:
        batch = collate([examples[i] for i in positions])              # Batch of (B, S), (B, T)

Shape legend: B batch, S source length, T target length (tgt_in and tgt_out, eos/bos included).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bahdanau._checks import (
    check_count,
    check_optional_positive_int,
    check_type,
    describe,
    is_int,
)
from bahdanau.data.tokenizers import Tokenizer, check_sides
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError


@dataclass(frozen=True)
class Example:
    """One encoded sentence pair; `index` is its position in the pairs it came from."""

    index: int
    src: list[int]   # source ids, no bos/eos
    tgt: list[int]   # target ids, no bos/eos


def check_examples(name: str, examples: Sequence[object]) -> None:
    """Every item of `examples` must be an `Example` (the error names the first that is not)."""
    for i, example in enumerate(examples):
        if not isinstance(example, Example):
            raise InputError(f"{name}[{i}] must be a bahdanau.Example (see encode_pairs), "
                             f"got {describe(example)}")


def special_token(tokens: Iterable[str], specials: Sequence[str]) -> str | None:
    """The first of `tokens` spelled like the pad, bos or eos special (`specials[:3]`), or None."""
    inside = specials[:3]
    return next((t for t in tokens if t in inside), None)


def refuse_specials(tokens: Iterable[str], specials: Sequence[str], where: str,
                    side: str) -> None:
    """Refuse a token spelled like the pad, bos or eos special (`specials[:3]`, a `Vocab`'s):
    it would become that id inside a sentence, where `collate` and the decoder put none. The
    one rule of `encode_pairs` and `bahdanau.data.prepare_corpus`.

    Raises:
        InputError: naming `where` (a pair, a file and line), the side and the token.
    """
    special = special_token(tokens, specials)
    if special is not None:               # a tokenizer of the user's own: ours escape it
        raise InputError(f"{where}: the {side}'s tokenizer gives the token {special!r}, the "
                         "vocabulary's special; it must spell a word otherwise "
                         "(WhitespaceTokenizer escapes it as '\\' + word)")


def encode_pairs(pairs: Iterable[tuple[str, str]], src_vocab: Vocab, tgt_vocab: Vocab,
                 tokenizer: Tokenizer | tuple[Tokenizer, Tokenizer], *,
                 max_len: int | None = None) -> list[Example]:
    """Tokenise and encode sentence pairs, dropping over-long ones.

    Args:
        pairs: (source text, target text) pairs, e.g. from `read_parallel`.
        src_vocab, tgt_vocab: vocabularies of the two sides.
        tokenizer: one tokenizer for both sides (a `TokenizerPair`: its own two sides), or a
            (source, target) pair of them.
        max_len: drop pairs with more than this many tokens on either side (bos/eos not counted);
            the paper's RNNsearch-30/-50 use 30/50 words. None keeps all.
    Returns:
        The kept examples, in input order, each with its index in `pairs`.
    Raises:
        InputError: `max_len` < 1, a vocabulary that is not a `Vocab`, a tokenizer argument
            that is neither one tokenizer nor a (source, target) tuple of two (`check_sides`),
            a pair that is not two str, a side that tokenises to nothing, or to a token spelled
            like the pad, bos or eos special (the pair index is named).
    """
    check_optional_positive_int("max_len", max_len)
    check_type("src_vocab", src_vocab, Vocab, "a Vocab")
    check_type("tgt_vocab", tgt_vocab, Vocab, "a Vocab")
    src_tok, tgt_tok = check_sides("tokenizer", tokenizer)
    examples = []
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(text, str) for text in pair)):
            raise InputError(f"pair {index} must be a (source, target) pair of str, "
                             f"got {describe(pair)}")
        src_text, tgt_text = pair
        src_tokens, tgt_tokens = src_tok.tokenize(src_text), tgt_tok.tokenize(tgt_text)
        for side, tokens, text, vocab in (("source", src_tokens, src_text, src_vocab),
                                          ("target", tgt_tokens, tgt_text, tgt_vocab)):
            if not tokens:
                raise InputError(f"pair {index}: the {side} {text!r} has no tokens")
            refuse_specials(tokens, vocab.specials, f"pair {index}", side)
        if max_len is not None and max(len(src_tokens), len(tgt_tokens)) > max_len:
            continue
        examples.append(Example(index, src_vocab.encode(src_tokens), tgt_vocab.encode(tgt_tokens)))
    return examples


# ----------------------------------------------------------------------------------------------
# Batches


@dataclass
class Batch:
    """A padded minibatch for `RNNSearch.loss` / `forward`.

    Attributes:
        src: (B, S) long source ids, padded with pad_id after each sentence.
        src_lengths: (B,) long real source lengths.
        tgt_in: (B, T) long decoder inputs: bos y_1 .. y_n, then padding.
        tgt_out: (B, T) long targets: y_1 .. y_n eos, then padding.
        indices: (B,) long `Example.index` of each row.
        pad_id: the padding id (`Vocab.pad_id`).
    """

    src: Tensor
    src_lengths: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    indices: Tensor
    pad_id: int = Vocab.pad_id

    def __len__(self) -> int:
        return self.src.shape[0]

    @property
    def n_tokens(self) -> int:
        """Number of real (non-pad) target tokens, eos included."""
        return int((self.tgt_out != self.pad_id).sum())

    @property
    def src_mask(self) -> Tensor:
        """(B, S) bool, True at real source tokens."""
        return self.src != self.pad_id

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on `device`."""
        def move(t: Tensor) -> Tensor:
            return t.to(device, non_blocking=non_blocking)
        return Batch(move(self.src), move(self.src_lengths), move(self.tgt_in),
                     move(self.tgt_out), move(self.indices), self.pad_id)

    def pin_memory(self) -> Batch:
        """A copy in pinned (page-locked) memory, for a faster, asynchronous copy to a GPU
        (`torch.utils.data.DataLoader(pin_memory=True)` calls this)."""
        return Batch(self.src.pin_memory(), self.src_lengths.pin_memory(),
                     self.tgt_in.pin_memory(), self.tgt_out.pin_memory(),
                     self.indices.pin_memory(), self.pad_id)


def pad_sources(sequences: Sequence[Sequence[int]], pad_id: int = Vocab.pad_id
                ) -> tuple[Tensor, Tensor]:
    """Right-pad id sequences into a (B, S) long tensor; also return the (B,) lengths."""
    longest = max(len(seq) for seq in sequences)
    src = torch.tensor([[*seq] + [pad_id] * (longest - len(seq)) for seq in sequences],
                       dtype=torch.long)                                              # (B, S)
    return src, torch.tensor([len(seq) for seq in sequences], dtype=torch.long)      # (B,)


def collate(examples: Sequence[Example]) -> Batch:
    """Pad examples into a `Batch`: S = longest source, T = longest target + 1.

    The special ids are `Vocab`'s: sources are padded with `Vocab.pad_id`, targets become
    tgt_in = bos y_1 .. y_n and tgt_out = y_1 .. y_n eos.

    Args:
        examples: encoded sentence pairs, e.g. from `encode_pairs`.
    Returns:
        The `Batch`.
    Raises:
        InputError: no examples, an item that is not an `Example`, an example with an empty
            source, or ids that are not ints.
    """
    if len(examples) == 0:
        raise InputError("collate needs at least one example")
    check_examples("examples", examples)
    for ex in examples:
        if not ex.src:
            raise InputError(f"example {ex.index} has an empty source")
        for side, ids in (("src", ex.src), ("tgt", ex.tgt)):
            if not (isinstance(ids, (list, tuple)) and all(is_int(i) for i in ids)):
                # torch.tensor would truncate floats and read True as 1: a silent wrong batch
                raise InputError(f"example {ex.index}: {side} must be a list of int token ids, "
                                 f"got {describe(ids)}")
    pad_id, bos_id, eos_id = Vocab.pad_id, Vocab.bos_id, Vocab.eos_id
    src, lengths = pad_sources([ex.src for ex in examples], pad_id)                # (B, S)
    t = max(len(ex.tgt) for ex in examples) + 1
    tgt_in = torch.tensor([[bos_id, *ex.tgt] + [pad_id] * (t - 1 - len(ex.tgt))
                           for ex in examples], dtype=torch.long)                     # (B, T)
    tgt_out = torch.tensor([[*ex.tgt, eos_id] + [pad_id] * (t - 1 - len(ex.tgt))
                            for ex in examples], dtype=torch.long)                    # (B, T)
    indices = torch.tensor([ex.index for ex in examples], dtype=torch.long)           # (B,)
    return Batch(src, lengths, tgt_in, tgt_out, indices, pad_id)


# CUDA graphs are recorded per shape: a captured update pads its batches' B, S and T
# (`pad_to_multiple`), and a captured search its sources' S
# (`bahdanau.captured_step.pad_to_bucket`), to multiples of this, so that few graphs serve all.
SHAPE_MULTIPLE = 8


def pad_to_multiple(batch: Batch, multiple: int = SHAPE_MULTIPLE) -> Batch:
    """The same batch on a shape from a small set: B, S and T rounded up to multiples.

    What a CUDA graph of an update needs, one graph per shape
    (`bahdanau.training.update.SyncFreeUpdate`). The loss is unchanged: source padding is
    masked, target padding is ignored, and each added row is a one-token source (eos) with no
    target token at all, which adds nothing to the loss or its gradient and counts as no
    sentence (a real row always has its eos target).

    Args:
        batch: a `Batch` on any device.
        multiple: the rounding, >= 1 (`SHAPE_MULTIPLE` by default; 1 returns the batch
            unchanged).
    Returns:
        The padded `Batch`; added rows have `indices` -1.
    Raises:
        InputError: `multiple` is not an int >= 1.
    """
    if not is_int(multiple) or multiple < 1:
        raise InputError(f"multiple must be an int >= 1, got {multiple!r}")
    (rows, src_len), tgt_len = batch.src.shape, batch.tgt_in.shape[1]
    new_rows, new_src, new_tgt = (math.ceil(n / multiple) * multiple
                                  for n in (rows, src_len, tgt_len))
    if (new_rows, new_src, new_tgt) == (rows, src_len, tgt_len):
        return batch
    pad_id, eos_id = batch.pad_id, Vocab.eos_id

    def grown(t: Tensor, cols: int) -> Tensor:
        out = t.new_full((new_rows, cols), pad_id)
        out[:rows, :t.shape[1]] = t
        return out

    src = grown(batch.src, new_src)
    src[rows:, 0] = eos_id
    lengths = batch.src_lengths.new_ones(new_rows)
    lengths[:rows] = batch.src_lengths
    indices = batch.indices.new_full((new_rows,), -1)
    indices[:rows] = batch.indices
    return Batch(src, lengths, grown(batch.tgt_in, new_tgt), grown(batch.tgt_out, new_tgt),
                 indices, pad_id)


# ----------------------------------------------------------------------------------------------
# Length-bucketed batch sampler


def _is_length(value: object) -> bool:
    """An int or a numpy integer, not a bool: what a lengths array's integer dtypes hold."""
    return is_int(value) or isinstance(value, np.integer)


def _lengths(items: Sequence[Any] | np.ndarray | Tensor) -> np.ndarray:
    """(N, 2) padded lengths (source S, target T) of Examples, (src, tgt) pairs or ints, or of
    an (N, 2) integer array of them (taken whole, as `PreparedCorpus.lengths` is). Floats and
    bools are refused, in a list as in an array: a float would be truncated, True read as 1."""
    if isinstance(items, Tensor):         # an array of torch's: the same rule
        if items.dtype.is_floating_point or items.dtype.is_complex or items.dtype == torch.bool:
            raise InputError(f"a lengths tensor must be (N, 2) integers, got {items.dtype} "
                             f"{tuple(items.shape)}")
        items = items.detach().cpu().numpy()
    if isinstance(items, np.ndarray):
        if items.ndim != 2 or items.shape[1] != 2 or items.dtype.kind not in "iu":
            raise InputError(f"a lengths array must be (N, 2) integers, got {items.dtype} "
                             f"{items.shape}")
        out = np.asarray(items, dtype=np.int64)   # no copy of an int64 array
    elif isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise InputError(f"lengths must be a list (of Examples, ints or (source, target) pairs "
                         f"of ints) or an (N, 2) integer array, got {describe(items)}")
    else:
        out = np.empty((len(items), 2), dtype=np.int64)
        for i, item in enumerate(items):
            if isinstance(item, Example):
                out[i] = (len(item.src), len(item.tgt) + 1)  # tgt_in/tgt_out carry bos/eos
            elif _is_length(item):
                out[i] = (item, item)
            elif (isinstance(item, (tuple, list)) and len(item) == 2
                  and all(_is_length(n) for n in item)):
                out[i] = item
            else:
                raise InputError(f"lengths[{i}] must be an Example, an int or a (source, "
                                 f"target) pair of ints, got {describe(item)}")
    if len(out) and out.min() < 1:
        raise InputError(f"lengths must be >= 1, got {int(out.min())} at position "
                         f"{int(np.argwhere(out < 1)[0][0])}")
    return out


class BucketBatchSampler:
    """The paper's minibatches: shuffle, take `bucket` batches' worth, sort by length, split.

    Each epoch: shuffle all examples (unless `shuffle=False`); cut the order into chunks of
    `bucket` minibatches' worth (`bucket * batch_size` sentences when `batch_size` is set, else
    sentences adding up to `bucket * max_tokens` tokens of max(S, T));
    sort each chunk by (source length, target length); split it into consecutive batches; shuffle
    the order of all batches. Everything is a function of (seed, epoch), so every process and
    every resumed run sees the same batches.

    Budget. A batch's cost is its padded size, `len(batch) * max(S, T)`, where S is the longest
    source and T the longest target + 1 (what `collate` pads to). A batch holds at most
    `batch_size` sentences and costs at most `max_tokens`, except that a single example over the
    budget gets a batch of its own.

    Distributed. With `num_replicas` R > 1 the global batch list is made the same way on every
    rank; if its length is not a multiple of R, the largest batches are halved until it is (so
    every example still appears exactly once), and rank r takes batches r, r+R, r+2R, ... Each
    rank therefore gets a disjoint shard and the same number of batches. Only if every batch
    holds one sentence and the count is still not a multiple of R are the first batches repeated,
    as `torch.utils.data.DistributedSampler` does.

    Args:
        lengths: one entry per example: an `Example`, a (source, target) length pair, or an int;
            or an (N, 2) integer array (numpy or torch) of (source, target) lengths, e.g.
            `PreparedCorpus.lengths`.
        batch_size: most sentences per batch (the paper: 80); None for no sentence cap.
        max_tokens: most padded tokens per batch (see Budget); None for no token cap.
        bucket: minibatches per sorted chunk (the paper: 20); 1 gives no sorting across batches.
        shuffle: shuffle examples and batches; False keeps the input order (chunks still sorted).
        seed: base seed; epoch e uses numpy's generator seeded with (seed, e).
        num_replicas: number of processes; default: the torch.distributed world size, or 1.
        rank: this process's rank; default: the torch.distributed rank, or 0.
    Raises:
        InputError: neither cap is set, a cap or `bucket` < 1, rank outside [0, num_replicas),
            fewer examples than replicas, or a length that is not an int >= 1 (a float or a
            bool, in a list as in an array).
    """

    def __init__(self, lengths: Sequence[Any] | np.ndarray | Tensor, *,
                 batch_size: int | None = 80, max_tokens: int | None = None, bucket: int = 20,
                 shuffle: bool = True, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None) -> None:
        if batch_size is None and max_tokens is None:
            raise InputError("set batch_size, max_tokens, or both")
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
            check_optional_positive_int(name, value)
        if not is_int(bucket) or bucket < 1:
            raise InputError(f"bucket must be a positive int, got {bucket!r}")
        if not (is_int(seed) or isinstance(seed, np.integer)):
            raise InputError(f"seed must be an int, got {describe(seed)}")
        check_type("shuffle", shuffle, bool, "True or False")
        if num_replicas is None or rank is None:
            dist = torch.distributed
            initialised = dist.is_available() and dist.is_initialized()
            if num_replicas is None:
                num_replicas = dist.get_world_size() if initialised else 1
            if rank is None:
                rank = dist.get_rank() if initialised else 0
        if not is_int(num_replicas) or num_replicas < 1:
            raise InputError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        if not is_int(rank) or not 0 <= rank < num_replicas:
            raise InputError(f"rank must be in [0, {num_replicas}), got {rank}")
        self._lengths = _lengths(lengths)
        if len(self._lengths) < num_replicas:
            raise InputError(
                f"{len(self._lengths)} examples cannot be shared among {num_replicas} replicas"
            )
        self.batch_size, self.max_tokens, self.bucket = batch_size, max_tokens, bucket
        self.shuffle, self.seed = shuffle, int(seed)
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch, self.position = 0, 0
        self._cache: dict[int, tuple[np.ndarray, ...]] = {}   # two epochs' batches

    # epoch and resumption ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a different epoch starts at its first batch."""
        check_count("epoch", epoch)
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict[str, int]:
        """{"epoch", "position"}: position = batches of this epoch already handed out."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state_dict()` output: the next batch is the one after `position`.

        Raises:
            InputError: `state` lacks "epoch" or "position", either is not an int >= 0, or
                `position` is past the epoch's batches.
        """
        if not isinstance(state, Mapping) or not {"epoch", "position"} <= state.keys():
            raise InputError(f"a sampler state is {{'epoch': int, 'position': int}}, got "
                             f"{describe(state)}")
        epoch, position = state["epoch"], state["position"]
        check_count("sampler epoch", epoch)
        check_count("sampler position", position)
        batches = len(self.epoch_batches(epoch))
        if position > batches:
            raise InputError(f"sampler position {position} is past epoch {epoch}'s {batches} "
                             "batches")
        self.epoch, self.position = epoch, position

    # batches ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches this rank gets in the current epoch."""
        return len(self.epoch_batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        """Yield this rank's remaining batches of the current epoch as lists of positions.

        `position` advances as each batch is handed out; when the epoch is exhausted it goes
        back to 0, so iterating again repeats the epoch (call `set_epoch` between epochs).
        """
        batches = self.epoch_batches(self.epoch)
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1].tolist()
        self.position = 0

    def epoch_batches(self, epoch: int) -> tuple[np.ndarray, ...]:
        """All of this rank's batches of `epoch`, in order: what iterating that epoch yields.

        Does not change the sampler's `epoch` or `position`: `bahdanau.training` keeps its place
        in its own `TrainState` and reads batch `position` of epoch `epoch` here. The batches of
        two epochs are kept (a third replaces the earlier made of the two), so reading one
        batch at a time, on either side of an epoch's end, costs nothing extra.

        Args:
            epoch: the epoch (0-based).
        Returns:
            The batches, each an int64 array of positions into `lengths` (arrays, not Python
            lists: 12M examples cost 96 MB, not half a gigabyte).
        """
        epoch = int(epoch)
        if epoch not in self._cache:
            if len(self._cache) == 2:
                del self._cache[next(iter(self._cache))]     # the earlier made of the two
            self._cache[epoch] = self._make(epoch)
        return self._cache[epoch]

    def _make(self, epoch: int) -> tuple[np.ndarray, ...]:
        rng = np.random.default_rng([self.seed % 2**64, int(epoch) % 2**64])
        lengths = self._lengths
        n = len(lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        longest = lengths.max(axis=1)
        batches: list[np.ndarray] = []
        for chunk in self._chunks(order, longest):
            keys = lengths[chunk]
            chunk = chunk[np.lexsort((keys[:, 1], keys[:, 0]))]
            batches.extend(np.split(chunk, self._cuts(chunk, longest)))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        batches = self._divisible(batches)
        return tuple(batches[self.rank::self.num_replicas])

    def _chunks(self, order: np.ndarray, longest: np.ndarray) -> Iterator[np.ndarray]:
        if self.batch_size is not None:
            size = self.bucket * self.batch_size
            for start in range(0, len(order), size):
                yield order[start:start + size]
            return
        assert self.max_tokens is not None   # __init__ requires batch_size or max_tokens
        budget = self.bucket * self.max_tokens
        ends = np.cumsum(longest[order])
        start = 0
        while start < len(order):
            base = ends[start - 1] if start else 0
            stop = int(np.searchsorted(ends, base + budget, side="right"))
            stop = max(stop, start + 1)
            yield order[start:stop]
            start = stop

    def _cuts(self, chunk: np.ndarray, longest: np.ndarray) -> list[int]:
        """Where the sorted `chunk` splits into batches: the positions that start a new one."""
        if self.max_tokens is None:
            assert self.batch_size is not None   # __init__ requires batch_size or max_tokens
            return list(range(self.batch_size, len(chunk), self.batch_size))
        cuts: list[int] = []
        start = width = 0
        for j, size in enumerate(longest[chunk].tolist()):
            count, new_width = j - start, max(width, size)
            fits = (self.batch_size is None or count < self.batch_size) and (
                new_width * (count + 1) <= self.max_tokens)
            if count and not fits:
                cuts.append(j)
                start, new_width = j, size
            width = new_width
        return cuts

    def _divisible(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        r = self.num_replicas
        while len(batches) % r:
            sizes = [len(b) for b in batches]
            big = int(np.argmax(sizes))
            if sizes[big] < 2:
                missing = (-len(batches)) % r
                return batches + batches[:missing]
            half = math.ceil(sizes[big] / 2)
            batch = batches[big]
            batches[big:big + 1] = [batch[:half], batch[half:]]
        return batches
