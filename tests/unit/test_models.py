"""Encoder, decoder and models against independent computations (float64, random weights)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from bahdanau import (
    AdditiveAttention,
    AttentiveDecoder,
    BiRNNEncoder,
    DecoderMemory,
    DecoderState,
    LuongAttention,
    ModelConfig,
    RNNEncDec,
    RNNSearch,
    build_model,
    functional,
    presets,
)
from bahdanau.errors import InputError

V = 16


def random_model(cls=RNNSearch, gru_form: str = "torch", seed: int = 0,
                 encoder_layers: int = 1) -> RNNSearch:
    """A tiny float64 model with weights large enough that any mistake shows in the output."""
    torch.manual_seed(seed)
    model = cls.from_config(replace(presets.tiny(V, V), gru_form=gru_form,
                                    encoder_layers=encoder_layers)).double()
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.data = 0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
    return model.eval()


def batch(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    src_lengths = torch.tensor([7, 3, 5])
    src = torch.randint(4, V, (3, 7), generator=gen)
    src[functional.lengths_to_mask(src_lengths, 7).logical_not()] = 0
    tgt_lengths = torch.tensor([5, 2, 4])
    tgt_in = torch.randint(4, V, (3, 5), generator=gen)
    tgt_in[:, 0] = 1
    tgt_in[functional.lengths_to_mask(tgt_lengths, 5).logical_not()] = 0
    return src, src_lengths, tgt_in, tgt_lengths


MODELS = [(RNNSearch, "torch"), (RNNSearch, "paper"), (RNNEncDec, "torch"), (RNNEncDec, "paper")]


# ---------------------------------------------------------------------------------- encoder
def test_encoder_padding_and_alone() -> None:
    model = random_model()
    src, src_lengths, _, _ = batch()
    annotations, mask = model.encoder(src, src_lengths)
    assert annotations.shape == (3, 7, 16) and mask.tolist()[1] == [True] * 3 + [False] * 4
    assert (annotations[~mask] == 0).all()
    for b in range(3):
        n = int(src_lengths[b])
        alone, _ = model.encoder(src[b:b + 1, :n], src_lengths[b:b + 1])
        torch.testing.assert_close(alone[0], annotations[b, :n], rtol=1e-12, atol=1e-12)
        gru = model.encoder.rnn
        emb = model.encoder.embedding(src[b:b + 1, :n])
        _, h_n = gru(emb)                                       # (2, 1, H): final fwd, bwd
        torch.testing.assert_close(annotations[b, 0, 8:], h_n[1, 0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(annotations[b, n - 1, :8], h_n[0, 0], rtol=1e-12, atol=1e-12)


def test_encoder_paper_form_by_the_equations() -> None:
    model = random_model(gru_form="paper")
    src, src_lengths, _, _ = batch()
    annotations, _ = model.encoder(src, src_lengths)
    rnn, hidden = model.encoder.rnn, 8
    for b in range(3):
        n = int(src_lengths[b])
        x = model.encoder.embedding(src[b, :n])

        def run(w_ih, b_ih, w_hh, b_hh, xs):
            h, out = torch.zeros(hidden, dtype=torch.float64), []
            for x_t in xs:
                gi = w_ih @ x_t + b_ih
                r = torch.sigmoid(gi[:hidden] + w_hh[:hidden] @ h + b_hh[:hidden])
                z = torch.sigmoid(gi[hidden:2 * hidden] + w_hh[hidden:2 * hidden] @ h
                                  + b_hh[hidden:2 * hidden])
                cand = torch.tanh(gi[2 * hidden:] + w_hh[2 * hidden:] @ (r * h) + b_hh[2 * hidden:])
                h = z * h + (1 - z) * cand
                out.append(h)
            return torch.stack(out)

        fwd = run(rnn.weight_ih_l0, rnn.bias_ih_l0, rnn.weight_hh_l0, rnn.bias_hh_l0, x)
        bwd = run(rnn.weight_ih_l0_reverse, rnn.bias_ih_l0_reverse, rnn.weight_hh_l0_reverse,
                  rnn.bias_hh_l0_reverse, x.flip(0)).flip(0)
        torch.testing.assert_close(annotations[b, :n], torch.cat([fwd, bwd], -1), rtol=1e-12,
                                   atol=1e-12)
    torch_form, _ = random_model(gru_form="torch").encoder(src, src_lengths)
    assert not torch.allclose(torch_form, annotations)


@pytest.mark.parametrize("gru_form", ["torch", "paper"])
def test_deeper_encoder_by_the_equations(gru_form: str) -> None:
    """Three layers: each runs both directions of its own weights over the annotations of the
    layer below, each sentence alone; the model's annotations are the top layer's."""
    model = random_model(gru_form=gru_form, encoder_layers=3)
    src, src_lengths, _, _ = batch()
    annotations, mask = model.encoder(src, src_lengths)
    assert annotations.shape == (3, 7, 16) and (annotations[~mask] == 0).all()
    rnn, hidden = model.encoder.rnn, 8

    def run(w_ih, b_ih, w_hh, b_hh, xs):
        h, out = torch.zeros(hidden, dtype=torch.float64), []
        for x_t in xs:
            gi, gh = w_ih @ x_t + b_ih, w_hh @ h + b_hh
            r = torch.sigmoid(gi[:hidden] + gh[:hidden])
            z = torch.sigmoid(gi[hidden:2 * hidden] + gh[hidden:2 * hidden])
            recurrent = (w_hh[2 * hidden:] @ (r * h) + b_hh[2 * hidden:] if gru_form == "paper"
                         else r * gh[2 * hidden:])
            h = z * h + (1 - z) * torch.tanh(gi[2 * hidden:] + recurrent)
            out.append(h)
        return torch.stack(out)

    for b in range(3):
        n = int(src_lengths[b])
        x = model.encoder.embedding(src[b, :n])
        for layer in range(3):
            fwd, bwd = ([getattr(rnn, f"{name}_l{layer}{suffix}")
                         for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")]
                        for suffix in ("", "_reverse"))
            assert fwd[0].shape == (3 * hidden, 8 if layer == 0 else 2 * hidden)
            x = torch.cat([run(*fwd, x), run(*bwd, x.flip(0)).flip(0)], -1)
        torch.testing.assert_close(annotations[b, :n], x, rtol=1e-12, atol=1e-12)
    one_layer, _ = random_model(gru_form=gru_form).encoder(src, src_lengths)
    assert not torch.allclose(one_layer, annotations)


def test_paper_initialisation() -> None:
    torch.manual_seed(0)
    model = RNNSearch.from_config(presets.small(2000, 2000))
    enc, dec = model.encoder, model.decoder
    for name, w in [("enc", enc.rnn.weight_hh_l0), ("dec", dec.weight_hh)]:
        for block in w.split(w.shape[1]):
            torch.testing.assert_close(block @ block.t(), torch.eye(w.shape[1]), atol=1e-4,
                                       rtol=0, msg=name)
    for w in (dec.attention.W_a.weight, dec.attention.U_a.weight):
        assert abs(w.std().item() - 0.001) < 0.0001
    assert (dec.attention.v_a == 0).all()
    for w in (enc.rnn.weight_ih_l0, dec.input_gates.weight, dec.output.weight,
              dec.readout_state.weight, dec.embedding.weight[4:]):
        assert abs(w.std().item() - 0.01) < 0.001
    for b in (enc.rnn.bias_hh_l0, dec.bias_hh, dec.output.bias, dec.init_proj.bias):
        assert (b == 0).all()
    assert (enc.embedding.weight[0] == 0).all() and (dec.embedding.weight[0] == 0).all()


@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_glorot_initialisation(cls) -> None:
    """init="glorot": each matrix uniform on +-sqrt(6 / (fan_in + fan_out)) (so its std is that
    bound / sqrt(3)), every vector 0, pad embedding rows 0."""
    torch.manual_seed(0)
    model = cls.from_config(replace(presets.small(2000, 2000), init="glorot"))
    assert model.config.init == "glorot"
    for name, param in model.named_parameters():
        if param.dim() == 1:
            assert (param == 0).all(), name
            continue
        fan_out, fan_in = param.shape
        bound = (6 / (fan_in + fan_out)) ** 0.5
        assert param.abs().max() <= bound, name
        pad_free = param[1:] if "embedding" in name else param
        assert abs(pad_free.std().item() / (bound / 3 ** 0.5) - 1) < 0.05, name
    assert (model.encoder.embedding.weight[0] == 0).all()
    assert (model.decoder.embedding.weight[0] == 0).all()


def test_init_is_checked() -> None:
    with pytest.raises(ValueError, match="init must be one of"):
        replace(presets.tiny(), init="xavier")


# ---------------------------------------------------------------------------------- decoder
@pytest.mark.parametrize(("cls", "form"), MODELS)
def test_step_equals_teacher_forcing_and_batch_equals_alone(cls, form) -> None:
    model = random_model(cls, form)
    src, src_lengths, tgt_in, tgt_lengths = batch()
    logits, attention = model(src, src_lengths, tgt_in, return_attention=True)
    assert logits.shape == (3, 5, V)
    assert (attention is None) == (cls is RNNEncDec)
    state, memory = model.encode(src, src_lengths)
    for i in range(5):
        out = model.step(tgt_in[:, i], state, memory)
        torch.testing.assert_close(out.logits, logits[:, i], rtol=1e-10, atol=1e-10)
        if attention is not None:
            torch.testing.assert_close(out.weights, attention[:, i], rtol=1e-10, atol=1e-10)
        state = out.state
    for b in range(3):
        n, t = int(src_lengths[b]), int(tgt_lengths[b])
        alone = model(src[b:b + 1, :n], src_lengths[b:b + 1], tgt_in[b:b + 1, :t])
        torch.testing.assert_close(alone[0], logits[b, :t], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("cls", "form"), MODELS)
def test_beam_rows_share_the_sentence_memory(cls, form) -> None:
    model = random_model(cls, form)
    src, src_lengths, _, _ = batch()
    state, memory = model.encode(src, src_lengths)
    gen = torch.Generator().manual_seed(5)
    beams = 3
    states = DecoderState(torch.randn(3 * beams, state.hidden.shape[1], generator=gen,
                                      dtype=torch.float64))
    tokens = torch.randint(4, V, (3 * beams,), generator=gen)
    grouped = model.step(tokens, states, memory)
    for row in range(3 * beams):
        b = row // beams
        _, own = model.encode(src[b:b + 1], src_lengths[b:b + 1])
        single = model.step(tokens[row:row + 1], states.rows(torch.tensor([row])), own)
        torch.testing.assert_close(grouped.logits[row], single.logits[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(grouped.state.hidden[row], single.state.hidden[0],
                                   rtol=1e-10, atol=1e-10)


def test_one_step_by_hand() -> None:
    """s_0, c_1 and the deep output of step 1 from the module's weights."""
    model = random_model()
    dec, attn = model.decoder, model.decoder.attention
    src, src_lengths, tgt_in, _ = batch()
    h, mask = model.encoder(src, src_lengths)
    s0 = torch.tanh(h[:, 0, 8:] @ dec.init_proj.weight.t() + dec.init_proj.bias)
    energy = torch.tanh((s0 @ attn.W_a.weight.t())[:, None] + h @ attn.U_a.weight.t()) @ attn.v_a
    a = torch.softmax(energy.masked_fill(~mask, float("-inf")), -1)
    c = torch.einsum("bs,bsc->bc", a, h)
    ey = dec.embedding(tgt_in[:, 0])
    t_tilde = dec.readout_state(s0) + ey @ dec.readout_embed.weight.t() \
        + c @ dec.readout_context.weight.t()
    t = torch.maximum(t_tilde[:, 0::2], t_tilde[:, 1::2])
    expected = t @ dec.output.weight.t() + dec.output.bias
    logits, attention = model(src, src_lengths, tgt_in, return_attention=True)
    torch.testing.assert_close(attention[:, 0], a, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(logits[:, 0], expected, rtol=1e-10, atol=1e-10)
    gates = (ey @ dec.input_gates.weight.t() + dec.input_gates.bias
             + c @ dec.context_gates.weight.t())
    s1 = functional.gru_update(gates, s0 @ dec.weight_hh.t() + dec.bias_hh, s0)
    for state, memory in (dec.init_state(h, mask), model.encode(src, src_lengths)):
        step = dec.step if isinstance(memory, DecoderMemory) else model.step
        torch.testing.assert_close(step(tgt_in[:, 0], state, memory).state.hidden, s1,
                                   rtol=1e-10, atol=1e-12)


def test_rnnencdec_fixed_context_by_hand() -> None:
    model = random_model(RNNEncDec)
    src, src_lengths, _, _ = batch()
    h, _ = model.encoder(src, src_lengths)
    _, memory = model.decoder.init_state(*model.encoder(src, src_lengths))
    last = src_lengths - 1
    fixed = torch.tanh(model.decoder.context_proj(
        torch.cat([h[torch.arange(3), last, :8], h[:, 0, 8:]], -1)))
    torch.testing.assert_close(memory.context, fixed, rtol=1e-12, atol=1e-12)
    assert memory.attention is None


@pytest.mark.parametrize(("cls", "form"), MODELS)
def test_loss_and_gradients_equal_forward_nll(cls, form) -> None:
    model = random_model(cls, form).train()
    src, src_lengths, tgt_in, _ = batch()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.zeros(3, 1, dtype=torch.long)], 1)
    tgt_out[tgt_in == 0] = 0
    tgt_out[torch.arange(3), (tgt_in != 0).sum(1) - 1] = 2
    loss, n = model.loss(src, src_lengths, tgt_in, tgt_out)
    ref, ref_n = functional.sequence_nll(model(src, src_lengths, tgt_in), tgt_out, 0)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    assert int(n) == int(ref_n) == int((tgt_out != 0).sum())
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    ref_grads = torch.autograd.grad(ref, params, allow_unused=True)
    for g, r in zip(grads, ref_grads, strict=True):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12)


def test_hand_assembled_equals_from_config() -> None:
    cfg = presets.tiny(V, V)
    torch.manual_seed(3)
    built = RNNSearch.from_config(cfg)
    attention = AdditiveAttention(query_size=12, key_size=16, align_size=10)
    encoder = BiRNNEncoder(V, 8, 8)
    decoder = AttentiveDecoder(V, 8, 12, 16, 6, attention=attention)
    by_hand = RNNSearch(encoder, decoder)
    assert [(n, p.shape) for n, p in by_hand.named_parameters()] == \
        [(n, p.shape) for n, p in built.named_parameters()]
    by_hand.load_state_dict(built.state_dict())
    src, src_lengths, tgt_in, _ = batch()
    torch.testing.assert_close(by_hand(src, src_lengths, tgt_in), built(src, src_lengths, tgt_in))


# ---------------------------------------------------------------------------------- configs
def test_rnnsearch_50_sizes_and_parameter_count() -> None:
    cfg = presets.rnnsearch_50(30000, 30000)
    assert (cfg.embed_size, cfg.hidden_size, cfg.decoder_size, cfg.align_size,
            cfg.maxout_size) == (620, 1000, 1000, 1000, 500)
    E, H, D, A, L, Vs, Vt = 620, 1000, 1000, 1000, 500, 30000, 30000
    encoder = Vs * E + 2 * (3 * H * (E + H) + 6 * H)
    alignment = A * D + A * 2 * H + A
    decoder = (Vt * E + (D * H + D) + (3 * D * E + 3 * D) + 3 * D * 2 * H + (3 * D * D + 3 * D)
               + (2 * L * D + 2 * L) + 2 * L * E + 2 * L * 2 * H + (Vt * L + Vt))
    model = RNNSearch.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == encoder + alignment + decoder == 80451000
    baseline = RNNEncDec.from_config(cfg)
    fixed_context = 2 * H * 2 * H + 2 * H
    assert sum(p.numel() for p in baseline.parameters()) == encoder + decoder + fixed_context


def test_build_model_dispatch_and_config_round_trip() -> None:
    cfg = presets.tiny(V, V)
    assert type(build_model(cfg)) is RNNSearch
    enc_dec = build_model(replace(cfg, arch="rnnencdec"))
    assert type(enc_dec) is RNNEncDec and enc_dec.config.arch == "rnnencdec"
    assert RNNEncDec.from_config(cfg).config.arch == "rnnencdec"
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(("field", "value", "match"), [
    ("embed_size", 0, "embed_size"),
    ("src_vocab_size", 4, "src_vocab_size"),
    ("arch", "transformer", "arch"),
    ("attention_impl", "cuda", "attention_impl"),
    ("gru_form", "lstm", "gru_form"),
    ("dropout", 1.0, "dropout"),
    ("dropout_rnn_inputs", 1.0, "^dropout_rnn_inputs must be"),
    ("dropout_rnn_inputs", -0.1, "^dropout_rnn_inputs must be"),
    ("dropout_deep_output", "0.1", "^dropout_deep_output must be"),
    ("dropout_deep_output", float("nan"), "^dropout_deep_output must be"),
    ("eos_id", 1, "distinct"),
    ("unk_id", 16, "unk_id"),
])
def test_config_validation(field, value, match) -> None:
    with pytest.raises(ValueError, match=match):
        replace(presets.tiny(V, V), **{field: value})


def test_config_from_dict_unknown_field() -> None:
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**presets.tiny().to_dict(), "layers": 2})


def test_config_from_dict_of_an_earlier_version_takes_the_later_fields_defaults() -> None:
    stored = presets.tiny().to_dict()
    del stored["dropout_rnn_inputs"], stored["dropout_deep_output"]
    assert ModelConfig.from_dict(stored) == presets.tiny()


DROPOUTS = ["dropout", "dropout_rnn_inputs", "dropout_deep_output"]


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize(("cls", "form"), MODELS[::3])
@pytest.mark.parametrize("field", DROPOUTS)
def test_dropout_changes_outputs_in_train_mode_only(field, cls, form, engine) -> None:
    """Each placement is the identity in eval mode, and dropout 0 (the paper) is the identity
    in train mode too: bit for bit the paper model's outputs."""
    weights = random_model(cls, form)
    paper, dropped = (cls.from_config(replace(weights.config, engine=engine, **changes)).double()
                      for changes in ({}, {field: 0.5}))
    for model in (paper, dropped):
        model.load_state_dict(weights.state_dict())
    src, src_lengths, tgt_in, _ = batch()
    expected = paper.eval()(src, src_lengths, tgt_in)
    assert torch.equal(dropped.eval()(src, src_lengths, tgt_in), expected)
    assert torch.equal(paper.train()(src, src_lengths, tgt_in), expected)
    torch.manual_seed(0)
    changed = dropped.train()(src, src_lengths, tgt_in)
    assert not torch.allclose(changed, expected)
    torch.manual_seed(0)
    assert torch.equal(dropped(src, src_lengths, tgt_in), changed)   # a function of the RNG


def test_padding_never_gives_nan() -> None:
    model = random_model().train()
    src = torch.tensor([[5, 0, 0, 0, 0], [5, 6, 7, 8, 9]])
    tgt = torch.tensor([[1, 5, 0], [1, 6, 7]])
    out = torch.tensor([[5, 2, 0], [6, 7, 2]])
    loss, _ = model.loss(src, torch.tensor([1, 5]), tgt, out)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert F.softmax(model(src, torch.tensor([1, 5]), tgt), -1).isfinite().all()


# ---------------------------------------------------------------------------------- the door
@pytest.mark.parametrize("build, name", [
    (lambda: AdditiveAttention(query_size=0, key_size=16, align_size=10), "query_size"),
    (lambda: AdditiveAttention(12, 16, -3), "align_size"),
    (lambda: AdditiveAttention(12, 16.0, 10), "key_size"),
    (lambda: LuongAttention(12, 0), "key_size"),
    (lambda: LuongAttention(True, 16), "query_size"),
])
def test_attention_sizes_must_be_positive_ints(build, name) -> None:
    with pytest.raises(InputError, match=rf"Attention: {name} must be a positive int, got "):
        build()


@pytest.mark.parametrize("row", [[5, 2, 7, 0, 0], [5, 6, 2, 2, 0]])
def test_loss_refuses_tokens_after_eos(row) -> None:
    # the example (a word after eos) and its variant (a second eos)
    model = random_model()
    src, src_lengths, tgt_in, _ = batch()
    tgt_out = torch.tensor([[6, 7, 8, 9, 2], row, [9, 8, 7, 2, 0]])
    tgt_in[1] = torch.tensor([1, 5, 6, 7, 8])
    with pytest.raises(InputError, match=r"^tgt_out row 1 has token \d+ at position [23], after "
                                         r"its eos \(=2\)"):
        model.loss(src, src_lengths, tgt_in, tgt_out)
    tgt_out[1] = torch.tensor([5, 2, 0, 0, 0])                 # padding after eos: fine
    loss, tokens = model.loss(src, src_lengths, tgt_in, tgt_out)
    assert int(tokens) == 5 + 2 + 4 and torch.isfinite(loss)


def test_step_refuses_bad_tokens_and_states_in_one_line() -> None:
    model = random_model()
    src, src_lengths, _, _ = batch()
    state, memory = model.encode(src, src_lengths)
    tokens = torch.tensor([1, 1, 1])
    assert model.step(tokens, state, memory).logits.shape == (3, V)
    D = model.decoder.hidden_size
    wide = DecoderState(torch.zeros(3, D + 1, dtype=torch.float64))
    for args, match in (((torch.tensor([1, V, 1]), state), f"token id {V}, outside"),
                        ((torch.tensor([1, -1, 1]), state), "token id -1, outside"),
                        ((torch.tensor([1.0, 1.0, 1.0]), state), "must hold integers"),
                        ((tokens[:2], state), rf"state.hidden has shape \(3, {D}\), expected "
                                              rf"\(2, {D}\)"),
                        ((tokens, wide), rf"state.hidden has shape \(3, {D + 1}\)"),
                        ((tokens, state.hidden), "state must be the DecoderState")):
        with pytest.raises(InputError, match=match) as err:
            model.step(*args, memory)
        assert "\n" not in str(err.value)
