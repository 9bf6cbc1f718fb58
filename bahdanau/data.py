"""Data pipeline: vocabularies, reversible tokenisation, parallel text, length-bucketed batches.

The pieces compose; none owns a loop::

    pairs = read_parallel("train.en.gz", "train.fr.gz")                 # [(src_text, tgt_text)]
    tok = DefaultTokenizer()
    src_vocab = Vocab.build((tok.tokenize(s) for s, _ in pairs), max_size=30000)
    tgt_vocab = Vocab.build((tok.tokenize(t) for _, t in pairs), max_size=30000)
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tok, max_len=50)
    sampler = BucketBatchSampler(examples, batch_size=80, seed=1234)
    for positions in sampler:
        batch = collate([examples[i] for i in positions])              # Batch of (B, S), (B, T)

The special ids belong to `Vocab` (pad 0, bos 1, eos 2, unk 3): `collate` pads and frames with
them, `ModelConfig`'s defaults are them, and `ModelConfig.check_vocabs` refuses a config that
disagrees (training, loading a checkpoint and translating call it).
Shape legend: B batch, S source length, T target length (tgt_in and tgt_out, eos/bos included).
"""

from __future__ import annotations

import json
import math
import operator
import os
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from bahdanau._checks import (
    check_optional_positive_int,
    check_path,
    check_tokenizer,
    check_type,
    describe,
    is_int,
)
from bahdanau._files import atomic_write
from bahdanau.datasets import read_lines
from bahdanau.errors import InputError

__all__ = [
    "SPECIALS",
    "Batch",
    "BucketBatchSampler",
    "DefaultTokenizer",
    "Example",
    "Tokenizer",
    "Vocab",
    "WhitespaceTokenizer",
    "collate",
    "encode_pairs",
    "normalize_whitespace",
    "read_parallel",
]

SPECIALS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3 = pad, bos, eos, unk


# ----------------------------------------------------------------------------------------------
# Vocabulary


class Vocab:
    """A token <-> id table: the four `SPECIALS` first (ids 0..3), then words.

    The special ids are defined here and nowhere else: `pad_id`, `bos_id`, `eos_id` and `unk_id`
    are the positions of the specials, the same for every vocabulary (so also readable on the
    class, `Vocab.pad_id`). `collate`, `ModelConfig` and `BeamSearch` take them from here.

    Args:
        tokens: the words, in id order (ids start after the specials); no duplicates, no specials.
        specials: the special tokens, in the order pad, bos, eos, unk.
    Raises:
        InputError: fewer or more than 4 specials, a duplicate token, or a word that is a special.
    """

    def __init__(self, tokens: Iterable[str], *, specials: Sequence[str] = SPECIALS) -> None:
        if isinstance(tokens, str):
            raise InputError("tokens must be a list of tokens, not one str")
        specials = tuple(specials)
        if len(specials) != 4:
            raise InputError(f"specials must be (pad, bos, eos, unk), got {specials!r}")
        self._itos: list[str] = [*specials, *tokens]
        self._stoi: dict[str, int] = {}
        for i, token in enumerate(self._itos):
            if not isinstance(token, str) or not token:
                raise InputError(f"vocabulary entry {i} must be a non-empty str, got {token!r}")
            if token in self._stoi:
                raise InputError(
                    f"duplicate vocabulary token {token!r} at ids {self._stoi[token]} and {i}"
                )
            self._stoi[token] = i
        self._specials = specials

    @classmethod
    def build(cls, token_lists: Iterable[list[str]], max_size: int | None = None,
              min_freq: int = 1, *, specials: Sequence[str] = SPECIALS) -> Vocab:
        """Count tokens and keep the most frequent ones (`from_counts` of the counts).

        Args:
            token_lists: tokenised sentences.
            max_size: keep at most this many words, specials not included (the paper keeps
                30,000, so `len(vocab)` is then 30,004); None keeps all.
            min_freq: drop words seen fewer times.
            specials: the special tokens (pad, bos, eos, unk).
        Returns:
            The vocabulary.
        Raises:
            InputError: `max_size` < 1, `min_freq` < 1, or an item that is a str, not a list.
        """
        _check_limits(max_size, min_freq)
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            if isinstance(tokens, str):
                raise InputError("Vocab.build takes token lists (tokenize each sentence first), "
                                 f"got the str {tokens[:40]!r}")
            counts.update(tokens)
        return cls.from_counts(counts, max_size, min_freq, specials=specials)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], max_size: int | None = None,
                    min_freq: int = 1, *, specials: Sequence[str] = SPECIALS) -> Vocab:
        """The most frequent words of `counts` (token -> count).

        Order is deterministic: by decreasing count, ties broken alphabetically (by code point).
        Tokens equal to a special, and the empty string, are not words.

        Args:
            counts: how often each token was seen.
            max_size, min_freq, specials: as for `build`.
        Returns:
            The vocabulary.
        Raises:
            InputError: `max_size` < 1 or `min_freq` < 1.
        """
        _check_limits(max_size, min_freq)
        skip = {*specials, ""}
        ranked = sorted((t for t, c in counts.items() if c >= min_freq and t not in skip),
                        key=lambda t: (-counts[t], t))
        if max_size is not None:
            ranked = ranked[:max_size]
        return cls(ranked, specials=specials)

    # ids of the specials: their positions in SPECIALS ------------------------------------------
    pad_id: ClassVar[int] = 0   # padding
    bos_id: ClassVar[int] = 1   # begin of sentence, the decoder's first input y_0
    eos_id: ClassVar[int] = 2   # end of sentence, the last target token of every sentence
    unk_id: ClassVar[int] = 3   # [UNK], which every word outside the vocabulary maps to

    @property
    def specials(self) -> tuple[str, ...]:
        """The special tokens, in the order pad, bos, eos, unk."""
        return self._specials

    @property
    def tokens(self) -> list[str]:
        """The words (without specials), in id order."""
        return self._itos[len(self._specials):]

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return self._itos == other._itos

    def __hash__(self) -> int:
        return hash(tuple(self._itos))

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, first={self._itos[4:9]!r})"

    def token_to_id(self, token: str) -> int:
        """The id of `token`, or `unk_id` if it is not in the vocabulary."""
        return self._stoi.get(token, self.unk_id)

    def id_to_token(self, index: int) -> str:
        """The token of id `index`; InputError outside [0, len)."""
        index = int(index)
        if not 0 <= index < len(self._itos):
            raise InputError(f"token id {index} is outside the vocabulary of size {len(self)}")
        return self._itos[index]

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Map tokens to ids; unknown tokens become `unk_id`. No bos/eos is added."""
        stoi, unk = self._stoi, self.unk_id
        return [stoi.get(t, unk) for t in tokens]

    def decode(self, ids: Iterable[int] | Tensor, *, strip_specials: bool = True) -> list[str]:
        """Map ids back to tokens.

        Args:
            ids: token ids (a list or a 1-D tensor).
            strip_specials: stop at the first eos and drop pad and bos; unk stays as its token
                ("<unk>"), since it stands for a word. False maps every id, eos included.
        Returns:
            The tokens.
        Raises:
            InputError: an id outside [0, len(self)).
        """
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            try:
                i = operator.index(i)                # ints and numpy ints; not 4.7
            except TypeError:
                raise InputError(f"ids must be integers, got {i!r}") from None
            if strip_specials:
                if i == self.eos_id:
                    break
                if i in (self.pad_id, self.bos_id):
                    continue
            out.append(self.id_to_token(i))
        return out

    # serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, list[str]]:
        """{"specials": [...], "tokens": [...]}: readable, JSON-able, checkpoint-safe."""
        return {"specials": list(self._specials), "tokens": self.tokens}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Vocab:
        """Rebuild from `to_dict()` output."""
        if not isinstance(data, dict) or set(data) != {"specials", "tokens"}:
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise InputError(f"a Vocab dict needs exactly the keys 'specials' and 'tokens', "
                             f"got {keys}")
        return cls(data["tokens"], specials=data["specials"])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `to_dict()` as UTF-8 JSON, one token per line (atomically: a crash leaves the
        old file or the new one)."""
        path = check_path("path", path)
        data = self.to_dict()
        body = ",\n".join(json.dumps(t, ensure_ascii=False) for t in data["tokens"])
        text = ('{\n"specials": ' + json.dumps(data["specials"], ensure_ascii=False)
                + ',\n"tokens": [\n' + body + "\n]\n}\n")
        encoded = text.encode("utf-8")
        atomic_write(path, lambda f: f.write(encoded))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Vocab:
        """Read a file written by `save`; InputError naming the file if it is not one."""
        path = check_path("path", path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls.from_dict(data)
        except (ValueError, UnicodeDecodeError) as err:
            raise InputError(f"{path}: not a vocabulary file ({err})") from None


def _check_limits(max_size: object, min_freq: object) -> None:
    check_optional_positive_int("max_size", max_size)
    if not is_int(min_freq) or min_freq < 1:
        raise InputError(f"min_freq must be a positive int, got {min_freq!r}")


# ----------------------------------------------------------------------------------------------
# Tokenisation


@runtime_checkable
class Tokenizer(Protocol):
    """Anything with these two methods can tokenise, e.g. a wrapper of a SentencePiece model."""

    def tokenize(self, text: str) -> list[str]:
        """The tokens of one sentence (non-empty strings)."""
        ...

    def detokenize(self, tokens: list[str]) -> str:
        """The text of a list of tokens (the inverse of `tokenize`)."""
        ...


def normalize_whitespace(text: str) -> str:
    """Runs of whitespace (as `str.split` sees it) become one space; ends are stripped."""
    return " ".join(text.split())


class WhitespaceTokenizer:
    """For pre-tokenised text: split on whitespace, join with single spaces."""

    def tokenize(self, text: str) -> list[str]:
        """The whitespace-separated tokens of `text`."""
        return text.split()

    def detokenize(self, tokens: list[str]) -> str:
        """The tokens joined with single spaces."""
        return " ".join(tokens)


def _is_word_char(ch: str) -> bool:
    # Letters, digits and combining marks (so accents stay inside their word).
    return ch.isalnum() or unicodedata.category(ch).startswith("M")


class DefaultTokenizer:
    """Reversible word/punctuation tokenizer: `detokenize(tokenize(s)) == normalize_whitespace(s)`.

    Scheme. The text is split on whitespace; each piece is split further into runs of word
    characters (letters, digits, combining marks) and single other characters (punctuation,
    symbols). Where two tokens were glued (no space between them in the text), one of them
    carries the joiner ``JOINER`` ("￭", U+FFED) on that side. Which one, `joiners` says:

    * ``"prefix"`` (the default): the second token, as a prefix::

        "A dog, running." -> ["A", "dog", "￭,", "running", "￭."]
        "l'homme (2)"     -> ["l", "￭'", "￭homme", "(", "￭2", "￭)"]

    * ``"punctuation"``: the punctuation or symbol token (a prefix when it follows the token it
      is glued to, a suffix when it precedes it), so that a word is the same token wherever it
      stands ("homme" in "un homme" and in "l'homme")::

        "l'homme (2)"     -> ["l", "￭'￭", "homme", "(￭", "2", "￭)"]

    `detokenize` glues a token to the one before it when it starts with a joiner or the one
    before it ends with one, and puts one space before every other token. A joiner character in
    the input is a symbol like any other: a one-character token "￭" is always that literal
    character, and it never takes a suffix joiner, so every input round-trips in both schemes.

    Args:
        lowercase: lowercase every token. The round trip then holds only up to case (and
            `str.lower` may change lengths, e.g. "İ"); references should be compared lowercased.
        joiners: "prefix" or "punctuation", as above.
    """

    JOINER = "\uffed"
    JOINERS: tuple[str, ...] = ("prefix", "punctuation")

    def __init__(self, *, lowercase: bool = False, joiners: str = "prefix") -> None:
        if joiners not in self.JOINERS:
            raise InputError(f"joiners must be one of {self.JOINERS}, got {joiners!r}")
        self.lowercase, self.joiners = lowercase, joiners

    def __repr__(self) -> str:
        return f"DefaultTokenizer(lowercase={self.lowercase}, joiners={self.joiners!r})"

    def tokenize(self, text: str) -> list[str]:
        """Split `text` into word and punctuation tokens, marking glued tokens with `JOINER`."""
        joiner, on_punctuation = self.JOINER, self.joiners == "punctuation"
        tokens: list[str] = []
        for piece in text.split():
            start, n = 0, len(piece)
            while start < n:
                end = start + 1
                if _is_word_char(piece[start]):
                    while end < n and _is_word_char(piece[end]):
                        end += 1
                token = piece[start:end].lower() if self.lowercase else piece[start:end]
                if start > 0:                          # glued to the token before it
                    last = tokens[-1][-1]               # a word char, punctuation, or "￭"
                    if on_punctuation and not _is_word_char(last) and last != joiner:
                        tokens[-1] += joiner            # a suffix on the punctuation before
                    else:                               # (a literal "￭" takes no suffix)
                        token = joiner + token
                tokens.append(token)
                start = end
        return tokens

    @classmethod
    def display(cls, token: str) -> str:
        """A token as a label (e.g. on an alignment plot's axis): without its joiner marks."""
        return cls._marks(token)[1]

    @classmethod
    def _marks(cls, token: str) -> tuple[bool, str, bool]:
        """(glued to the token before, the token without its marks, glued to the one after)."""
        before = len(token) > 1 and token[0] == cls.JOINER
        core = token[1:] if before else token
        after = len(core) > 1 and core[-1] == cls.JOINER
        return before, core[:-1] if after else core, after

    def detokenize(self, tokens: list[str]) -> str:
        """Inverse of `tokenize` (up to whitespace normalisation), for either scheme."""
        parts: list[str] = []
        glue_next = False
        for token in tokens:
            glue, core, next_glue = self._marks(token)
            if parts and not (glue or glue_next):
                parts.append(" ")
            parts.append(core)
            glue_next = next_glue
        return "".join(parts)


# ----------------------------------------------------------------------------------------------
# Parallel text and examples


def read_parallel(src_path: str | os.PathLike[str], tgt_path: str | os.PathLike[str], *,
                  non_empty: bool = False) -> list[tuple[str, str]]:
    """Read two line-aligned UTF-8 files (plain or gzip) into (source, target) pairs.

    Each file is read by `bahdanau.datasets.read_lines` (same rules as standard input: gzip
    recognised by its first bytes, a leading BOM removed, lines split on ``\\n`` only).

    Args:
        src_path: source-language file; line i translates to line i of `tgt_path`.
        tgt_path: target-language file.
        non_empty: refuse empty files (where sentences are needed, e.g. training data); by
            default two empty files give ``[]``.
    Returns:
        The pairs, in file order, lines as read (line endings removed).
    Raises:
        InputError: naming the file: different line counts (both files named), a line that is
            empty or only whitespace (1-based line named), text that is not valid UTF-8 (line
            named), truncated or damaged gzip data, or an empty file with `non_empty`.
        OSError: a file cannot be opened or read.
    """
    src_file, tgt_file = check_path("src_path", src_path), check_path("tgt_path", tgt_path)
    src_lines = read_lines(src_file, non_empty=non_empty)
    tgt_lines = read_lines(tgt_file, non_empty=non_empty)
    if len(src_lines) != len(tgt_lines):
        raise InputError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}: "
            "the files are not line-aligned"
        )
    for path, lines in ((src_path, src_lines), (tgt_path, tgt_lines)):
        for i, line in enumerate(lines):
            if not line.strip():
                raise InputError(f"{path}: line {i + 1} is empty")
    return list(zip(src_lines, tgt_lines, strict=True))


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


def encode_pairs(pairs: Iterable[tuple[str, str]], src_vocab: Vocab, tgt_vocab: Vocab,
                 tokenizer: Tokenizer | tuple[Tokenizer, Tokenizer], *,
                 max_len: int | None = None) -> list[Example]:
    """Tokenise and encode sentence pairs, dropping over-long ones.

    Args:
        pairs: (source text, target text) pairs, e.g. from `read_parallel`.
        src_vocab, tgt_vocab: vocabularies of the two sides.
        tokenizer: one tokenizer for both sides, or a (source, target) pair of them.
        max_len: drop pairs with more than this many tokens on either side (bos/eos not counted);
            the paper's RNNsearch-30/-50 use 30/50 words. None keeps all.
    Returns:
        The kept examples, in input order, each with its index in `pairs`.
    Raises:
        InputError: `max_len` < 1, or a side tokenises to nothing (the pair index is named).
    """
    check_optional_positive_int("max_len", max_len)
    check_type("src_vocab", src_vocab, Vocab, "a Vocab")
    check_type("tgt_vocab", tgt_vocab, Vocab, "a Vocab")
    src_tok, tgt_tok = tokenizer if isinstance(tokenizer, tuple) else (tokenizer, tokenizer)
    check_tokenizer("tokenizer", src_tok)
    check_tokenizer("tokenizer", tgt_tok)
    examples = []
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(text, str) for text in pair)):
            raise InputError(f"pair {index} must be a (source, target) pair of str, "
                             f"got {describe(pair)}")
        src_text, tgt_text = pair
        src_tokens, tgt_tokens = src_tok.tokenize(src_text), tgt_tok.tokenize(tgt_text)
        for side, tokens, text in (("source", src_tokens, src_text),
                                   ("target", tgt_tokens, tgt_text)):
            if not tokens:
                raise InputError(f"pair {index}: the {side} {text!r} has no tokens")
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


# ----------------------------------------------------------------------------------------------
# Length-bucketed batch sampler


def _lengths(items: Sequence[Any] | np.ndarray) -> np.ndarray:
    """(N, 2) padded lengths (source S, target T) of Examples, (src, tgt) pairs or ints, or of
    an (N, 2) integer array of them (taken whole, as `PreparedCorpus.lengths` is)."""
    if isinstance(items, np.ndarray):
        if items.ndim != 2 or items.shape[1] != 2 or items.dtype.kind not in "iu":
            raise InputError(f"a lengths array must be (N, 2) integers, got {items.dtype} "
                             f"{items.shape}")
        out = np.asarray(items, dtype=np.int64)   # no copy of an int64 array
    else:
        out = np.empty((len(items), 2), dtype=np.int64)
        for i, item in enumerate(items):
            if isinstance(item, Example):
                out[i] = (len(item.src), len(item.tgt) + 1)  # tgt_in/tgt_out carry bos/eos
            elif isinstance(item, (int, np.integer)):
                out[i] = (item, item)
            else:
                out[i] = tuple(item)
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
            or an (N, 2) integer array of (source, target) lengths, e.g. `PreparedCorpus.lengths`.
        batch_size: most sentences per batch (the paper: 80); None for no sentence cap.
        max_tokens: most padded tokens per batch (see Budget); None for no token cap.
        bucket: minibatches per sorted chunk (the paper: 20); 1 gives no sorting across batches.
        shuffle: shuffle examples and batches; False keeps the input order (chunks still sorted).
        seed: base seed; epoch e uses numpy's generator seeded with (seed, e).
        num_replicas: number of processes; default: the torch.distributed world size, or 1.
        rank: this process's rank; default: the torch.distributed rank, or 0.
    Raises:
        InputError: neither cap is set, a cap or `bucket` < 1, rank outside [0, num_replicas),
            or fewer examples than replicas.
    """

    def __init__(self, lengths: Sequence[Any] | np.ndarray, *, batch_size: int | None = 80,
                 max_tokens: int | None = None, bucket: int = 20, shuffle: bool = True,
                 seed: int = 0, num_replicas: int | None = None, rank: int | None = None) -> None:
        if batch_size is None and max_tokens is None:
            raise InputError("set batch_size, max_tokens, or both")
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
            check_optional_positive_int(name, value)
        if not is_int(bucket) or bucket < 1:
            raise InputError(f"bucket must be a positive int, got {bucket!r}")
        if not (is_int(seed) or isinstance(seed, np.integer)):
            raise InputError(f"seed must be an int, got {describe(seed)}")
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
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def state_dict(self) -> dict[str, int]:
        """{"epoch", "position"}: position = batches of this epoch already handed out."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state_dict()` output: the next batch is the one after `position`."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if position < 0:
            raise InputError(f"sampler position must be >= 0, got {position}")
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

        Does not change the sampler's `epoch` or `position`: `bahdanau.train` keeps its place
        in its own `TrainState` and reads batch `position` of epoch `epoch` here. The batches of
        the last two epochs asked for are kept, so reading one batch at a time, on either side
        of an epoch's end, costs nothing extra.

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
