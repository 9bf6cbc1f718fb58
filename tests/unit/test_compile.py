"""The model traces whole: `torch.compile(fullgraph=True)` of the loss and of one decoder step,
and `torch.export` of one decoder step with dynamic batch and source length, all equal to eager
(float64) on a shape other than the one traced.

A graph break fails `fullgraph=True`, so these are what keeps the training and decoding steps
capturable (CUDA graphs need the same). RNN tracing is switched on only inside the tests.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch._dynamo
from torch import Tensor, nn
from torch.export import Dim

from bahdanau import DecoderState, RNNEncDec, RNNSearch, functional, presets

V = 16
SETUPS = [("fast", "additive"), ("fast", "luong_general"), ("reference", "additive"),
          ("fast", None)]


def model_for(engine: str, attention: str | None) -> RNNSearch:
    cfg = replace(presets.tiny(V, V), engine=engine, attention=attention or "additive")
    torch.manual_seed(0)
    model = (RNNSearch if attention else RNNEncDec).from_config(cfg).double()
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.data = 0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
    return model


def batch(sizes: tuple[int, ...], seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Padded source, lengths (the longest = S), tgt_in and tgt_out for the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    src_lengths = torch.tensor(sizes)
    src = torch.randint(4, V, (len(sizes), max(sizes)), generator=gen)
    src[~functional.lengths_to_mask(src_lengths, max(sizes))] = 0
    tgt = torch.randint(4, V, (len(sizes), 6), generator=gen)
    tgt_lengths = torch.tensor([6 - i % 3 for i in range(len(sizes))])
    tgt[~functional.lengths_to_mask(tgt_lengths, 6)] = 0
    tgt_in = torch.cat([torch.ones(len(sizes), 1, dtype=torch.long), tgt[:, :-1]], 1)
    tgt_in[~functional.lengths_to_mask(tgt_lengths, 6)] = 0
    return src, src_lengths, tgt_in, tgt


def assert_grads_equal(model: nn.Module, loss_fn, *args) -> None:
    params = [p for p in model.parameters()]
    outputs = []
    for fn in loss_fn:
        loss, n_tokens = fn(*args)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        outputs.append((loss, n_tokens, grads))
    (loss, n, grads), (ref, ref_n, ref_grads) = outputs
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-10)
    assert int(n) == int(ref_n)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads, strict=True):
        if r is None:
            assert g is None or not g.any(), name
        else:
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize(("engine", "attention"), SETUPS)
def test_compiled_loss_is_one_graph_equal_to_eager(engine, attention) -> None:
    model = model_for(engine, attention).train()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = torch.compile(model.loss, fullgraph=True, backend="aot_eager", dynamic=True)
        for sizes, seed in (((5, 2, 4), 1), ((3, 7, 1, 6), 2)):  # and a second shape
            assert_grads_equal(model, (compiled, model.loss), *batch(sizes, seed))


@pytest.mark.parametrize(("engine", "attention"), SETUPS)
def test_compiled_decoder_step_is_one_graph_equal_to_eager(engine, attention) -> None:
    model = model_for(engine, attention).eval()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = torch.compile(model.step, fullgraph=True, backend="aot_eager", dynamic=True)
        for sizes, seed in (((5, 2, 4), 1), ((3, 7, 1, 6), 2)):
            src, src_lengths, tgt_in, _ = batch(sizes, seed)
            state, memory = model.encode(src, src_lengths)
            got, want = compiled(tgt_in[:, 0], state, memory), model.step(tgt_in[:, 0], state,
                                                                           memory)
            for g, w in zip((got.logits, got.state.hidden, got.weights),
                            (want.logits, want.state.hidden, want.weights), strict=True):
                torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


class DecoderStep(nn.Module):
    """One decoder step as a module (what `torch.export` takes)."""

    def __init__(self, model: RNNSearch) -> None:
        super().__init__()
        self.model = model

    def forward(self, prev_tokens: Tensor, state: DecoderState, memory) -> tuple[Tensor, ...]:
        out = self.model.step(prev_tokens, state, memory)
        return (out.logits, out.state.hidden) + (() if out.weights is None else (out.weights,))


def step_dynamic_shapes(memory, batch: Dim, src_len: Dim):
    """Dynamic dims of `encode`'s memory: every per-sentence tensor has B rows, and those over
    source positions have S columns; the engine's step weight and bias have neither (nor its
    query_rows and calls_context, an int and a bool)."""
    def dims(tensor: Tensor | None, over_source: bool) -> dict[int, Dim] | None:
        if tensor is None:
            return None
        return {0: batch, 1: src_len} if over_source else {0: batch}

    def decoder_memory(m):
        attention = None
        if m.attention is not None:
            attention = type(m.attention)(*(dims(t, True) for t in m.attention))
        return type(m)(dims(m.annotations, True), dims(m.mask, True), attention,
                       dims(m.context, False))

    if not hasattr(memory, "step_weight"):
        return decoder_memory(memory)
    return type(memory)(decoder_memory(memory.decoder),
                        dims(memory.values, memory.values.dim() == 3), step_weight=None,
                        step_bias=None, query_rows=None, calls_context=None)


@pytest.mark.parametrize(("engine", "attention"), SETUPS)
def test_exported_decoder_step_equals_eager_on_another_shape(engine, attention) -> None:
    model = model_for(engine, attention).eval()
    src, src_lengths, tgt_in, _ = batch((5, 2, 4), 1)
    state, memory = model.encode(src, src_lengths)
    batch_dim, src_dim = Dim("batch", min=1), Dim("src_len", min=1)
    program = torch.export.export(
        DecoderStep(model), (tgt_in[:, 0], state, memory),
        dynamic_shapes=({0: batch_dim}, DecoderState({0: batch_dim}, None),
                        step_dynamic_shapes(memory, batch_dim, src_dim)))
    src, src_lengths, tgt_in, _ = batch((3, 7, 1, 6, 2), 2)
    state, memory = model.encode(src, src_lengths)
    got = program.module()(tgt_in[:, 0], state, memory)
    want = DecoderStep(model)(tgt_in[:, 0], state, memory)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
