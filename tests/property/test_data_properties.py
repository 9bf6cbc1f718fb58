"""Hypothesis properties of tokenisation, vocabularies and the length-bucketed batch sampler."""

from __future__ import annotations

import unicodedata
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from bahdanau.data import BucketBatchSampler, CharTokenizer, DefaultTokenizer, Vocab

# Letters, digits, punctuation, symbols, combining marks, odd spaces and the joiner itself.
_PIECES = st.sampled_from(list("aZé9 .,;:!?'\"()«»-—…\t\n\u00a0\u2009\u0301\u200d\uffed$€/"))
_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    st.lists(st.one_of(_PIECES, st.text(st.characters(exclude_categories=("Cs",)),
                                        min_size=1, max_size=4)), max_size=30).map("".join),
)


@given(_TEXT, st.sampled_from(DefaultTokenizer.JOINERS))
def test_tokenizer_round_trip(text: str, joiners: str) -> None:
    tok = DefaultTokenizer(joiners=joiners)
    tokens = tok.tokenize(text)
    assert tok.detokenize(tokens) == " ".join(text.split())
    assert all(token and not any(c.isspace() for c in token) for token in tokens)


@given(st.one_of(_TEXT, st.lists(st.sampled_from([" ", CharTokenizer.SPACE, "\\", "a"]),
                                 max_size=12).map("".join)))
def test_char_tokenizer_round_trip_is_exact(text: str) -> None:
    """Every text comes back as it was, spaces and literal "▁" included; a token is one
    character, or a literal "▁" escaped."""
    tok = CharTokenizer()
    tokens = tok.tokenize(text)
    assert tok.detokenize(tokens) == text
    assert len(tokens) == len(text)
    assert all(len(t) == 1 and t != " " or t == CharTokenizer.ESCAPED_SPACE for t in tokens)


@given(_TEXT)
def test_punctuation_joiners_keep_words_bare_and_split_alike(text: str) -> None:
    """Both schemes cut at the same places; with "punctuation" a word carries a joiner only
    after a literal joiner character."""
    prefix = DefaultTokenizer().tokenize(text)
    punct = DefaultTokenizer(joiners="punctuation").tokenize(text)
    assert list(map(DefaultTokenizer.display, prefix)) == list(map(DefaultTokenizer.display,
                                                                   punct))
    joiner = DefaultTokenizer.JOINER
    for before, token in pairwise([None, *punct]):
        if _word_char(token[-1]) and token[0] == joiner:
            assert before is not None and before.endswith(joiner)


def _word_char(c: str) -> bool:
    return c.isalnum() or unicodedata.category(c).startswith("M")


@given(_TEXT)
def test_tokenizer_splits_punctuation_from_words(text: str) -> None:
    # Without its joiner prefix a token is a run of word characters or one other character.
    joiner = DefaultTokenizer.JOINER
    for token in DefaultTokenizer().tokenize(text):
        bare = token[1:] if len(token) > 1 and token[0] == joiner else token
        assert all(map(_word_char, bare)) or (len(bare) == 1 and not _word_char(bare))


@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "dé", "<unk>", "x"]), max_size=6),
                max_size=8),
       st.lists(st.sampled_from(["a", "b", "zz", "x"]), max_size=8))
def test_vocab_encode_decode(corpus: list[list[str]], sentence: list[str]) -> None:
    vocab = Vocab.build(corpus)
    known = {t for s in corpus for t in s}
    decoded = vocab.decode(vocab.encode(sentence))
    assert decoded == [t if t in known else "<unk>" for t in sentence]
    assert Vocab.from_dict(vocab.to_dict()) == vocab


_LENGTHS = st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=120)


@st.composite
def _sampler_args(draw: st.DrawFn) -> dict:
    lengths = draw(_LENGTHS)
    mode = draw(st.sampled_from(["sentences", "tokens", "both"]))
    batch_size = draw(st.integers(1, 12)) if mode != "tokens" else None
    max_tokens = draw(st.integers(1, 120)) if mode != "sentences" else None
    return {"lengths": lengths, "batch_size": batch_size, "max_tokens": max_tokens,
            "bucket": draw(st.integers(1, 5)), "seed": draw(st.integers(0, 2**40)),
            "shuffle": draw(st.booleans())}


def _cost(lengths: list[tuple[int, int]], batch: list[int]) -> int:
    return len(batch) * max(max(lengths[i]) for i in batch)


@given(_sampler_args(), st.integers(0, 50))
def test_sampler_each_example_once_within_budget(args: dict, epoch: int) -> None:
    sampler = BucketBatchSampler(**args)
    sampler.set_epoch(epoch)
    batches = list(sampler)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(args["lengths"])))
    assert len(batches) == len(sampler)
    for batch in batches:
        assert batch
        if args["batch_size"] is not None:
            assert len(batch) <= args["batch_size"]
        if args["max_tokens"] is not None and len(batch) > 1:
            assert _cost(args["lengths"], batch) <= args["max_tokens"]
    again = BucketBatchSampler(**args)
    again.set_epoch(epoch)
    assert list(again) == batches


@given(st.lists(st.integers(1, 30), min_size=20, max_size=100), st.integers(0, 2**31),
       st.integers(0, 100))
def test_sampler_epochs_differ(lengths: list[int], seed: int, epoch: int) -> None:
    sampler = BucketBatchSampler(lengths, batch_size=4, bucket=2, seed=seed)
    sampler.set_epoch(epoch)
    first = list(sampler)
    sampler.set_epoch(epoch + 1)
    assert list(sampler) != first


@given(_sampler_args(), st.integers(2, 4), st.integers(0, 9))
def test_sampler_shards_disjoint_and_covering(args: dict, replicas: int, epoch: int) -> None:
    args["lengths"] = args["lengths"] + [(1, 1)] * replicas  # at least one example per rank
    shards = []
    for rank in range(replicas):
        sampler = BucketBatchSampler(**args, num_replicas=replicas, rank=rank)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    assert len({len(s) for s in shards}) == 1
    flat = [i for shard in shards for b in shard for i in b]
    n = len(args["lengths"])
    if any(len(b) > 1 for shard in shards for b in shard) or n % replicas == 0:
        assert sorted(flat) == list(range(n))
    else:  # batches of one sentence, not divisible: the first ones are repeated
        assert set(flat) == set(range(n))


@given(_sampler_args(), st.integers(0, 5), st.data())
def test_sampler_resume_continues_exactly(args: dict, epoch: int, data: st.DataObject) -> None:
    sampler = BucketBatchSampler(**args)
    sampler.set_epoch(epoch)
    full = list(sampler)
    k = data.draw(st.integers(0, len(full)))
    it = iter(sampler)
    head = [next(it) for _ in range(k)]
    resumed = BucketBatchSampler(**args)
    resumed.load_state_dict(sampler.state_dict())
    assert head + list(resumed) == full
