"""The attention seam and the fast engine against the paper-shaped reference decoder.

A user-defined, stateful attention (coverage, written below as a user would) and Luong's
attention go through training, beam search and alignments with no change to the decoder. For
every attention (additive in each CPU impl, Luong general and dot, coverage, none for RNNencdec)
and every decoder (the paper's in both GRU forms, the conditional GRU with and without layer
norm), the engine and the reference agree in float64: losses, every gradient, logits, weights,
decoded tokens and scores.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import NamedTuple

import pytest
import torch
from adapted_layers import adapt
from search_asserts import assert_same_hypotheses
from torch import Tensor, nn

from bahdanau import (
    AdditiveAttention,
    Attention,
    AttentiveDecoder,
    BeamSearch,
    BiRNNEncoder,
    RNNEncDec,
    RNNSearch,
    functional,
    presets,
    train_step,
)
from bahdanau.conditional_decoder import ConditionalGRUDecoder
from bahdanau.data import Batch
from bahdanau.engine import ConditionalEngine, DecoderEngine
from bahdanau.errors import InputError


class CoverageMemory(NamedTuple):
    keys: Tensor                  # (B, S, A) U h_j
    mask: Tensor                  # (B, S)


class CoverageAttention(Attention):
    """Additive attention with linguistic coverage (Tu et al. 2016): the energies also see
    C_ij = sum_{k<i} a_kj, the attention each source word has had so far, a per-row state.

        e_ij = v^T tanh(W s_{i-1} + U h_j + w_c C_ij)        C_{i+1, j} = C_ij + a_ij
    """

    def __init__(self, query_size: int, key_size: int, align_size: int) -> None:
        super().__init__(query_size=query_size, key_size=key_size)
        self.W = nn.Linear(query_size, align_size, bias=False)
        self.U = nn.Linear(key_size, align_size, bias=False)
        self.w_c = nn.Parameter(torch.full((align_size,), 0.5))
        self.v = nn.Parameter(torch.randn(align_size))

    def prepare(self, annotations: Tensor, mask: Tensor) -> CoverageMemory:
        return CoverageMemory(self.U(annotations), mask)

    def initial_state(self, memory: CoverageMemory) -> Tensor:
        return torch.zeros(memory.mask.shape, dtype=memory.keys.dtype,
                           device=memory.keys.device)             # (B, S) C_1 = 0

    def project_query(self, query: Tensor) -> Tensor:
        return self.W(query)

    def weights(self, query: Tensor, memory: CoverageMemory, state: Tensor | None) -> Tensor:
        assert state is not None
        batch, src_len, align = memory.keys.shape
        coverage = state.view(batch, -1, src_len, 1) * self.w_c  # (B, K, S, A)
        energy = torch.tanh(query.view(batch, -1, 1, align) + memory.keys[:, None] + coverage)
        weights = functional.masked_softmax(energy @ self.v, memory.mask[:, None, :])
        return weights.reshape(-1, src_len)

    def next_state(self, state: Tensor | None, weights: Tensor) -> Tensor:
        assert state is not None
        return state + weights

V = 16
ATTENTIONS = ["additive/reference", "additive/sigmoid", "luong_general", "luong_dot", "coverage",
              "none"]
# the paper's decoder in each GRU form, and the conditional GRU (torch form) without and with
# layer norm
DECODERS = ["torch", "paper", "cgru", "cgru/layer-norm"]
# every pair but RNNencdec's fixed context with the cGRU, which attends
CASES = [(attention, decoder) for attention in ATTENTIONS for decoder in DECODERS
         if not (attention == "none" and decoder.startswith("cgru"))]


def build(attention: str, decoder: str, engine: str, seed: int = 0) -> RNNSearch:
    """A tiny float64 model with weights large enough that any mistake shows in the output."""
    conditional, form = decoder.startswith("cgru"), "paper" if decoder == "paper" else "torch"
    cfg = replace(presets.tiny(V, V), gru_form=form, engine=engine, decoder_size=16,
                  decoder="cgru" if conditional else "paper",
                  layer_norm=decoder == "cgru/layer-norm")
    if attention.startswith("additive/"):
        cfg = replace(cfg, attention_impl=attention.split("/")[1])
    elif attention.startswith("luong"):
        cfg = replace(cfg, attention=attention)
    if attention == "none":
        model = RNNEncDec.from_config(cfg)
    elif attention == "coverage":
        encoder = BiRNNEncoder(V, 8, 8, gru_form=form)
        decoder_class = ConditionalGRUDecoder if conditional else AttentiveDecoder
        model = RNNSearch(encoder, decoder_class(V, 8, 16, 16, 6, gru_form=form,
                                                 attention=CoverageAttention(16, 16, 10),
                                                 layer_norm=cfg.layer_norm), engine=engine)
    else:
        model = RNNSearch.from_config(cfg)
    model = model.double()
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.data = 0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
    return model


def twins(attention: str, decoder: str) -> tuple[RNNSearch, RNNSearch]:
    """The fast and the reference model with the same weights."""
    return build(attention, decoder, "fast"), build(attention, decoder, "reference")


def batch(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    src_lengths = torch.tensor([7, 3, 5])
    src = torch.randint(4, V, (3, 7), generator=gen)
    src[functional.lengths_to_mask(src_lengths, 7).logical_not()] = 0
    tgt_lengths = torch.tensor([5, 2, 4])
    tgt = torch.randint(4, V, (3, 6), generator=gen)
    tgt[:, 0] = 1
    tgt[functional.lengths_to_mask(tgt_lengths + 1, 6).logical_not()] = 0
    return src, src_lengths, tgt[:, :-1], tgt[:, 1:]


def gradients(model: RNNSearch, label_smoothing: float = 0.0):
    src, src_lengths, tgt_in, tgt_out = batch()
    loss, n_tokens = model.loss(src, src_lengths, tgt_in, tgt_out,
                                label_smoothing=label_smoothing)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    return loss, n_tokens, grads


def assert_same_gradients(model, grads, ref_grads) -> None:
    """The engine's gradients equal the reference's, parameter by parameter (named); a
    parameter the reference leaves without gradient gets none or zeros."""
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads, strict=True):
        if r is None:
            assert g is None or not g.any(), name
        else:
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12, msg=name)


def assert_same_loss_and_gradients(fast, reference) -> None:
    """In training mode, the engine's loss (label smoothing 0.1), token count and gradients
    equal the reference's."""
    fast.train(), reference.train()
    loss, n_tokens, grads = gradients(fast, label_smoothing=0.1)
    ref_loss, ref_tokens, ref_grads = gradients(reference, label_smoothing=0.1)
    assert int(n_tokens) == int(ref_tokens) == 11
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert_same_gradients(fast, grads, ref_grads)


def assert_steps_equal_teacher_forcing(model, src, src_lengths, tgt_in, logits):
    """The model's own `step`, position by position from `encode`, gives `logits` (B, T, V);
    returns the memory `encode` built."""
    state, memory = model.encode(src, src_lengths)
    for i in range(tgt_in.shape[1]):
        out = model.step(tgt_in[:, i], state, memory)
        torch.testing.assert_close(out.logits, logits[:, i], rtol=1e-10, atol=1e-10)
        state = out.state
    return memory


@pytest.mark.parametrize(("attention", "decoder"), CASES)
def test_engine_loss_and_gradients_equal_the_reference(attention, decoder) -> None:
    assert_same_loss_and_gradients(*twins(attention, decoder))


@pytest.mark.parametrize(("attention", "decoder"), CASES)
def test_engine_logits_steps_and_search_equal_the_reference(attention, decoder) -> None:
    fast, reference = twins(attention, decoder)
    fast.eval(), reference.eval()
    src, src_lengths, tgt_in, _ = batch()
    logits, weights = fast(src, src_lengths, tgt_in, return_attention=True)
    ref_logits, ref_weights = reference(src, src_lengths, tgt_in, return_attention=True)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-10)
    assert (weights is None) == (ref_weights is None) == (attention == "none")
    if weights is not None:
        torch.testing.assert_close(weights, ref_weights, rtol=1e-10, atol=1e-10)
    assert_steps_equal_teacher_forcing(fast, src, src_lengths, tgt_in, logits)
    search = BeamSearch(beam_size=3, n_best=2, max_len=6)
    assert_same_hypotheses(search(fast, src, src_lengths), search(reference, src, src_lengths),
                           tol=1e-10)


@pytest.mark.parametrize(("attention", "decoder"), CASES)
def test_sequence_level_gradients_equal_per_step_autograd(attention, decoder) -> None:
    """The engine's per-sequence gradient sums against the same engine with them switched off."""
    model = build(attention, decoder, "fast").train()
    per_step = RNNSearch(model.encoder, model.decoder)
    per_step.engine = type(model.engine)(model.decoder, sequence_grads=False)
    _, _, summed = gradients(model)
    _, _, plain = gradients(per_step)
    assert_same_gradients(model, summed, plain)


def test_sequence_level_gradients_with_retained_graph() -> None:
    """A second backward over a retained graph adds the same gradients again."""
    model = build("additive/sigmoid", "torch", "fast").train()
    src, src_lengths, tgt_in, _ = batch()
    loss = model(src, src_lengths, tgt_in).square().sum()
    loss.backward(retain_graph=True)
    once = [p.grad.clone() for p in model.parameters()]
    loss.backward()
    for (name, p), g in zip(model.named_parameters(), once, strict=True):
        torch.testing.assert_close(p.grad, 2 * g, rtol=1e-12, atol=1e-12, msg=name)


class FixedMask(nn.Module):
    """A deterministic stand-in for the decoder's GRU-input dropout: every row's features are
    scaled by the same fixed factors, so the engine and the reference, which drop different
    tensors in a different order, must compute the same function."""

    p = 0.5  # what `AttentiveDecoder.drops_rnn_inputs` reads: the dropout is active

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.linspace(0.0, 2.0, x.shape[-1], dtype=x.dtype)


@pytest.mark.parametrize(("attention", "decoder"),
                         [case for case in CASES if case[1] in ("torch", "cgru/layer-norm")])
def test_engine_with_gru_input_dropout_equals_the_reference(attention, decoder) -> None:
    """While the GRU-input dropout is active the engine mixes h_j, not C h_j, and applies C to
    the dropped c_i (and C_o to c_i) at each step: losses, gradients, logits and its own steps
    still agree."""
    fast, reference = twins(attention, decoder)
    for model in (fast, reference):
        model.decoder.rnn_input_dropout = FixedMask()
        model.train()
    loss, _, grads = gradients(fast)
    ref_loss, _, ref_grads = gradients(reference)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert_same_gradients(fast, grads, ref_grads)
    src, src_lengths, tgt_in, _ = batch()
    logits = reference(src, src_lengths, tgt_in)
    torch.testing.assert_close(fast(src, src_lengths, tgt_in), logits, rtol=1e-10, atol=1e-10)
    memory = assert_steps_equal_teacher_forcing(fast, src, src_lengths, tgt_in, logits)
    assert memory.calls_context and memory.values.shape[-1] == 16        # h_j: C, C_o called
    fast.eval()
    assert not fast.encode(src, src_lengths)[1].calls_context         # decoding: [C; C_o] h_j


def test_engine_is_chosen_once_at_construction() -> None:
    fast, reference = twins("additive/reference", "torch")
    assert type(fast.engine) is DecoderEngine and fast.engine.decoder is fast.decoder
    assert reference.engine is None
    conditional = build("additive/reference", "cgru", "fast")
    assert type(conditional.engine) is ConditionalEngine
    assert conditional.engine.decoder is conditional.decoder

    class OwnStep(ConditionalGRUDecoder):          # a step of its own: no twin runs it
        has_fast_twin = False

    own = OwnStep(V, 8, 16, 16, 6, attention=AdditiveAttention(16, 16, 10))
    assert RNNSearch(conditional.encoder.float(), own).engine is None
    # an engine refuses a decoder whose step it does not compute, rather than run its own
    for engine, decoder in ((DecoderEngine, conditional.decoder), (ConditionalEngine, own),
                            (ConditionalEngine, fast.decoder)):
        with pytest.raises(InputError, match=f"computes the step of .*not of "
                                             f"{type(decoder).__name__}: .*fast_twin"):
            engine(decoder)

    class Subclassed(ConditionalGRUDecoder):       # the same step: the cGRU's twin
        pass

    class OwnForm(AttentiveDecoder):               # a form with an engine of its own
        pass

    class OwnFormEngine(DecoderEngine):
        twin_of = OwnForm

    decoder = Subclassed(V, 8, 16, 16, 6, attention=AdditiveAttention(16, 16, 10))
    assert type(RNNSearch(conditional.encoder, decoder).engine) is ConditionalEngine
    decoder = OwnForm(V, 8, 16, 16, 6, attention=AdditiveAttention(16, 16, 10))
    assert type(RNNSearch(conditional.encoder, decoder).engine) is OwnFormEngine
    with pytest.raises(InputError, match="DecoderEngine computes the step of AttentiveDecoder"):
        DecoderEngine(decoder)
    with pytest.raises(ValueError, match="engine must be one of"):
        RNNSearch(fast.encoder, fast.decoder, engine="quick")
    with pytest.raises(ValueError, match="engine must be one of"):
        replace(presets.tiny(), engine="quick")


# ---------------------------------------------------------------------------------- the seam
def user_model(attention: str, vocab: int = V, scale: float = 0.0, seed: int = 0) -> RNNSearch:
    """A float32 model with the given attention; with `scale`, random weights of that size."""
    torch.manual_seed(seed)
    if attention == "coverage":
        model = RNNSearch(BiRNNEncoder(vocab, 8, 8),
                          AttentiveDecoder(vocab, 8, 16, 16, 6,
                                           attention=CoverageAttention(16, 16, 10)))
    else:
        model = RNNSearch.from_config(replace(presets.tiny(vocab, vocab), decoder_size=16,
                                              attention=attention))
    if scale:
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.data = scale * torch.randn(p.shape, generator=gen)
    return model


@pytest.mark.parametrize("attention", ["coverage", "luong_general", "luong_dot"])
def test_user_attention_trains_decodes_and_aligns(attention) -> None:
    model = user_model(attention)
    src, src_lengths, _, _ = batch()
    sentences = [[6, 8, 7, 4], [9, 11], [5, 13, 15]]
    tgt_in = torch.tensor([[1] + s + [0] * (4 - len(s)) for s in sentences])
    tgt_out = torch.tensor([s + [2] + [0] * (4 - len(s)) for s in sentences])
    data = Batch(src, src_lengths, tgt_in, tgt_out, torch.arange(3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = [train_step(model, data, optimizer).loss_sum for _ in range(30)]
    assert losses[-1] < 0.2 * losses[0], losses                   # it learns the batch
    hyps = model.translate(src, src_lengths, beam_size=4, n_best=2, max_len=8)
    for b, sentence in enumerate(hyps):
        assert len(sentence) == 2
        for hyp in sentence:
            n = int(src_lengths[b])
            assert hyp.attention is not None
            assert hyp.attention.shape == (len(hyp.tokens) + 1, n)
            torch.testing.assert_close(hyp.attention.sum(1), torch.ones(len(hyp.tokens) + 1))
    assert [h[0].tokens for h in hyps] == sentences


@pytest.mark.parametrize("attention", ["coverage", "luong_general"])
def test_user_attention_wide_beam_equals_exhaustive_enumeration(attention) -> None:
    """V = 6 (4 specials, 2 words), cap 3: 39 sequences, scored by teacher forcing. The beam
    carries and reorders the attention's per-row state (coverage) correctly."""
    model = user_model(attention, vocab=6, scale=1.5, seed=3).double().eval()
    src = torch.tensor([[5, 4, 3, 5], [4, 3, 0, 0]])
    src_lengths = torch.tensor([4, 2])
    results = BeamSearch(beam_size=40, n_best=3, max_len=3)(model, src, src_lengths)
    for b in range(2):
        n = int(src_lengths[b])
        scored = []
        for length in range(1, 4):
            for words in itertools.product([3, 4, 5], repeat=length):
                tokens = list(words)
                tgt_in, tgt_out = torch.tensor([[1] + tokens]), torch.tensor([tokens + [2]])
                logp = torch.log_softmax(model(src[b:b + 1, :n], src_lengths[b:b + 1], tgt_in),
                                         -1)
                scored.append((logp.gather(2, tgt_out[..., None]).sum().item(), tokens))
        best = sorted(scored, key=lambda c: -c[0])[:3]
        assert [h.tokens for h in results[b]] == [tokens for _, tokens in best]
        for hyp, (log_prob, _) in zip(results[b], best, strict=True):
            assert hyp.log_prob == pytest.approx(log_prob, abs=1e-10)


def test_fused_query_projection_is_offered_only_by_plain_linears() -> None:
    """The engine fuses W_a into its step matmul only through `query_weight`."""
    additive = user_model("additive")
    luong_dot, coverage = user_model("luong_dot"), user_model("coverage")
    attention = additive.decoder.attention
    assert attention.query_weight() is attention.W_a.weight
    assert luong_dot.decoder.attention.query_weight() is None
    assert coverage.decoder.attention.query_weight() is None
    src, src_lengths, _, _ = batch()
    _, memory = additive.encode(src, src_lengths)
    rows = additive.decoder.recurrent_rows
    assert memory.step_weight.shape == (attention.W_a.weight.shape[0] + rows, 16)
    _, memory = coverage.encode(src, src_lengths)
    assert memory.step_weight.shape == (rows, 16)


class _Wrapped(nn.Module):
    """A layer behind a wrapper, as LoRA or quantisation wrap one: called, it is the layer, but
    it has none of the layer's attributes (`weight`, `bias`, `p`)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


class WrappedDecoder(AttentiveDecoder):
    """A decoder whose layers are wrapped: only its fusion seam says what they hold."""

    def wrap(self) -> None:
        for name in ("context_gates", "readout_context", "output", "rnn_input_dropout"):
            setattr(self, name, _Wrapped(getattr(self, name)))

    def value_weight(self) -> Tensor:
        return torch.cat([self.context_gates.layer.weight, self.readout_context.layer.weight])

    def drops_rnn_inputs(self) -> bool:
        return self.training and self.rnn_input_dropout.layer.p > 0

    def output_weights(self) -> tuple[Tensor, Tensor]:
        return self.output.layer.weight, self.output.layer.bias


@pytest.mark.parametrize("drop", [False, True])
def test_the_engine_meets_the_decoder_only_at_its_fusion_seam(drop) -> None:
    """With the decoder's layers wrapped, so that no `.weight` or `.p` can be read from them,
    the engine still equals the reference: it reads them only through `value_weight`,
    `drops_rnn_inputs` and `output_weights` (and `recurrent_weights`)."""
    models = []
    for engine in ("fast", "reference"):
        decoder = WrappedDecoder(V, 8, 16, 16, 6, attention=AdditiveAttention(16, 16, 10,
                                                                             impl="reference"))
        model = RNNSearch(BiRNNEncoder(V, 8, 8), decoder, engine=engine).double()
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.data = 0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        if drop:
            decoder.rnn_input_dropout = FixedMask()
        decoder.wrap()
        models.append(model.train())
    fast, reference = models
    loss, _, grads = gradients(fast)
    ref_loss, _, ref_grads = gradients(reference)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert_same_gradients(fast, grads, ref_grads)
    src, src_lengths, tgt_in, _ = batch()
    assert fast.encode(src, src_lengths)[1].calls_context == drop
    torch.testing.assert_close(fast(src, src_lengths, tgt_in), reference(src, src_lengths, tgt_in),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", ["additive/reference", "luong_general", "none"])
def test_wrapped_layers_that_expose_their_base_weight_are_called(attention) -> None:
    """LoRA-style wrappers that still expose the base layer's `weight`: the decoder and the
    attention offer none of their weights, so the engine calls them, and still equals the
    reference (reading the base weight would drop the low-rank change)."""
    fast, reference = twins(attention, "torch")
    for model in (fast, reference):
        adapt(model.decoder)
    decoder = fast.decoder
    assert (decoder.value_weight(), decoder.output_weights(), decoder.input_weights(),
            decoder.readout_weights()) == (None, None, None, None)
    assert decoder.attention is None or decoder.attention.query_weight() is None
    assert_same_loss_and_gradients(fast, reference)
    fast.eval(), reference.eval()
    src, src_lengths, tgt_in, _ = batch()
    logits = reference(src, src_lengths, tgt_in)
    torch.testing.assert_close(fast(src, src_lengths, tgt_in), logits, rtol=1e-10, atol=1e-10)
    memory = assert_steps_equal_teacher_forcing(fast, src, src_lengths, tgt_in, logits)
    assert memory.calls_context
    search = BeamSearch(beam_size=3, n_best=2, max_len=6)
    assert_same_hypotheses(search(fast, src, src_lengths), search(reference, src, src_lengths),
                           tol=1e-10)
