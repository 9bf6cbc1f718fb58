"""Hypothesis invariants of the additive attention reference (float64)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from bahdanau import AdditiveAttention, functional
from bahdanau.kernels import sigmoid_attention_weights


@st.composite
def attention_inputs(draw, max_beams: int = 1):
    batch = draw(st.integers(1, 4))
    src_len = draw(st.integers(1, 9))
    align = draw(st.integers(1, 6))
    width = draw(st.integers(1, 5))
    beams = draw(st.integers(1, max_beams))
    lengths = draw(st.lists(st.integers(1, src_len), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))

    def randn(*shape: int) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)

    mask = functional.lengths_to_mask(torch.tensor(lengths), src_len)
    return (randn(batch * beams, align), randn(batch, src_len, align),
            randn(batch, src_len, width), mask, randn(align))


@given(attention_inputs())
def test_weights_normalised_and_zero_at_padding(inputs) -> None:
    query, keys, values, mask, v = inputs
    context, weights = functional.additive_attention(query, keys, values, mask, v)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0], dtype=weights.dtype))
    assert (weights[~mask] == 0.0).all()
    assert (weights >= 0).all() and torch.isfinite(weights).all()
    expected = torch.einsum("bs,bsc->bc", weights, values)
    torch.testing.assert_close(context, expected, rtol=1e-12, atol=1e-12)


@given(attention_inputs(), st.integers(1, 4))
def test_extra_padding_changes_nothing(inputs, extra: int) -> None:
    query, keys, values, mask, v = inputs
    context, weights = functional.additive_attention(query, keys, values, mask, v)
    pad = (0, 0, 0, extra)
    keys_p, values_p = torch.nn.functional.pad(keys, pad), torch.nn.functional.pad(values, pad)
    keys_p[:, -extra:] = 123.0                                    # garbage under the padding
    values_p[:, -extra:] = -77.0
    mask_p = torch.nn.functional.pad(mask, (0, extra), value=False)
    context_p, weights_p = functional.additive_attention(query, keys_p, values_p, mask_p, v)
    torch.testing.assert_close(context_p, context, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights_p[:, : mask.shape[1]], weights, rtol=1e-12, atol=1e-12)
    assert (weights_p[:, mask.shape[1]:] == 0.0).all()


@given(attention_inputs(), st.randoms(use_true_random=False))
def test_permuting_source_positions_permutes_weights(inputs, rnd) -> None:
    query, keys, values, mask, v = inputs
    perm = list(range(keys.shape[1]))
    rnd.shuffle(perm)
    perm_t = torch.tensor(perm)
    context, weights = functional.additive_attention(query, keys, values, mask, v)
    context_p, weights_p = functional.additive_attention(query, keys[:, perm_t], values[:, perm_t],
                                                         mask[:, perm_t], v)
    torch.testing.assert_close(weights_p, weights[:, perm_t], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(context_p, context, rtol=1e-12, atol=1e-12)


@given(attention_inputs(max_beams=3))
def test_beam_rows_equal_repeated_sentences(inputs) -> None:
    """Rows grouped K per sentence equal running each row against a copy of its sentence."""
    query, keys, values, mask, v = inputs
    beams = query.shape[0] // keys.shape[0]
    context, weights = functional.additive_attention(query, keys, values, mask, v)
    rep = (keys.repeat_interleave(beams, 0), values.repeat_interleave(beams, 0),
           mask.repeat_interleave(beams, 0))
    context_r, weights_r = functional.additive_attention(query, *rep, v)
    torch.testing.assert_close(context, context_r, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights, weights_r, rtol=1e-12, atol=1e-12)


@given(attention_inputs())
def test_module_forward_is_attend_of_projected_query(inputs) -> None:
    _, keys_in, values, mask, _ = inputs
    batch, src_len, width = values.shape
    gen = torch.Generator().manual_seed(0)
    attn = AdditiveAttention(query_size=3, key_size=width, align_size=4, impl="reference").double()
    for p in attn.parameters():
        p.data = torch.randn(p.shape, generator=gen, dtype=torch.float64)
    query = torch.randn(batch, 3, generator=gen, dtype=torch.float64)
    memory = attn.prepare(values, mask)
    keys = memory.keys
    torch.testing.assert_close(keys, values @ attn.U_a.weight.t(), rtol=1e-12, atol=1e-12)
    context, weights, state = attn(query, memory, values)
    assert state is None
    energy = torch.tanh((query @ attn.W_a.weight.t())[:, None, :] + keys) @ attn.v_a
    expected = torch.softmax(energy.masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(weights, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(context, torch.einsum("bs,bsc->bc", expected, values))


def test_gradcheck_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)  # 2 beams
    keys = torch.randn(3, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    values = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = functional.lengths_to_mask(torch.tensor([4, 1, 2]), 4)

    def context_and_weights(q, k, h, v_a):
        return functional.additive_attention(q, k, h, mask, v_a)

    assert torch.autograd.gradcheck(context_and_weights, (query, keys, values, v))


def test_huge_energies_single_real_token_stay_finite() -> None:
    gen = torch.Generator().manual_seed(4)
    query = (1e4 * torch.randn(2, 5, generator=gen, dtype=torch.float64)).requires_grad_()
    keys = (1e4 * torch.randn(2, 6, 5, generator=gen, dtype=torch.float64)).requires_grad_()
    values = torch.randn(2, 6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    v = 1e4 * torch.randn(5, generator=gen, dtype=torch.float64)
    mask = functional.lengths_to_mask(torch.tensor([1, 6]), 6)
    context, weights = functional.additive_attention(query, keys, values, mask, v)
    assert weights[0, 0] == 1.0 and (weights[0, 1:] == 0).all()
    (context.sum() + weights.sum()).backward()
    for t in (context, weights, query.grad, keys.grad, values.grad):
        assert torch.isfinite(t).all()


@given(attention_inputs(max_beams=2))
def test_sigmoid_form_is_the_same_function(inputs) -> None:
    """v^T tanh(x) = (2v)^T sigmoid(2x) - sum(v): same weights, context and gradients."""
    query, keys, values, mask, v = (t.clone().requires_grad_(t.dtype != torch.bool)
                                    for t in inputs)
    plain = functional.additive_attention(query, keys, values, mask, v)
    fast_weights = sigmoid_attention_weights(query, keys, mask, v)
    fast = (functional.weighted_sum(fast_weights, values), fast_weights)
    for a, b in zip(plain, fast, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    leaves = (query, keys, values, v)
    probe = [torch.randn(t.shape, dtype=t.dtype, generator=torch.Generator().manual_seed(1))
             for t in plain]
    g_plain = torch.autograd.grad(sum((t * p).sum() for t, p in zip(plain, probe, strict=True)),
                                  leaves)
    g_fast = torch.autograd.grad(sum((t * p).sum() for t, p in zip(fast, probe, strict=True)),
                                 leaves)
    for a, b in zip(g_plain, g_fast, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
