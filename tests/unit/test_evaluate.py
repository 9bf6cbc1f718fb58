"""Evaluation helpers against sacrebleu called directly, and hand-made examples."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import sacrebleu
import torch
from search_asserts import random_model
from training_fixtures import TINY_VOCAB

from bahdanau import BeamSearch, RNNSearch, WhitespaceTokenizer, presets
from bahdanau.data import CharTokenizer, DefaultTokenizer, Vocab
from bahdanau.evaluate import (
    bleu_by_length,
    bleu_without_unk,
    corpus_bleu,
    corpus_scores,
    has_unk,
    score_test_set,
    translate_batches,
    translate_corpus,
)

HYPS = ["a man is riding a bike .", "two dogs play in the snow", "the girl sings loud"]
REFS = ["a man is riding a bicycle .", "two dogs are playing in the snow", "a girl sings"]


def test_identical_corpus_is_100() -> None:
    assert corpus_bleu(REFS, REFS) == pytest.approx(100.0)


def test_scores_equal_sacrebleu() -> None:
    scores = corpus_scores(HYPS, REFS)
    assert scores.bleu == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert scores.chrf == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert scores.n_sentences == 3
    assert "tok:13a" in scores.bleu_signature and "version:" in scores.chrf_signature


def test_no_unk_subset_by_hand() -> None:
    vocab = Vocab(["a", "man", "girl"])
    assert has_unk(["a", "dog"], vocab) and not has_unk(["a", "man"], vocab)
    score, n = bleu_without_unk(HYPS, REFS, [False, True, False])
    assert n == 2
    assert score == pytest.approx(sacrebleu.corpus_bleu([HYPS[0], HYPS[2]],
                                                        [[REFS[0], REFS[2]]]).score)
    assert bleu_without_unk(HYPS, REFS, [True] * 3) == (None, 0)


def test_length_buckets_by_hand() -> None:
    buckets = bleu_by_length([3, 12, 9], HYPS, REFS, edges=(10, 20))
    assert [(b.low, b.high, b.n_sentences) for b in buckets] == [(0, 10, 2), (10, 20, 1),
                                                                  (20, None, 0)]
    assert buckets[0].bleu == pytest.approx(corpus_bleu([HYPS[0], HYPS[2]], [REFS[0], REFS[2]]))
    assert buckets[2].bleu is None


def test_unk_is_decided_on_the_reference_as_written() -> None:
    """As characters, "a\u00a0b" holds a symbol outside {a, b, \u2581} (its space is not one):
    the pair does not count without [UNK], though chrF reads it with a plain space."""
    chars, vocab = CharTokenizer(), Vocab(["a", "b", "\u2581"])
    got = score_test_set(["a b", "a b"], ["ab", "ab"], ["a\u00a0b", "a b"], vocab, vocab, chars)
    assert (got["sentences"], got["sentences_no_unk"], got["chrf"]) == (2, 1, 100.0)


def test_score_test_set_by_hand() -> None:
    """Sources with 2, 6 and 3 tokens; the second source and the third reference have a word
    outside the vocabularies, so only the first pair counts without [UNK]."""
    tok = DefaultTokenizer()
    sources = ["a man", "two dogs play in the snow", "the girl sings"]
    src_vocab = Vocab(["a", "man", "the", "girl", "sings"])
    tgt_vocab = Vocab(dict.fromkeys(w for r in REFS[:2] for w in tok.tokenize(r)))
    refs = [REFS[0], REFS[1], "a  girl sings"]                 # double space: normalised
    got = score_test_set(HYPS, sources, refs, src_vocab, tgt_vocab, tok, edges=(3, 6))
    clean = [REFS[0], REFS[1], "a girl sings"]
    assert got["bleu"] == round(sacrebleu.corpus_bleu(HYPS, [clean]).score, 2)
    assert got["chrf"] == round(sacrebleu.corpus_chrf(HYPS, [clean]).score, 2)
    assert (got["sentences"], got["sentences_no_unk"]) == (3, 1)
    assert got["bleu_no_unk"] == round(sacrebleu.corpus_bleu(HYPS[:1], [clean[:1]]).score, 2)
    assert [(b["low"], b["high"], b["sentences"]) for b in got["bleu_by_length"]] == [
        (0, 3, 1), (3, 6, 1), (6, None, 1)]
    assert got["bleu_by_length"][1]["bleu"] == round(corpus_bleu(HYPS[2:], clean[2:]), 2)
    assert got["bleu_signature"].startswith("nrefs:1|")


def test_lowercasing_tokenizer_scores_case_insensitively_and_says_so() -> None:
    """With a lowercasing tokenizer the hypotheses are lowercase: every score compares them
    with the references case-insensitively, and the BLEU signature says case:lc."""
    tok = DefaultTokenizer(lowercase=True)
    refs = ["A man is riding a bicycle .", "Two dogs are playing in the snow", "A girl sings"]
    vocab = Vocab(dict.fromkeys(w for r in refs + HYPS for w in tok.tokenize(r)))
    got = score_test_set(HYPS, HYPS, refs, vocab, vocab, tok, edges=(3,))
    lowered = [r.lower() for r in refs]
    assert got["bleu"] == round(sacrebleu.corpus_bleu(HYPS, [lowered]).score, 2)
    assert got["bleu"] > round(sacrebleu.corpus_bleu(HYPS, [refs]).score, 2)
    assert got["chrf"] == round(sacrebleu.corpus_chrf(HYPS, [lowered]).score, 2)
    assert "|case:lc|" in got["bleu_signature"]
    assert got["bleu_no_unk"] == got["bleu"]
    assert got["bleu_by_length"][1]["bleu"] == round(corpus_bleu(HYPS, lowered), 2)
    mixed = score_test_set(HYPS, HYPS, refs, vocab, vocab, DefaultTokenizer(), edges=(3,))
    assert "|case:mixed|" in mixed["bleu_signature"] and mixed["bleu"] < got["bleu"]


@pytest.mark.parametrize(("call", "match"), [
    (lambda: corpus_bleu(HYPS, REFS[:2]), "3 hypotheses but 2 references"),
    (lambda: corpus_bleu([], []), "no sentences"),
    (lambda: bleu_by_length([1, 2], HYPS, REFS), "2 source lengths"),
    (lambda: bleu_by_length([1, 2, 3], HYPS, REFS, edges=(20, 10)), "edges"),
    (lambda: bleu_without_unk(HYPS, REFS, [True]), "1 unk flags"),
    # an empty reference used to be scored (every word of its translation a false positive)
    (lambda: corpus_bleu(HYPS, [REFS[0], "", REFS[2]]), "^reference 2 is empty"),
    (lambda: corpus_scores(HYPS, [REFS[0], REFS[1], " \t"]), "^reference 3 is empty"),
])
def test_errors(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_translate_corpus_keeps_input_order() -> None:
    """Sentences of 3, 1, 6, 2 and 3 words in batches of 3 (sorted by length): each result is
    its sentence's translated alone. The model's outputs differ by sentence, so results in
    another order would not pass."""
    tok, vocab = WhitespaceTokenizer(), TINY_VOCAB
    sentences = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10", "w2 w2", "w11 w3 w0"]
    model = random_model(seed=1, scale=1.5).float()
    search = BeamSearch(beam_size=2, max_len=5)
    batched = translate_corpus(model, sentences, vocab, vocab, tok, search=search, batch_size=3,
                               progress=None)
    assert len({result.text for result in batched}) == len(sentences)
    for sentence, result in zip(sentences, batched, strict=True):
        [alone] = translate_corpus(model, [sentence], vocab, vocab, tok, search=search,
                                   progress=None)
        assert result.hypothesis.tokens == alone.hypothesis.tokens
        assert result.text == tok.detokenize(vocab.decode(alone.hypothesis.tokens))
    with pytest.raises(ValueError, match="sentence 2 is empty"):
        translate_corpus(model, ["w1", "   "], vocab, vocab, tok, search=search)


def test_translate_batches_come_in_the_order_of_their_first_sentence() -> None:
    """Sources of 5, 1, 4, 2, 3, 6 words in batches of 2: sorted by length, the batches are
    {1, 3}, {4, 2}, {0, 5}; taken by their first sentence, {0, 5} comes first, then {1, 3},
    then {2, 4}, so after each batch every sentence before the next batch's first is done.
    Their translations are translate_corpus's; a bad input is refused at the call, before
    any batch is decoded."""
    tok, model = WhitespaceTokenizer(), random_model(seed=1, scale=1.5).float()
    sentences = [" ".join(f"w{j}" for j in range(n)) for n in (5, 1, 4, 2, 3, 6)]
    search = BeamSearch(beam_size=2, max_len=5)
    batches = list(translate_batches(model, sentences, TINY_VOCAB, TINY_VOCAB, tok,
                                     search=search, batch_size=2))
    assert [sorted(i for i, _ in batch) for batch in batches] == [[0, 5], [1, 3], [2, 4]]
    whole = translate_corpus(model, sentences, TINY_VOCAB, TINY_VOCAB, tok, search=search,
                             batch_size=2, progress=None)
    assert len({t.text for t in whole}) >= 4          # outputs that tell the sentences apart
    for batch in batches:
        for i, translation in batch:
            assert translation.text == whole[i].text
            assert translation.hypothesis.tokens == whole[i].hypothesis.tokens
    with pytest.raises(ValueError, match="sentence 2 is empty"):
        translate_batches(model, ["w1", " "], TINY_VOCAB, TINY_VOCAB, tok, search=search)
    for blank in ("   ", "\t", "\u00a0"):       # characters would make its spaces tokens
        with pytest.raises(ValueError, match="sentence 2 is empty"):
            translate_batches(model, ["w1", blank], TINY_VOCAB, TINY_VOCAB, CharTokenizer(),
                              search=search)


def test_translate_corpus_refuses_config_ids_that_differ_from_vocabularies() -> None:
    tok = DefaultTokenizer()
    vocab = Vocab.build([tok.tokenize("a man and two dogs .")])
    model = RNNSearch.from_config(replace(presets.tiny(len(vocab), len(vocab)), eos_id=5))
    with pytest.raises(ValueError, match=r"^model config eos_id=5 but src_vocab.eos_id=2: "):
        translate_corpus(model, ["a man ."], vocab, vocab, tok)


# ------------------------------------------------------------ constrained decoding from text
SENTENCES = ["a man .", "two dogs play in the snow .", "a girl", "dogs ."]


def text_model(lowercase: bool = False):
    tok = DefaultTokenizer(lowercase=lowercase)
    vocab = Vocab.build([tok.tokenize(s) for s in SENTENCES])
    torch.manual_seed(0)
    return RNNSearch.from_config(presets.tiny(len(vocab), len(vocab))).eval(), vocab, tok


def holds(words: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(words[i:i + n] == phrase for i in range(len(words) - n + 1))


@pytest.mark.parametrize("lowercase", [False, True])
def test_translate_corpus_holds_the_phrases_given_as_text(lowercase) -> None:
    """Phrases are tokenised with the model's tokenizer (a lowercasing one lowercases them)."""
    from bahdanau import BeamSearch, Translator

    model, vocab, tok = text_model(lowercase)
    constraints = [["two dogs"], [], ["the snow", "A" if lowercase else "a"], ["play ."]]
    avoid = [["a"], ["dogs"], [], ["man", "girl"]]
    search = BeamSearch(beam_size=3, n_best=2, max_len=8)
    out = translate_corpus(model, SENTENCES, vocab, vocab, tok, search=search, batch_size=3,
                           constraints=constraints, avoid=avoid)
    for t, need, shun in zip(out, constraints, avoid, strict=True):
        for hyp in t.nbest:
            words = vocab.decode(hyp.tokens)
            assert all(holds(words, tok.tokenize(p)) for p in need), (words, need)
            assert not any(holds(words, tok.tokenize(p)) for p in shun), (words, shun)
    translator = Translator(model, tok, vocab, vocab)
    assert translator.translate(SENTENCES, search=search, constraints=constraints,
                                avoid=avoid) == [t.text for t in out]


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(constraints=[["two dogs"]] * 3), "constraints must hold one list of phrases per "
                                           "sentence (4)"),
    (dict(avoid="dogs"), "avoid must hold one list of phrases per sentence (4)"),
    (dict(constraints=[[], [], [], ["zebra crossing"]]),
     "constraints, sentence 4: the phrase 'zebra crossing' has words outside the target "
     "vocabulary (zebra crossing): the model cannot write it"),
    (dict(avoid=[[], ["a zebra"], [], []]), "avoid, sentence 2: the phrase 'a zebra' has "
                                            "words outside the target vocabulary (zebra)"),
    (dict(constraints=[[], [], [], ["  "]]), "constraints, sentence 4: the phrase '  ' is "
                                             "empty"),
    (dict(constraints=[[], [], [], [["dogs"]]]), "constraints, sentence 4: expected a list "
                                                 "of phrases (str)"),
    (dict(constraints=[[], [], [], "dogs"]), "expected a list of phrases (str), got str"),
    (dict(constraints=[[], [], [], ["two dogs play in the snow", "a man"]]),
     "sentence 4: its phrases need at least 8 tokens, more than the 6"),
    (dict(constraints=[[], [], [], ["dogs play"]], avoid=[[], [], [], ["play"]]),
     "sentence 4: its phrases cannot all appear"),
])
def test_translate_corpus_refuses_bad_phrases_before_decoding(kwargs, match, monkeypatch
                                                              ) -> None:
    """Each refused before the first batch is encoded (the last sentence's too), naming the
    sentence in the corpus."""
    from bahdanau import BeamSearch

    model, vocab, tok = text_model()
    encoded = []
    monkeypatch.setattr(model, "encode", lambda *a, **k: encoded.append(a) or 1 / 0)
    with pytest.raises(ValueError, match=re.escape(match)) as err:
        translate_corpus(model, SENTENCES, vocab, vocab, tok, batch_size=1,
                         search=BeamSearch(beam_size=2, max_len=6), **kwargs)
    assert "\n" not in str(err.value) and not encoded


def test_a_pair_whose_target_side_lowercases_is_scored_without_case() -> None:
    """Characters in, lowercased words out (`TokenizerPair`): the target side writes lowercase,
    so BLEU against cased references ignores case, as for a lowercasing tokenizer alone; a
    cased target side keeps case."""
    from bahdanau.data import CharTokenizer, TokenizerPair

    refs = ["A Man sings .", "The Girl sings ."]
    hyps = [r.lower() for r in refs]
    vocab = Vocab(["a", "man", "the", "girl", "sings", "."])
    lowered = TokenizerPair(CharTokenizer(), DefaultTokenizer(lowercase=True))
    cased = TokenizerPair(DefaultTokenizer(lowercase=True), CharTokenizer())
    assert score_test_set(hyps, hyps, refs, vocab, vocab, lowered)["bleu"] == 100.0
    assert score_test_set(hyps, hyps, refs, vocab, vocab, cased)["bleu"] < 50.0
