"""Bad input raises ValueError naming the argument; nothing falls back silently."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from bahdanau import (
    AdditiveAttention,
    Attention,
    AttentiveDecoder,
    BeamSearch,
    Ensemble,
    InputError,
    LuongAttention,
    RNNEncDec,
    RNNSearch,
    _checks,
    greedy_search,
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
    (SRC.float(), LENGTHS, TGT, "src must hold integers of dtype torch.int64"),
    (SRC.to(torch.uint8), LENGTHS, TGT, r"src must hold .* got dtype torch.uint8"),
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


PADDED_IN = torch.tensor([[1, 5, 6], [1, 7, 0]])
PADDED_OUT = torch.tensor([[5, 6, 2], [7, 2, 0]])


@pytest.mark.parametrize(("tgt_in", "tgt_out", "match"), [
    (PADDED_IN, torch.tensor([[5, 0, 2], [7, 2, 0]]), "tgt_out row 0 has pad_id .* position 1"),
    (PADDED_IN, torch.tensor([[5, 6, 2], [7, 2, 9]]), "tgt_out row 1 has 3 targets but tgt_in "
                                                      "only 2 inputs"),
    (torch.tensor([[1, 0, 6], [1, 7, 0]]), PADDED_OUT, "tgt_in row 0 has pad_id .* position 1"),
    (torch.tensor([[1, 5, 6], [0, 0, 0]]), PADDED_OUT, r"tgt_in .* no real token: rows \[1\]"),
    (PADDED_IN, torch.tensor([[5, 6, 2], [0, 0, 0]]), r"tgt_out .* no real token: rows \[1\]"),
])
def test_targets_are_padded_only_at_the_end(model, tgt_in, tgt_out, match) -> None:
    """A pad inside a target would silently drop that position from the loss."""
    assert torch.isfinite(model.loss(SRC, LENGTHS, PADDED_IN, PADDED_OUT)[0])
    # the common split of one padded row, full[:, :-1] and full[:, 1:], feeds eos as a last
    # input with no target: allowed
    full = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    assert model.loss(SRC, LENGTHS, full[:, :-1], full[:, 1:])[1] == 5
    with pytest.raises(InputError, match=match):
        model.loss(SRC, LENGTHS, tgt_in, tgt_out)


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


def test_attention_without_scores_cannot_be_built() -> None:
    """A subclass that defines neither `score` nor `weights` fails when built, not at the first
    decoder step, in one line naming what to implement."""
    class NoWeights(Attention):
        def __init__(self):
            super().__init__(query_size=4, key_size=6)

        def project_query(self, query):
            return query

    with pytest.raises(InputError, match=r"^NoWeights defines no score\(query, keys\): an "
                                         r"attention subclasses bahdanau.Attention") as err:
        NoWeights()
    assert "\n" not in str(err.value)


def test_decoder_errors() -> None:
    with pytest.raises(ValueError, match="query_size=4"):
        AttentiveDecoder(V, 8, 12, 16, 6, attention=AdditiveAttention(4, 16, 10))
    with pytest.raises(ValueError, match="impl must be one of"):
        AdditiveAttention(4, 6, 5, impl="bogus")
    decoder = AttentiveDecoder(V, 8, 12, 16, 6, attention=AdditiveAttention(12, 16, 10))
    with pytest.raises(ValueError, match="annotations has shape"):
        decoder.init_state(torch.randn(2, 3, 15), torch.ones(2, 3, dtype=torch.bool))


class UncheckedAttention(Attention):
    """A seam implementation that checks nothing itself, like a user's own attention."""

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__(query_size=query_size, key_size=key_size)

    def prepare(self, annotations, mask):
        return (annotations, mask)

    def project_query(self, query):
        return query[:, : self.key_size]

    def weights(self, query, memory, state):
        return torch.softmax(torch.zeros(memory[1].shape), -1)


@pytest.mark.parametrize("attention", [
    AdditiveAttention(12, 16, 10), LuongAttention(12, 16), UncheckedAttention(12, 16), None,
], ids=["additive", "luong", "unchecked", "none"])
def test_init_state_checks_shapes_not_values(value_checks, attention) -> None:
    """Behind the model's door the decoder trusts the mask (built from lengths the door
    checked), for any attention: it reads no values, and still refuses a wrong dtype or size."""
    decoder = AttentiveDecoder(V, 8, 12, 16, 6, attention=attention)
    annotations, mask = torch.randn(2, 3, 16), torch.tensor([[True] * 3, [True, False, False]])
    decoder.init_state(annotations, mask)
    assert value_checks == []
    with pytest.raises(InputError, match="mask must be a bool mask"):
        decoder.init_state(annotations, mask.long())
    with pytest.raises(InputError, match="mask has shape"):
        decoder.init_state(annotations, mask[:, :2])


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


# ----------------------------------------------------------------------------------------------
# Every entry point refuses a bad batch and checks its values once, at the model's door; the parts
# behind the door check ranks and sizes only.


def _models() -> dict[str, RNNSearch]:
    torch.manual_seed(0)
    cfg = presets.tiny(V, V)
    return {"fast": RNNSearch.from_config(cfg),
            "reference": RNNSearch.from_config(replace(cfg, engine="reference")),
            "rnnencdec": RNNEncDec.from_config(cfg)}


MODELS = _models()
TGT_OUT = torch.tensor([[5, 2], [6, 2]])


def _forward(model, src, lengths, tgt_in=TGT, tgt_out=TGT_OUT, **kw):
    return model(src, lengths, tgt_in, **kw)


def _loss(model, src, lengths, tgt_in=TGT, tgt_out=TGT_OUT, **kw):
    return model.loss(src, lengths, tgt_in, tgt_out, **kw)


def _encode(model, src, lengths, tgt_in=None, tgt_out=None, **kw):
    return model.encode(src, lengths, **kw)


def _translate(model, src, lengths, tgt_in=None, tgt_out=None, **kw):
    return model.translate(src, lengths, beam_size=2, max_len=3, **kw)


ENTRY_POINTS = {"forward": _forward, "loss": _loss, "encode": _encode, "translate": _translate}

# Bad sources, each with the one-line message every entry point must give.
BAD_SOURCES = [
    (torch.tensor([[5, 6, 7], [0, 0, 0]]), torch.tensor([3, 0]),
     "src_lengths holds length 0: every sequence needs at least one token"),
    (torch.tensor([[5, 6, 7], [0, 0, 0]]), torch.tensor([3, 2]),            # all padding
     "src row 1 has pad_id at position 0, inside its length 2: lengths and padding "
     r"\(pad_id=0\) disagree"),
    (SRC, torch.tensor([2, 2]), "src row 0 has a token at position 2, after its length 2"),
    (SRC, torch.tensor([3, 3]), "src row 1 has pad_id at position 2, inside its length 3"),
    (torch.tensor([[5, 6, 16], [8, 9, 0]]), LENGTHS,
     "src holds token id 16, outside the vocabulary of size 16"),
    (torch.tensor([[5, 6, 7], [-3, 9, 0]]), LENGTHS, "src holds token id -3"),
]


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("src", "lengths", "message"), BAD_SOURCES)
def test_every_entry_point_refuses_a_bad_source(model_name, entry, src, lengths, message) -> None:
    with pytest.raises(InputError, match=f"^{message}"):
        ENTRY_POINTS[entry](MODELS[model_name], src, lengths)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize(("entry", "tgt_in", "tgt_out", "message"), [
    ("forward", torch.tensor([[1, 16], [1, 6]]), TGT_OUT, "tgt_in holds token id 16"),
    ("forward", torch.tensor([[1, 5], [-1, 6]]), TGT_OUT, "tgt_in holds token id -1"),
    ("loss", torch.tensor([[1, 16], [1, 6]]), TGT_OUT, "tgt_in holds token id 16"),
    ("loss", torch.tensor([[1, 5], [-1, 6]]), TGT_OUT, "tgt_in holds token id -1"),
    ("loss", TGT, torch.tensor([[5, 2], [6, 16]]), "tgt_out holds token id 16"),
    ("loss", TGT, torch.tensor([[5, -2], [6, 2]]), "tgt_out holds token id -2"),
])
def test_target_ids_out_of_range(model_name, entry, tgt_in, tgt_out, message) -> None:
    with pytest.raises(InputError, match=f"^{message}, outside the vocabulary of size 16$"):
        ENTRY_POINTS[entry](MODELS[model_name], SRC, LENGTHS, tgt_in, tgt_out)


@pytest.fixture
def value_checks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Records (check, tensor name) for every value check any bahdanau module runs: those that
    read a tensor's contents. `check_lengths` counts only when it reads the lengths."""
    names = ("check_end_padding", "check_lengths", "check_mask_rows", "check_padding",
             "check_token_ids")
    originals = {name: getattr(_checks, name) for name in names}
    calls: list[tuple[str, str]] = []

    def spy(check: str):
        def run(name, *args, **kwargs):
            if kwargs.get("values", True):
                calls.append((check, name))
            return originals[check](name, *args, **kwargs)
        return run

    modules = [m for n, m in list(sys.modules.items())
               if n.startswith("bahdanau.") and n != "bahdanau._checks"]
    for module in modules:
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, spy(name))
    return calls


SOURCE_CHECKS = [("check_lengths", "src_lengths"), ("check_token_ids", "src"),
                 ("check_padding", "src")]
# `RNNSearch.step` is a door of its own: each call checks its (N,) token ids, unless its caller
# made them itself (the search passes check=False: a read back to the host at every step)
STEP_CHECK = ("check_token_ids", "prev_tokens")


def batch_checks(calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The value checks of a batch's tensors: `calls` without the steps' own."""
    return [call for call in calls if call != STEP_CHECK]
TARGET_IN_CHECKS = [("check_end_padding", "tgt_in")]


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize(("entry", "expected"), [
    ("forward", [*SOURCE_CHECKS, ("check_token_ids", "tgt_in"), *TARGET_IN_CHECKS]),
    ("loss", [*SOURCE_CHECKS, ("check_token_ids", "tgt_in"), ("check_token_ids", "tgt_out"),
              *TARGET_IN_CHECKS, ("check_end_padding", "tgt_out")]),
    ("encode", SOURCE_CHECKS),
    ("translate", SOURCE_CHECKS),
])
def test_value_checks_run_once_per_batch(value_checks, model_name, entry, expected) -> None:
    """Each tensor's values are checked once; the mask, built from checked lengths, never."""
    ENTRY_POINTS[entry](MODELS[model_name], SRC, LENGTHS)
    assert batch_checks(value_checks) == expected
    assert STEP_CHECK not in value_checks


def test_searches_check_the_source_once(value_checks) -> None:
    """Through the model's `encode`; an ensemble through its first member only."""
    model = MODELS["fast"]
    BeamSearch(beam_size=2, max_len=3)(model, SRC, LENGTHS)
    greedy_search(model, SRC, LENGTHS, max_len=3)
    assert batch_checks(value_checks) == SOURCE_CHECKS * 2
    value_checks.clear()
    greedy_search(Ensemble(list(MODELS.values())), SRC, LENGTHS, max_len=3)
    assert batch_checks(value_checks) == SOURCE_CHECKS


@pytest.mark.parametrize("model_name", MODELS)
def test_encode_check_false_skips_the_value_checks_and_changes_nothing(value_checks,
                                                                      model_name) -> None:
    """`encode(check=False)`, what an ensemble passes to its members after the first: the same
    state on a good batch, no value read; a batch whose padding disagrees with its lengths
    (which the caller vouched for) runs instead of raising."""
    model = MODELS[model_name].eval()
    want, _ = model.encode(SRC, LENGTHS)
    value_checks.clear()
    got, _ = model.encode(SRC, LENGTHS, check=False)
    torch.testing.assert_close(got.hidden, want.hidden, rtol=0, atol=0)
    model.encode(torch.tensor([[5, 6, 7], [8, 9, 4]]), LENGTHS, check=False)
    assert value_checks == []


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize(("src", "lengths", "match"), [
    (SRC.float(), LENGTHS, "src must hold integers of dtype torch.int64"),
    (SRC, LENGTHS[:1], r"src_lengths has shape \(1,\), expected \(2,\)"),
    (SRC, LENGTHS.float(), "src_lengths must hold integer"),
    (SRC[:, :0], LENGTHS, "padded to length 0"),
])
def test_encode_checks_shapes_either_way(check, src, lengths, match) -> None:
    with pytest.raises(InputError, match=match):
        MODELS["fast"].encode(src, lengths, check=check)


@pytest.mark.parametrize(("tgt_in", "match"), [
    (TGT.float(), "tgt_in must hold integer"),
    (TGT[:1], "tgt_in has shape"),
    (TGT[:, :0], "no target positions"),
])
def test_parts_behind_the_door_check_target_shapes_only(value_checks, tgt_in, match) -> None:
    """The reference decoder and the engine check the ranks and sizes of the targets the door
    passes them, and read no values."""
    for model in MODELS.values():
        state, memory = model.encode(SRC, LENGTHS)
        value_checks.clear()
        run = model.decoder if model.engine is None else model.engine.features
        with pytest.raises(InputError, match=match):
            run(tgt_in, state, memory)
        run(TGT, state, memory)
        assert value_checks == []


class _PlainEncoder(torch.nn.Module):
    """A user's encoder: `forward(src, src_lengths)` only, no `check_inputs`, no checks."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner, self.output_size = inner, inner.output_size

    def forward(self, src, src_lengths):
        return self.inner(src, src_lengths, check=False)


def test_an_encoder_without_checks_is_checked_by_the_model() -> None:
    """The model calls a user's encoder as the seam says (no `check` argument) and checks the
    lengths against the padding itself."""
    base = MODELS["fast"]
    model = RNNSearch(_PlainEncoder(base.encoder), base.decoder)
    assert torch.equal(model.loss(SRC, LENGTHS, TGT, TGT_OUT)[0],
                       base.loss(SRC, LENGTHS, TGT, TGT_OUT)[0])
    for src, lengths, message in BAD_SOURCES[:4]:             # lengths and padding
        for entry in ENTRY_POINTS.values():
            with pytest.raises(InputError, match=f"^{message}"):
                entry(model, src, lengths)


def test_api_refusals_found_by_the_reliability_audit() -> None:
    """Arguments that once gave a silent wrong answer or a raw exception."""
    from bahdanau import DefaultTokenizer, ModelConfig, Vocab, translate_corpus

    model, vocab = MODELS["fast"], Vocab([f"w{i}" for i in range(V - 4)])
    for kwargs, match in (({"batch_size": -1}, "batch_size must be an int >= 1"),
                          ({"batch_size": 0}, "batch_size must be an int >= 1"),
                          ({"unk_replace": "no"}, "unk_replace must be True or False"),
                          ({"device": "gpu"}, "device 'gpu' is not a device"),
                          ({"device": "meta"}, "not on meta")):
        with pytest.raises(InputError, match=match):
            translate_corpus(model, ["w1 w2"], vocab, vocab, DefaultTokenizer(), **kwargs)
    with pytest.raises(InputError, match="not one str"):
        translate_corpus(model, "w1 w2", vocab, vocab, DefaultTokenizer())
    with pytest.raises(InputError, match="early_stopping must be True or False"):
        BeamSearch(early_stopping="no")
    with pytest.raises(InputError, match="max_len must be <="):
        BeamSearch(max_len=10**30)
    with pytest.raises(InputError, match="embed_size must be an integer, got True"):
        ModelConfig(src_vocab_size=16, tgt_vocab_size=16, embed_size=True)


def test_api_silent_wrongs_found_by_the_reliability_audit() -> None:
    """Calls that once returned a plausible wrong answer now raise InputError."""
    from bahdanau import (
        CheckpointManager,
        DefaultTokenizer,
        Example,
        Vocab,
        collate,
        corpus_bleu,
        encode_pairs,
        train_step,
    )
    from bahdanau.evaluate import bleu_by_length

    with pytest.raises(InputError, match="token lists"):
        Vocab.build(["a dog", "a cat"])                    # a character vocabulary before
    with pytest.raises(InputError, match="not one str"):
        Vocab("abc")
    with pytest.raises(InputError, match="not one str"):
        corpus_bleu("abc", "abd")
    with pytest.raises(InputError, match="ids must be integers, got 4.7"):
        Vocab(["a", "b"]).decode([4.7])
    assert Vocab(["a", "b"]).decode(torch.tensor([4, 5])) == ["a", "b"]
    for call in (lambda: Vocab.build([["a"]], max_size=True),
                 lambda: encode_pairs([("a", "b")], Vocab(["a"]), Vocab(["b"]),
                                      DefaultTokenizer(), max_len=True),
                 lambda: CheckpointManager("unused", keep_last=True),
                 lambda: bleu_by_length(["a"], ["a"], [1], edges=(10.5, 20))):
        with pytest.raises(InputError):
            call()
    model = MODELS["fast"]
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    batch = collate([Example(0, [5, 6], [7]), Example(1, [8], [9, 10])])
    with pytest.raises(InputError, match="none of the parameters"):
        train_step(model, batch, other)


def _wrong_type_calls(tmp_path) -> list[tuple[str, object, str]]:
    """(case, call, expected message) for arguments of the wrong Python type at the public
    entry points: each once raised TypeError or AttributeError from deep inside."""
    from bahdanau import (
        CheckpointManager,
        DefaultTokenizer,
        Example,
        ModelConfig,
        TrainConfig,
        Vocab,
        build_model,
        collate,
        corpus_scores,
        encode_pairs,
        load_checkpoint,
        make_optimizer,
        model_from_checkpoint,
        read_parallel,
        save_checkpoint,
        translate_corpus,
    )
    from bahdanau.data import BucketBatchSampler
    from bahdanau.training import setup_run

    model, vocab = MODELS["fast"], Vocab([f"w{i}" for i in range(V - 4)])
    tok = DefaultTokenizer()
    cfg = TrainConfig(max_steps=1)
    return [
        ("build_model None", lambda: build_model(None), "cfg must be a ModelConfig"),
        ("build_model dict", lambda: build_model({"src_vocab_size": 9}),
         "cfg must be a ModelConfig .*got dict"),
        ("from_config dict", lambda: RNNSearch.from_config({}), "cfg must be a ModelConfig"),
        ("ModelConfig.from_dict list", lambda: ModelConfig.from_dict([]),
         "ModelConfig.from_dict needs a dict, got list"),
        ("ModelConfig.from_dict missing", lambda: ModelConfig.from_dict({"embed_size": 8}),
         r"ModelConfig fields \['src_vocab_size', 'tgt_vocab_size'\] are missing"),
        ("TrainConfig.from_dict str", lambda: TrainConfig.from_dict("lr=1"),
         "TrainConfig.from_dict needs a dict, got str"),
        ("ModelConfig dropout str", lambda: ModelConfig(9, 9, dropout="0.1"),
         "dropout must be a finite number"),
        ("TrainConfig rho nan", lambda: TrainConfig(rho=float("nan")),
         "rho must be a finite number"),
        ("make_optimizer cfg dict", lambda: make_optimizer(model, {"optimizer": "adam"}),
         "cfg must be a TrainConfig"),
        ("make_optimizer model", lambda: make_optimizer("model", cfg),
         "model must be a torch.nn.Module"),
        ("BeamSearch model", lambda: BeamSearch()(object(), SRC, LENGTHS),
         "model must be a torch.nn.Module"),
        ("collate lists", lambda: collate([[5, 6]]),
         r"examples\[0\] must be a bahdanau.Example"),
        ("collate str ids", lambda: collate([Example(0, ["a"], [5])]),
         "example 0: src must be a list of int token ids"),
        ("collate float ids", lambda: collate([Example(0, [5], [6.5])]),
         "example 0: tgt must be a list of int token ids"),
        ("encode_pairs tokenizer None", lambda: encode_pairs([("a", "b")], vocab, vocab, None),
         "tokenizer must be a tokenizer instance"),
        ("encode_pairs tokenizer class",
         lambda: encode_pairs([("a", "b")], vocab, vocab, DefaultTokenizer),
         "tokenizer must be a tokenizer instance"),
        ("encode_pairs pair str", lambda: encode_pairs(["a b"], vocab, vocab, tok),
         r"pair 0 must be a \(source, target\) pair of str"),
        ("encode_pairs vocab path", lambda: encode_pairs([("a", "b")], "v.json", vocab, tok),
         "src_vocab must be a Vocab"),
        ("read_parallel None", lambda: read_parallel(None, "b"), "src_path must be a path"),
        ("read_parallel int", lambda: read_parallel("a", 3), "tgt_path must be a path"),
        ("Vocab.load int", lambda: Vocab.load(3), "path must be a path"),
        ("Vocab.save dir", lambda: vocab.save(tmp_path), "is a directory"),
        ("sampler seed str", lambda: BucketBatchSampler([3, 4], seed="x"),
         "seed must be an int, got str"),
        ("sampler rank float", lambda: BucketBatchSampler([3, 4], num_replicas=2, rank=0.5),
         "rank must be in"),
        ("translate_corpus None item",
         lambda: translate_corpus(model, ["w1", None], vocab, vocab, tok),
         r"sentences\[1\] must be a str, got NoneType"),
        ("translate_corpus tokenizer class",
         lambda: translate_corpus(model, ["w1"], vocab, vocab, DefaultTokenizer),
         "tokenizer must be a tokenizer instance"),
        ("translate_corpus search int",
         lambda: translate_corpus(model, ["w1"], vocab, vocab, tok, search=5),
         "search must be a BeamSearch or None"),
        ("translate_corpus model", lambda: translate_corpus(None, ["w1"], vocab, vocab, tok),
         "model must be a torch.nn.Module"),
        ("corpus_scores None item", lambda: corpus_scores(["a", None], ["a", "b"]),
         r"hypotheses\[1\] must be a str, got NoneType"),
        ("load_checkpoint int", lambda: load_checkpoint(5), "path must be a path"),
        ("model_from_checkpoint list", lambda: model_from_checkpoint([1]),
         "checkpoint must be a file path or a payload dict, got list"),
        ("save_checkpoint to a directory", lambda: save_checkpoint(tmp_path, {}),
         "is a directory, not a file"),
        ("CheckpointManager None", lambda: CheckpointManager(None),
         "directory must be a path"),
        ("setup_run tuples", lambda: setup_run(model, [(0, [5], [6])], cfg, src_vocab=vocab,
                                               tgt_vocab=vocab),
         r"examples\[0\] must be a bahdanau.Example"),
        ("setup_run cfg dict", lambda: setup_run(model, [Example(0, [5], [6])], {},
                                                 src_vocab=vocab, tgt_vocab=vocab),
         "cfg must be a TrainConfig"),
        ("forward uint8 src", lambda: model(SRC.to(torch.uint8), LENGTHS, TGT),
         "src must hold integers of dtype torch.int64"),
        ("forward meta lengths", lambda: model(SRC, LENGTHS.to("meta"), TGT),
         "src_lengths is on the meta device"),
    ]


def test_wrong_python_types_are_one_line_input_errors(tmp_path) -> None:
    """Every wrong-typed argument is an InputError naming it, never a raw TypeError or
    AttributeError, and nothing is written."""
    before = sorted(tmp_path.iterdir())
    for case, call, match in _wrong_type_calls(tmp_path):
        with pytest.raises(InputError, match=match) as info:
            call()
        assert "\n" not in str(info.value), case
    assert sorted(tmp_path.iterdir()) == before
