"""Error rates for transduction (grapheme-to-phoneme conversion, transliteration, inflection),
where an output is right or wrong rather than more or less fluent, and a source may have
several right answers.

References. A source has one or more references; `error_rates` takes, per source, the list of
its references. `group_references` makes those lists from line-aligned sources and references
in which a source repeats (``evaluate --src/--ref`` files, or the pairs of a TSV file that
`read_reference_tsv` reads): every line of the same source, consecutive or not, is one item;
items keep the order of their source's first line, and an item's references the order of their
lines, as written (a reference repeated letter for letter counted once). Sources are the same
when their tokens are, as the model reads them: `tokenize(source)`, whitespace-separated by
default (``bahdanau evaluate`` uses the model's source tokenizer, so for characters "a b" and
"a  b" are two sources, as they are two inputs).

Scores, over N items, tokens being `tokenize(text)` (whitespace-separated by default: a
phoneme sequence "K AE T" is three tokens; `bahdanau evaluate` uses the model's target
tokenizer):

* ``wer``, the word (sequence) error rate: 100 x the share of items whose hypothesis has
  other tokens than every one of its references (a word is wrong unless it equals a reference);
* ``per``, the token (phoneme) error rate: 100 x sum_i d_i / sum_i |r_i|, where r_i is the
  reference of item i closest to its hypothesis in edit distance d_i (the first such in its
  list when several are equally close): the distances and the chosen references' lengths are
  summed over the corpus before dividing, the usual G2P phoneme error rate (Yao & Zweig 2015);
* ``accuracy`` = 100 - ``wer``.

`edit_distance` is Levenshtein's, unit costs: a dozen lines of dynamic programming, written out
here rather than taken from a package, so the core needs none.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bahdanau._checks import check_strings, describe
from bahdanau.data.text import read_lines
from bahdanau.errors import InputError

METRICS: tuple[str, ...] = ("wer", "per", "accuracy")   # evaluate --metric's choices


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two token sequences: the fewest insertions, deletions and
    substitutions (each costing 1) that turn `a` into `b`."""
    previous = list(range(len(b) + 1))     # distances from a[:0] to each prefix of b
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1,              # delete x
                               current[j - 1] + 1,           # insert y
                               previous[j - 1] + (x != y)))  # substitute, or keep
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class ErrorRates:
    """`error_rates`' scores (percentages) and the counts they come from.

    Attributes:
        wer: word (sequence) error rate, 100 x errors / items.
        per: token error rate, 100 x edits / reference_tokens.
        accuracy: 100 - wer.
        items: sources scored (a source with several references counts once).
        errors: items whose hypothesis equals none of their references.
        edits: summed edit distances to the closest references.
        reference_tokens: summed lengths of those closest references.
    """

    wer: float
    per: float
    accuracy: float
    items: int
    errors: int
    edits: int
    reference_tokens: int

    def as_dict(self, metrics: Sequence[str] = METRICS) -> dict[str, float]:
        """The chosen scores by name, rounded to 2 decimals (as `bahdanau evaluate` writes)."""
        return {name: round(getattr(self, name), 2) for name in metrics}


def error_rates(hypotheses: Sequence[str], references: Sequence[Sequence[str]], *,
                tokenize: Callable[[str], list[str]] = str.split) -> ErrorRates:
    """WER, PER and accuracy of `hypotheses` against one or more references each.

    Args:
        hypotheses: one output text per item.
        references: per item, a non-empty list of its reference texts.
        tokenize: a text's tokens (default: split on whitespace).
    Returns:
        The `ErrorRates`.
    Raises:
        InputError: no items, `references` not a list of lists of str (a set has no order, which
            the closest reference's ties need), as many hypotheses as reference lists they are
            not, an item without references, a reference without tokens, or a `tokenize` that
            is not callable; one line each.
    """
    check_strings("hypotheses", hypotheses)
    _check_tokenize(tokenize)
    if isinstance(references, str | bytes) or not isinstance(references, Sequence):
        raise InputError(f"references must be a list of reference lists, got "
                         f"{describe(references)}")
    if not hypotheses:
        raise InputError("no hypotheses to score: at least one item is needed")
    if len(hypotheses) != len(references):
        raise InputError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    errors = edits = reference_tokens = 0
    for index, (hypothesis, refs) in enumerate(zip(hypotheses, references, strict=True)):
        if (isinstance(refs, str) or not isinstance(refs, Sequence) or not refs
                or not all(isinstance(r, str) for r in refs)):
            raise InputError(f"item {index}: its references must be a non-empty list of str, "
                             f"got {describe(refs)}")
        tokens = tokenize(hypothesis)
        best: tuple[int, int] | None = None          # (distance, reference length)
        for ref in refs:
            ref_tokens = tokenize(ref)
            if not ref_tokens:
                raise InputError(f"item {index}: the reference {ref!r} has no tokens")
            distance = edit_distance(tokens, ref_tokens)
            if best is None or distance < best[0]:
                best = (distance, len(ref_tokens))
        assert best is not None
        errors += best[0] > 0
        edits += best[0]
        reference_tokens += best[1]
    wer = 100.0 * errors / len(hypotheses)
    return ErrorRates(wer=wer, per=100.0 * edits / reference_tokens, accuracy=100.0 - wer,
                      items=len(hypotheses), errors=errors, edits=edits,
                      reference_tokens=reference_tokens)


def group_references(sources: Sequence[str], references: Sequence[str], *,
                     tokenize: Callable[[str], list[str]] = str.split
                     ) -> tuple[list[str], list[list[str]], list[int]]:
    """Line-aligned sources and references as items: each distinct source once, with all of
    its references (the rules in this module's docstring).

    Args:
        sources, references: one source and one of its references per line.
        tokenize: a source's tokens, which decide whether two lines have the same source
            (default: split on whitespace; the model's source tokenizer's for its outputs).
    Returns:
        (the distinct sources in order of first appearance, each as its first line has it,
        their reference lists, and for each item the index of its source's first line).
    Raises:
        InputError: no lines, as many sources as references there are not, or a `tokenize`
            that is not callable.
    """
    check_strings("sources", sources)
    check_strings("references", references)
    _check_tokenize(tokenize)
    if not sources:
        raise InputError("no sources to group: at least one line is needed")
    if len(sources) != len(references):
        raise InputError(f"{len(sources)} sources but {len(references)} references")
    items: dict[tuple[str, ...], list[str]] = {}
    first: dict[tuple[str, ...], int] = {}
    for line, (source, reference) in enumerate(zip(sources, references, strict=True)):
        key = tuple(tokenize(source))
        refs = items.setdefault(key, [])
        first.setdefault(key, line)
        if reference not in refs:
            refs.append(reference)
    lines = list(first.values())
    return [sources[line] for line in lines], list(items.values()), lines


def _check_tokenize(tokenize: object) -> None:
    if not callable(tokenize):
        raise InputError(f"tokenize must be a callable (a text -> its tokens), got "
                         f"{describe(tokenize)}")


def read_reference_tsv(path: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """The (sources, references) of a file of ``source<TAB>reference`` lines (UTF-8, plain or
    gzip), for `group_references`: a source with several references has several lines.

    Raises:
        InputError: naming the file (and the line): it cannot be read or is empty, a line has
            no tab or more than one, or an empty source or reference.
    """
    path = Path(path)
    try:
        lines = read_lines(path)
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not lines:
        raise InputError(f"{path} is empty: at least one source<TAB>reference line is needed")
    sources, references = [], []
    for number, line in enumerate(lines, start=1):
        parts = line.split("\t")
        if len(parts) != 2:
            what = "no tab" if len(parts) == 1 else f"{len(parts) - 1} tabs"
            raise InputError(f"{path}: line {number} has {what}; each line is "
                             "source<TAB>reference")
        if not parts[0].strip() or not parts[1].strip():
            side = "source" if not parts[0].strip() else "reference"
            raise InputError(f"{path}: line {number} has an empty {side}")
        sources.append(parts[0])
        references.append(parts[1])
    return sources, references
