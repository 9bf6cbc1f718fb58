"""Vocabularies: the token <-> id tables of each side, with the special ids every model shares.

`SPECIALS` take ids 0..3 in every `Vocab` (pad, bos, eos, unk): the ids themselves are declared
in `bahdanau.config` (`PAD_ID` ...), so that the configs need nothing from the data.
"""

from __future__ import annotations

import json
import operator
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from torch import Tensor

from bahdanau._checks import (
    JSON_ERRORS,
    check_optional_positive_int,
    check_path,
    is_int,
)
from bahdanau._files import atomic_write
from bahdanau.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from bahdanau.errors import InputError

SPECIALS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3 = pad, bos, eos, unk


# ----------------------------------------------------------------------------------------------
# Vocabulary


class Vocab:
    """A token <-> id table: the four `SPECIALS` first (ids 0..3), then words.

    `pad_id`, `bos_id`, `eos_id` and `unk_id` are the positions of the specials, the same for
    every vocabulary (so also readable on the class, `Vocab.pad_id`): `bahdanau.config`'s
    `PAD_ID` ... `UNK_ID`, which `ModelConfig` defaults to. `collate` and `BeamSearch` take them
    from here.

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
    pad_id: ClassVar[int] = PAD_ID   # padding
    bos_id: ClassVar[int] = BOS_ID   # begin of sentence, the decoder's first input y_0
    eos_id: ClassVar[int] = EOS_ID   # end of sentence, the last target token of every sentence
    unk_id: ClassVar[int] = UNK_ID   # [UNK], which every word outside the vocabulary maps to

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
        except JSON_ERRORS as err:
            raise InputError(f"{path}: not a vocabulary file ({err})") from None


def _check_limits(max_size: object, min_freq: object) -> None:
    check_optional_positive_int("max_size", max_size)
    if not is_int(min_freq) or min_freq < 1:
        raise InputError(f"min_freq must be a positive int, got {min_freq!r}")
