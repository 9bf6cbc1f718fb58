"""Unit tests for bahdanau.data: hand-worked vocabularies, tokens, files, batches and samplers."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest
import torch

from bahdanau.data import (
    SPECIALS,
    Batch,
    BucketBatchSampler,
    DefaultTokenizer,
    Example,
    TokenizerPair,
    Vocab,
    WhitespaceTokenizer,
    collate,
    encode_pairs,
    read_parallel,
)
from bahdanau.errors import InputError

J = DefaultTokenizer.JOINER


# ----------------------------------------------------------------------------------------------
# Vocab


def test_vocab_build_orders_by_count_then_alphabet() -> None:
    # counts: b 3, a 2, d 2, c 1 -> b, then a/d tied (alphabetical), then c
    vocab = Vocab.build([["b", "a", "b", "d"], ["c", "a", "b", "d"]])
    assert vocab.tokens == ["b", "a", "d", "c"]
    assert len(vocab) == 8
    assert [vocab.id_to_token(i) for i in range(4)] == list(SPECIALS)
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3)
    assert vocab.token_to_id("b") == 4 and vocab.token_to_id("c") == 7


def test_vocab_size_cap_and_min_freq() -> None:
    lists = [["b", "a", "b", "d"], ["c", "a", "b", "d"]]
    assert Vocab.build(lists, max_size=2).tokens == ["b", "a"]
    assert Vocab.build(lists, min_freq=2).tokens == ["b", "a", "d"]
    assert Vocab.build(lists, max_size=1, min_freq=3).tokens == ["b"]


def test_vocab_build_is_independent_of_sentence_order() -> None:
    lists = [["x", "y"], ["z", "y"], ["w"]]
    assert Vocab.build(lists) == Vocab.build(list(reversed(lists)))


def test_vocab_specials_in_corpus_are_not_words() -> None:
    vocab = Vocab.build([["<unk>", "a", "</s>", "<pad>"]])
    assert vocab.tokens == ["a"]
    assert vocab.encode(["<unk>", "</s>"]) == [3, 2]


def test_vocab_encode_unknown_and_decode() -> None:
    vocab = Vocab(["the", "cat"])
    assert vocab.encode(["the", "dog", "cat"]) == [4, 3, 5]
    assert vocab.decode([4, 3, 5]) == ["the", "<unk>", "cat"]
    # bos/pad dropped, stops at eos
    assert vocab.decode([1, 4, 0, 5, 2, 4, 4]) == ["the", "cat"]
    assert vocab.decode(torch.tensor([4, 2, 5])) == ["the"]
    assert vocab.decode([1, 4, 2, 0], strip_specials=False) == ["<s>", "the", "</s>", "<pad>"]


def test_vocab_decode_out_of_range() -> None:
    with pytest.raises(ValueError, match="token id 6 is outside the vocabulary of size 6"):
        Vocab(["the", "cat"]).decode([4, 6])


def test_vocab_rejects_duplicates_and_specials() -> None:
    with pytest.raises(ValueError, match="duplicate vocabulary token 'a'"):
        Vocab(["a", "b", "a"])
    with pytest.raises(ValueError, match="duplicate vocabulary token '<s>'"):
        Vocab(["<s>"])


def test_vocab_dict_and_file_round_trip(tmp_path) -> None:
    vocab = Vocab(["été", "dog", J + "."])
    data = vocab.to_dict()
    assert data == {"specials": list(SPECIALS), "tokens": ["été", "dog", J + "."]}
    assert Vocab.from_dict(json.loads(json.dumps(data))) == vocab
    path = tmp_path / "vocab.json"
    vocab.save(path)
    assert json.loads(path.read_text(encoding="utf-8")) == data
    assert "été" in path.read_text(encoding="utf-8")  # readable, not \u-escaped
    assert Vocab.load(path) == vocab
    assert Vocab.load(path) != Vocab(["été", "dog"])


def test_vocab_load_bad_file_names_it(tmp_path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"tokens": ["a"]}', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json"):
        Vocab.load(path)


# ----------------------------------------------------------------------------------------------
# Tokenizers


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("A dog, running.", ["A", "dog", J + ",", "running", J + "."]),
        ("l'homme (2)", ["l", J + "'", J + "homme", "(", J + "2", J + ")"]),
        ("  deux\t chiens\n", ["deux", "chiens"]),
        ("«Oui»!", ["«", J + "Oui", J + "»", J + "!"]),
        ("café", ["café"]),
        ("cafe\u0301s", ["cafe\u0301s"]),  # a combining accent stays in its word
        ("a ￭ b￭c", ["a", "￭", "b", J + "￭", J + "c"]),
    ],
)
def test_default_tokenizer_examples(text: str, tokens: list[str]) -> None:
    tok = DefaultTokenizer()
    assert tok.tokenize(text) == tokens
    assert tok.detokenize(tokens) == " ".join(text.split())


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("A dog, running.", ["A", "dog", J + ",", "running", J + "."]),
        ("l'homme (2)", ["l", J + "'" + J, "homme", "(" + J, "2", J + ")"]),
        ("«Oui»!", ["«" + J, "Oui", J + "»" + J, "!"]),
        ("a ￭ b￭c (￭)", ["a", "￭", "b", J + "￭", J + "c", "(" + J, "￭", J + ")"]),
    ],
)
def test_default_tokenizer_punctuation_joiners(text: str, tokens: list[str]) -> None:
    tok = DefaultTokenizer(joiners="punctuation")
    assert tok.tokenize(text) == tokens
    assert tok.detokenize(tokens) == " ".join(text.split())
    assert DefaultTokenizer.display(J + "'" + J) == "'"
    with pytest.raises(ValueError, match="joiners must be one of"):
        DefaultTokenizer(joiners="suffix")


def test_default_tokenizer_lowercase() -> None:
    tok = DefaultTokenizer(lowercase=True)
    assert tok.tokenize("Deux Chiens.") == ["deux", "chiens", J + "."]
    assert tok.detokenize(tok.tokenize("Deux Chiens.")) == "deux chiens."


def test_whitespace_tokenizer() -> None:
    tok = WhitespaceTokenizer()
    assert tok.tokenize(" a  b, c ") == ["a", "b,", "c"]
    assert tok.detokenize(["a", "b,"]) == "a b,"


# ----------------------------------------------------------------------------------------------
# read_parallel


def _write(path, lines: list[bytes], *, gz: bool = False) -> None:
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(gzip.compress(data) if gz else data)


def test_read_parallel_plain_and_gzip(tmp_path) -> None:
    _write(tmp_path / "a.en", [b"A dog.", "Un été".encode()])
    _write(tmp_path / "a.fr.gz", [b"Un chien.", b"Summer"], gz=True)
    pairs = read_parallel(tmp_path / "a.en", tmp_path / "a.fr.gz")
    assert pairs == [("A dog.", "Un chien."), ("Un été", "Summer")]


def test_read_parallel_different_line_counts_names_both_files(tmp_path) -> None:
    _write(tmp_path / "src.txt", [b"a", b"b", b"c"])
    _write(tmp_path / "tgt.txt", [b"x", b"y"])
    with pytest.raises(ValueError, match=r"src\.txt has 3 lines but .*tgt\.txt has 2"):
        read_parallel(tmp_path / "src.txt", tmp_path / "tgt.txt")


@pytest.mark.parametrize("empty", [b"", b"  \t"])
def test_read_parallel_empty_line_names_file_and_line(tmp_path, empty: bytes) -> None:
    _write(tmp_path / "src.txt", [b"a", b"b", b"c"])
    _write(tmp_path / "tgt.txt", [b"x", empty, b"z"])
    with pytest.raises(ValueError, match=r"tgt\.txt: line 2 is empty"):
        read_parallel(tmp_path / "src.txt", tmp_path / "tgt.txt")


def test_read_parallel_damaged_gzip_names_the_file(tmp_path) -> None:
    _write(tmp_path / "src.txt", [b"a", b"b"])
    (tmp_path / "tgt.txt.gz").write_bytes(gzip.compress(b"x\ny\n")[:-3])
    with pytest.raises(InputError, match=r"tgt\.txt\.gz: truncated gzip data"):
        read_parallel(tmp_path / "src.txt", tmp_path / "tgt.txt.gz")


@pytest.mark.parametrize("empty", ["src.txt", "tgt.txt"])
def test_read_parallel_non_empty_names_the_empty_file(tmp_path, empty: str) -> None:
    _write(tmp_path / "src.txt", [b"a"])
    _write(tmp_path / "tgt.txt", [b"x"])
    (tmp_path / empty).write_bytes(b"")
    with pytest.raises(InputError, match=rf"{empty.replace('.', '[.]')} is empty"):
        read_parallel(tmp_path / "src.txt", tmp_path / "tgt.txt", non_empty=True)


def test_read_parallel_empty_files_give_no_pairs_unless_non_empty(tmp_path) -> None:
    (tmp_path / "src.txt").write_bytes(b"")
    (tmp_path / "tgt.txt").write_bytes("\ufeff".encode())          # a BOM alone is empty too
    assert read_parallel(tmp_path / "src.txt", tmp_path / "tgt.txt") == []
    with pytest.raises(InputError, match=r"src[.]txt is empty"):
        read_parallel(tmp_path / "src.txt", tmp_path / "tgt.txt", non_empty=True)


def test_read_parallel_bad_utf8_names_file_and_line(tmp_path) -> None:
    _write(tmp_path / "src.txt", [b"a", b"b", b"caf\xe9"], gz=True)
    _write(tmp_path / "tgt.txt", [b"x", b"y", b"z"])
    with pytest.raises(ValueError, match=r"src\.txt: line 3 is not valid UTF-8"):
        read_parallel(tmp_path / "src.txt", tmp_path / "tgt.txt")


# ----------------------------------------------------------------------------------------------
# encode_pairs and collate


def test_encode_pairs_filters_long_pairs_and_keeps_indices() -> None:
    tok = WhitespaceTokenizer()
    src_vocab, tgt_vocab = Vocab(["a", "b"]), Vocab(["x", "y"])
    pairs = [("a b", "x"), ("a a a", "y"), ("b", "x y x y"), ("b a", "y q")]
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tok, max_len=2)
    assert examples == [Example(0, [4, 5], [4]), Example(3, [5, 4], [5, 3])]
    assert len(encode_pairs(pairs, src_vocab, tgt_vocab, tok)) == 4
    # max_len counts tokens without bos/eos: a 3-token side passes max_len=3
    assert [e.index for e in encode_pairs(pairs, src_vocab, tgt_vocab, tok, max_len=3)] == [0, 1, 3]


def test_encode_pairs_tokenizer_per_side_and_errors() -> None:
    pairs = [("a,b", "x,y")]
    out = encode_pairs(pairs, Vocab(["a,b"]), Vocab(["x", J + ",", J + "y"]),
                       (WhitespaceTokenizer(), DefaultTokenizer()))
    assert out == [Example(0, [4], [4, 5, 6])]
    with pytest.raises(ValueError, match="pair 1: the target"):
        encode_pairs([("a", "x"), ("a", "  ")], Vocab(["a"]), Vocab(["x"]), WhitespaceTokenizer())
    with pytest.raises(ValueError, match="max_len"):
        encode_pairs(pairs, Vocab(["a"]), Vocab(["x"]), WhitespaceTokenizer(), max_len=0)


def _untouched_pairs():
    raise AssertionError("the pairs were read before the arguments were checked")
    yield


_TOK = WhitespaceTokenizer()


@pytest.mark.parametrize(("tokenizer", "message"), [
    ((_TOK, _TOK, _TOK), "tokenizer must be one tokenizer or a (source, target) tuple of two, "
                         "got a tuple of 3"),
    ((_TOK,), "tokenizer must be one tokenizer or a (source, target) tuple of two, got a tuple "
              "of 1"),
    ([_TOK, _TOK], "tokenizer must be one tokenizer or a (source, target) tuple of two, got a "
                   "list of 2"),
    ((_TOK, "x"), "tokenizer[1] must be a tokenizer instance with tokenize() and detokenize() "
                  "(e.g. DefaultTokenizer()), got str 'x'"),
    ((TokenizerPair(_TOK, DefaultTokenizer()), _TOK),
     "tokenizer[0] is a TokenizerPair: give the pair alone, or a (source, target) tuple of "
     "single tokenizers"),
])
def test_encode_pairs_refuses_a_tokenizer_argument_in_one_line(tokenizer, message: str) -> None:
    # one tokenizer, a TokenizerPair or a (source, target) tuple of two: anything else is
    # refused before a pair is read (a tuple of three was unpacked into a traceback)
    with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
        encode_pairs(_untouched_pairs(), Vocab(["a"]), Vocab(["x"]), tokenizer)


def test_special_words_in_whitespace_text_stay_words() -> None:
    # "</s>", "<s>" and "<pad>" typed in pre-tokenised text are words: before, "a </s> b"
    # encoded as [a, eos, b], cutting the sentence (and "<pad>" broke the padding).
    tok = WhitespaceTokenizer()
    text = "a </s> b <s> <pad>"
    vocab = Vocab.build([tok.tokenize(text)])
    (example,) = encode_pairs([(text, text)], vocab, vocab, tok)
    assert not {Vocab.pad_id, Vocab.bos_id, Vocab.eos_id} & set(example.src + example.tgt)
    assert len(example.tgt) == 5
    assert tok.detokenize(vocab.decode(example.tgt)) == text     # and back on decoding


@pytest.mark.parametrize("text", [r"\</s> </s>", r"x \\<s> <s>x <unk>", "<pad><pad> \\"])
def test_whitespace_escapes_round_trip(text: str) -> None:
    # the variant: already-escaped words, look-alikes and "<unk>" (the unknown word, unescaped)
    tok = WhitespaceTokenizer()
    tokens = tok.tokenize(text)
    assert tok.detokenize(tokens) == text
    assert not set(tokens) & {"<pad>", "<s>", "</s>"}
    assert Vocab([]).encode(["<unk>"]) == [Vocab.unk_id]


def test_encode_pairs_refuses_a_tokenizer_that_gives_a_special() -> None:
    class Splitter:                          # a tokenizer of the user's own, without escapes
        def tokenize(self, text: str) -> list[str]:
            return text.split()

        def detokenize(self, tokens: list[str]) -> str:
            return " ".join(tokens)

    pairs = [("a", "x"), ("a", "x </s> y")]
    with pytest.raises(InputError, match=r"^pair 1: the target's tokenizer gives the token "
                                         r"'</s>'"):
        encode_pairs(pairs, Vocab(["a"]), Vocab(["x", "y"]), Splitter())


def test_collate_pads_and_adds_bos_eos() -> None:
    batch = collate([Example(7, [5, 6, 7], [9]), Example(2, [8], [10, 11])])
    assert batch.src.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.src_lengths.tolist() == [3, 1]
    assert batch.tgt_in.tolist() == [[1, 9, 0], [1, 10, 11]]
    assert batch.tgt_out.tolist() == [[9, 2, 0], [10, 11, 2]]
    assert batch.indices.tolist() == [7, 2]
    assert batch.n_tokens == 5
    assert batch.src_mask.tolist() == [[True, True, True], [True, False, False]]
    for t in (batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, batch.indices):
        assert t.dtype == torch.long
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.tgt_out, batch.tgt_out)


def test_collate_takes_the_special_ids_from_vocab_and_errors() -> None:
    batch = collate([Example(0, [4, 5], []), Example(1, [6], [7])])
    assert batch.src[1, 1] == Vocab.pad_id == batch.pad_id == 0
    assert batch.tgt_in[:, 0].tolist() == [Vocab.bos_id] * 2 == [1, 1]
    assert batch.tgt_out.tolist() == [[Vocab.eos_id, Vocab.pad_id], [7, Vocab.eos_id]]
    with pytest.raises(TypeError):
        collate([Example(0, [4], [])], pad_id=3)  # no second source of special ids
    with pytest.raises(ValueError, match="at least one example"):
        collate([])
    with pytest.raises(ValueError, match="example 4 has an empty source"):
        collate([Example(4, [], [5])])


# ----------------------------------------------------------------------------------------------
# BucketBatchSampler


def test_sampler_sorts_within_buckets_without_shuffle() -> None:
    # chunks of bucket * batch_size = 4: [5, 1, 4, 2] -> sorted positions 1, 3, 2, 0; then [3, 6]
    sampler = BucketBatchSampler([5, 1, 4, 2, 3, 6], batch_size=2, bucket=2, shuffle=False)
    assert list(sampler) == [[1, 3], [2, 0], [4, 5]]
    assert len(sampler) == 3


def test_sampler_token_budget_by_padded_size() -> None:
    # (src, tgt) pairs; cost = sentences * max(longest src, longest tgt)
    lengths = [(2, 2), (2, 3), (4, 1), (1, 1), (5, 5)]
    sampler = BucketBatchSampler(lengths, batch_size=None, max_tokens=8, bucket=1,
                                 shuffle=False)
    # Chunks hold bucket * max_tokens = 8 tokens of max(src, tgt): [0, 1] (2 + 3), [2, 3]
    # (4 + 1), [4]. Sorted by source length, [2, 3] becomes [3, 2]; it costs 2 * 4 = 8 <= 8.
    assert list(sampler) == [[0, 1], [3, 2], [4]]
    # Budget 7: [3, 2] would cost 8, so it is split.
    tight = BucketBatchSampler(lengths, batch_size=None, max_tokens=7, bucket=1, shuffle=False)
    assert list(tight) == [[0, 1], [3], [2], [4]]


def test_sampler_single_example_over_budget_gets_own_batch() -> None:
    sampler = BucketBatchSampler([3, 10, 3], batch_size=None, max_tokens=6, bucket=1,
                                 shuffle=False)
    assert list(sampler) == [[0], [1], [2]]


def test_sampler_example_lengths_include_bos_eos() -> None:
    # Example with 2 target ids pads to T = 3: two of them cost 2 * 3 = 6 > 5.
    examples = [Example(0, [4], [4, 4]), Example(1, [4], [4, 4])]
    sampler = BucketBatchSampler(examples, batch_size=None, max_tokens=5, shuffle=False)
    assert list(sampler) == [[0], [1]]


def test_sampler_distributed_splits_to_equal_counts() -> None:
    # 3 batches [0, 1], [2, 3], [4] for 2 ranks: the first (largest) is halved -> 4 batches
    shards = [list(BucketBatchSampler(range(1, 6), batch_size=2, bucket=1, shuffle=False,
                                      num_replicas=2, rank=r)) for r in range(2)]
    assert shards == [[[0], [2, 3]], [[1], [4]]]


def test_sampler_resume_mid_epoch() -> None:
    a = BucketBatchSampler(list(range(1, 41)), batch_size=3, bucket=2, seed=5)
    a.set_epoch(2)
    full = list(a)
    it = iter(a)
    head = [next(it) for _ in range(4)]
    state = a.state_dict()
    assert state == {"epoch": 2, "position": 4}
    b = BucketBatchSampler(list(range(1, 41)), batch_size=3, bucket=2, seed=5)
    b.load_state_dict(state)
    b.set_epoch(2)  # same epoch: keeps the position
    assert head + list(b) == full
    assert b.state_dict() == {"epoch": 2, "position": 0}  # exhausted: the epoch starts over


@pytest.mark.parametrize(("call", "fragment"), [
    (lambda s: s.load_state_dict({"epoch": 0, "position": 99}),
     "sampler position 99 is past epoch 0's 14 batches"),        # 40 sentences, 3 a batch
    (lambda s: s.load_state_dict({"epoch": 0, "position": 1.9}),
     "sampler position must be an int >= 0, got 1.9"),
    (lambda s: s.load_state_dict({"epoch": -3, "position": 0}),
     "sampler epoch must be an int >= 0, got -3"),
    (lambda s: s.load_state_dict({"epoch": 0}), "a sampler state is {'epoch': int, "),
    (lambda s: s.set_epoch(1.7), "epoch must be an int >= 0, got 1.7"),
    (lambda s: s.set_epoch(True), "epoch must be an int >= 0, got True"),
])
def test_sampler_state_is_checked(call, fragment: str) -> None:
    sampler = BucketBatchSampler(list(range(1, 41)), batch_size=3, bucket=2, seed=5)
    with pytest.raises(InputError, match=re.escape(fragment)):
        call(sampler)
    assert sampler.state_dict() == {"epoch": 0, "position": 0}         # unchanged
    with pytest.raises(InputError, match="shuffle must be True or False"):
        BucketBatchSampler([1, 2], batch_size=1, shuffle="no")       # a str would shuffle


def test_sampler_epoch_batches_are_the_iteration_and_keep_the_state() -> None:
    sampler = BucketBatchSampler(list(range(1, 41)), batch_size=3, bucket=2, seed=5)
    next(iter(sampler))                                   # epoch 0, one batch handed out
    other = BucketBatchSampler(list(range(1, 41)), batch_size=3, bucket=2, seed=5)
    other.set_epoch(3)
    assert [list(b) for b in sampler.epoch_batches(3)] == list(other)
    assert sampler.state_dict() == {"epoch": 0, "position": 1}


def test_sampler_set_epoch_changes_order_and_resets_position() -> None:
    sampler = BucketBatchSampler(list(range(1, 41)), batch_size=4, seed=0)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second
    assert sorted(i for b in second for i in b) == list(range(40))
    sampler.set_epoch(0)
    assert list(sampler) == first


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": None}, "set batch_size, max_tokens"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"max_tokens": -1}, "max_tokens must be a positive int"),
        ({"bucket": 0}, "bucket must be a positive int"),
        ({"num_replicas": 2, "rank": 2}, r"rank must be in \[0, 2\)"),
        ({"num_replicas": 5, "rank": 0}, "3 examples cannot be shared among 5 replicas"),
    ],
)
def test_sampler_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BucketBatchSampler([1, 2, 3], **kwargs)


def test_sampler_rejects_zero_length() -> None:
    with pytest.raises(ValueError, match="lengths must be >= 1, got 0 at position 1"):
        BucketBatchSampler([(1, 1), (0, 2)])


_NOT_INTS = "must be an Example, an int or a (source, target) pair of ints, got "


@pytest.mark.parametrize(("lengths", "message"), [
    ([3.7, 4], f"lengths[0] {_NOT_INTS}float 3.7"),                # was read as 3
    ([4, (2, 3.7)], f"lengths[1] {_NOT_INTS}tuple (2, 3.7)"),
    ([True, 2], f"lengths[0] {_NOT_INTS}bool True"),               # was read as 1
    ([(2, 3), (False, 2)], f"lengths[1] {_NOT_INTS}tuple (False, 2)"),
    ([(2, 3, 4)], f"lengths[0] {_NOT_INTS}tuple (2, 3, 4)"),
    ([None], f"lengths[0] {_NOT_INTS}NoneType None"),
    (torch.tensor([[3.7, 4.0], [2.0, 2.0]]),
     "a lengths tensor must be (N, 2) integers, got torch.float32 (2, 2)"),
    (torch.tensor([[True, True]]), "a lengths tensor must be (N, 2) integers, got torch.bool "
                                   "(1, 2)"),
    (np.array([[3.7, 4.0]]), "a lengths array must be (N, 2) integers, got float64 (1, 2)"),
    (None, "lengths must be a list (of Examples, ints or (source, target) pairs of ints) or an "
           "(N, 2) integer array, got NoneType None"),
])
def test_sampler_refuses_lengths_that_are_not_ints(lengths, message: str) -> None:
    # a list is held to the rule of an array: integers, no float truncated, no bool read as 1
    with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
        BucketBatchSampler(lengths, batch_size=2)


def test_sampler_takes_integer_lengths_of_any_kind_alike() -> None:
    pairs = [(2, 3), (4, 1), (1, 1), (5, 2)]
    expected = list(BucketBatchSampler(pairs, batch_size=2, seed=3))
    for lengths in ([list(p) for p in pairs], [(np.int32(s), t) for s, t in pairs],
                    np.array(pairs, dtype=np.int16), torch.tensor(pairs)):
        assert list(BucketBatchSampler(lengths, batch_size=2, seed=3)) == expected


def test_display_drops_only_the_joiner_mark() -> None:
    tokens = DefaultTokenizer().tokenize("Hello, world! (x)")
    assert [DefaultTokenizer.display(t) for t in tokens] == ["Hello", ",", "world", "!", "(",
                                                             "x", ")"]
    assert DefaultTokenizer.display(J) == J                 # a lone joiner is a symbol
