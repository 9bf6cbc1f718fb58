"""SentencePiece as a tokenizer.

`SentencePieceTokenizer` wraps a SentencePiece model (its serialized bytes) behind the
`bahdanau.Tokenizer` protocol: `tokenize` gives the pieces, `detokenize` plain text. One model
serves both languages (train it on source and target sentences together), as one
`DefaultTokenizer` does. The `sentencepiece` package is optional (``pip install
'bahdanau[sentencepiece]'``) and is imported only when a model is built or trained::

    tok = SentencePieceTokenizer.train([s for pair in pairs for s in pair], vocab_size=8000)
    src_vocab = Vocab.build(tok.tokenize(s) for s, _ in pairs)      # all pieces: no max_size
    tgt_vocab = Vocab.build(tok.tokenize(t) for _, t in pairs)
    train(model, examples, cfg, src_vocab=..., tgt_vocab=..., tokenizer=tok, ...)

The special ids stay `Vocab`'s (pad 0, bos 1, eos 2, unk 3): models trained here have no
bos/eos/pad pieces of their own, and a character the model does not know becomes the token
"<unk>". No piece can be "<pad>", "<s>" or "</s>", which a `Vocab` would read as its specials.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
from collections.abc import Iterable
from typing import Any, Literal

from bahdanau._checks import check_path, describe, is_int
from bahdanau._files import atomic_write
from bahdanau.data.text import normalize_whitespace
from bahdanau.data.vocab import SPECIALS, Vocab
from bahdanau.errors import InputError

_UNK = SPECIALS[3]                          # the token of a character the model does not know


def _sentencepiece() -> Any:
    """The `sentencepiece` module; InputError saying how to install it if it is missing."""
    try:
        import sentencepiece
    except ImportError:
        raise InputError("SentencePiece needs the sentencepiece package: pip install "
                         "'bahdanau[sentencepiece]'") from None
    return sentencepiece


def _message(err: Exception, fallback: str) -> str:
    """SentencePiece's error on one line, without its status, source location and failed
    condition ("INTERNAL: src/x.cc(12) [cond] "), which say nothing to a user; `fallback` if
    nothing else is left."""
    text = re.sub(r"^[A-Z_a-z]+: ", "", " ".join(str(err).split()))
    return re.sub(r"^\S+\(\d+\) \[[^\]]*\]\s*", "", text) or fallback


class SentencePieceTokenizer:
    """The `bahdanau.Tokenizer` protocol over a SentencePiece model.

    `tokenize` normalises whitespace, then returns the model's pieces ("▁A", "▁dog", "s"); a
    stretch of characters that the model does not know is one "<unk>" token (`Vocab` maps it to
    `unk_id`). `detokenize` is SentencePiece's decoding: for a model made by `train`,
    ``detokenize(tokenize(s)) == normalize_whitespace(s)`` for every text whose characters were
    in its training sentences ("<unk>" decodes as " ⁇ ").

    Args:
        model_proto: the model's serialized bytes (the contents of a ``.model`` file).
    Raises:
        InputError: `model_proto` is not bytes or not a SentencePiece model, the model lets text
            produce a piece spelled like a `Vocab` special ("<pad>", "<s>", "</s>", "<unk>"),
            or the sentencepiece package is not installed.
    """

    def __init__(self, model_proto: bytes) -> None:
        if not isinstance(model_proto, (bytes, bytearray)):
            raise InputError(f"model_proto must be the bytes of a SentencePiece model, got "
                             f"{describe(model_proto)}")
        self._proto = bytes(model_proto)
        spm = _sentencepiece()
        if not self._proto:                     # SentencePieceProcessor would skip loading it
            raise InputError("not a SentencePiece model (it is empty)")
        try:
            processor = spm.SentencePieceProcessor(model_proto=self._proto)
        except RuntimeError as err:
            raise InputError(f"not a SentencePiece model "
                             f"({_message(err, 'it does not parse')})") from None
        for special in SPECIALS:
            i = processor.piece_to_id(special)
            if processor.id_to_piece(i) == special and not (
                    processor.is_control(i) or processor.is_unknown(i)):
                raise InputError(f"the SentencePiece model's piece {special!r} (id {i}) can "
                                 "come from text, but a Vocab reads it as its special token")
        self._sp = processor
        self._pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        self._piece_set = frozenset(self._pieces)

    @classmethod
    def train(cls, sentences: Iterable[str], *, vocab_size: int,
              model_type: Literal["bpe", "unigram"] = "unigram", max_sentences: int = 1_000_000,
              seed: int = 0, character_coverage: float = 1.0) -> SentencePieceTokenizer:
        """Train a SentencePiece model in memory.

        At most `max_sentences` sentences are used, drawn uniformly by a reservoir sample seeded
        with `seed` (so the same sentences and seed give the same model). Whitespace is
        normalised and blank sentences are skipped; no other normalisation is applied (the
        "identity" rule), so detokenising gives back the text. The model has a piece "<unk>"
        and no bos, eos or pad pieces: those ids are `Vocab`'s.

        Args:
            sentences: training text, e.g. the source and target sides of the training pairs
                (one model serves both languages).
            vocab_size: pieces in the model, "<unk>" included (SentencePiece refuses a size
                that the text cannot fill or that its characters exceed; its limit is named).
            model_type: "unigram" (SentencePiece's default) or "bpe".
            max_sentences: train on at most this many sentences.
            seed: seed of the sample and of SentencePiece's own random choices.
            character_coverage: fraction of the characters (by frequency) that get pieces;
                the rest become "<unk>". 1.0 keeps every character seen.
        Returns:
            The tokenizer.
        Raises:
            InputError: an argument out of range, no text to train on, SentencePiece refused
                the settings (its reason, on one line), or sentencepiece is not installed.
        """
        if isinstance(sentences, (str, bytes)):
            raise InputError("sentences must be an iterable of str, not one str")
        if not is_int(vocab_size) or vocab_size < 2:
            raise InputError(f"vocab_size must be an int >= 2, got {describe(vocab_size)}")
        if model_type not in ("bpe", "unigram"):
            raise InputError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}")
        if not is_int(max_sentences) or max_sentences < 1:
            raise InputError(f"max_sentences must be an int >= 1, got {describe(max_sentences)}")
        if not is_int(seed) or seed < 0:
            raise InputError(f"seed must be an int >= 0, got {describe(seed)}")
        if (isinstance(character_coverage, bool) or not isinstance(character_coverage, float | int)
                or not 0 < character_coverage <= 1):
            raise InputError(f"character_coverage must be in (0, 1], got "
                             f"{describe(character_coverage)}")
        sample = _reservoir(sentences, max_sentences, seed)
        if not sample:
            raise InputError("sentences hold no text to train a SentencePiece model on")
        spm = _sentencepiece()
        model = io.BytesIO()
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
                model_type=model_type, character_coverage=float(character_coverage),
                normalization_rule_name="identity",
                # Vocab owns the special ids. Control pieces would also make SentencePiece drop
                # their characters ("<", "/", ">") from the alphabet, so there are none.
                unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
                # On by default, and what keeps "<s>" etc. from being learned: a piece never
                # mixes scripts, and "<" is not a letter.
                split_by_unicode_script=True,
                num_threads=min(os.cpu_count() or 1, 16), minloglevel=2)
        except RuntimeError as err:
            raise InputError(f"SentencePiece cannot train this model: "
                             f"{_message(err, 'it gives no reason')}") from None
        return cls(model.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SentencePieceTokenizer:
        """Read a SentencePiece ``.model`` file (one of `save`'s, or trained elsewhere).

        Raises:
            InputError: naming the file: it does not exist, cannot be read, or is not a
                SentencePiece model this tokenizer can use.
        """
        path = check_path("path", path)
        try:
            proto = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except OSError as err:
            raise InputError(f"{path}: cannot be read ({err.strerror or err})") from None
        try:
            return cls(proto)
        except InputError as err:
            raise InputError(f"{path}: {err}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model as a ``.model`` file, atomically (a crash leaves the old file or the
        new one); `load` and SentencePiece itself read it."""
        atomic_write(check_path("path", path), lambda f: f.write(self._proto))

    @property
    def model_proto(self) -> bytes:
        """The model's serialized bytes."""
        return self._proto

    @property
    def pieces(self) -> list[str]:
        """Every piece of the model, in the model's id order ("<unk>" first for `train`'s)."""
        return list(self._pieces)

    def tokenize(self, text: str) -> list[str]:
        """The pieces of `text` (whitespace normalised); unknown characters give "<unk>"."""
        sp = self._sp
        ids = sp.encode(normalize_whitespace(text))
        unk = sp.unk_id()
        return [_UNK if i == unk else piece for i, piece in zip(ids, sp.id_to_piece(ids),
                                                                 strict=True)]

    def detokenize(self, tokens: list[str]) -> str:
        """The text of `tokens` (SentencePiece's decoding, whitespace normalised)."""
        unk = self._sp.id_to_piece(self._sp.unk_id())
        return normalize_whitespace(self._sp.decode_pieces(
            [unk if t == _UNK else t for t in tokens]))

    def check_vocab(self, vocab: Vocab, name: str) -> None:
        """Refuse a vocabulary holding a word that is not a piece of this model.

        Args:
            vocab: a vocabulary built from this tokenizer's output.
            name: what to call it in the message ("src", "tgt").
        Raises:
            InputError: naming the first such word and its id.
        """
        for i, token in enumerate(vocab.tokens, start=len(vocab.specials)):
            if token not in self._piece_set:
                raise InputError(f"{name} vocabulary entry {token!r} (id {i}) is not a piece of "
                                 "the SentencePiece model: the vocabulary was built with another "
                                 "tokenizer")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SentencePieceTokenizer):
            return NotImplemented
        return self._proto == other._proto

    def __hash__(self) -> int:
        return hash(self._proto)

    def __repr__(self) -> str:
        digest = hashlib.sha256(self._proto).hexdigest()[:12]
        return f"SentencePieceTokenizer(pieces={len(self._pieces)}, sha256={digest!r})"

    def __reduce__(self) -> tuple[type, tuple[bytes]]:  # pickle the bytes, not the processor
        return SentencePieceTokenizer, (self._proto,)


def _reservoir(sentences: Iterable[str], k: int, seed: int) -> list[str]:
    """At most `k` of the non-blank `sentences` (whitespace normalised), each kept with the same
    chance: Algorithm R with `random.Random(seed)`; all of them, in order, if there are <= k."""
    rng, sample = random.Random(seed), []
    for n, sentence in enumerate(s for s in map(_sentence, sentences) if s):
        if n < k:
            sample.append(sentence)
        elif (j := rng.randrange(n + 1)) < k:
            sample[j] = sentence
    return sample


def _sentence(value: object) -> str:
    if not isinstance(value, str):
        raise InputError(f"sentences must hold str, got {describe(value)}")
    return normalize_whitespace(value)


def check_vocabs(tokenizer: object, src_vocab: Vocab, tgt_vocab: Vocab) -> None:
    """For a `SentencePieceTokenizer`, `check_vocab` both vocabularies; others pass."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        tokenizer.check_vocab(src_vocab, "src")
        tokenizer.check_vocab(tgt_vocab, "tgt")
