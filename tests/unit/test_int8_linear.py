"""int8 step matmuls against hand-worked quantisation, a float64 reference and the float model.

The quantisation is checked by hand (per output channel and symmetric for a weight, per tensor
and asymmetric for an input); the int8 product against `F.linear` of the dequantised input and
weight in float64 (the int32 sums are exact, so only the final float32 rounding may differ);
and an int8 copy of a model against the float model it was copied from, which it must leave
as it is and whose tokens it must find on most sentences.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

import bahdanau
from bahdanau import BeamSearch, RNNSearch, presets
from bahdanau.checkpoint import save_checkpoint
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import WhitespaceTokenizer, collate
from bahdanau.kernels import int8_linear
from bahdanau.kernels.int8_linear import Int8Linear
from bahdanau.kernels.packed_linear import PackedLinear
from bahdanau.training import make_optimizer, train_step
from bahdanau.training.state import checkpoint_payload

needs_int8 = pytest.mark.skipif(not int8_linear.available(),
                                reason=f"{int8_linear.unavailable_reason()}")


def test_int8_runs_wherever_the_cpu_has_int8_dot_products() -> None:
    """The self-check of `available` passes on every CPU with VNNI and torch with the ops (so
    a broken product fails here rather than skipping the tests below)."""
    ops = hasattr(torch.ops.onednn, "qlinear_pointwise") and torch.backends.mkldnn.is_available()
    assert int8_linear.available() == (ops and torch.cpu._is_vnni_supported())


def test_a_weight_is_quantised_per_output_channel_and_symmetrically() -> None:
    weight = torch.tensor([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [-2.0, 1.0, 0.0]])
    values, scales = int8_linear.quantize_weight(weight)
    # row 0: scale 1/127, -0.5 * 127 = -63.5 rounds to even (-64), 0.25 * 127 = 31.75 to 32;
    # row 1: all zero, scale 1; row 2: scale 2/127, 1 / (2/127) = 63.5 rounds to 64
    assert values.dtype == torch.int8
    assert values.tolist() == [[127, -64, 32], [0, 0, 0], [-127, 64, 0]]
    torch.testing.assert_close(scales, torch.tensor([1 / 127, 1.0, 2 / 127]))
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 33, generator=gen) * torch.rand(50, 1, generator=gen)
    values, scales = int8_linear.quantize_weight(weight)
    assert values.abs().amax(1).eq(127).all()                   # each row uses its full range
    error = (values.double() * scales.double()[:, None] - weight.double()).abs()
    assert (error <= scales.double()[:, None] / 2 * (1 + 1e-6)).all()


def test_an_input_is_quantised_per_tensor_to_uint8() -> None:
    # range [-1, 3] onto 0..255: scale 4/255, zero point round(63.75) = 64;
    # -1 -> round(-63.75) + 64 = 0, 0 -> 64, 3 -> round(191.25) + 64 = 255, 1 -> 64 + 64
    values, scale, zero_point = int8_linear.quantize_input(torch.tensor([[-1.0, 0.0], [3.0, 1.0]]))
    assert values.dtype == torch.uint8 and values.tolist() == [[0, 64], [255, 128]]
    assert zero_point.item() == 64
    torch.testing.assert_close(scale, torch.tensor(4 / 255))
    values, scale, zero_point = int8_linear.quantize_input(torch.tensor([[0.5, 2.0]]))
    assert zero_point.item() == 0 and values.tolist() == [[64, 255]]   # 0 stays exact
    values, scale, zero_point = int8_linear.quantize_input(torch.zeros(2, 3))
    assert scale.item() == 1.0 and values.eq(0).all()


@needs_int8
@pytest.mark.parametrize("bias", [True, False])
def test_the_int8_product_is_the_dequantised_product(bias) -> None:
    """Exactly `F.linear` of the dequantised input and weight, up to the float32 rounding of
    the result (4 ulps of what its terms add up to), for any number of rows and odd sizes."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(97, 70, generator=gen) / 8
    b = torch.randn(97, generator=gen) if bias else None
    layer = int8_linear.quantize(weight, b)
    values, scales = int8_linear.quantize_weight(weight)
    with torch.inference_mode():
        for rows in (1, 3, 40):
            x = torch.randn(rows, 70, generator=gen) * 3 + 1
            got = layer(x)
            assert got.dtype == torch.float32 and got.shape == (rows, 97)
            want = int8_linear.dequantized_linear(x.double(), values, scales,
                                                  None if b is None else b.double())
            qx, x_scale, zero_point = int8_linear.quantize_input(x)
            size = F.linear((qx.double() - zero_point.double()).abs() * x_scale.double(),
                            values.double().abs() * scales.double()[:, None],
                            None if b is None else b.double().abs())
            assert ((got.double() - want).abs() <= 4 * torch.finfo(torch.float32).eps * size
                    + 1e-30).all()
        x = torch.randn(5, 70, generator=gen)                  # bf16 in, float32 out
        assert layer(x.bfloat16()).dtype == torch.float32
        torch.testing.assert_close(layer(x.bfloat16()), layer(x.bfloat16().float()))


def model(engine: str = "fast", decoder: str = "paper") -> RNNSearch:
    cfg = replace(presets.tiny(40, 40), engine=engine, decoder_size=32, align_size=24,
                  maxout_size=16, decoder=decoder)
    torch.manual_seed(0)
    net = RNNSearch.from_config(cfg).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.4)
    return net


@needs_int8
@pytest.mark.parametrize("decoder", ["paper", "cgru"])
def test_an_int8_copy_finds_the_float_tokens_on_most_sentences(decoder) -> None:
    net = model(decoder=decoder)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    quantized = net.int8_copy()
    assert quantized.int8 and not net.int8
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    gen = torch.Generator().manual_seed(2)
    src_lengths = torch.randint(2, 9, (40,), generator=gen)
    src = torch.randint(4, 40, (40, 8), generator=gen)
    src[torch.arange(8) >= src_lengths[:, None]] = 0
    with torch.inference_mode():
        packed = quantized.encode(src, src_lengths)[1].packed
    assert [type(p) for p in packed] == [Int8Linear, PackedLinear, Int8Linear, Int8Linear,
                                         Int8Linear]            # the input gates stay float
    search = BeamSearch(beam_size=3, max_len=12)
    floats, int8s = search(net, src, src_lengths), search(quantized, src, src_lengths)
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(floats, int8s, strict=True))
    assert same >= 32, f"{same} of 40 sentences decoded to the float tokens"
    assert not all(a[0].score == b[0].score for a, b in zip(floats, int8s, strict=True))
    again = copy.deepcopy(quantized)                   # quantised again, by the same engine
    assert type(again.engine) is type(net.engine)
    assert ([h[0].tokens for h in search(again, src, src_lengths)]
            == [h[0].tokens for h in int8s])
    # teacher forcing is the float model's
    torch.testing.assert_close(quantized(src, src_lengths, src[:, :4]),
                               net(src, src_lengths, src[:, :4]))


@needs_int8
def test_int8_copies_decode_only_and_only_where_they_can() -> None:
    """Refused without the fast engine or float32 CPU weights, and by training; copied (a deep
    copy quantises the copy's weights again), never shared."""
    one_line_error(lambda: model("reference").int8_copy(), "fast engine", "float32")
    one_line_error(lambda: model().double().int8_copy(), "float32 weights on a CPU")
    quantized = tiny_model().int8_copy()
    for again in (copy.deepcopy(quantized), quantized.int8_copy()):   # quantised again
        assert again.int8 and again.engine.decoder is again.decoder is not quantized.decoder
    optimizer = make_optimizer(quantized, TrainConfig())
    batch = collate(random_examples(3))
    one_line_error(lambda: train_step(quantized, batch, optimizer), "int8 copy for decoding",
                   "train the float model")


@needs_int8
def test_load_and_the_commands_decode_in_int8(tmp_path, capsys) -> None:
    checkpoint, source = tmp_path / "m.pt", tmp_path / "in.txt"
    save_checkpoint(checkpoint, checkpoint_payload(tiny_model(), src_vocab=TINY_VOCAB,
                                                   tgt_vocab=TINY_VOCAB,
                                                   tokenizer=WhitespaceTokenizer()))
    assert bahdanau.load(checkpoint, int8=True).model.int8
    assert all(m.int8 for m in bahdanau.load([checkpoint, checkpoint], int8=True).model.members)
    one_line_error(lambda: bahdanau.load(checkpoint, int8=1), "int8 must be True or False")
    source.write_text("w1 w2 w3\nw4 w5\n", encoding="utf-8")
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(source), "--threads",
            "1", "--device", "cpu", "--max-len", "5"]
    assert main(argv) == 0
    floats = capsys.readouterr().out
    assert main([*argv, "--int8"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(floats.splitlines()) == 2
    assert main([*argv, "--int8", "--amp", "bf16"]) == 2
    assert "does not combine with --amp bf16" in capsys.readouterr().err
