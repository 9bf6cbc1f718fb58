"""Lexically constrained decoding (bahdanau.constraints) against independent computations.

Expectations: a substring search over every short sequence (what the automaton must say of
it), a breadth-first search over extensions (the fewest tokens still needed), a plain round robin
written with lists (the bank allocation), enumeration of every sequence of a tiny vocabulary
scored by teacher forcing (the wide beam), and the plain search (no phrases, or a sentence
without phrases in a constrained batch).
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from search_asserts import assert_same_hypotheses, random_model, reorder_tol

from bahdanau import BeamSearch, Ensemble, RNNEncDec, RNNSearch
from bahdanau.constraints import MAX_STATES, allocate, automaton
from bahdanau.errors import InputError
from bahdanau.search import length_normalise

TOL64 = reorder_tol(torch.float64)
PAD, BOS, EOS = 0, 1, 2
SRC = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 0, 0, 0], [4, 12, 13, 0, 0]])
LENGTHS = torch.tensor([5, 2, 3])
LONGER_SRC = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [9, 10, 0, 0, 0, 0, 0],
                           [4, 12, 13, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0, 0],
                           [8, 8, 9, 9, 10, 0, 0], [13, 5, 0, 0, 0, 0, 0]])
LONGER_LENGTHS = torch.tensor([7, 2, 3, 1, 5, 2])


def holds(tokens, phrase) -> bool:
    """`phrase` appears contiguously in `tokens`."""
    n = len(phrase)
    return any(tuple(tokens[i:i + n]) == tuple(phrase) for i in range(len(tokens) - n + 1))


def walk(auto, tokens) -> int:
    """The automaton's state after `tokens` (-1 once a move is refused)."""
    state = 0
    for t in tokens:
        state = (auto.moves[state][auto.letters.index(t)] if t in auto.letters
                 else auto.other[state])
        if state < 0:
            return -1
    return state


# ------------------------------------------------------------------------------ the automaton
# required phrases, avoided phrases: overlaps of a phrase with itself (3 3 4) and with another
# (3 4 / 4 5), a phrase inside another (3 / 3 4), a required phrase holding an avoided one
PHRASE_SETS = [
    (((3, 3, 4),), ()),
    (((3, 4), (4, 5)), ()),
    (((3,), (3, 4)), ((4, 3),)),
    (((4, 5),), ((5,),)),
    ((), ((3, 4), (4,))),
    (((3, 4, 3),), ((4, 4),)),
]
WORDS = (3, 4, 5, 6)                                # 6 is a word of no phrase


@pytest.mark.parametrize(("positive", "avoid"), PHRASE_SETS)
def test_the_automaton_says_what_a_substring_search_says(positive, avoid) -> None:
    """Over every sequence of up to 6 words: a move is refused exactly when the sequence ends
    in an avoided phrase; `dist` is 0 exactly when every required phrase appears, and is the
    fewest words of any extension (of up to 4) that brings them all and no avoided one."""
    auto = automaton(positive, avoid, True)
    for n in range(7):
        for seq in itertools.product(WORDS, repeat=n):
            state = walk(auto, seq)
            if any(holds(seq, a) for a in avoid):
                assert state == -1, seq
                continue
            assert state >= 0, seq
            assert (auto.dist[state] == 0) == all(holds(seq, p) for p in positive), seq
            if n <= 3:
                fewest = next((k for k in range(5) for ext in itertools.product(WORDS, repeat=k)
                               if all(holds(seq + ext, p) for p in positive)
                               and not any(holds(seq + ext, a) for a in avoid)), None)
                if fewest is None:
                    assert auto.dist[state] > 4, seq
                else:
                    assert auto.dist[state] == fewest, seq


def test_the_bank_counts_the_constraint_tokens_met() -> None:
    """Phrases "3 4 5" and "6": the tokens of the phrases held plus the progress into one."""
    auto = automaton(((3, 4, 5), (6,)), (), True)
    expected = {(): 0, (3,): 1, (3, 4): 2, (3, 4, 5): 3, (3, 4, 5, 7): 3, (6,): 1,
                (6, 3, 4): 3, (3, 4, 6): 1 + 0, (3, 4, 5, 6): 4, (3, 3): 1}
    for seq, met in expected.items():
        assert auto.met[walk(auto, seq)] == met, seq
    assert auto.total == 4


def test_without_a_word_outside_the_phrases_there_is_no_other_move() -> None:
    auto = automaton(((3,),), (), False)
    assert set(auto.other) == {-1}
    assert auto.dist[0] == 1


# ----------------------------------------------------------------------- the bank allocation
def round_robin(scores, bank, eligible, k, banks):
    """The allocation with lists: each bank's live candidates by score (ties by position), then
    the first of every bank (fullest first), the second of every bank, ...; then -inf ones and
    ineligible ones in their order."""
    live = [i for i in range(len(scores)) if eligible[i] and scores[i] != -math.inf]
    per_bank = {b: sorted((i for i in live if bank[i] == b), key=lambda i: (-scores[i], i))
                for b in range(banks)}
    order = [per_bank[b][r] for r in range(len(scores)) for b in reversed(range(banks))
             if r < len(per_bank[b])]
    order += [i for i in range(len(scores)) if eligible[i] and i not in live]
    order += [i for i in range(len(scores)) if not eligible[i]]
    return order[:k]


@pytest.mark.parametrize("seed", range(6))
def test_allocation_is_round_robin_over_the_banks(seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    n, width, banks, k = 3, 11, 4, 5
    scores = torch.randn(n, width, generator=gen, dtype=torch.float64)
    scores[torch.rand(n, width, generator=gen) < 0.2] = -math.inf
    scores[0, 3] = scores[0, 7]                                 # a tie: the earlier first
    bank = torch.randint(0, banks - (seed % 2), (n, width), generator=gen)  # an empty bank
    eligible = torch.rand(n, width, generator=gen) < 0.8
    got = allocate(scores, bank, eligible, k, banks)
    for b in range(n):
        assert got[b].tolist() == round_robin(scores[b].tolist(), bank[b].tolist(),
                                              eligible[b].tolist(), k, banks)


def test_a_nan_score_is_taken_first() -> None:
    scores = torch.tensor([[-1.0, float("nan"), -0.5, -2.0]])
    got = allocate(scores, torch.tensor([[0, 0, 1, 1]]), torch.ones(1, 4, dtype=torch.bool), 2,
                   2)
    assert 1 in got[0].tolist()


# ---------------------------------------------------------------------------- the wide beam
def sequence_log_prob(model, src, length, tokens: list[int]) -> float:
    """Teacher-forced log p(tokens + eos | src) from the model's forward."""
    tgt_in = torch.tensor([[BOS] + tokens])
    tgt_out = torch.tensor([tokens + [EOS]])
    logp = torch.log_softmax(model(src[None, :length], torch.tensor([length]), tgt_in), -1)
    return logp.gather(2, tgt_out[..., None]).sum().item()


EXHAUSTIVE = [                         # (required, avoided) for each of the three sentences
    ([[[4]], [[3, 5]], [[5], [4]]], None),
    ([[[3, 4], [4, 5]], [[5, 5]], []], [[], [[3]], [[4, 4]]]),    # 3 4 5 fits only overlapped
    (None, [[[4]], [[3, 3], [5]], [[3]]]),
    ([[[3, 4, 3]], [[4], [4, 4]], [[5]]], [[[4, 4]], [], [[5, 3]]]),
]


@pytest.mark.parametrize(("positive", "avoid"), EXHAUSTIVE)
@pytest.mark.parametrize(("penalty", "min_len"), [("none", 1), ("average", 2), ("gnmt", 1)])
def test_wide_beam_equals_exhaustive_enumeration(positive, avoid, penalty, min_len) -> None:
    """V = 6 (4 specials, unk and 2 words), cap 3: every sequence enumerated; the best three
    that hold every phrase and no avoided one are the search's n-best, with their scores."""
    model = random_model(vocab=6, seed=1, scale=1.5)
    words, max_len = [3, 4, 5], 3
    search = BeamSearch(beam_size=40, n_best=3, max_len=max_len, min_len=min_len,
                        length_penalty=penalty, alpha=0.8)
    found = search(model, SRC, LENGTHS, constraints=positive, avoid=avoid)
    for b in range(3):
        need = positive[b] if positive else []
        shun = avoid[b] if avoid else []
        length = int(LENGTHS[b])
        scored = []
        for n in range(min_len, max_len + 1):
            for seq in itertools.product(words, repeat=n):
                if not all(holds(seq, p) for p in need) or any(holds(seq, a) for a in shun):
                    continue
                logp = sequence_log_prob(model, SRC[b], length, list(seq))
                score = length_normalise(torch.tensor(logp, dtype=torch.float64), n + 1,
                                         penalty, 0.8).item()
                scored.append((score, logp, list(seq)))
        scored.sort(key=lambda x: (-x[0], len(x[2])))
        assert scored
        for hyp, (score, logp, seq) in zip(found[b], scored[:3], strict=True):
            assert hyp.tokens == seq
            assert hyp.score == pytest.approx(score, abs=1e-9)
            assert hyp.log_prob == pytest.approx(logp, abs=1e-9)


# -------------------------------------------------------------------- no phrases, some phrases
@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_no_phrases_is_the_plain_search_bit_for_bit(cls) -> None:
    model = random_model(cls, seed=2)
    search = BeamSearch(beam_size=3, n_best=2, max_len=8, length_penalty="average")
    plain = search(model, SRC, LENGTHS)
    for kwargs in (dict(constraints=None), dict(constraints=[[], [], []]),
                   dict(avoid=[[], [], []]), dict(constraints=[[]] * 3, avoid=[[]] * 3)):
        assert_same_hypotheses(search(model, SRC, LENGTHS, **kwargs), plain)
    assert_same_hypotheses(model.translate(SRC, LENGTHS, beam_size=3, n_best=2, max_len=8,
                                           length_penalty="average", constraints=[[]] * 3),
                           plain)


SETTINGS = [
    dict(beam_size=1, max_len=9),
    dict(beam_size=3, n_best=2, min_len=2, max_len=9, max_len_ratio=1.5,
         length_penalty="average"),
    dict(beam_size=4, n_best=3, max_len=7, length_penalty="gnmt", alpha=0.8),
    dict(beam_size=2, n_best=2, max_len=5, early_stopping=False),
]
MIXED = [[[4, 5]], [], [[9], [13]], [], [[6, 6]], []]      # phrases for LONGER_SRC's sentences
AVOID = [[], [[15]], [], [], [[4]], []]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_sentences_without_phrases_in_a_constrained_batch_are_searched_as_without(settings
                                                                                  ) -> None:
    """A sentence with no phrase has one bank: the allocation is the plain search's order, so
    it finds the plain search's hypotheses (up to the order of sums its rows share)."""
    model = random_model(seed=5, scale=0.5)
    plain = BeamSearch(**settings)(model, LONGER_SRC, LONGER_LENGTHS)
    mixed = BeamSearch(**settings)(model, LONGER_SRC, LONGER_LENGTHS, constraints=MIXED)
    free = [i for i, p in enumerate(MIXED) if not p]
    assert_same_hypotheses([mixed[i] for i in free], [plain[i] for i in free], tol=TOL64)
    # ... and a sentence that avoids what its plain translation does not hold, too
    unused = [[[w]] if not any(w in h.tokens for h in plain[i]) else [] for i, w in
              enumerate([14, 15, 14, 15, 14, 15])]
    avoiding = BeamSearch(**settings)(model, LONGER_SRC, LONGER_LENGTHS, avoid=unused)
    assert_same_hypotheses(avoiding, plain, tol=TOL64)


def assert_phrases_held(results, positive, avoid) -> None:
    for b, hyps in enumerate(results):
        assert hyps
        for hyp in hyps:
            assert all(holds(hyp.tokens, p) for p in positive[b]), (b, hyp.tokens)
            assert not any(holds(hyp.tokens, a) for a in avoid[b]), (b, hyp.tokens)


def ensemble_model():
    return Ensemble([random_model(seed=3), random_model(seed=4)])


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
@pytest.mark.parametrize("make", [
    lambda: random_model(seed=5, scale=0.5),
    lambda: random_model(RNNEncDec, seed=6),
    lambda: random_model(seed=7, dtype=torch.float32),             # the packed-weight step
    lambda: random_model(seed=8, engine="reference"),
    ensemble_model,
], ids=["rnnsearch", "rnnencdec", "float32", "reference-engine", "ensemble"])
def test_phrases_hold_with_every_option(make, settings) -> None:
    """Every hypothesis holds every phrase and no avoided one; the n-best are distinct, in
    order, within [min_len, cap], and their log-probabilities and alignments are the
    teacher-forced ones."""
    model = make()
    search = BeamSearch(**settings)
    results = search(model, LONGER_SRC, LONGER_LENGTHS, constraints=MIXED, avoid=AVOID)
    assert_phrases_held(results, MIXED, AVOID)
    caps = search.caps(LONGER_LENGTHS).tolist()
    members = model.members if isinstance(model, Ensemble) else [model]
    for b, hyps in enumerate(results):
        assert len(hyps) == search.n_best
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
        length = int(LONGER_LENGTHS[b])
        for hyp in hyps:
            assert settings.get("min_len", 1) <= len(hyp.tokens) <= caps[b]
            if len(members) > 1:
                continue
            float32 = next(model.parameters()).dtype == torch.float32
            tolerance = 1e-3 if float32 else 1e-9
            assert hyp.log_prob == pytest.approx(
                sequence_log_prob(model, LONGER_SRC[b], length, hyp.tokens), abs=tolerance)
            if hyp.attention is not None:
                _, attention = model(LONGER_SRC[b:b + 1, :length], LONGER_LENGTHS[b:b + 1],
                                     torch.tensor([[BOS] + hyp.tokens]), return_attention=True)
                torch.testing.assert_close(hyp.attention, attention[0].to(hyp.attention.dtype),
                                           rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("check_every", [3, 1000])
def test_every_check_interval_and_kept_groups_find_the_same_hypotheses(check_every) -> None:
    """The constrained step reads nothing back to the host: with the host's look every k steps,
    and with the power-of-two groups of captured steps (`fixed_rows`, run here on the CPU
    through the plain step), the same hypotheses."""
    from bahdanau.search import step_call

    model = random_model(seed=5, scale=0.5)
    settings = dict(beam_size=3, n_best=2, max_len=9, length_penalty="average")
    want = BeamSearch(**settings)(model, LONGER_SRC, LONGER_LENGTHS, constraints=MIXED,
                                  avoid=AVOID)
    search = BeamSearch(**settings, check_every=check_every)
    got = search(model, LONGER_SRC, LONGER_LENGTHS, constraints=MIXED, avoid=AVOID)
    assert_same_hypotheses(got, want, tol=TOL64)
    lexical = search._lexical(model, LONGER_LENGTHS, LONGER_SRC.device, MIXED, AVOID)
    with torch.inference_mode():
        kept = search._search(model.eval(), LONGER_SRC, LONGER_LENGTHS, step_call(model),
                              fixed_rows=True, lexical=lexical)
    assert_same_hypotheses(kept, want, tol=TOL64)


def test_a_tight_cap_forces_the_phrases_in() -> None:
    """max_len 4 and phrases of 4 tokens in all: the only translations are the two orders."""
    model = random_model(seed=9)
    found = BeamSearch(beam_size=3, n_best=3, max_len=4)(
        model, SRC, LENGTHS, constraints=[[[7, 8], [9, 10]], [[11], [12, 13, 14]], [[6]] * 2])
    assert sorted(h.tokens for h in found[0]) == [[7, 8, 9, 10], [9, 10, 7, 8]]
    assert sorted(h.tokens for h in found[1]) == [[11, 12, 13, 14], [12, 13, 14, 11]]
    assert all(6 in h.tokens for h in found[2])


# ------------------------------------------------------------------------------- bad phrases
class Counting(torch.nn.Module):
    """A model that counts its `encode` calls: nothing is decoded before the phrases pass."""

    def __init__(self, model: RNNSearch) -> None:
        super().__init__()
        self.model, self.config, self.encoded = model, model.config, 0

    def encode(self, src, src_lengths):
        self.encoded += 1
        return self.model.encode(src, src_lengths)

    def step(self, prev_tokens, state, memory):
        return self.model.step(prev_tokens, state, memory)


BAD = [
    (dict(constraints=[[[4]], []]), "constraints must hold one list of phrases per sentence (3)"),
    (dict(avoid=[[[4]]] * 4), "avoid must hold one list of phrases per sentence (3)"),
    (dict(constraints="4 5"), "constraints must hold one list of phrases per sentence"),
    (dict(constraints=[[[4]], [[]], []]), "constraints, sentence 1 of the batch: a phrase is "
                                          "empty"),
    (dict(avoid=[[], [], [[]]]), "avoid, sentence 2 of the batch: a phrase is empty"),
    (dict(constraints=[[[4, 16]], [], []]), "the phrase [4, 16] holds 16, which is no word"),
    (dict(constraints=[[[-1]], [], []]), "holds -1, which is no word"),
    (dict(constraints=[[[4, 2]], [], []]), "holds 2, which is no word"),           # eos
    (dict(avoid=[[[0]], [], []]), "avoid, sentence 0 of the batch: the phrase [0] holds 0"),
    (dict(constraints=[[4, 5], [], []]), "a phrase must be a list of target ids, got int 4"),
    (dict(constraints=[[["a"]], [], []]), "a phrase must be a list of target ids"),
    (dict(constraints=[[[4.0]], [], []]), "a phrase must be a list of target ids"),
    (dict(constraints=[4, [], []]), "expected a list of phrases, got int 4"),
    # more than the cap allows: max_len 6, or the ratio's cap (sentence 1 has 2 tokens)
    (dict(constraints=[[[4, 5, 6, 7, 8, 9, 10]], [], []]),
     "sentence 0 of the batch: its phrases need at least 7 tokens, more than the 6"),
    (dict(constraints=[[[4, 5, 6], [7, 8, 9, 10]], [], []]), "need at least 7 tokens"),
    (dict(constraints=[[], [[4, 5, 6]], []], ratio=1.0),
     "sentence 1 of the batch: its phrases need at least 3 tokens, more than the 2"),
    # an avoided phrase inside a required one, or one that every way of holding them makes
    (dict(constraints=[[[4, 5, 6]], [], []], avoid=[[[5, 6]], [], []]),
     "sentence 0 of the batch: its phrases cannot all appear in a translation that holds none "
     "of its avoided phrases"),
    (dict(constraints=[[], [], [[4]]], avoid=[[], [], [[4]]]), "cannot all appear"),
    (dict(constraints=[[[w] for w in range(3, 16)], [], []], max_len=20),
     f"its phrases make more than {MAX_STATES} states"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_phrases_are_one_line_errors_before_decoding(kwargs, match) -> None:
    model = Counting(random_model())
    kwargs = dict(kwargs)
    search = BeamSearch(beam_size=2, max_len=kwargs.pop("max_len", 6),
                        max_len_ratio=kwargs.pop("ratio", None))
    with pytest.raises(InputError, match=re.escape(match)) as err:
        search(model, SRC, LENGTHS, **kwargs)
    assert "\n" not in str(err.value)
    assert model.encoded == 0


def test_an_ensemble_of_models_without_configs_takes_phrases() -> None:
    """Members assembled by hand (no `config`): the ensemble's target vocabulary is its
    members' `vocab_sizes`, so phrases are checked and held as with one such model."""
    members = [random_model(seed=3), random_model(seed=4)]
    for member in members:
        member.config = None
    model = Ensemble(members)
    src, lengths = torch.tensor([[5, 6, 7, 2]]), torch.tensor([4])
    phrase = [8, 9]
    [hyps] = BeamSearch(beam_size=4, max_len=8)(model, src, lengths, constraints=[[phrase]])
    assert all(holds(h.tokens, phrase) for h in hyps)
