"""bahdanau.kernels.linear_cross_entropy against torch's cross_entropy (float64) and gradcheck."""

import pytest
import torch
import torch.nn.functional as F

from bahdanau import RNNSearch, functional, presets
from bahdanau.kernels import linear_cross_entropy


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("chunk_rows", [None, 1, 4])
def test_matches_cross_entropy(label_smoothing: float, with_bias: bool,
                               chunk_rows: int | None) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(9, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(13, generator=gen, dtype=torch.float64, requires_grad=True) if with_bias \
        else None
    target = torch.randint(0, 13, (9,), generator=gen)
    inputs = [t for t in (hidden, weight, bias) if t is not None]

    ours = linear_cross_entropy(hidden, weight, bias, target,
                                           label_smoothing=label_smoothing, chunk_rows=chunk_rows)
    ref = F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="sum",
                          label_smoothing=label_smoothing)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    for g_ours, g_ref in zip(torch.autograd.grad(ours, inputs), torch.autograd.grad(ref, inputs),
                             strict=True):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-12)


def test_gradcheck() -> None:
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 5, 2, 2])
    assert torch.autograd.gradcheck(
        lambda h, w, b: linear_cross_entropy(h, w, b, target, label_smoothing=0.2),
        (hidden, weight, bias))


def test_second_backward_recomputes() -> None:
    """The first backward reuses the logits in place; a retained graph still differentiates."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(10, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 7, (10,), generator=gen)
    loss = linear_cross_entropy(hidden, weight, None, target, chunk_rows=3)
    first = torch.autograd.grad(loss, (hidden, weight), retain_graph=True)
    second = torch.autograd.grad(loss, (hidden, weight))
    ref = torch.autograd.grad(F.cross_entropy(hidden @ weight.t(), target, reduction="sum"),
                              (hidden, weight))
    for a, b, r in zip(first, second, ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b, r, rtol=1e-10, atol=1e-12)


def test_half_precision_accumulates_in_float32() -> None:
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(6, 4, generator=gen)
    weight = torch.randn(8, 4, generator=gen)
    target = torch.randint(0, 8, (6,), generator=gen)
    loss = linear_cross_entropy(hidden.bfloat16(), weight.bfloat16(), None, target)
    assert loss.dtype == torch.float32
    ref = F.cross_entropy(F.linear(hidden.bfloat16().double(), weight.bfloat16().double()),
                          target, reduction="sum")
    torch.testing.assert_close(loss.double(), ref, rtol=1e-2, atol=1e-2)


def test_autocast_bf16_backward() -> None:
    """Under CPU autocast the matmul runs in bf16; gradients come back in the inputs' dtypes."""
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(12, 8, generator=gen, requires_grad=True)
    weight = torch.randn(20, 8, generator=gen, requires_grad=True)
    bias = torch.randn(20, generator=gen, requires_grad=True)
    target = torch.randint(0, 20, (12,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, bias, target, chunk_rows=5)
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    ref = F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="sum")
    ref_grads = torch.autograd.grad(ref, (hidden, weight, bias))
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=2e-1)
    for g, r in zip(grads, ref_grads, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-2)


def test_bad_shapes_and_smoothing() -> None:
    with pytest.raises(ValueError, match="target"):
        linear_cross_entropy(torch.zeros(3, 2), torch.zeros(5, 2), None,
                                        torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(torch.zeros(3, 2), torch.zeros(5, 2), None,
                                        torch.zeros(3, dtype=torch.long), chunk_rows=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_cross_entropy(torch.zeros(3, 2), torch.zeros(5, 2), None,
                                        torch.zeros(3, dtype=torch.long), label_smoothing=1.0)


def test_model_loss_equals_sequence_nll_of_forward() -> None:
    torch.manual_seed(0)
    model = RNNSearch.from_config(presets.tiny()).double()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    src_lengths = torch.tensor([6, 2, 4])
    src = torch.randint(4, 16, (3, 6))
    src[~functional.lengths_to_mask(src_lengths, 6)] = 0
    tgt_in = torch.randint(4, 16, (3, 5))
    tgt_out = torch.randint(4, 16, (3, 5))
    tgt_out[1, 3:] = 0
    tgt_in[1, 4:] = 0
    for smoothing in (0.0, 0.1):
        loss, n_tokens = model.loss(src, src_lengths, tgt_in, tgt_out, label_smoothing=smoothing)
        ref, ref_n = functional.sequence_nll(model(src, src_lengths, tgt_in), tgt_out, 0,
                                             label_smoothing=smoothing)
        torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
        assert int(n_tokens) == int(ref_n) == 13
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        ref_grads = torch.autograd.grad(ref, list(model.parameters()), allow_unused=True)
        for g, r in zip(grads, ref_grads, strict=True):
            if r is None:
                assert g is None or not g.any()
            else:
                torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12)
