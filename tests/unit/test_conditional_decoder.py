"""The conditional GRU decoder and the layer-normalised GRUs against float64 references written
here from their equations (bahdanau.conditional_decoder, bahdanau.layer_norm), one sentence at a
time: a step, a whole sequence, gradients, the search, and the config that rebuilds them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bahdanau import BeamSearch, ModelConfig, build_model, functional, presets
from bahdanau.conditional_decoder import ConditionalGRUDecoder
from bahdanau.decoder import AttentiveDecoder
from bahdanau.engine import ConditionalEngine
from bahdanau.errors import InputError
from bahdanau.evaluate import score_ids
from bahdanau.layer_norm import GateNorm
from bahdanau.search import greedy_search

V = 16
E, H, D = 8, 8, 12                 # presets.tiny


def random_model(decoder: str = "cgru", layer_norm: bool = True, engine: str = "fast",
                 seed: int = 0):
    """A tiny float64 model, every weight (layer norms' gains and shifts included) drawn large
    enough that a mistake shows."""
    torch.manual_seed(seed)
    cfg = replace(presets.tiny(V, V), decoder=decoder, layer_norm=layer_norm, engine=engine)
    model = build_model(cfg).double()
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


# ------------------------------------------------------------------ the references, by hand
def layer_norm(a, norm: torch.nn.LayerNorm):
    """g * (a - mean) / sqrt(var + 1e-5) + beta over the last axis (biased variance)."""
    mean = a.mean(-1, keepdim=True)
    var = ((a - mean) ** 2).mean(-1, keepdim=True)
    return norm.weight * (a - mean) / torch.sqrt(var + 1e-5) + norm.bias


def normed(a, gate_norm: GateNorm | None, size: int):
    """[LN_rz(a[:2D]); LN_n(a[2D:])], or a itself without layer norm."""
    if gate_norm is None:
        return a
    return torch.cat([layer_norm(a[..., :2 * size], gate_norm.gates),
                      layer_norm(a[..., 2 * size:], gate_norm.candidate)], -1)


def gru(x_proj, h_proj, h, size: int):
    """r, z = sigmoid(x_rz + h_rz); n = tanh(x_n + r * h_n); h' = (1 - z) * n + z * h."""
    r = torch.sigmoid(x_proj[..., :size] + h_proj[..., :size])
    z = torch.sigmoid(x_proj[..., size:2 * size] + h_proj[..., size:2 * size])
    n = torch.tanh(x_proj[..., 2 * size:] + r * h_proj[..., 2 * size:])
    return (1 - z) * n + z * h


def encode_alone(model, ids):
    """Annotations [fwd h_j; bwd h_j] of one unpadded sentence: (S,) -> (S, 2H)."""
    enc = model.encoder
    x = enc.embedding.weight[ids]
    norms = enc.norms or [None] * 4
    states = []
    for d, suffix in enumerate(("", "_reverse")):
        w_ih, w_hh = getattr(enc.rnn, f"weight_ih_l0{suffix}"), getattr(enc.rnn,
                                                                          f"weight_hh_l0{suffix}")
        b_ih, b_hh = getattr(enc.rnn, f"bias_ih_l0{suffix}"), getattr(enc.rnn,
                                                                        f"bias_hh_l0{suffix}")
        h, out = torch.zeros(H, dtype=torch.float64), []
        order = range(len(ids)) if d == 0 else reversed(range(len(ids)))
        for j in order:
            h = gru(normed(w_ih @ x[j] + b_ih, norms[2 * d], H),
                    normed(w_hh @ h + b_hh, norms[2 * d + 1], H), h, H)
            out.append(h)
        states.append(torch.stack(out if d == 0 else out[::-1]))
    return torch.cat(states, -1)


def attend(attn, query, annotations):
    """e_j = v_a^T tanh(W_a q + U_a h_j), a = softmax(e), c = sum_j a_j h_j."""
    energy = torch.tanh(attn.W_a.weight @ query + annotations @ attn.U_a.weight.t()) @ attn.v_a
    weights = torch.softmax(energy, 0)
    return weights @ annotations, weights


def decode_alone(model, annotations, tgt_in):
    """Logits (T, V) of one sentence's teacher-forced targets, by the decoder's equations:
    cGRU (s'_i from s_{i-1} and E y_{i-1}; c_i from s'_i; s_i from s'_i and c_i; output from
    s_i) or the paper's (c_i from s_{i-1}; s_i from s_{i-1} and [E y_{i-1}; c_i]; output from
    s_{i-1}), each GRU layer-normalised when the model is."""
    dec = model.decoder
    s = torch.tanh(dec.init_proj.weight @ annotations[0, H:] + dec.init_proj.bias)
    n1 = dec.gate_norms or [None, None]
    logits = []
    for y in tgt_in:
        ey = dec.embedding.weight[y]
        x = dec.input_gates.weight @ ey + dec.input_gates.bias
        if isinstance(dec, ConditionalGRUDecoder):
            n2 = dec.gate_norms2 or [None, None]
            s_first = gru(normed(x, n1[0], D), normed(dec.weight_hh @ s + dec.bias_hh, n1[1], D),
                          s, D)
            c, _ = attend(dec.attention, s_first, annotations)
            s_new = gru(normed(dec.context_gates.weight @ c, n2[0], D),
                        normed(dec.weight_hh2 @ s_first + dec.bias_hh2, n2[1], D), s_first, D)
            readout_state = s_new
        else:
            c, _ = attend(dec.attention, s, annotations)
            s_new = gru(normed(x + dec.context_gates.weight @ c, n1[0], D),
                        normed(dec.weight_hh @ s + dec.bias_hh, n1[1], D), s, D)
            readout_state = s
        t_tilde = (dec.readout_state.weight @ readout_state + dec.readout_state.bias
                   + dec.readout_embed.weight @ ey + dec.readout_context.weight @ c)
        t = torch.maximum(t_tilde[0::2], t_tilde[1::2])
        logits.append(dec.output.weight @ t + dec.output.bias)
        s = s_new
    return torch.stack(logits)


CASES = [("cgru", False, "fast"), ("cgru", True, "fast"), ("cgru", True, "reference"),
         ("paper", True, "fast"), ("paper", True, "reference")]


# ------------------------------------------------------------------ the tests
def test_gate_norm_and_one_gru_step_by_hand() -> None:
    gen = torch.Generator().manual_seed(3)
    norm = GateNorm(5).double()
    for p in norm.parameters():
        p.data = torch.randn(p.shape, generator=gen, dtype=torch.float64)
    x, hp, h = (torch.randn(2, n, generator=gen, dtype=torch.float64) for n in (15, 15, 5))
    torch.testing.assert_close(norm(x), normed(x, norm, 5), rtol=1e-12, atol=1e-12)
    got = functional.gru_update(norm(x), norm(hp), h)
    torch.testing.assert_close(got, gru(normed(x, norm, 5), normed(hp, norm, 5), h, 5),
                               rtol=1e-12, atol=1e-12)


def test_cgru_first_step_by_hand() -> None:
    """s'_1, c_1 and s_1 of the first step, from the module's weights (no layer norm)."""
    model = random_model(layer_norm=False)
    dec = model.decoder
    src, src_lengths, tgt_in, _ = batch()
    annotations = encode_alone(model, src[0, :7])
    state, memory = model.encode(src[:1], src_lengths[:1])
    out = model.step(tgt_in[:1, 0], state, memory)
    s0 = torch.tanh(dec.init_proj.weight @ annotations[0, H:] + dec.init_proj.bias)
    ey = dec.embedding.weight[tgt_in[0, 0]]
    s_first = gru(dec.input_gates.weight @ ey + dec.input_gates.bias,
                  dec.weight_hh @ s0 + dec.bias_hh, s0, D)
    c, a = attend(dec.attention, s_first, annotations)
    s1 = gru(dec.context_gates.weight @ c, dec.weight_hh2 @ s_first + dec.bias_hh2, s_first, D)
    torch.testing.assert_close(out.weights[0], a, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.state.hidden[0], s1, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("decoder", "layer_norm", "engine"), CASES)
def test_whole_sequences_equal_the_reference(decoder, layer_norm, engine) -> None:
    """Teacher-forced logits of a padded batch == each sentence alone, by the equations."""
    model = random_model(decoder, layer_norm, engine)
    assert (model.engine is not None) == (engine == "fast")
    src, src_lengths, tgt_in, tgt_lengths = batch()
    logits = model(src, src_lengths, tgt_in)
    for b in range(3):
        annotations = encode_alone(model, src[b, :src_lengths[b]])
        expected = decode_alone(model, annotations, tgt_in[b, :tgt_lengths[b]])
        torch.testing.assert_close(logits[b, :tgt_lengths[b]], expected, rtol=1e-10,
                                   atol=1e-10)


@pytest.mark.parametrize(("decoder", "layer_norm"), [("cgru", True), ("paper", True)])
def test_gradients_equal_the_reference_path(decoder, layer_norm) -> None:
    """The loss's gradients (each fast engine's sequence-level sums) equal plain autograd
    through the sentence-alone reference."""
    model = random_model(decoder, layer_norm).train()
    src, src_lengths, tgt_in, tgt_lengths = batch()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.zeros_like(tgt_in[:, :1])], 1)
    for b, n in enumerate(tgt_lengths.tolist()):
        tgt_out[b, n - 1] = 2                                    # eos
    loss, _ = model.loss(src, src_lengths, tgt_in, tgt_out)
    got = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    reference = 0
    for b, n in enumerate(tgt_lengths.tolist()):
        logits = decode_alone(model, encode_alone(model, src[b, :src_lengths[b]]),
                              tgt_in[b, :n])
        reference = reference - torch.log_softmax(logits, -1).gather(
            1, tgt_out[b, :n, None]).sum()
    torch.testing.assert_close(loss, reference, rtol=1e-10, atol=1e-10)
    expected = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    for (name, _), g, e in zip(model.named_parameters(), got, expected, strict=True):
        if e is None:
            assert g is None or not g.any(), name
            continue
        torch.testing.assert_close(g, e, rtol=1e-8, atol=1e-10, msg=name)


def test_search_scores_what_forced_decoding_scores() -> None:
    """Beam search over the cGRU with layer norm: the best hypothesis's log-probability is the
    forced-decoding score of its tokens, and beam 1 is greedy."""
    model = random_model()
    src, src_lengths, _, _ = batch()
    hyps = BeamSearch(beam_size=3, max_len=6)(model, src, src_lengths)
    for b, sentence in enumerate(hyps):
        best = sentence[0]
        [forced] = score_ids(model, [(src[b, :src_lengths[b]].tolist(), best.tokens)],
                             progress=None)
        if len(best.tokens) < 6:                               # ended by eos, which is scored
            assert forced.log_prob == pytest.approx(float(best.log_prob), abs=1e-9)
    greedy = greedy_search(model, src, src_lengths, max_len=6)
    beam1 = BeamSearch(beam_size=1, max_len=6)(model, src, src_lengths)
    assert [h.tokens for h in greedy] == [s[0].tokens for s in beam1]


def test_config_rebuilds_the_decoder_and_old_configs_are_the_paper_s() -> None:
    cfg = replace(presets.tiny(V, V), decoder="cgru", layer_norm=True, init="glorot")
    model = build_model(cfg)
    assert isinstance(model.decoder, ConditionalGRUDecoder)
    assert isinstance(model.engine, ConditionalEngine)
    for norm in (m for m in model.modules() if isinstance(m, GateNorm)):   # glorot keeps g = 1
        assert bool((norm.gates.weight == 1).all() and (norm.candidate.bias == 0).all())
    again = build_model(ModelConfig.from_dict(cfg.to_dict()))
    assert again.state_dict().keys() == model.state_dict().keys()
    old = {k: v for k, v in presets.tiny(V, V).to_dict().items()
           if k not in ("decoder", "layer_norm")}                 # an earlier checkpoint's
    paper = build_model(ModelConfig.from_dict(old))
    assert type(paper.decoder) is AttentiveDecoder and paper.encoder.norms is None
    assert paper.decoder.gate_norms is None and paper.engine is not None


@pytest.mark.parametrize(("changes", "match"), [
    ({"layer_norm": True, "gru_form": "paper"},
     "^layer_norm normalises U h.*gru_form torch, or layer_norm=False "),
    ({"decoder": "cgru", "arch": "rnnencdec"}, "^decoder cgru attends.*arch rnnsearch"),
    ({"decoder": "cgru", "gru_form": "paper"}, "^decoder cgru is built of the torch form's "
     "GRUs: it needs gru_form torch$"),
    ({"decoder": "lstm"}, "^decoder must be one of paper, cgru, got 'lstm'$"),
    ({"layer_norm": 1}, "^layer_norm must be true or false, got 1$"),
])
def test_bad_settings_are_one_line(changes, match) -> None:
    with pytest.raises(InputError, match=match):
        replace(presets.tiny(V, V), **changes)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_the_cgru_exports_and_its_programs_decode_as_greedy(layer_norm) -> None:
    """`bahdanau export`'s programs of a cGRU model, layer-normalised or not: greedy decoding
    over them gives `greedy_search`'s tokens (float64, random weights, a batch of several
    lengths)."""
    from bahdanau.serving import export_programs, greedy_decode

    model = random_model(layer_norm=layer_norm)
    programs = export_programs(model)
    src, src_lengths, _, _ = batch()
    got = greedy_decode(programs.encoder.module(), programs.step.module(), src, src_lengths,
                        bos_id=1, eos_id=2, pad_id=0, max_len=8, min_len=1)
    assert got == [h.tokens for h in greedy_search(model, src, src_lengths, max_len=8)]
