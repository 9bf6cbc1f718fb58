"""The search's pieces against NumPy: candidate selection, kept n-best, length penalties."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

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
