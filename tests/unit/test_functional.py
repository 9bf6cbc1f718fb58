"""Hand-worked values for the reference math in bahdanau.functional."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bahdanau import functional


def test_lengths_to_mask() -> None:
    mask = functional.lengths_to_mask(torch.tensor([2, 0, 3]), 4)
    assert mask.tolist() == [[True, True, False, False], [False] * 4, [True, True, True, False]]


def test_masked_softmax_by_hand() -> None:
    scores = torch.tensor([[1.0, 2.0, 50.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    e1, e2 = math.exp(1.0), math.exp(2.0)
    weights = functional.masked_softmax(scores, mask)[0].tolist()
    assert math.isclose(weights[0], e1 / (e1 + e2), rel_tol=1e-12)
    assert math.isclose(weights[1], e2 / (e1 + e2), rel_tol=1e-12)
    assert weights[2] == 0.0


def test_additive_attention_by_hand() -> None:
    """S=2, A=1: e_j = v tanh(q + k_j); weights are a two-way softmax; c = a h."""
    q, k1, k2, v = 0.3, -0.2, 0.9, 2.0
    query = torch.tensor([[q]], dtype=torch.float64)
    keys = torch.tensor([[[k1], [k2]]], dtype=torch.float64)
    values = torch.tensor([[[1.0, 10.0], [3.0, -2.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True]])
    context, weights = functional.additive_attention(query, keys, values, mask,
                                                     torch.tensor([v], dtype=torch.float64))
    e1, e2 = v * math.tanh(q + k1), v * math.tanh(q + k2)
    a1 = math.exp(e1) / (math.exp(e1) + math.exp(e2))
    a2 = 1.0 - a1
    assert math.isclose(weights[0, 0].item(), a1, rel_tol=1e-12)
    assert math.isclose(weights[0, 1].item(), a2, rel_tol=1e-12)
    assert math.isclose(context[0, 0].item(), a1 * 1.0 + a2 * 3.0, rel_tol=1e-12)
    assert math.isclose(context[0, 1].item(), a1 * 10.0 + a2 * -2.0, rel_tol=1e-12)


def test_maxout_pairs() -> None:
    x = torch.tensor([[1.0, 4.0, -2.0, -3.0, 0.5, 0.25]])
    assert functional.maxout(x).tolist() == [[4.0, -2.0, 0.5]]


def _gru_case(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    d, e, n = 4, 3, 5

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return r(3 * d, e), r(3 * d), r(3 * d, d), r(3 * d), r(n, e), r(n, d), d


def test_gru_update_torch_form_equals_gru_cell() -> None:
    w_ih, b_ih, w_hh, b_hh, x, h, d = _gru_case()
    cell = torch.nn.GRUCell(x.shape[1], d).double()
    with torch.no_grad():
        cell.weight_ih.copy_(w_ih)
        cell.bias_ih.copy_(b_ih)
        cell.weight_hh.copy_(w_hh)
        cell.bias_hh.copy_(b_hh)
    ours = functional.gru_update(F.linear(x, w_ih, b_ih), F.linear(h, w_hh, b_hh), h)
    torch.testing.assert_close(ours, cell(x, h), rtol=1e-12, atol=1e-12)


def test_gru_update_paper_form_by_the_equations() -> None:
    """Appendix A: r, z = sigma(W x + U h); h~ = tanh(W x + U (r * h)); z keeps the old state."""
    w_ih, b_ih, w_hh, b_hh, x, h, d = _gru_case(1)
    w_r, w_z, w_n = w_ih.split(d)
    u_r, u_z, u_n = w_hh.split(d)
    b_r, b_z, b_n = b_ih.split(d)
    c_r, c_z, c_n = b_hh.split(d)
    r = torch.sigmoid(x @ w_r.t() + b_r + h @ u_r.t() + c_r)
    z = torch.sigmoid(x @ w_z.t() + b_z + h @ u_z.t() + c_z)
    cand = torch.tanh(x @ w_n.t() + b_n + (r * h) @ u_n.t() + c_n)
    expected = z * h + (1 - z) * cand
    ours = functional.gru_update(F.linear(x, w_ih, b_ih), F.linear(h, w_hh[: 2 * d], b_hh[: 2 * d]),
                                 h, weight_hn=u_n, bias_hn=c_n)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)
    torch_form = functional.gru_update(F.linear(x, w_ih, b_ih), F.linear(h, w_hh, b_hh), h)
    assert not torch.allclose(ours, torch_form)                  # the two forms really differ


def test_sequence_nll_ignores_padding() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64)
    target = torch.tensor([[1, 4, 0], [2, 0, 0]])
    loss, n = functional.sequence_nll(logits, target, pad_id=0)
    logp = torch.log_softmax(logits, -1)
    expected = -(logp[0, 0, 1] + logp[0, 1, 4] + logp[1, 0, 2])
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    assert int(n) == 3
    smoothed, _ = functional.sequence_nll(logits, target, 0, label_smoothing=0.1)
    assert not torch.isclose(smoothed, loss)
