"""The search's pieces against NumPy (candidate selection, kept n-best, length penalties), and
constrained decoding on random tiny models: every hypothesis holds its phrases, and a sentence
alone finds what it finds in a batch."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from search_asserts import assert_same_hypotheses, random_model, reorder_tol

from bahdanau import BeamSearch
from bahdanau.search import length_normalise, select_candidates, update_kept


@given(st.integers(1, 3), st.integers(1, 4), st.integers(3, 7), st.integers(0, 2**31 - 1),
       st.booleans())
def test_select_candidates_matches_numpy(n_sent, beams, vocab, seed, dead) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(n_sent, beams))
    if dead and beams > 1:
        scores[:, 1:] = -np.inf                                    # only beam 0 live
    log_probs = np.log(rng.dirichlet(np.ones(vocab), size=(n_sent, beams)))
    eos = 2
    sel = select_candidates(torch.tensor(scores), torch.tensor(log_probs), eos)
    for b in range(n_sent):
        flat = (scores[b][:, None] + log_probs[b]).ravel()
        order = np.argsort(-flat, kind="stable")[: 2 * beams]
        np.testing.assert_allclose(sel.top_scores[b].numpy(), flat[order])
        live = np.isfinite(flat[order])            # -inf candidates tie: their order is free
        parents, tokens = order // vocab, order % vocab
        assert sel.top_parent[b][live].tolist() == parents[live].tolist()
        finished = [(t == eos and r < beams and ok)
                    for r, (t, ok) in enumerate(zip(tokens, live, strict=True))]
        assert sel.finished[b].tolist() == finished
        cont = [i for i, t in enumerate(tokens) if t != eos and live[i]][:beams]
        n = len(cont)
        np.testing.assert_allclose(sel.scores[b].numpy()[:n], flat[order][cont])
        assert (sel.scores[b].numpy()[n:] == -np.inf).all()
        assert sel.parent[b][:n].tolist() == parents[cont].tolist()
        assert sel.token[b][:n].tolist() == tokens[cont].tolist()


@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_update_kept_matches_numpy(n_sent, n_best, n_new, seed) -> None:
    rng = np.random.default_rng(seed)
    kept = -np.sort(-rng.normal(size=(n_sent, n_best)), axis=1)
    kept[:, rng.integers(0, n_best + 1):] = -np.inf
    new = rng.normal(size=(n_sent, n_new))
    mask = rng.random(size=(n_sent, n_new)) < 0.5
    out = update_kept(torch.tensor(kept), torch.tensor(new), torch.tensor(mask)).numpy()
    for b in range(n_sent):
        pool = np.concatenate([kept[b], new[b][mask[b]]])
        np.testing.assert_allclose(out[b], -np.sort(-pool)[:n_best])


@given(st.floats(-50, 0), st.integers(1, 80), st.floats(0.0, 2.0))
def test_length_penalties(log_prob, length, alpha) -> None:
    lp = torch.tensor(log_prob, dtype=torch.float64)
    assert length_normalise(lp, length, "none", alpha).item() == log_prob
    assert np.isclose(length_normalise(lp, length, "average", alpha).item(), log_prob / length)
    gnmt = log_prob / ((5 + length) / 6) ** alpha
    assert np.isclose(length_normalise(lp, length, "gnmt", alpha).item(), gnmt)


# ------------------------------------------------------------- lexically constrained decoding
SRC = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 0, 0, 0], [4, 12, 13, 0, 0], [7, 0, 0, 0, 0]])
LENGTHS = torch.tensor([5, 2, 3, 1])
REQUIRED = list(range(3, 10))                   # words for required phrases (3 is unk)
AVOIDED = list(range(10, 16))                   # words for avoided ones: always satisfiable


def holds(tokens: list[int], phrase: list[int]) -> bool:
    n = len(phrase)
    return any(tokens[i:i + n] == phrase for i in range(len(tokens) - n + 1))


def phrase_lists(words: list[int], most: int) -> st.SearchStrategy:
    """One list of up to `most` phrases of 1-2 of `words` per sentence of SRC."""
    phrase = st.lists(st.sampled_from(words), min_size=1, max_size=2)
    return st.lists(st.lists(phrase, max_size=most), min_size=4, max_size=4)


@given(st.integers(0, 2**16), phrase_lists(REQUIRED, 2), phrase_lists(AVOIDED, 2),
       st.integers(1, 4), st.sampled_from(["none", "average", "gnmt"]), st.booleans())
def test_constrained_hypotheses_hold_every_phrase_and_no_avoided_one(
        seed, positive, avoid, beam, penalty, float32) -> None:
    model = random_model(seed=seed, scale=0.7, dtype=torch.float32 if float32 else torch.float64)
    search = BeamSearch(beam_size=beam, n_best=beam, max_len=6, length_penalty=penalty)
    for b, hyps in enumerate(search(model, SRC, LENGTHS, constraints=positive, avoid=avoid)):
        assert len(hyps) == beam
        for hyp in hyps:
            assert all(holds(hyp.tokens, p) for p in positive[b]), (b, hyp.tokens, positive[b])
            assert not any(holds(hyp.tokens, a) for a in avoid[b]), (b, hyp.tokens, avoid[b])


@settings(max_examples=20)                      # five searches each
@given(st.integers(0, 2**16), phrase_lists(REQUIRED, 2), phrase_lists(AVOIDED, 1),
       st.integers(1, 3))
def test_a_constrained_sentence_alone_equals_its_result_in_a_batch(seed, positive, avoid,
                                                                   beam) -> None:
    model = random_model(seed=seed, scale=0.7)
    search = BeamSearch(beam_size=beam, n_best=beam, max_len=6, length_penalty="average")
    batched = search(model, SRC, LENGTHS, constraints=positive, avoid=avoid)
    for b in range(SRC.shape[0]):
        length = int(LENGTHS[b])
        alone = search(model, SRC[b:b + 1, :length], LENGTHS[b:b + 1],
                       constraints=positive[b:b + 1], avoid=avoid[b:b + 1])
        assert_same_hypotheses(alone, batched[b:b + 1], tol=reorder_tol(torch.float64))
