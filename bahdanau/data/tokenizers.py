"""Tokenizers: the protocol, the default reversible tokenizer, and where tokenizers are stored.

`Tokenizer` is what the library asks of one (`tokenize`, `detokenize`); `DefaultTokenizer`
splits words and punctuation reversibly, `WhitespaceTokenizer` splits on spaces,
`CharTokenizer` splits into characters (a space is the symbol "▁"), and
`bahdanau.data.sentencepiece.SentencePieceTokenizer` wraps a SentencePiece model.

Two sides. A model reads its sources and writes its targets with one tokenizer, unless it is a
`TokenizerPair`: one tokenizer per side (e.g. letters in, space-separated phonemes out for
grapheme-to-phoneme conversion). A pair tokenizes as its source side and detokenizes as its
target side, which is all that translating asks; `sides` gives the (source, target) tokenizers
of any tokenizer, and every place that tokenizes a target text asks it. `check_sides` gives
them for an argument that may also be a (source, target) tuple (`encode_pairs`'s), refusing
anything else before any work.

Storing. `tokenizer_to_payload` turns `DefaultTokenizer`, `WhitespaceTokenizer`,
`CharTokenizer`, `SentencePieceTokenizer` or a `TokenizerPair` of the first three into a
checkpoint-safe dict (a SentencePiece model as a uint8 tensor of its bytes),
`tokenizer_from_payload` reads it back; checkpoints keep it in their `tokenizer` section.
`save_tokenizer` / `load_tokenizer` do the same in a folder: ``tokenizer.json``, and
``sentencepiece.model`` beside it for SentencePiece; `tokenizer_files` gives those files' bytes,
which every folder that stores a tokenizer writes (a prepared corpus, a model folder and an
exported folder, the last two naming the SentencePiece model ``tokenizer.model``). Tokenizers
of other types cannot be stored.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import Tensor

from bahdanau._checks import (
    JSON_ERRORS,
    check_path,
    check_tokenizer,
    describe,
)
from bahdanau._files import atomic_file
from bahdanau._folders import PREPARED_SENTENCEPIECE, TOKENIZER_FILE
from bahdanau.data.sentencepiece import SentencePieceTokenizer
from bahdanau.data.vocab import SPECIALS
from bahdanau.errors import InputError

# A SentencePiece tokenizer's model beside its JSON in a prepared corpus (`save_tokenizer`);
# model and exported folders name it `bahdanau.serving.SENTENCEPIECE_FILE`.
SENTENCEPIECE_FILE = PREPARED_SENTENCEPIECE


@runtime_checkable
class Tokenizer(Protocol):
    """Anything with these two methods can tokenise, e.g. a wrapper of a SentencePiece model."""

    def tokenize(self, text: str) -> list[str]:
        """The tokens of one sentence (non-empty strings)."""
        ...

    def detokenize(self, tokens: list[str]) -> str:
        """The text of a list of tokens (the inverse of `tokenize`)."""
        ...


# A word spelled like the pad, bos or eos special, after any backslashes: `WhitespaceTokenizer`
# escapes it, so that "</s>" in a text is a word, never the id that ends a sentence.
_SPECIAL_WORD = re.compile("\\\\*(?:" + "|".join(map(re.escape, SPECIALS[:3])) + ")")


class WhitespaceTokenizer:
    """For pre-tokenised text: split on whitespace, join with single spaces.

    A word spelled like a `Vocab` special that shapes a sentence ("<pad>", "<s>", "</s>") is a
    word like any other: `tokenize` escapes it with a backslash ("</s>" -> "\\</s>", and a word
    that already is such an escape gets one more backslash), `detokenize` removes that backslash,
    so ``detokenize(tokenize(s)) == " ".join(s.split())`` for every text. "<unk>" is not escaped:
    it reads as the unknown word, as in corpora whose rare words were replaced by it, and it
    decodes as "<unk>" again.
    """

    def __repr__(self) -> str:
        return "WhitespaceTokenizer()"

    def tokenize(self, text: str) -> list[str]:
        """The whitespace-separated tokens of `text`, special-looking words escaped."""
        return ["\\" + t if _SPECIAL_WORD.fullmatch(t) else t for t in text.split()]

    def detokenize(self, tokens: list[str]) -> str:
        """The tokens joined with single spaces, the escapes of `tokenize` removed."""
        return " ".join(t[1:] if t[:1] == "\\" and _SPECIAL_WORD.fullmatch(t) else t
                        for t in tokens)


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


class CharTokenizer:
    """Characters as tokens, for character-level transduction (grapheme-to-phoneme conversion,
    transliteration, inflection): ``detokenize(tokenize(s)) == s`` for every text.

    Each character (Unicode code point, as the text holds it: no normalisation) is one token; a
    space is the visible symbol ``SPACE`` ("▁", U+2581), so that a token is never blank and an
    alignment plot shows it. A literal "▁" in the text is the token ``ESCAPED_SPACE`` ("\\▁"),
    so the two never meet; every other whitespace character (a tab) is a token as it is::

        "New York" -> ["N", "e", "w", "▁", "Y", "o", "r", "k"]
    """

    SPACE = "\u2581"
    ESCAPED_SPACE = "\\" + SPACE

    def __repr__(self) -> str:
        return "CharTokenizer()"

    def tokenize(self, text: str) -> list[str]:
        """The characters of `text`, a space as `SPACE` and a literal "▁" as `ESCAPED_SPACE`."""
        space, escaped = self.SPACE, self.ESCAPED_SPACE
        return [space if ch == " " else escaped if ch == space else ch for ch in text]

    def detokenize(self, tokens: list[str]) -> str:
        """The text of `tokens`: the inverse of `tokenize` (other tokens are joined as they are)."""
        space, escaped = self.SPACE, self.ESCAPED_SPACE
        return "".join(" " if t == space else space if t == escaped else t for t in tokens)


class TokenizerPair:
    """One tokenizer per side: `source` reads what the model translates, `target` what it writes.

    As a `Tokenizer` it is what translating needs: `tokenize` is the source's and `detokenize`
    the target's. Code that tokenizes a target text (building the target vocabulary, encoding
    training pairs, forced decoding) takes the target side with `sides`.

    Args:
        source, target: a `DefaultTokenizer`, `WhitespaceTokenizer` or `CharTokenizer` each (the
            kinds a pair can store; a SentencePiece model serves both sides on its own).
    Raises:
        InputError: a side of another kind.
    """

    def __init__(self, source: Tokenizer, target: Tokenizer) -> None:
        for side, tokenizer in (("source", source), ("target", target)):
            if type(tokenizer) not in _PAIRED:
                raise InputError(f"a TokenizerPair's {side} must be a DefaultTokenizer, "
                                 f"WhitespaceTokenizer or CharTokenizer, got {describe(tokenizer)}")
        self.source, self.target = source, target

    def __repr__(self) -> str:
        return f"TokenizerPair(source={self.source!r}, target={self.target!r})"

    def tokenize(self, text: str) -> list[str]:
        """The tokens of a source text."""
        return self.source.tokenize(text)

    def detokenize(self, tokens: list[str]) -> str:
        """The text of a target's tokens."""
        return self.target.detokenize(tokens)


_PAIRED = (DefaultTokenizer, WhitespaceTokenizer, CharTokenizer)


def sides(tokenizer: Tokenizer) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers: a `TokenizerPair`'s two, else `tokenizer` twice."""
    if isinstance(tokenizer, TokenizerPair):
        return tokenizer.source, tokenizer.target
    return tokenizer, tokenizer


def check_sides(name: str, tokenizer: object) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers of a tokenizer argument that may also be a pair, checked
    before any work: one tokenizer instance (`sides`: a `TokenizerPair` gives its own two) or a
    (source, target) tuple of two instances.

    Raises:
        InputError: a list, a tuple of other than two, a tuple holding a `TokenizerPair` (which
            side of it would tokenize is not said), or something else than a tokenizer instance
            (`check_tokenizer`), naming `name` (and `name[i]` for an item of the tuple).
    """
    if isinstance(tokenizer, list) or (isinstance(tokenizer, tuple) and len(tokenizer) != 2):
        raise InputError(f"{name} must be one tokenizer or a (source, target) tuple of two, got "
                         f"a {type(tokenizer).__name__} of {len(tokenizer)}")
    if not isinstance(tokenizer, tuple):
        check_tokenizer(name, tokenizer)
        return sides(cast(Tokenizer, tokenizer))
    for i, side in enumerate(tokenizer):
        check_tokenizer(f"{name}[{i}]", side)
        if isinstance(side, TokenizerPair):
            raise InputError(f"{name}[{i}] is a TokenizerPair: give the pair alone, or a "
                             "(source, target) tuple of single tokenizers")
    return tokenizer[0], tokenizer[1]


def writes_lowercase(tokenizer: Tokenizer) -> bool:
    """Whether the text `tokenizer` writes (its target side's) is lowercased: BLEU against raw
    references then ignores case."""
    return bool(getattr(sides(tokenizer)[1], "lowercase", False))


# ----------------------------------------------------------------------------------------------
# Storing


_KEYS = {"default": ("lowercase", "joiners"), "whitespace": (), "char": (),
         "sentencepiece": ("model",), "pair": ("source", "target")}


def tokenizer_to_payload(tokenizer: object) -> dict[str, Any]:
    """A checkpoint-safe dict describing one of bahdanau's tokenizers.

    Args:
        tokenizer: a `DefaultTokenizer`, `WhitespaceTokenizer`, `CharTokenizer`,
            `SentencePieceTokenizer` or `TokenizerPair`.
    Returns:
        ``{"name": "default", "lowercase": bool, "joiners": str}``, ``{"name": "whitespace"}``,
        ``{"name": "char"}``, ``{"name": "sentencepiece", "model": (N,) uint8 tensor of the
        model's bytes}`` or ``{"name": "pair", "source": dict, "target": dict}`` (a dict of
        the first three kinds each).
    Raises:
        InputError: any other tokenizer (subclasses included): only these can be stored.
    """
    if type(tokenizer) is DefaultTokenizer:
        return {"name": "default", "lowercase": bool(tokenizer.lowercase),
                "joiners": tokenizer.joiners}
    if type(tokenizer) is WhitespaceTokenizer:
        return {"name": "whitespace"}
    if type(tokenizer) is CharTokenizer:
        return {"name": "char"}
    if type(tokenizer) is TokenizerPair:
        return {"name": "pair", "source": tokenizer_to_payload(tokenizer.source),
                "target": tokenizer_to_payload(tokenizer.target)}
    if type(tokenizer) is SentencePieceTokenizer:
        return {"name": "sentencepiece",
                "model": torch.frombuffer(bytearray(tokenizer.model_proto), dtype=torch.uint8)}
    raise InputError(f"only bahdanau's tokenizers (DefaultTokenizer, WhitespaceTokenizer, "
                     f"CharTokenizer, SentencePieceTokenizer, TokenizerPair) can be stored, "
                     f"got {type(tokenizer).__name__}; "
                     "keep your own tokenizer's files beside the checkpoint")


def comparable_payload(data: dict[str, Any]) -> dict[str, Any]:
    """A `tokenizer_to_payload` dict that ``==`` compares: a SentencePiece model as its bytes
    (two tokenizers are the same when their payloads compare equal)."""
    return {k: bytes(v.cpu().numpy()) if isinstance(v, Tensor) else v for k, v in data.items()}


def tokenizer_from_payload(data: Any) -> Tokenizer:
    """The tokenizer that `tokenizer_to_payload` described.

    Raises:
        InputError: not a dict, an unknown name, missing or unknown keys, a value of the wrong
            type, or a SentencePiece model that does not load; one line each.
    """
    return _build(data, _model_from_tensor)


def _model_from_tensor(value: Any) -> SentencePieceTokenizer:
    if not (isinstance(value, Tensor) and value.dtype == torch.uint8 and value.dim() == 1):
        raise InputError(f"the sentencepiece tokenizer's 'model' must be a 1-D uint8 tensor of "
                         f"the model's bytes, got {describe(value)}")
    return SentencePieceTokenizer(value.cpu().numpy().tobytes())


def _checked(data: Any, *, paired: bool = False) -> str:
    """The name of a `tokenizer_to_payload`-shaped dict, once its keys and settings are known
    to be right (a SentencePiece model is checked when it is read); `paired`: a side of a
    pair, which is neither a SentencePiece model nor a pair."""
    if not isinstance(data, dict):
        raise InputError(f"a tokenizer is stored as a dict with a 'name', got {describe(data)}")
    name = data.get("name")
    if name not in _KEYS:
        raise InputError(f"unknown tokenizer {name!r}: bahdanau stores "
                         f"{', '.join(map(repr, _KEYS))}")
    if paired and name in ("sentencepiece", "pair"):
        raise InputError(f"a tokenizer pair's side is 'default', 'whitespace' or 'char', "
                         f"got {name!r}")
    expected = {"name", *_KEYS[name]}
    if set(data) != expected:
        raise InputError(f"the {name} tokenizer is stored with the keys {sorted(expected)}, "
                         f"got {sorted(map(str, data))}")
    if name == "default":
        if not isinstance(data["lowercase"], bool):
            raise InputError(f"the default tokenizer's 'lowercase' must be a bool, got "
                             f"{describe(data['lowercase'])}")
        if data["joiners"] not in DefaultTokenizer.JOINERS:
            raise InputError(f"the default tokenizer's 'joiners' must be one of "
                             f"{DefaultTokenizer.JOINERS}, got {describe(data['joiners'])}")
    if name == "pair":
        for side in ("source", "target"):
            try:
                _checked(data[side], paired=True)
            except InputError as err:
                raise InputError(f"the pair's {side}: {err}") from None
    return name


def _build(data: Any, read_model: Callable[[Any], SentencePieceTokenizer]) -> Tokenizer:
    """The tokenizer of a `tokenizer_to_payload`-shaped dict; `read_model` turns its "model"
    entry into a `SentencePieceTokenizer`."""
    name = _checked(data)
    if name == "default":
        return DefaultTokenizer(lowercase=data["lowercase"], joiners=data["joiners"])
    if name == "whitespace":
        return WhitespaceTokenizer()
    if name == "char":
        return CharTokenizer()
    if name == "pair":
        return TokenizerPair(_build(data["source"], read_model), _build(data["target"], read_model))
    return read_model(data["model"])


def tokenizer_files(tokenizer: object, model_file: str) -> dict[str, bytes]:
    """The files that store `tokenizer` in a folder, by name, in the order to write them: for
    SentencePiece, the model's bytes as `model_file`, then ``tokenizer.json``
    (`tokenizer_to_payload`'s dict, a SentencePiece model replaced by `model_file`, as
    indented JSON); `load_tokenizer` reads them back.

    Args:
        tokenizer: one that `tokenizer_to_payload` stores.
        model_file: the name of the SentencePiece model beside ``tokenizer.json``
            (``sentencepiece.model`` in a prepared corpus, ``tokenizer.model`` in a model
            folder or an exported folder).
    Raises:
        InputError: a tokenizer of another type.
    """
    data = tokenizer_to_payload(tokenizer)
    files: dict[str, bytes] = {}
    if data["name"] == "sentencepiece":
        files[model_file] = data["model"].numpy().tobytes()
        data["model"] = model_file
    files[TOKENIZER_FILE] = (json.dumps(data, indent=2) + "\n").encode("utf-8")
    return files


def save_tokenizer(tokenizer: object, folder: str | os.PathLike[str]) -> Path:
    """Write `tokenizer` into `folder`: its `tokenizer_files`, ``tokenizer.json`` and, for
    SentencePiece, the model as ``sentencepiece.model`` beside it. Each file is written
    atomically, the model first.

    Args:
        tokenizer: one that `tokenizer_to_payload` stores.
        folder: where the files go; created if missing.
    Returns:
        The path of ``tokenizer.json``.
    Raises:
        InputError: a tokenizer of another type, or `folder` is not a path.
    """
    folder = check_path("folder", folder)
    for name, data in tokenizer_files(tokenizer, SENTENCEPIECE_FILE).items():
        with atomic_file(folder / name) as f:
            f.write(data)
    return folder / TOKENIZER_FILE


def load_tokenizer(folder: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer that `save_tokenizer` wrote into `folder`.

    Raises:
        InputError: naming the file: ``tokenizer.json`` is missing, is not JSON, or describes no
            tokenizer bahdanau stores; or the SentencePiece model it names is missing or is not
            a SentencePiece model.
    """
    folder = check_path("folder", folder)
    path = folder / TOKENIZER_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (save_tokenizer writes it)") from None
    except JSON_ERRORS as err:                      # JSONDecodeError is a ValueError
        raise InputError(f"{path} is damaged: {err}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror or err})") from None

    try:
        _checked(data)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None

    def read_model(name: Any) -> SentencePieceTokenizer:
        if not isinstance(name, str) or not name or Path(name).name != name:
            raise InputError(f"{path}: 'model' must name a file beside it, got {describe(name)}")
        return SentencePieceTokenizer.load(folder / name)   # errors name the model file

    return _build(data, read_model)
