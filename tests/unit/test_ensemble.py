"""Ensembles (bahdanau.ensemble) under the unchanged BeamSearch, and loading them.

Expectations: an ensemble of one model decodes exactly as the model; of two copies, as one; of
two different models, each step's log-probabilities are log(mean of the members' probabilities)
computed by hand in float64, and a hypothesis' log-probability and alignment are those of the
members' teacher-forced `forward` combined the same way.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import replace

import pytest
import torch
from search_asserts import assert_same_hypotheses, random_model
from training_fixtures import TINY_VOCAB, tiny_model

from bahdanau import BeamSearch, Ensemble, RNNEncDec, RNNSearch, greedy_search, presets
from bahdanau.checkpoint import save_checkpoint
from bahdanau.data import DefaultTokenizer, Vocab, WhitespaceTokenizer
from bahdanau.errors import InputError
from bahdanau.training.state import checkpoint_payload
from bahdanau.translate import load

BOS, EOS = 1, 2
SRC = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 0, 0, 0], [4, 12, 13, 0, 0]])
LENGTHS = torch.tensor([5, 2, 3])
VOCAB = TINY_VOCAB


@pytest.mark.parametrize("model", [random_model(seed=1), tiny_model(0).eval()])
def test_ensemble_of_one_decodes_exactly_as_the_model(model) -> None:
    search = BeamSearch(beam_size=3, n_best=2, max_len=7)
    assert_same_hypotheses(search(Ensemble([model]), SRC, LENGTHS),
                           search(model, SRC, LENGTHS))
    assert [h.tokens for h in greedy_search(Ensemble([model]), SRC, LENGTHS, max_len=7)] == [
        h.tokens for h in greedy_search(model, SRC, LENGTHS, max_len=7)]


def test_ensemble_of_two_copies_decodes_as_one() -> None:
    model = random_model(seed=2)
    search = BeamSearch(beam_size=4, n_best=3, max_len=8, length_penalty="average")
    assert_same_hypotheses(search(Ensemble([model, copy.deepcopy(model)]), SRC, LENGTHS),
                           search(model, SRC, LENGTHS), tol=1e-9)


def test_step_is_log_of_mean_probability_in_float64() -> None:
    a, b = random_model(seed=3), random_model(seed=4)
    ensemble = Ensemble([a, b])
    state, memory = ensemble.encode(SRC, LENGTHS)
    tokens = torch.full((3,), BOS)
    states = [m.encode(SRC, LENGTHS) for m in (a, b)]
    for step_tokens in ([BOS] * 3, [7, 8, 9], [11, 4, 6]):
        tokens = torch.tensor(step_tokens)
        out = ensemble.step(tokens, state, memory)
        members = [m.step(tokens, s, mem) for m, (s, mem) in zip((a, b), states, strict=True)]
        probs = [torch.exp(o.logits - o.logits.max(-1, keepdim=True).values) for o in members]
        probs = [p / p.sum(-1, keepdim=True) for p in probs]
        expected = torch.log((probs[0] + probs[1]) / 2)
        torch.testing.assert_close(out.logits, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(out.weights, (members[0].weights + members[1].weights) / 2,
                                   rtol=0, atol=1e-15)
        state = out.state
        states = [(o.state, mem) for o, (_, mem) in zip(members, states, strict=True)]


def test_hypotheses_score_with_the_members_teacher_forced_mean() -> None:
    a, b = random_model(seed=5), random_model(seed=6)
    results = BeamSearch(beam_size=3, n_best=2, max_len=6)(Ensemble([a, b]), SRC, LENGTHS)
    for i, hyps in enumerate(results):
        n = int(LENGTHS[i])
        for hyp in hyps:
            tgt_in = torch.tensor([[BOS, *hyp.tokens]])
            target = torch.tensor([*hyp.tokens, EOS])
            probs, weights = [], []
            for m in (a, b):
                logits, attention = m(SRC[i:i + 1, :n], LENGTHS[i:i + 1], tgt_in,
                                      return_attention=True)
                probs.append(torch.softmax(logits[0], -1)[torch.arange(len(target)), target])
                weights.append(attention[0])
            expected = torch.log((probs[0] + probs[1]) / 2).sum().item()
            assert math.isclose(hyp.log_prob, expected, rel_tol=0, abs_tol=1e-9)
            torch.testing.assert_close(hyp.attention, (weights[0] + weights[1]) / 2)


def test_members_without_attention() -> None:
    encdec = random_model(RNNEncDec, seed=7)
    only = Ensemble([encdec, random_model(RNNEncDec, seed=8)])
    assert only.arch == "rnnencdec"
    assert BeamSearch(beam_size=2, max_len=4)(only, SRC, LENGTHS)[0][0].attention is None
    mixed = Ensemble([encdec, random_model(seed=9)])
    assert mixed.arch == "rnnsearch"
    hyp = BeamSearch(beam_size=2, max_len=4)(mixed, SRC, LENGTHS)[1][0]
    assert hyp.attention.shape == (len(hyp.tokens) + 1, 2)


def test_bad_members_are_refused_in_one_line() -> None:
    for bad, fragment in (([], "non-empty list"), (tiny_model(), "non-empty list"),
                          ([tiny_model(), torch.nn.Linear(2, 2)], "models[1] must be"),
                          ([tiny_model(), tiny_model(tgt_vocab_size=17)],
                           "models[1] has tgt_vocab_size=17 but models[0] has 16"),
                          ([tiny_model(), tiny_model().to("meta")],
                           "models[1] is on meta but models[0] on cpu: ensemble members "
                           "decode on one device")):
        with pytest.raises(InputError, match=re.escape(fragment)) as err:
            Ensemble(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="only decodes"):
        Ensemble([tiny_model()])(SRC, LENGTHS, SRC)


def _without_config(model: RNNSearch) -> RNNSearch:
    """The same model assembled from its parts, as a user may build one: no `config`."""
    return RNNSearch(model.encoder, model.decoder)


@pytest.mark.parametrize("sizes, message", [
    ((16, 17), "models[1] has tgt_vocab_size=17 but models[0] has 16"),   # the case
    ((15, 16), "models[1] has src_vocab_size=15 but models[0] has 16"),
])
def test_members_without_configs_must_share_vocabulary_sizes(sizes, message) -> None:
    # before, a member built from parts (no config) was not compared, and the ensemble failed
    # only while decoding (a shape error in the averaging)
    other = _without_config(RNNSearch.from_config(presets.tiny(*sizes)))
    for members in ([random_model(), other], [_without_config(random_model()), other]):
        with pytest.raises(InputError, match=re.escape(message)):
            Ensemble(members)
    same = Ensemble([_without_config(random_model()), random_model(seed=1)])   # default ids
    assert len(same.members) == 2


def test_memory_estimate_holds_every_member() -> None:
    """A search of an ensemble holds every member's memory, state and scores at once (`encode`
    keeps each member's memory for the whole search): `BeamSearch.memory_needed` counts them
    all, not the first member's alone. Computed by hand for members of different sizes, in
    either order; a member without a `ModelConfig` adds nothing of its own but its scores; an
    ensemble of one needs what its member does."""
    small = RNNSearch.from_config(replace(presets.tiny(), hidden_size=4, decoder_size=6,
                                          align_size=5))
    large = RNNSearch.from_config(replace(presets.tiny(), hidden_size=10, decoder_size=12,
                                          align_size=7))
    search, sentences, src_len = BeamSearch(beam_size=3, max_len=7), 2, 5
    rows, steps, vocab, size = sentences * 3, 7 + 1, 16, 4          # float32

    def by_hand(scores: int, states: int, widths: int) -> int:
        per_row = (2 * vocab * scores * size        # logits and log-probabilities
                   + 2 * 3 * (size + 8)             # the 2K top candidates and their ids
                   + 2 * states * size              # the states s_i, reordered
                   + steps * (16 + src_len * size))  # each step's parents, tokens and a_ij
        return rows * per_row + sentences * src_len * widths * size   # annotations and keys

    both = by_hand(3, 6 + 12, (2 * 4 + 5) + (2 * 10 + 7))   # two members' and the combined V
    assert search.memory_needed(Ensemble([small, large]), sentences, src_len) == both
    assert search.memory_needed(Ensemble([large, small]), sentences, src_len) == both
    partial = Ensemble([small, _without_config(large)])
    assert search.memory_needed(partial, sentences, src_len) == by_hand(3, 6, 2 * 4 + 5)
    alone = search.memory_needed(large, sentences, src_len)
    assert alone == by_hand(1, 12, 2 * 10 + 7)
    assert search.memory_needed(Ensemble([large]), sentences, src_len) == alone


def _checkpoint(path, model, tokenizer=None, tgt_vocab=VOCAB):
    save_checkpoint(path, checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=tgt_vocab,
                                             tokenizer=tokenizer or DefaultTokenizer()))
    return path


def test_load_several_checkpoints_as_an_ensemble(tmp_path) -> None:
    a = _checkpoint(tmp_path / "a.pt", tiny_model(0))
    b = _checkpoint(tmp_path / "b.pt", tiny_model(1, hidden_size=10))
    translator = load([a, b])
    assert isinstance(translator.model, Ensemble) and not translator.model.training
    single = load(a)
    assert isinstance(single.model, RNNSearch) and isinstance(load([a]).model, RNNSearch)
    texts = translator.translate(["w4 w5 w6", "w7"], search=BeamSearch(beam_size=2, max_len=5))
    assert len(texts) == 2
    other_vocab = Vocab([f"v{i}" for i in range(12)])
    c = _checkpoint(tmp_path / "c.pt", tiny_model(0), tgt_vocab=other_vocab)
    with pytest.raises(InputError, match=f"{c}: its target vocabulary .* differs from {a}'s"):
        load([a, c])
    d = _checkpoint(tmp_path / "d.pt", tiny_model(0), tokenizer=WhitespaceTokenizer())
    with pytest.raises(InputError, match=rf"{d}: its tokenizer \(whitespace\) differs from "
                                         rf"{a}'s \(default") as err:
        load([a, d])
    assert "\n" not in str(err.value)
