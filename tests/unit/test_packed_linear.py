"""The step matmuls with oneDNN-packed weights against `F.linear` and the reference decoder.

Packing runs only for float32 CPU tensors under inference mode, for a search; there the packed
product must equal `F.linear` to float32 rounding, and a search through the packed engine must
find what the reference decoder finds. Everywhere else (autograd, no_grad, autocast, float64,
teacher forcing, export) nothing is packed, so the float64 tests of tests/unit/test_engine.py
cover the unpacked path.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from adapted_layers import adapt
from search_asserts import assert_same_hypotheses

from bahdanau import BeamSearch, RNNSearch, presets
from bahdanau.kernels import packed_linear
from bahdanau.serving import export_programs

needs_onednn = pytest.mark.skipif(not packed_linear.available(),
                                  reason="this build of torch has no oneDNN linear ops")


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_packed_product_equals_f_linear_for_any_number_of_rows(bias) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 48, generator=gen)
    b = torch.randn(300, generator=gen) if bias else None
    with torch.inference_mode():
        packed = packed_linear.pack_for_steps(weight, rows=8)
        assert packed is not None
        for rows in (1, 3, 8, 40):                       # fewer, as many and more than packed for
            x = torch.randn(rows, 48, generator=gen)
            got = packed_linear.linear(x, weight, b, packed)
            torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
        x = torch.randn(40, 96, generator=gen)[:, ::2]   # a strided input
        torch.testing.assert_close(packed_linear.linear(x, weight, b, packed),
                                   F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
        x = torch.randn(5, 48, generator=gen).double()    # another dtype: F.linear's answer
        b64 = None if b is None else b.double()
        assert torch.equal(packed_linear.linear(x, weight.double(), b64, packed),
                           F.linear(x, weight.double(), b64))


def test_nothing_is_packed_outside_inference_mode_or_for_float64(monkeypatch) -> None:
    weight = torch.randn(6, 4)
    assert packed_linear.pack_for_steps(weight, 2) is None              # autograd on
    with torch.no_grad():                                               # traceable for export
        assert packed_linear.pack_for_steps(weight, 2) is None
    with torch.inference_mode():
        assert packed_linear.pack_for_steps(weight.double(), 2) is None
        with torch.autocast("cpu", dtype=torch.bfloat16):              # bf16 inputs
            assert packed_linear.pack_for_steps(weight, 2) is None
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)   # oneDNN switched off
        assert packed_linear.pack_for_steps(weight, 2) is None
    x = torch.randn(3, 4, requires_grad=True)
    packed_linear.linear(x, weight, None, None).sum().backward()       # F.linear: differentiable
    torch.testing.assert_close(x.grad, weight.sum(0).expand(3, 4))


def model(engine: str, decoder: str = "paper") -> RNNSearch:
    cfg = replace(presets.tiny(30, 30), engine=engine, decoder_size=16, decoder=decoder)
    torch.manual_seed(0)
    net = RNNSearch.from_config(cfg).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.5)
    return net


@needs_onednn
@pytest.mark.parametrize("decoder", ["paper", "cgru"])
def test_search_through_packed_weights_equals_the_reference_decoder(decoder) -> None:
    fast, reference = model("fast", decoder), model("reference", decoder)
    reference.load_state_dict(fast.state_dict())
    gen = torch.Generator().manual_seed(1)
    src_lengths = torch.tensor([7, 3, 5, 6])
    src = torch.randint(4, 30, (4, 7), generator=gen)
    src[torch.arange(7) >= src_lengths[:, None]] = 0
    with torch.inference_mode():
        assert fast(src, src_lengths, src[:, :3]).dtype == torch.float32   # teacher forcing:
        state, memory = fast._encode(src, src_lengths)                     # nothing packed
        assert all(packed is None for packed in memory.packed)
        state, memory = fast.encode(src, src_lengths)
        assert all(packed is not None for packed in memory.packed)         # all five maps
        kept = memory.select(torch.tensor([0, 2]))
        assert kept.packed is memory.packed
        ref_state, ref_memory = reference.encode(src, src_lengths)
        tokens = torch.full((4,), 1)
        for _ in range(4):
            out, ref = fast.step(tokens, state, memory), reference.step(tokens, ref_state,
                                                                       ref_memory)
            torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
            state, ref_state, tokens = out.state, ref.state, ref.logits.argmax(-1)
    search = BeamSearch(beam_size=3, n_best=2, max_len=8)
    assert_same_hypotheses(search(fast, src, src_lengths), search(reference, src, src_lengths),
                           tol=1e-4)


@needs_onednn
def test_wrapped_layers_are_called_not_packed() -> None:
    """LoRA-style wrappers exposing their base `weight`: only the step weight is packed (the
    GRU's recurrent rows, the decoder's own parameters; the wrapped W_a is called), and the
    search still finds what the reference finds."""
    fast, reference = model("fast"), model("reference")
    reference.load_state_dict(fast.state_dict())
    for net in (fast, reference):
        adapt(net.decoder)
    gen = torch.Generator().manual_seed(3)
    src, src_lengths = torch.randint(4, 30, (3, 6), generator=gen), torch.tensor([6, 6, 6])
    with torch.inference_mode():
        packed = fast.encode(src, src_lengths)[1].packed
    assert packed.step is not None and packed[1:] == (None, None, None, None)
    search = BeamSearch(beam_size=3, n_best=2, max_len=8)
    assert_same_hypotheses(search(fast, src, src_lengths), search(reference, src, src_lengths),
                           tol=1e-4)


@needs_onednn
def test_search_under_autocast_and_export_inside_inference_mode(tmp_path) -> None:
    """Neither packs: a bf16 autocast search runs as without packing, and programs exported
    inside a caller's inference mode hold no packed weight (they can be saved)."""
    net, gen = model("fast"), torch.Generator().manual_seed(2)
    src, src_lengths = torch.randint(4, 30, (3, 5), generator=gen), torch.tensor([5, 5, 5])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hyps = BeamSearch(beam_size=2, max_len=4)(net, src, src_lengths)
    assert [len(h) for h in hyps] == [1, 1, 1]
    with torch.inference_mode():
        programs = export_programs(net)
    graph = str(programs.step.graph)
    assert "mkldnn" not in graph and "linear_pointwise" not in graph
    torch.export.save(programs.step, tmp_path / "step.pt2")           # opaque tensors cannot
    assert (tmp_path / "step.pt2").stat().st_size > 0                   # be saved
