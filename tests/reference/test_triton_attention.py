"""The fused Triton attention against the float64 reference (forward and every gradient).

On a machine without CUDA these run through Triton's interpreter (TRITON_INTERPRET=1, set by the
test command before anything imports triton). Tolerance: the fused error against float64 may be
at most twice the same-dtype reference's error, plus a small absolute slack for the dtype; both
errors are against the float64 reference of the same inputs, rounded to the dtype.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (the README's test command sets it)",
                allow_module_level=True)

from bahdanau import AdditiveAttention, RNNSearch, functional, presets  # noqa: E402
from bahdanau.kernels import triton_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SLACK = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@st.composite
def problems(draw):
    """Odd sizes included: S crosses the source block (64 under the interpreter), A and M their
    blocks; masks are prefixes, a single real token anywhere, or arbitrary."""
    batch, beams = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    src_len = draw(st.one_of(st.sampled_from([1, 7, 97]), st.integers(1, 80)))
    align = draw(st.integers(1, 140))
    width = draw(st.integers(1, 300))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["prefix", "single", "any"]))
    if kind == "prefix":
        mask = torch.arange(src_len)[None] < torch.randint(1, src_len + 1, (batch, 1),
                                                           generator=gen)
    elif kind == "single":
        mask = torch.zeros(batch, src_len, dtype=torch.bool)
        mask[torch.arange(batch), torch.randint(0, src_len, (batch,), generator=gen)] = True
    else:
        mask = torch.rand(batch, src_len, generator=gen) < 0.5
        mask[torch.arange(batch), torch.randint(0, src_len, (batch,), generator=gen)] = True
    scale = draw(st.sampled_from([0.3, 1.0, 3.0]))

    def randn(*shape: int) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)

    tensors = (randn(batch * beams, align), randn(batch, src_len, align),
               randn(batch, src_len, width), randn(align))
    return tensors, mask, randn(batch * beams, width), randn(batch * beams, src_len)


def _run(fn, tensors, mask, grad_context, grad_weights, dtype):
    """Outputs and the gradients of <context, grad_context> + <weights, grad_weights>."""
    query, keys, values, v = (t.to(DEVICE, dtype).requires_grad_() for t in tensors)
    context, weights = fn(query, keys, values, mask.to(DEVICE), v)
    objective = ((context.double() * grad_context.to(DEVICE)).sum()
                 + (weights.double() * grad_weights.to(DEVICE)).sum())
    grads = torch.autograd.grad(objective, (query, keys, values, v))
    return [t.detach().double().cpu() for t in (context, weights, *grads)]


NAMES = ("context", "weights", "d query_proj", "d keys", "d annotations", "d v")


@settings(max_examples=12)
@given(problems(), st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_fused_matches_float64_reference(problem, dtype) -> None:
    tensors, mask, grad_context, grad_weights = problem
    # Every path starts from the values `dtype` can hold, so each error below is that path's own
    # arithmetic. (A sharp softmax over saturated tanh can move the gradients more under the
    # rounding of the inputs to bfloat16 than under either path's arithmetic.)
    tensors = tuple(t.to(dtype).double() for t in tensors)
    grad_context, grad_weights = (g.to(dtype).double() for g in (grad_context, grad_weights))
    exact = _run(functional.additive_attention, tensors, mask, grad_context, grad_weights,
                 torch.float64)
    same_dtype = _run(functional.additive_attention, tensors, mask, grad_context, grad_weights,
                      dtype)
    fused = _run(triton_attention.additive_attention, tensors, mask, grad_context, grad_weights,
                 dtype)
    beams = fused[1].shape[0] // mask.shape[0]
    assert (fused[1][~mask.repeat_interleave(beams, 0)] == 0).all(), "weights at padding"
    for name, want, ref, got in zip(NAMES, exact, same_dtype, fused, strict=True):
        assert torch.isfinite(got).all(), name
        scale = want.abs().max().item() + 1.0
        bound = 2 * (ref - want).abs().max().item() + SLACK[dtype] * scale
        error = (got - want).abs().max().item()
        assert error <= bound, f"{name}: fused error {error:.3g} > {bound:.3g} ({dtype})"


def test_several_source_blocks_and_strided_query() -> None:
    """S = 97 spans two source blocks (the split softmax and its combine); the query rows are a
    strided view of a wider projection, as the decoder passes them."""
    gen = torch.Generator().manual_seed(3)
    batch, beams, src_len, align, width = 2, 3, 97, 33, 20
    projected = torch.randn(batch * beams, align + 7, generator=gen, dtype=torch.float64)
    query = projected[:, :align]                                 # row stride align + 7
    keys = torch.randn(batch, src_len, align, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, src_len, width, generator=gen, dtype=torch.float64)
    v = torch.randn(align, generator=gen, dtype=torch.float64)
    mask = torch.arange(src_len)[None] < torch.tensor([[97], [70]])
    want = functional.additive_attention(query, keys, values, mask, v)
    got = triton_attention.additive_attention(
        *(t.float().to(DEVICE) for t in (query, keys, values)), mask.to(DEVICE),
        v.float().to(DEVICE))
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g.double().cpu(), w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1].sum(-1).cpu(), torch.ones(batch * beams))


def test_opcheck() -> None:
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch of both ops."""
    gen = torch.Generator().manual_seed(0)
    batch, beams, src_len, align, width = 2, 2, 9, 5, 6

    def randn(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_(grad)

    query, keys = randn(batch * beams, align, grad=True), randn(batch, src_len, align, grad=True)
    values, v = randn(batch, src_len, width, grad=True), randn(align, grad=True)
    mask = (torch.arange(src_len)[None] < torch.tensor([[3], [9]])).to(DEVICE)
    torch.library.opcheck(torch.ops.bahdanau.additive_attention.default,
                          (query, keys, values, mask, v, False))
    weights = torch.softmax(randn(batch * beams, src_len), -1)
    torch.library.opcheck(
        torch.ops.bahdanau.additive_attention_backward.default,
        (randn(batch * beams, width), randn(batch * beams, src_len), query.detach(),
         keys.detach(), values.detach(), v.detach(), weights))


def test_errors_name_the_problem() -> None:
    fused = triton_attention.additive_attention
    q, k, h = torch.randn(2, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 5)
    v, mask = torch.randn(4), torch.ones(2, 3, dtype=torch.bool)
    q, k, h, v, mask = (t.to(DEVICE) for t in (q, k, h, v, mask))
    with pytest.raises(ValueError, match="float64"):
        fused(q.double(), k.double(), h.double(), mask, v.double())
    with pytest.raises(ValueError, match="one dtype"):
        fused(q.half(), k, h, mask, v)
    with pytest.raises(ValueError, match=r"v has shape \(3,\), expected \(4,\)"):
        fused(q, k, h, mask, v[:3])
    with pytest.raises(ValueError, match="mask has shape"):
        fused(q, k, h, mask[:, :2], v)
    with pytest.raises(ValueError, match="multiple of the batch size"):
        fused(q[:1].expand(3, 4), k, h, mask, v)
    with pytest.raises(ValueError, match="empty"):
        fused(q, k[:, :0], h[:, :0], mask[:, :0], v)


def test_module_and_model_use_the_fused_path() -> None:
    """impl="triton" through AdditiveAttention and a whole RNNsearch: same loss, gradients and
    beam search as the reference module (float32)."""
    cfg = presets.tiny(src_vocab_size=13, tgt_vocab_size=11)
    torch.manual_seed(0)
    reference = RNNSearch.from_config(replace(cfg, attention_impl="reference")).to(DEVICE)
    for p in reference.parameters():                          # away from the tiny init
        torch.nn.init.normal_(p, std=0.3)
    fused = RNNSearch.from_config(replace(cfg, attention_impl="triton"))
    fused = fused.to(DEVICE)
    fused.load_state_dict(reference.state_dict())
    src = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 4, 0, 0]], device=DEVICE)
    lengths = torch.tensor([5, 3], device=DEVICE)
    tgt_in = torch.tensor([[1, 5, 6, 7], [1, 8, 0, 0]], device=DEVICE)
    tgt_out = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]], device=DEVICE)
    losses = []
    for model in (reference, fused):
        model.zero_grad()
        loss, _ = model.loss(src, lengths, tgt_in, tgt_out)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for (name, p_ref), p_fused in zip(reference.named_parameters(), fused.parameters(),
                                      strict=True):
        torch.testing.assert_close(p_fused.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)
    reference.eval(), fused.eval()
    want = reference.translate(src, lengths, beam_size=3, max_len=6)
    got = fused.translate(src, lengths, beam_size=3, max_len=6)
    for hyps_want, hyps_got in zip(want, got, strict=True):
        assert hyps_got[0].tokens == hyps_want[0].tokens
        torch.testing.assert_close(hyps_got[0].log_prob, hyps_want[0].log_prob, rtol=1e-5,
                                   atol=1e-5)
        torch.testing.assert_close(hyps_got[0].attention, hyps_want[0].attention, rtol=1e-5,
                                   atol=1e-6)


def test_module_accepts_only_its_impl_names() -> None:
    with pytest.raises(ValueError, match="impl must be one of"):
        AdditiveAttention(4, 6, 5, impl="fused")
