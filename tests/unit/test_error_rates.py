"""Unit tests for bahdanau.error_rates: edit distance, WER / PER / accuracy against several
references, the grouping of references by source, and the reference TSV.

Every expectation is worked by hand in the comments beside it.
"""

from __future__ import annotations

import gzip

import pytest
from training_fixtures import one_line_error

from bahdanau import CharTokenizer
from bahdanau.error_rates import (
    edit_distance,
    error_rates,
    group_references,
    read_reference_tsv,
)


@pytest.mark.parametrize(("a", "b", "distance"), [
    ("kitten", "sitting", 3),       # k->s, e->i, insert g
    ("flaw", "lawn", 2),            # delete f, insert n
    ("abc", "", 3),                 # three deletions
    ("", "", 0),
    ("abc", "abc", 0),
    ("ab", "ba", 2),                # no transpositions: two substitutions
])
def test_edit_distance_hand_worked(a: str, b: str, distance: int) -> None:
    assert edit_distance(list(a), list(b)) == distance
    assert edit_distance(list(b), list(a)) == distance


def test_error_rates_hand_worked_with_several_references() -> None:
    rates = error_rates(
        ["K AE T", "D AO G", "B ER D"],
        [["K AE T"],                   # equal: distance 0, the reference has 3 tokens
         ["D AA G", "D AO G"],         # the second is equal: 0 (of 3), though the first is 1
         ["B ER D Z"]])                # one insertion: 1 (of 4); the item is wrong
    # WER = 1 wrong / 3 = 33.33; PER = (0 + 0 + 1) / (3 + 3 + 4) = 10.0; accuracy = 66.67
    assert (rates.items, rates.errors, rates.edits, rates.reference_tokens) == (3, 1, 1, 10)
    assert rates.wer == pytest.approx(100 / 3)
    assert rates.per == pytest.approx(10.0)
    assert rates.accuracy == pytest.approx(200 / 3)
    assert rates.as_dict(("wer", "per")) == {"wer": 33.33, "per": 10.0}


def test_per_sums_over_the_corpus_against_the_closest_reference() -> None:
    rates = error_rates(
        ["A B", "A", "A B C D E F G H"],
        [["A C", "A B C D"],           # distances 1 (of 2) and 2 (of 4): the closest is "A C"
         ["B", "A C"],                 # a tie at 1: the first, "B" (of 1), is taken
         ["A B C D E F G X"]])         # 1 (of 8)
    # PER = (1 + 1 + 1) / (2 + 1 + 8) = 3 / 11, not the mean of the ratios (1/2 + 1 + 1/8) / 3
    assert rates.per == pytest.approx(300 / 11)
    assert rates.wer == 100.0 and rates.accuracy == 0.0


def test_an_empty_hypothesis_deletes_the_whole_reference() -> None:
    rates = error_rates(["", "X"], [["A B"], ["X"]], tokenize=str.split)
    # 2 deletions (of 2) and 0 (of 1): PER = 2 / 3; one item of two wrong: WER = 50
    assert rates.per == pytest.approx(200 / 3) and rates.wer == 50.0


def test_tokens_are_what_tokenize_says() -> None:
    # As characters, "cat" vs "cot" is one substitution of three; as words, one of one.
    assert error_rates(["cat"], [["cot"]], tokenize=list).per == pytest.approx(100 / 3)
    assert error_rates(["cat"], [["cot"]]).per == 100.0
    # Whitespace does not make an output wrong: the tokens are equal.
    assert error_rates(["K  AE T "], [["K AE T"]]).wer == 0.0


def test_group_references_by_source_consecutive_or_not() -> None:
    sources = ["read", "lead", "read ", "read", "lead"]
    references = ["R IY D", "L IY D", "R EH D", "R IY D", "L EH D"]
    items, groups, first = group_references(sources, references)
    # "read " has the tokens of "read" (split on whitespace); line 3 repeats line 0's reference
    assert items == ["read", "lead"]
    assert groups == [["R IY D", "R EH D"], ["L IY D", "L EH D"]]
    assert first == [0, 1]
    # a reference is kept as written: one spaced otherwise is another reference (with the
    # same whitespace tokens, so it changes no score)
    assert group_references(["read", "read"], ["R IY D", "R  IY D"])[1] == [
        ["R IY D", "R  IY D"]]


def test_characters_group_and_score_as_the_model_reads_them() -> None:
    chars = CharTokenizer().tokenize
    # As characters, "a b" and "a  b" are other inputs than "ab": three items
    items, groups, first = group_references(["ab", "a b", "a  b", "ab"], ["X", "Y", "Z", "W"],
                                            tokenize=chars)
    assert (items, groups, first) == (["ab", "a b", "a  b"], [["X", "W"], ["Y"], ["Z"]],
                                      [0, 1, 2])
    # An output written exactly as its reference is right, whatever its spaces
    for text in ("New\u00a0York", "a  b"):
        _, refs, _ = group_references(["x"], [text], tokenize=chars)
        assert error_rates([text], refs, tokenize=chars).wer == 0.0
    # "a b" against "a  b" (a, _, _, b): one space inserted of 4 tokens
    rates = error_rates(["a b"], [["a  b"]], tokenize=chars)
    assert (rates.wer, rates.per) == (100.0, 25.0)


def test_reference_tsv_reads_pairs_plain_or_gzip(tmp_path) -> None:
    text = "read\tR IY D\nlead\tL IY D\nread\tR EH D\n"
    (tmp_path / "r.tsv").write_text(text, encoding="utf-8")
    (tmp_path / "r.tsv.gz").write_bytes(gzip.compress(text.encode()))
    for name in ("r.tsv", "r.tsv.gz"):
        sources, references = read_reference_tsv(tmp_path / name)
        assert sources == ["read", "lead", "read"]
        assert references == ["R IY D", "L IY D", "R EH D"]


@pytest.mark.parametrize(("call", "fragment"), [
    (lambda: error_rates([], []), "at least one item"),
    (lambda: error_rates(["A"], [["A"], ["B"]]), "1 hypotheses but 2 reference lists"),
    (lambda: error_rates(["A"], [[]]), "item 0: its references must be a non-empty list"),
    (lambda: error_rates(["A"], ["A"]), "item 0: its references must be a non-empty list"),
    (lambda: error_rates(["A"], [[" "]]), "item 0: the reference ' ' has no tokens"),
    (lambda: error_rates("A", [["A"]]), "hypotheses must be a list of str"),
    (lambda: error_rates(["A"], None), "references must be a list of reference lists"),
    (lambda: error_rates(["A"], [{"A", "B"}]), "item 0: its references must be a non-empty list"),
    (lambda: error_rates(["A"], [["A"]], tokenize=None), "tokenize must be a callable"),
    (lambda: group_references([], []), "at least one line"),
    (lambda: group_references(["a", "b"], ["A"]), "2 sources but 1 references"),
    (lambda: group_references(["a"], ["A"], tokenize=3), "tokenize must be a callable"),
], ids=["empty", "counts", "no-references", "references-a-str", "blank-reference",
        "hypotheses-a-str", "references-none", "references-a-set", "tokenize-none",
        "group-empty", "group-counts", "group-tokenize"])
def test_bad_arguments_are_one_line(call, fragment: str) -> None:
    one_line_error(call, fragment)


@pytest.mark.parametrize(("text", "fragment"), [
    (None, "cannot be read"),
    ("", "is empty"),
    ("read\tR IY D\nlead L IY D\n", "line 2 has no tab"),
    ("read\tR IY D\tx\n", "line 1 has 2 tabs"),
    ("read\t \n", "line 1 has an empty reference"),
    ("\tR IY D\n", "line 1 has an empty source"),
])
def test_bad_reference_tsv_is_one_line_naming_it(tmp_path, text, fragment: str) -> None:
    path = tmp_path / "refs.tsv"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    assert one_line_error(lambda: read_reference_tsv(path), fragment).startswith(str(path))
