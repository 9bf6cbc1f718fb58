"""What a hypothesis' attention points to: hard alignments (`argmax_alignment`) and the
replacement of generated [UNK]s by the source words they attend to (`replace_unk`).

Both read `Hypothesis.attention`, the (T + 1, S) weights a search keeps (its last row is eos'),
so both need a model with attention (`RNNSearch`); RNNencdec has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bahdanau.errors import InputError
from bahdanau.search import Hypothesis


def replace_unk(hypothesis: Hypothesis, src_tokens: Sequence[str], tgt_tokens: Sequence[str], *,
                unk: str = "<unk>", dictionary: Mapping[str, str] | None = None) -> list[str]:
    """Replace each generated [UNK] by the source word it attends to most.

    An extension beyond the paper (Luong et al. 2015's "unk replace", with attention standing in
    for the alignment model): the source word is copied, or translated through `dictionary` if
    it has an entry.

    Args:
        hypothesis: a hypothesis with attention (from `RNNSearch`).
        src_tokens: the S source tokens of its sentence (real positions only).
        tgt_tokens: the hypothesis' tokens as strings (`len(hypothesis.tokens)` of them).
        unk: the unknown-word token.
        dictionary: optional source word -> target word mapping.
    Returns:
        The target tokens with [UNK]s replaced.
    Raises:
        InputError: no attention (RNNencdec), or lengths that do not match the attention.
    """
    if hypothesis.attention is None:
        raise InputError("replace_unk needs attention weights; RNNencdec has none")
    rows, cols = hypothesis.attention.shape
    if len(tgt_tokens) != rows - 1 or len(src_tokens) != cols:
        raise InputError(f"attention is {tuple(hypothesis.attention.shape)} but there are "
                         f"{len(tgt_tokens)} target and {len(src_tokens)} source tokens")
    out = list(tgt_tokens)
    for i, token in enumerate(tgt_tokens):
        if token == unk:
            word = src_tokens[int(hypothesis.attention[i].argmax())]
            out[i] = dictionary.get(word, word) if dictionary else word
    return out


def argmax_alignment(hypothesis: Hypothesis) -> list[tuple[int, int]]:
    """Hard alignment: each target token j with the source position i it attends to most.

    The (i, j) pairs, 0-based, in target order, are what Pharaoh / fast_align files write as
    ``i-j`` (source first). Positions count the tokens the model reads and writes (the
    tokenizer's tokens or subword pieces, before detokenisation); eos has no pair (its row of
    attention is left out), and ties go to the first source position.

    Raises:
        InputError: no attention (RNNencdec).
    """
    if hypothesis.attention is None:
        raise InputError("an alignment needs attention weights; RNNencdec has none")
    best = hypothesis.attention[:-1].argmax(dim=1).tolist()       # one per target token
    return [(int(i), j) for j, i in enumerate(best)]
