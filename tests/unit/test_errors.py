"""Bad input raises ValueError naming the argument; nothing falls back silently."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bahdanau import (
    AdditiveAttention,
    Attention,
    AttentiveDecoder,
    InputError,
    LuongAttention,
    RNNSearch,
    presets,
)

V = 16


@pytest.fixture(scope="module")
def model() -> RNNSearch:
    torch.manual_seed(0)
    return RNNSearch.from_config(presets.tiny(V, V))


SRC = torch.tensor([[5, 6, 7], [8, 9, 0]])
LENGTHS = torch.tensor([3, 2])
TGT = torch.tensor([[1, 5], [1, 6]])


@pytest.mark.parametrize(("src", "lengths", "tgt", "match"), [
    (SRC.float(), LENGTHS, TGT, "src must hold integer token ids"),
    (SRC[None], LENGTHS, TGT, "src must have 2 dims"),
    (SRC, LENGTHS[:1], TGT, r"src_lengths has shape \(1,\), expected \(2,\)"),
    (SRC, torch.tensor([3, 0]), TGT, "at least one token"),
    (SRC, torch.tensor([4, 2]), TGT, "longer than the padded length 3"),
    (SRC, LENGTHS.float(), TGT, "src_lengths must hold integer"),
    (torch.tensor([[5, 6, 16], [8, 9, 0]]), LENGTHS, TGT, "src holds token id 16"),
    (torch.tensor([[5, -1, 7], [8, 9, 0]]), LENGTHS, TGT, "src holds token id -1"),
    (SRC, LENGTHS, torch.tensor([[1, 99], [1, 6]]), "tgt_in holds token id 99"),
    (SRC, LENGTHS, TGT[:1], "tgt_in"),
    (SRC, LENGTHS, TGT[:, :0], "no target positions"),
    (SRC[:0], LENGTHS[:0], TGT[:0], "empty batch"),
])
def test_model_input_errors(model, src, lengths, tgt, match) -> None:
    with pytest.raises(ValueError, match=match):
        model(src, lengths, tgt)


def test_padding_ids_are_checked_too(model) -> None:
    """Padding positions are embedded as well, so they must hold valid ids (pad_id)."""
    with pytest.raises(ValueError, match="src holds token id 999"):
        model(torch.tensor([[5, 6, 7], [8, 9, 999]]), LENGTHS, TGT)


@pytest.mark.parametrize(("src", "match"), [
    (torch.tensor([[5, 0, 7], [8, 9, 0]]), "row 0 has pad_id at position 1, inside its length 3"),
    (torch.tensor([[5, 6, 7], [8, 9, 4]]), "row 1 has a token at position 2, after its length 2"),
])
def test_lengths_must_agree_with_the_padding(model, src, match) -> None:
    """A length that disagrees with the padding would silently cut or pad a sentence."""
    with pytest.raises(ValueError, match=match):
        model(src, LENGTHS, TGT)
    with pytest.raises(ValueError, match=match):
        model.translate(src, LENGTHS, beam_size=2, max_len=3)


def test_loss_shape_mismatch(model) -> None:
    with pytest.raises(ValueError, match="tgt_out"):
        model.loss(SRC, LENGTHS, TGT, TGT[:, :1])


def test_loss_target_ids_are_checked(model) -> None:
    with pytest.raises(ValueError, match="tgt_out holds token id 99"):
        model.loss(SRC, LENGTHS, TGT, torch.tensor([[5, 99], [6, 2]]))


@pytest.mark.parametrize(("args", "match"), [
    ((SRC, torch.tensor([4, 2])), "longer than the padded length 3"),
    ((SRC, torch.tensor([3, 0])), "at least one token"),
    ((torch.tensor([[5, 6, 16], [8, 9, 0]]), LENGTHS), "src holds token id 16"),
    ((SRC, LENGTHS, torch.tensor([[1, 99], [1, 6]])), "tgt_in holds token id 99"),
    ((SRC, LENGTHS, TGT, torch.tensor([[5, -1], [6, 2]])), "tgt_out holds token id -1"),
    ((SRC, LENGTHS, TGT, TGT[:, :1]), "differ in shape"),
    ((SRC, LENGTHS, TGT[:1]), "tgt_in has shape"),
])
def test_check_batch_has_every_value_check(model, args, match) -> None:
    """What code calling a compiled model runs first, in eager code."""
    with pytest.raises(ValueError, match=match):
        model.check_batch(*args)
    model.check_batch(SRC, LENGTHS, TGT, TGT)


def _attention_inputs():
    attn = AdditiveAttention(query_size=4, key_size=6, align_size=5, impl="reference")
    return attn, torch.randn(2, 4), torch.randn(2, 3, 6), \
        torch.tensor([[True, True, False], [True, False, False]])


@pytest.mark.parametrize(("change", "match"), [
    (lambda h, m: (h, m.float()), "mask must be a bool mask"),
    (lambda h, m: (h, m[:, :2]), "mask has shape"),
    (lambda h, m: (h[:, :2], m), "mask has shape"),
    (lambda h, m: (h[..., :4], m), "annotations has shape"),
    (lambda h, m: (h[:, :0], m[:, :0]), "empty"),
])
def test_attention_prepare_errors(change, match) -> None:
    attn, _, annotations, mask = _attention_inputs()
    with pytest.raises(ValueError, match=match):
        attn.prepare(*change(annotations, mask))


@pytest.mark.parametrize(("change", "match"), [
    (lambda q, h: (q[:, :3], h), "query has shape"),
    (lambda q, h: (q[:1], h), "query rows"),
    (lambda q, h: (q[0], h), "query must have 2 dims"),
    (lambda q, h: (q, h[0]), "values must have 3 dims"),
])
def test_attention_step_errors(change, match) -> None:
    attn, query, annotations, mask = _attention_inputs()
    memory = attn.prepare(annotations, mask)
    query, values = change(query, annotations)
    with pytest.raises(ValueError, match=match):
        attn(query, memory, values)


def test_attention_without_weights_cannot_be_built() -> None:
    """A subclass that misses part of the seam fails when built, not at the first decoder step."""
    class NoWeights(Attention):
        def prepare(self, annotations, mask):
            return mask

        def project_query(self, query):
            return query

    with pytest.raises(TypeError, match="abstract method '?weights"):
        NoWeights()


def test_decoder_errors() -> None:
    with pytest.raises(ValueError, match="query_size=4"):
        AttentiveDecoder(V, 8, 12, 16, 6, attention=AdditiveAttention(4, 16, 10))
    with pytest.raises(ValueError, match="impl must be one of"):
        AdditiveAttention(4, 6, 5, impl="bogus")
    decoder = AttentiveDecoder(V, 8, 12, 16, 6, attention=AdditiveAttention(12, 16, 10))
    with pytest.raises(ValueError, match="no real token"):
        decoder.init_state(torch.randn(2, 3, 16), torch.tensor([[True] * 3, [False] * 3]))
    with pytest.raises(ValueError, match="annotations has shape"):
        decoder.init_state(torch.randn(2, 3, 15), torch.ones(2, 3, dtype=torch.bool))


class UncheckedAttention(Attention):
    """A seam implementation that checks nothing itself, like a user's own attention."""

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__()
        self.query_size, self.key_size = query_size, key_size

    def prepare(self, annotations, mask):
        return (annotations, mask)

    def project_query(self, query):
        return query[:, : self.key_size]

    def weights(self, query, memory, state):
        return torch.softmax(torch.zeros(memory[1].shape), -1)


@pytest.mark.parametrize("attention", [
    AdditiveAttention(12, 16, 10), LuongAttention(12, 16), UncheckedAttention(12, 16), None,
], ids=["additive", "luong", "unchecked", "none"])
def test_init_state_checks_the_mask_rows_for_any_attention(attention) -> None:
    """The decoder, the caller of the seam, checks the mask once per batch; check=False skips
    it (the mask then comes from checked lengths) and keeps the shape checks."""
    decoder = AttentiveDecoder(V, 8, 12, 16, 6, attention=attention)
    annotations, empty_row = torch.randn(2, 3, 16), torch.tensor([[True] * 3, [False] * 3])
    with pytest.raises(InputError, match=r"^mask \(2, 3\) has rows with no real token: "
                                         r"rows \[1\]$"):
        decoder.init_state(annotations, empty_row)
    if attention is not None:                     # RNNencdec indexes the last real token
        decoder.init_state(annotations, empty_row, check=False)
    with pytest.raises(InputError, match="mask must be a bool mask"):
        decoder.init_state(annotations, empty_row.long(), check=False)


def test_triton_on_cpu_without_interpreter_raises() -> None:
    """An explicit impl='triton' that cannot run raises; it never falls back to the reference."""
    code = (
        "import torch\n"
        "from bahdanau import AdditiveAttention\n"
        "a = AdditiveAttention(4, 6, 5, impl='triton')\n"
        "h = torch.randn(2, 3, 6)\n"
        "try:\n"
        "    a(torch.randn(2, 4), a.prepare(h, torch.ones(2, 3, dtype=torch.bool)), h)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    assert "ValueError: impl='triton' cannot run" in out.stdout

