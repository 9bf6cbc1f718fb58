"""The fused Triton attention against the float64 reference (forward and every gradient).

On a machine without CUDA these run through Triton's interpreter (TRITON_INTERPRET=1, set by the
test command before anything imports triton). Tolerance: the fused error against float64 may be
at most twice the same-dtype reference's error, plus a small absolute slack for the dtype; both
errors are against the float64 reference of the same inputs, rounded to the dtype. Under
autocast (mixed dtypes) the "same-dtype reference" is the reference under the same autocast.
"""

from __future__ import annotations

import inspect
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
HALF = [torch.bfloat16, torch.float16]


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


def _run(fn, tensors, mask, grad_context, grad_weights, dtypes, amp=None):
    """Outputs and the gradients of <context, grad_context> + <weights, grad_weights>, in
    float64 on the CPU, and the dtypes they came in. `dtypes`: one dtype, or one for each of
    (query_proj, keys, annotations, v); `amp`: an autocast dtype for the call, or None."""
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,) * 4
    query, keys, values, v = (t.to(DEVICE, d).requires_grad_()
                              for t, d in zip(tensors, dtypes, strict=True))
    with torch.autocast(DEVICE, dtype=amp or torch.bfloat16, enabled=amp is not None):
        context, weights = fn(query, keys, values, mask.to(DEVICE), v)
    objective = ((context.double() * grad_context.to(DEVICE)).sum()
                 + (weights.double() * grad_weights.to(DEVICE)).sum())
    grads = torch.autograd.grad(objective, (query, keys, values, v))
    outputs = (context, weights, *grads)
    return [t.detach().double().cpu() for t in outputs], [t.dtype for t in outputs]


NAMES = ("context", "weights", "d query_proj", "d keys", "d annotations", "d v")


def _assert_within_bound(exact, same_dtype, fused, slack, label) -> None:
    """Each fused error against float64 is at most twice the same-dtype reference's plus
    `slack` times the quantity's scale."""
    for name, want, ref, got in zip(NAMES, exact, same_dtype, fused, strict=True):
        assert torch.isfinite(got).all(), name
        scale = want.abs().max().item() + 1.0
        bound = 2 * (ref - want).abs().max().item() + slack * scale
        error = (got - want).abs().max().item()
        assert error <= bound, f"{name}: fused error {error:.3g} > {bound:.3g} ({label})"


@settings(max_examples=12)
@given(problems(), st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_fused_matches_float64_reference(problem, dtype) -> None:
    tensors, mask, grad_context, grad_weights = problem
    # Every path starts from the values `dtype` can hold, so each error below is that path's own
    # arithmetic. (A sharp softmax over saturated tanh can move the gradients more under the
    # rounding of the inputs to bfloat16 than under either path's arithmetic.)
    tensors = tuple(t.to(dtype).double() for t in tensors)
    grad_context, grad_weights = (g.to(dtype).double() for g in (grad_context, grad_weights))
    problem = (tensors, mask, grad_context, grad_weights)
    exact, _ = _run(functional.additive_attention, *problem, torch.float64)
    same_dtype, _ = _run(functional.additive_attention, *problem, dtype)
    fused, fused_dtypes = _run(triton_attention.additive_attention, *problem, dtype)
    assert fused_dtypes == [dtype] * 6
    beams = fused[1].shape[0] // mask.shape[0]
    assert (fused[1][~mask.repeat_interleave(beams, 0)] == 0).all(), "weights at padding"
    _assert_within_bound(exact, same_dtype, fused, SLACK[dtype], dtype)


@settings(max_examples=8)
@given(problems(), st.sampled_from(HALF), st.booleans())
def test_mixed_dtypes_under_autocast(problem, half, float32_values) -> None:
    """What autocast hands the kernel: half-precision query rows and keys (outputs of linear
    layers), v_a in float32, and values in half precision (the engine's, from a linear layer) or
    float32 (the paper-shaped decoder's annotations, from the GRU). The outputs have the
    reference's dtypes under the same autocast, each gradient its input's dtype, and the errors
    the bound of the same-dtype test with the autocast reference as the same-dtype one."""
    tensors, mask, grad_context, grad_weights = problem
    dtypes = (half, half, torch.float32 if float32_values else half, torch.float32)
    tensors = tuple(t.to(d).double() for t, d in zip(tensors, dtypes, strict=True))
    grad_context, grad_weights = (g.to(half).double() for g in (grad_context, grad_weights))
    problem = (tensors, mask, grad_context, grad_weights)
    exact, _ = _run(functional.additive_attention, *problem, torch.float64)
    autocast_ref, ref_dtypes = _run(functional.additive_attention, *problem, dtypes, amp=half)
    fused, fused_dtypes = _run(triton_attention.additive_attention, *problem, dtypes, amp=half)
    assert fused_dtypes[:2] == ref_dtypes[:2], "outputs in the reference's dtypes"
    assert fused_dtypes[2:] == list(dtypes) == ref_dtypes[2:], "gradients in the inputs' dtypes"
    _assert_within_bound(exact, autocast_ref, fused, SLACK[half], f"{dtypes} under {half}")


def test_mixed_dtypes_without_autocast_promote() -> None:
    """Outside autocast a mix is computed in float32 and returned in the promoted dtype (the
    reference itself refuses mixed matmuls there)."""
    gen = torch.Generator().manual_seed(4)
    q, k = torch.randn(4, 6, generator=gen).bfloat16(), torch.randn(2, 5, 6, generator=gen).half()
    h, v = torch.randn(2, 5, 3, generator=gen), torch.randn(6, generator=gen).bfloat16()
    mask = torch.arange(5)[None] < torch.tensor([[5], [2]])
    context, weights = triton_attention.additive_attention(
        *(t.to(DEVICE) for t in (q, k, h, mask, v)))
    assert (context.dtype, weights.dtype) == (torch.float32, torch.float32)
    want = functional.additive_attention(q.double(), k.double(), h.double(), mask, v.double())
    for w, g in zip(want, (context, weights), strict=True):
        torch.testing.assert_close(g.double().cpu(), w, rtol=1e-5, atol=1e-6)


def test_masks_with_holes_beams_and_strided_query() -> None:
    """S = 97 and A = 70 span several source blocks and alignment slices, and several programs
    (the split over S); the masks have holes
    (real tokens after padding); K = 3 beams per sentence; the query rows are a strided view of a
    wider projection, as the decoder passes them. Forward and every gradient, float32 against
    float64."""
    gen = torch.Generator().manual_seed(3)
    batch, beams, src_len, align, width = 2, 3, 97, 70, 20
    projected = torch.randn(batch * beams, align + 7, generator=gen, dtype=torch.float64)
    keys = torch.randn(batch, src_len, align, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, src_len, width, generator=gen, dtype=torch.float64)
    v = torch.randn(align, generator=gen, dtype=torch.float64)
    mask = torch.rand(batch, src_len, generator=gen) < 0.4
    mask[:, 90] = True                                           # a real token after holes
    mask[1, 70:] = False                                         # and a padded tail
    grads = (torch.randn(batch * beams, width, generator=gen, dtype=torch.float64),
             torch.randn(batch * beams, src_len, generator=gen, dtype=torch.float64))
    results = []
    for fn, dtype in ((functional.additive_attention, torch.float64),
                      (triton_attention.additive_attention, torch.float32)):
        wide, *leaves = (t.to(DEVICE, dtype, copy=True).requires_grad_()
                         for t in (projected, keys, values, v))
        query = wide[:, :align]                                  # row stride align + 7
        assert query.stride(0) == align + 7
        context, weights = fn(query, leaves[0], leaves[1], mask.to(DEVICE), leaves[2])
        ((context * grads[0].to(DEVICE, dtype)).sum()
         + (weights * grads[1].to(DEVICE, dtype)).sum()).backward()
        outputs = (context, weights, wide.grad, *(leaf.grad for leaf in leaves))
        results.append([t.detach().double().cpu() for t in outputs])
    for name, want, got in zip(("context", "weights", "d query", "d keys", "d values", "d v"),
                               *results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(results[1][1].sum(-1), torch.ones(batch * beams,
                                                                 dtype=torch.float64))
    assert (results[1][1][~mask.repeat_interleave(beams, 0)] == 0).all()


def _cache_key(kernel, args: dict) -> str:
    """The key Triton's JIT would look its compiled binaries up by for a launch with `args`
    (the specialisation of every argument and the launch options), from Triton's own binder
    and the kernel's do_not_specialize. Works under the interpreter, which compiles nothing."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import KernelParam, create_function_from_signature

    dont = getattr(kernel, "do_not_specialize", None) or kernel.kwargs["do_not_specialize"]
    signature = inspect.signature(kernel.fn)
    params = [KernelParam(i, p, i in dont or p.name in dont, False)
              for i, p in enumerate(signature.parameters.values())]
    binder = create_function_from_signature(signature, params, BaseBackend)
    _, specialization, options = binder(**args)
    return str(specialization) + str(options)


def test_no_recompilation_per_source_length() -> None:
    """Ten source lengths (multiples of 16 among them, which Triton would mark divisible) give
    every configuration of both kernels one compile key: nothing compiled depends on S."""
    ta = triton_attention
    gen = torch.Generator().manual_seed(0)
    batch, beams, align = 2, 3, 40
    forward, backward = set(), set()
    for src_len in (3, 7, 12, 16, 21, 32, 33, 47, 48, 60):
        keys = torch.randn(batch, src_len, align, generator=gen).to(DEVICE)
        query = torch.randn(batch * beams, align, generator=gen).to(DEVICE)
        v = torch.randn(align, generator=gen).to(DEVICE)
        mask = torch.ones(batch, src_len, dtype=torch.uint8, device=DEVICE)
        energies = query.new_empty(batch * beams, src_len)
        for config in ta._candidates(ta._FORWARD_CONFIGS, ta._row_block(beams)):
            _, args = ta._energy_launch(query, keys, mask, v, energies, config,
                                        ta._tanh_mode(False))
            forward.add((config, _cache_key(ta._energy_kernel, args)))
        for config in ta._candidates(ta._BACKWARD_CONFIGS, 1):
            buffers = ta._backward_buffers(query, keys, config)
            _, args = ta._backward_launch(query, keys, v, energies, *buffers, config)
            backward.add((config, _cache_key(ta._backward_kernel, args)))
    assert len(forward) == len(ta._candidates(ta._FORWARD_CONFIGS, ta._row_block(beams)))
    assert len(backward) == len(ta._candidates(ta._BACKWARD_CONFIGS, 1))


def test_tuning_times_every_candidate_once_and_never_during_capture(monkeypatch) -> None:
    """`_choose` on CUDA (stood in for here): a key seen during a CUDA graph capture gets its
    default without timing; the first key seen outside one times every candidate and keeps the
    fastest, which later calls (captured or not) reuse without timing."""
    ta = triton_attention
    candidates = ta._candidates(ta._FORWARD_CONFIGS, 1)
    speed = {config: 1.0 + i for i, config in enumerate(candidates)}
    fastest = candidates[3]
    speed[fastest] = 0.5
    timed, capturing = [], [True]

    def fake_bench(fn, **_):
        fn()
        return speed[timed[-1]]

    monkeypatch.setattr(ta, "interpreting", lambda: False)
    monkeypatch.setattr(ta, "do_bench", fake_bench)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(ta, "_TUNED", {})
    key = ("test-key",)
    assert ta._choose(key, candidates, timed.append) == candidates[0]
    assert timed == [] and ta._TUNED == {}
    capturing[0] = False
    assert ta._choose(key, candidates, timed.append) == fastest
    assert timed == list(candidates)
    capturing[0] = True
    assert ta._choose(key, candidates, timed.append) == fastest
    assert len(timed) == len(candidates)


def test_compiled_variants_counts_binaries() -> None:
    count = triton_attention.compiled_variants()
    assert isinstance(count, int)
    if not torch.cuda.is_available():
        assert count == 0                                        # the interpreter compiles none


@pytest.mark.gpu
def test_ten_source_lengths_compile_nothing_new() -> None:
    """On CUDA: after the first length has been tuned and compiled, nine more lengths (two more
    tuning buckets, timed again) add no binary."""
    gen = torch.Generator().manual_seed(0)
    batch, beams, align, width = 3, 2, 72, 24
    v = torch.randn(align, generator=gen).cuda()
    counts = []
    for src_len in (3, 7, 12, 16, 21, 32, 33, 47, 48, 60):
        query = torch.randn(batch * beams, align, generator=gen).cuda().requires_grad_()
        keys = torch.randn(batch, src_len, align, generator=gen).cuda().requires_grad_()
        values = torch.randn(batch, src_len, width, generator=gen).cuda()
        mask = torch.ones(batch, src_len, dtype=torch.bool, device="cuda")
        context, weights = triton_attention.additive_attention(query, keys, values, mask, v)
        (context.sum() + weights.sum()).backward()
        counts.append(triton_attention.compiled_variants())
    assert counts[1:] == counts[:1] * 9, counts


@pytest.mark.gpu
def test_capture_of_an_untimed_key() -> None:
    """A key first seen inside a CUDA graph capture is not timed (timing would synchronise and
    break the capture): its default configuration runs, the capture succeeds and its replay
    equals an eager call. (As for any kernel, the default's binary is compiled before the
    capture, here by launching it directly, which times nothing.)"""
    ta = triton_attention
    gen = torch.Generator().manual_seed(1)
    batch, src_len, align, width = 4, 11, 200, 16       # A = 200: a key no other test uses
    query = torch.randn(batch, align, generator=gen).cuda()
    keys = torch.randn(batch, src_len, align, generator=gen).cuda()
    values = torch.randn(batch, src_len, width, generator=gen).cuda()
    mask = torch.ones(batch, src_len, dtype=torch.bool, device="cuda")
    v = torch.randn(align, generator=gen).cuda()
    energies = query.new_empty(batch, src_len)
    default = ta._candidates(ta._FORWARD_CONFIGS, 1)[0]
    grid, args = ta._energy_launch(query, keys, mask.view(torch.uint8), v, energies, default,
                                   ta._tanh_mode(False))
    ta._energy_kernel[grid](**args)
    tuned = len(ta._TUNED)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = triton_attention.additive_attention(query, keys, values, mask, v)
    assert len(ta._TUNED) == tuned, "nothing was timed during the capture"
    graph.replay()
    eager = triton_attention.additive_attention(query, keys, values, mask, v)
    for c, e in zip(captured, eager, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)


def test_opcheck() -> None:
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch of both ops,
    the forward with autocast's mix of dtypes (bfloat16 query rows and keys, float32 values and
    v, a bfloat16 context)."""
    gen = torch.Generator().manual_seed(0)
    batch, beams, src_len, align, width = 2, 2, 9, 5, 6

    def randn(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(DEVICE).requires_grad_(grad)

    query, keys = randn(batch * beams, align, grad=True), randn(batch, src_len, align, grad=True)
    values, v = randn(batch, src_len, width, grad=True), randn(align, grad=True)
    mask = (torch.arange(src_len)[None] < torch.tensor([[3], [9]])).to(DEVICE)
    half = [t.detach().bfloat16().requires_grad_() for t in (query, keys)]   # autocast's mix
    torch.library.opcheck(torch.ops.bahdanau.additive_attention.default,
                          (*half, values, mask, v, False, torch.bfloat16))
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
    with pytest.raises(ValueError, match=r"\{'v': torch.float64\}"):
        fused(q.half(), k, h, mask, v.double())
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


def _loss_grads_and_beams(model, batch, amp):
    """Loss, parameter gradients and the best beam of each sentence, under autocast to `amp`
    (None: float32 without autocast)."""
    src, lengths, tgt_in, tgt_out = batch
    model.zero_grad()
    model.train()
    with torch.autocast(DEVICE, dtype=amp or torch.bfloat16, enabled=amp is not None):
        loss, _ = model.loss(src, lengths, tgt_in, tgt_out)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.eval()
    with torch.autocast(DEVICE, dtype=amp or torch.bfloat16, enabled=amp is not None):
        beams = [hyps[0] for hyps in model.translate(src, lengths, beam_size=3, max_len=5)]
    return loss.detach(), grads, beams


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("half", HALF)
def test_model_under_autocast(engine, half) -> None:
    """A training step and beam search under autocast with impl="triton", for both engines (the
    engine mixes half-precision values, the paper-shaped decoder float32 annotations): the
    loss, every parameter gradient and each best beam's log-probability are within twice the
    reference impl's autocast error (against float32) plus the dtype's slack, in the same
    dtypes, and beam search finds the same tokens as in float32."""
    cfg = replace(presets.tiny(src_vocab_size=13, tgt_vocab_size=11), engine=engine)
    torch.manual_seed(0)
    reference = RNNSearch.from_config(replace(cfg, attention_impl="reference")).to(DEVICE)
    for p in reference.parameters():                          # away from the tiny init
        torch.nn.init.normal_(p, std=0.3)
    fused = RNNSearch.from_config(replace(cfg, attention_impl="triton")).to(DEVICE)
    fused.load_state_dict(reference.state_dict())
    batch = tuple(torch.tensor(t, device=DEVICE) for t in (
        [[5, 6, 7, 8, 9], [9, 10, 4, 0, 0]], [5, 3], [[1, 5, 6, 7], [1, 8, 0, 0]],
        [[5, 6, 7, 2], [8, 2, 0, 0]]))
    exact = _loss_grads_and_beams(reference, batch, None)
    ref = _loss_grads_and_beams(reference, batch, half)
    got = _loss_grads_and_beams(fused, batch, half)

    def within(name, want, ref_value, value):
        want, ref_value, value = (torch.as_tensor(t) for t in (want, ref_value, value))
        assert value.dtype == ref_value.dtype, name
        scale = want.abs().max().item() + 1.0
        bound = 2 * (ref_value.double() - want.double()).abs().max().item() + SLACK[half] * scale
        error = (value.double() - want.double()).abs().max().item()
        assert error <= bound, f"{name}: error {error:.3g} > {bound:.3g} ({engine}, {half})"

    within("loss", exact[0], ref[0], got[0])
    for name in exact[1]:
        within(f"d {name}", exact[1][name], ref[1][name], got[1][name])
    for want, ref_hyp, hyp in zip(exact[2], ref[2], got[2], strict=True):
        assert hyp.tokens == want.tokens
        within("beam log-probability", want.log_prob, ref_hyp.log_prob, hyp.log_prob)


def test_module_accepts_only_its_impl_names() -> None:
    with pytest.raises(ValueError, match="impl must be one of"):
        AdditiveAttention(4, 6, 5, impl="fused")
