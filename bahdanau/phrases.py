"""Phrases given as text for lexically constrained decoding (`bahdanau.constraints`): the
target ids the search takes (`encode_phrases`), checked against their sentences before any
decoding (`check_constraints`).

A phrase is tokenised as the model's tokenizer tokenises its target side, and every word must
be one of the target vocabulary (a word outside it could only be written as `<unk>`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from bahdanau._checks import describe
from bahdanau.constraints import check_per_sentence, compile_constraints
from bahdanau.data.tokenizers import Tokenizer, sides
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.search import BeamSearch

Phrases = list[list[list[int]]]     # per sentence, its phrases as target ids


def _sentence(i: int) -> str:
    return f"sentence {i + 1}"


def encode_phrases(name: str, entries: object, n_sentences: int, tokenizer: Tokenizer,
                   tgt_vocab: Vocab, label: Callable[[int], str] = _sentence
                   ) -> Phrases | None:
    """Phrases given as text (one list of str per sentence) as target ids, tokenised as the
    model's tokenizer tokenises the target side (`bahdanau.data.tokenizers.sides`); None stays
    None.

    Raises:
        InputError: not one list of str per sentence, a phrase with no token, or one with a
            word outside `tgt_vocab` (the model cannot write it: it would be `<unk>`), named
            by `name` and `label(i)`.
    """
    if entries is None:
        return None
    out = []
    for i, phrases in enumerate(check_per_sentence(name, entries, n_sentences)):
        if (isinstance(phrases, (str, bytes)) or not isinstance(phrases, Sequence)
                or not all(isinstance(p, str) for p in phrases)):
            raise InputError(f"{name}, {label(i)}: expected a list of phrases (str), got "
                             f"{describe(phrases)}")
        ids = []
        for phrase in phrases:
            tokens = sides(tokenizer)[1].tokenize(phrase)
            if not tokens:
                raise InputError(f"{name}, {label(i)}: the phrase {phrase!r} is empty; a phrase "
                                 "needs at least one word")
            unknown = [t for t in tokens if t not in tgt_vocab]
            if unknown:
                raise InputError(f"{name}, {label(i)}: the phrase {phrase!r} has words outside "
                                 f"the target vocabulary ({' '.join(unknown)}): the model "
                                 "cannot write it")
            ids.append(tgt_vocab.encode(tokens))
        out.append(ids)
    return out


def check_constraints(lengths: Sequence[int], constraints: object, avoid: object,
                      tgt_vocab: Vocab, tokenizer: Tokenizer, search: BeamSearch, *,
                      names: tuple[str, str] = ("constraints", "avoid"),
                      label: Callable[[int], str] = _sentence
                      ) -> tuple[Phrases | None, Phrases | None]:
    """Phrases given as text for sentences of `lengths` source tokens, as target ids, checked
    before any decoding: `encode_phrases`, then `bahdanau.constraints.compile_constraints` under
    the caps of `search`.

    Returns:
        The required and the avoided phrases as ids (None where not given).
    Raises:
        InputError: what `encode_phrases` or `compile_constraints` refuses.
    """
    if constraints is None and avoid is None:
        return None, None
    positive = encode_phrases(names[0], constraints, len(lengths), tokenizer, tgt_vocab, label)
    avoided = encode_phrases(names[1], avoid, len(lengths), tokenizer, tgt_vocab, label)
    caps = search.caps(torch.tensor(list(lengths), dtype=torch.long)).tolist()
    compile_constraints(positive, avoided, caps, len(tgt_vocab),
                        (tgt_vocab.pad_id, tgt_vocab.bos_id, tgt_vocab.eos_id), label=label,
                        names=names)
    return positive, avoided
