"""BiRNNEncoder's traced path (no PackedSequence) against its eager paths, compiled and exported."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.export import Dim

from bahdanau import BiRNNEncoder, ModelConfig, RNNSearch, functional
from bahdanau.encoder import _gru_layer, _gru_layer_scan

V, E, H = 13, 6, 5
FORMS = ["torch", "paper"]
# (gru_form, num_layers): each form, one layer and stacked
STACKS = [("torch", 1), ("paper", 1), ("torch", 3), ("paper", 2)]


def random_encoder(gru_form: str, seed: int = 0, *, layer_norm: bool = False,
                   num_layers: int = 1) -> BiRNNEncoder:
    """A float64 encoder with weights large enough that any mistake shows in the output."""
    encoder = BiRNNEncoder(V, E, H, gru_form=gru_form, layer_norm=layer_norm,
                           num_layers=num_layers).double()
    gen = torch.Generator().manual_seed(seed)
    for p in encoder.parameters():
        p.data = 0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
    return encoder


def padded_batch(lengths: list[int], src_len: int, seed: int = 1,
                 vocab: int = V) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    src_lengths = torch.tensor(lengths)
    src = torch.randint(1, vocab, (len(lengths), src_len), generator=gen)
    src[~functional.lengths_to_mask(src_lengths, src_len)] = 0
    return src, src_lengths


def padded_path(encoder: BiRNNEncoder, src: torch.Tensor, src_lengths: torch.Tensor):
    """The path `forward` takes under tracing, called directly in eager mode."""
    mask = functional.lengths_to_mask(src_lengths, src.shape[1])
    return encoder._padded_gru(encoder.embedding(src), src_lengths, mask), mask


def grads(encoder: BiRNNEncoder, out: torch.Tensor, weights: torch.Tensor) -> dict:
    encoder.zero_grad()
    (out * weights).sum().backward()
    return {name: p.grad.clone() for name, p in encoder.named_parameters()}


def no_padded_path(*args, **kwargs):
    raise AssertionError("eager forward took the padded path")


@pytest.mark.parametrize(("gru_form", "num_layers"), STACKS)
def test_padded_path_equals_eager_path(gru_form: str, num_layers: int, monkeypatch) -> None:
    """float64: annotations and every parameter's gradient, mixed lengths (1 and full incl.)."""
    encoder = random_encoder(gru_form, num_layers=num_layers)
    src, src_lengths = padded_batch([6, 1, 4, 6, 2], 6)
    with monkeypatch.context() as patch:                     # packed (torch) or loop (paper)
        patch.setattr(encoder, "_padded_gru", no_padded_path)
        eager, mask = encoder(src, src_lengths)
    padded, padded_mask = padded_path(encoder, src, src_lengths)
    assert torch.equal(mask, padded_mask)
    assert (padded[~mask] == 0).all() and (eager[~mask] == 0).all()
    assert (padded[mask].abs() > 1e-3).any(dim=-1).all()
    torch.testing.assert_close(padded, eager, rtol=1e-12, atol=1e-12)
    # a sentence alone, without padding, gives the same annotations (the reversal is per row)
    alone, _ = encoder(src[2:3, :4], src_lengths[2:3])
    torch.testing.assert_close(padded[2, :4], alone[0], rtol=1e-12, atol=1e-12)

    weights = torch.randn(eager.shape, generator=torch.Generator().manual_seed(2),
                          dtype=torch.float64)
    want, got = grads(encoder, eager, weights), grads(encoder, padded, weights)
    assert set(got) == {name for name, _ in encoder.named_parameters()}
    for name in want:
        assert want[name].abs().max() > 1e-3, name
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=name)


def test_layer_normalised_layers_stack() -> None:
    """Two layer-normalised layers equal two one-layer encoders of the same weights and norms,
    the second run over the first's annotations; a sentence alone gives the same."""
    deep = random_encoder("torch", layer_norm=True, num_layers=2)
    assert deep.norms is not None and len(deep.norms) == 8
    weights = deep.state_dict()
    first = BiRNNEncoder(V, E, H, layer_norm=True).double()
    first.load_state_dict({name: value for name, value in weights.items()
                           if "_l1" not in name and not name.startswith(tuple(
                               f"norms.{k}." for k in range(4, 8)))})
    second = BiRNNEncoder(V, 2 * H, H, layer_norm=True).double()
    second.load_state_dict({"embedding.weight": second.embedding.weight} | {
        name.replace("_l1", "_l0"): value for name, value in weights.items() if "_l1" in name} | {
        f"norms.{int(name.split('.')[1]) - 4}.{name.split('.', 2)[2]}": value
        for name, value in weights.items()
        if name.startswith(tuple(f"norms.{k}." for k in range(4, 8)))})
    src, src_lengths = padded_batch([6, 1, 4, 6, 2], 6)
    got, mask = deep(src, src_lengths)
    below, _ = first(src, src_lengths)
    want = second._norm_gru(below, mask)
    assert (got[~mask] == 0).all() and (got[mask].abs() > 1e-3).any(dim=-1).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, below)
    alone, _ = deep(src[2:3, :4], src_lengths[2:3])
    torch.testing.assert_close(got[2, :4], alone[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gru_form", FORMS)
def test_gru_layer_op(gru_form: str) -> None:
    """The registered op: schema, fake implementation, autograd (finite differences)."""
    gen = torch.Generator().manual_seed(3)
    args = [torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
            for shape in [(2, 3, 4), (9, 4), (9, 3), (9,), (9,)]]
    op = torch.ops.bahdanau.gru_layer.default
    torch.library.opcheck(op, (*args, gru_form == "paper"))
    assert torch.autograd.gradcheck(lambda *a: op(*a, gru_form == "paper"), args)


@pytest.mark.parametrize("gru_form", FORMS)
def test_scan_layer_equals_the_loop(gru_form: str) -> None:
    """`_gru_layer_scan` (the exported GRU: it runs as traced by `torch.export`) gives
    `_gru_layer`'s states in float64 at the traced shape and another (B and S dynamic), as one
    scan and no registered op."""
    gen = torch.Generator().manual_seed(6)
    weights = [0.5 * torch.randn(shape, generator=gen, dtype=torch.float64)
               for shape in [(9, 4), (9, 3), (9,), (9,)]]
    paper = gru_form == "paper"

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterList(weights)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _gru_layer_scan(x, *self.weights, paper)

    x = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64)
    program = torch.export.export(Layer(), (x,), dynamic_shapes=({0: Dim("b"), 1: Dim("s")},))
    assert "higher_order.scan" in program.graph_module.code
    assert "bahdanau" not in program.graph_module.code
    for inputs in (x, torch.randn(3, 8, 4, generator=gen, dtype=torch.float64)):
        want = _gru_layer(inputs, *weights, paper)
        assert want.abs().min() > 1e-6                          # no state is trivially 0
        torch.testing.assert_close(program.module()(inputs), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("gru_form", "num_layers"), STACKS)
def test_compile_fullgraph_equals_eager(gru_form: str, num_layers: int) -> None:
    """No graph break (fullgraph), value checks skipped in the graph, same outputs and grads."""
    torch._dynamo.reset()
    encoder = random_encoder(gru_form, num_layers=num_layers)
    backend = CompileCounterWithBackend("aot_eager")      # aot_eager, recording the graphs
    compiled = torch.compile(encoder, fullgraph=True, backend=backend)
    for lengths, src_len in [([5, 1, 3], 5), ([7, 2, 7, 4], 7)]:
        src, src_lengths = padded_batch(lengths, src_len)
        want, want_mask = encoder(src, src_lengths)
        with torch._dynamo.config.patch(allow_rnn=True):   # lets dynamo read encoder.rnn
            got, got_mask = compiled(src, src_lengths)
        assert torch.equal(got_mask, want_mask) and (got[~got_mask] == 0).all()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(4),
                              dtype=torch.float64)
        expected, actual = grads(encoder, want, weights), grads(encoder, got, weights)
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], rtol=1e-10, atol=1e-12,
                                       msg=name)
    assert backend.graphs
    for graph in backend.graphs:           # the padded path, both directions of each layer
        assert graph.code.count("bahdanau.gru_layer") == 2 * num_layers
        assert "pack" not in graph.code
    torch._dynamo.reset()


@pytest.mark.parametrize(("gru_form", "num_layers", "layer_norm"),
                         [(*stack, False) for stack in STACKS] + [("torch", 2, True)])
def test_export_dynamic_batch_and_length(gru_form: str, num_layers: int,
                                         layer_norm: bool) -> None:
    """Exported with dynamic B and S at one shape, the program matches eager at another."""
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, embed_size=8, hidden_size=6,
                      decoder_size=10, align_size=7, maxout_size=4, gru_form=gru_form,
                      encoder_layers=num_layers, layer_norm=layer_norm)
    encoder = RNNSearch.from_config(cfg).eval().encoder
    src, src_lengths = padded_batch([6, 1, 4], 6, vocab=20)
    batch, length = Dim("batch"), Dim("length")
    program = torch.export.export(encoder, (src, src_lengths),
                                  dynamic_shapes=({0: batch, 1: length}, {0: batch}))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "scan" in targets, targets
    assert not any("bahdanau" in t or "gru.input" in t or "pack" in t for t in targets), targets
    scans = num_layers if layer_norm else 2 * num_layers   # layer norm: both directions in one
    assert program.graph_module.code.count("higher_order.scan(") == scans

    src2, src_lengths2 = padded_batch([9, 3, 1, 9, 5], 9, seed=5, vocab=20)
    want, want_mask = encoder(src2, src_lengths2)
    got, got_mask = program.module()(src2, src_lengths2)
    assert got.shape == (5, 9, 12) and torch.equal(got_mask, want_mask)
    assert (got[~got_mask] == 0).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gru_form", FORMS)
def test_eager_checks_values(gru_form: str) -> None:
    encoder = random_encoder(gru_form)
    src, src_lengths = padded_batch([3, 1], 3)
    big = src.clone()
    big[0, 1] = V
    for bad_src, bad_lengths, match in [(src, torch.tensor([3, 0]), "at least one token"),
                                        (src, torch.tensor([4, 1]), "longer than the padded"),
                                        (big, src_lengths, "outside the vocabulary")]:
        with pytest.raises(ValueError, match=match):
            encoder(bad_src, bad_lengths)
        with pytest.raises(ValueError, match=match):
            encoder.check_inputs(bad_src, bad_lengths)


@pytest.mark.parametrize("gru_form", FORMS)
def test_check_false_skips_only_the_value_checks(gru_form: str) -> None:
    """A caller that vouches for its batch skips the value checks: ids in the padding then
    change nothing (the encoder reads only each sentence's real tokens). Shapes are checked."""
    encoder = random_encoder(gru_form)
    src, src_lengths = padded_batch([4, 1, 3], 4)
    junk = src.clone()
    junk[1, 1:] = 7                                           # tokens after row 1's length
    with pytest.raises(ValueError, match="row 1 has a token at position 1, after its length 1"):
        encoder(junk, src_lengths)
    want, want_mask = encoder(src, src_lengths)
    got, got_mask = encoder(junk, src_lengths, check=False)
    assert torch.equal(got_mask, want_mask)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for bad_src, bad_lengths, match in [(src.double(), src_lengths, "src must hold integer"),
                                        (src, src_lengths[:2], "expected \\(3,\\)"),
                                        (src, src_lengths[None], "src_lengths must have 1 dims"),
                                        (src[:, :0], src_lengths, "padded to length 0"),
                                        (src[:0], src_lengths[:0], "empty batch")]:
        with pytest.raises(ValueError, match=match):
            encoder(bad_src, bad_lengths, check=False)
