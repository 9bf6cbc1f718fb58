"""bfloat16 and float16 autocast on every path, against float64, within bounds from the rounding.

Paths: RNNsearch with each attention implementation (reference, sigmoid, and the Triton kernel
under TRITON_INTERPRET=1) and each engine (fast, reference); Luong attention, RNNencdec and
layer-normalised GRUs with each engine. For each, on the CPU, the loss and every parameter's
gradient (by `model.loss` and by `train_step`, float16 with a GradScaler), a greedy translation
and an exhaustive beam search under `torch.autocast` are held to the float64 result of the same
weights; float32 without autocast is held to the same standard, which checks the bounds
themselves.

Every bound is that of `rounding_bounds`: the first-order effect on the checked scalar of a
rounding error of the unit roundoff of its dtype in every value the run materialises (forward
and backward, the accumulators of its sums included), measured in float64; the test takes the
worst case or LAMBDA times the typical size, the smaller (`Bound.likely`). The effects are
measured on a float64 run of the same code as the run bounded (under autocast too, which leaves
float64 alone but steers the code that asks whether it is on), and the errors against float64
with autocast off: code that runs only under autocast is held to the model's function, not to
itself. A gradient is checked through its projection on a fixed
random sign vector, so every element counts. A decoded token may differ from float64's only
where float64's margin to it is within the bound of that margin: elsewhere the tokens must be
float64's (and so float32's).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import itertools
import os
from contextlib import nullcontext

import pytest
import torch
from rounding_bounds import Replay, record, roundoffs

from bahdanau import BeamSearch
from bahdanau.data import Example, collate
from bahdanau.errors import InputError
from bahdanau.jobs.resolve import autocast
from bahdanau.models import build_model
from bahdanau.presets import tiny
from bahdanau.training.step import train_step

# Hoeffding: a sum of independent roundings exceeds LAMBDA times its typical size with
# probability at most 2 exp(-LAMBDA^2 / 2), 3e-8 for 6 (`rounding_bounds.Bound.likely`).
LAMBDA = 6.0
LR = 2.0**-4            # SGD's rate: a power of two, so the update's only rounding is its sum

HAS_TRITON = importlib.util.find_spec("triton") is not None
_SKIP_TRITON = pytest.mark.skipif(
    not HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton is not installed" if not HAS_TRITON else
    "the kernel takes these CPU tensors under TRITON_INTERPRET=1 (the README's test command)")

# The model's choices of each path (`ModelConfig` fields over `presets.tiny`)
PATHS = [
    *(pytest.param({"attention_impl": impl, "engine": engine}, id=f"{impl}-{engine}",
                   marks=[_SKIP_TRITON] if impl == "triton" else [])
      for impl, engine in itertools.product(("reference", "sigmoid", "triton"),
                                            ("fast", "reference"))),
    *(pytest.param({**choices, "attention_impl": "reference", "engine": engine},
                   id=f"{name}-{engine}")
      for name, choices in (("luong", {"attention": "luong_general"}),
                            ("encdec", {"arch": "rnnencdec"}),
                            ("layer-norm", {"layer_norm": True}))
      for engine in ("fast", "reference")),
]
# float32: no autocast (the bounds' own check); the others: autocast to them
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float16, id="fp16")]


def _model(path: dict, tgt_vocab: int = 16):
    """A float32 `presets.tiny` model with the choices of `path` whose every parameter is drawn
    (biases and v_a too, which the initialisation leaves 0): N(0, 1/fan_in) matrices,
    N(0, 1/4) vectors."""
    cfg = dataclasses.replace(tiny(16, tgt_vocab), **path)
    model = build_model(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            scale = p.shape[-1] ** -0.5 if p.dim() > 1 else 0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return model


def _exact(model):
    """The float64 twin of `model` (the reference attention for the Triton kernel, which takes
    no float64; the kernel accumulates in float32 and materialises what the reference does)."""
    cfg = model.config
    if cfg.attention_impl == "triton":
        twin = build_model(dataclasses.replace(cfg, attention_impl="reference"))
        twin.load_state_dict(model.state_dict())
    else:
        twin = copy.deepcopy(model)
    return twin.to(next(model.parameters()).device, torch.float64)


def _matched(model) -> float:
    """The least share of the float64 run's ops that the run bounded must make too: all but the
    stray few (`rounding_bounds.roundoffs`); the Triton kernel is one op where the float64 twin
    makes the reference attention's dozen per step, a fifth of a decoding step's ops."""
    return 0.75 if model.config.attention_impl == "triton" else 0.99


def _autocast(dtype: torch.dtype, device: str = "cpu"):
    """autocast to `dtype` on `device`; float32: none. A float64 model runs unchanged under it,
    through the same code as the model it checks (which asks whether autocast is on)."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device, dtype=dtype)


def _batch():
    """Two sentence pairs, padded on both sides."""
    return collate([Example(0, [5, 6, 7, 8, 9], [10, 11, 12]), Example(1, [13, 14, 4], [15])])


def _loss_and_gradients(model, batch):
    params = list(model.parameters())
    loss, _ = model.loss(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
    return [loss, *torch.autograd.grad(loss, params)]


def _signs(tensors, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 2, t.shape, generator=gen).double() * 2 - 1).to(t.device)
            for t in tensors]


def _applied_update(model, batch, dtype):
    """The loss and the gradient of the first update `train_step` applies (SGD at LR, no
    clipping; float16 with a GradScaler, whose overflowing steps are skipped), the gradient
    read from the weights it moved; and the float32 roundoff of that reading, per parameter."""
    device = batch.src.device.type
    scaler = torch.amp.GradScaler(device) if dtype == torch.float16 else None
    amp = None if dtype == torch.float32 else dtype
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sentences = batch.src.shape[0]
    for _ in range(20):                          # the scaler halves its scale on each overflow
        before = [p.detach().clone() for p in model.parameters()]
        stats = train_step(model, batch, optimizer, clip_norm=None, amp_dtype=amp,
                           scaler=scaler)
        after = [p.detach() for p in model.parameters()]
        assert all(bool(p.isfinite().all()) for p in after)
        if any(not torch.equal(a, b) for a, b in zip(after, before, strict=True)):
            # p' = fl(p - LR g): g up to |p'| u / LR, times the sentences the loss was divided by
            grads = [(b.double() - a.double()) * sentences / LR
                     for a, b in zip(after, before, strict=True)]
            slack = [a.double().abs() * sentences * 2.0**-24 / LR for a in after]
            return stats.loss_sum, grads, slack
        assert scaler is not None, "an update without a GradScaler was skipped"
    raise AssertionError("the GradScaler skipped 20 updates")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_loss_and_gradients_within_the_rounding_bound(path, dtype) -> None:
    """The loss and each parameter's gradient, by `model.loss` under autocast and by the first
    update `train_step` applies (float16: with a GradScaler), within their rounding bounds of
    float64's."""
    model = _model(path)
    exact, batch = _exact(model), _batch()
    want = _loss_and_gradients(exact, batch)          # float64, autocast off: the truth
    with _autocast(dtype):
        exact_run, path = record(lambda: _loss_and_gradients(exact, batch))
        run, got = record(lambda: _loss_and_gradients(model, batch))
    replay = Replay(exact_run, list(exact.parameters()), path)
    held, units = roundoffs(exact_run, run, list(exact.parameters()), list(model.parameters()),
                            least_matched=_matched(model))
    signs = _signs(want[1:])
    scalars = [replay.outputs[0], *((s * g).sum() for s, g in zip(signs, replay.outputs[1:],
                                                                  strict=True))]
    bounds = [b.likely(LAMBDA) for b in replay.bounds(scalars, held, units)]
    names = ["loss", *(name for name, _ in model.named_parameters())]

    def check(loss, grads, slack, how: str) -> None:
        errors = [abs(float(loss) - float(want[0].detach()))]
        errors += [abs(float((s * (g.double() - w)).sum()))
                   for s, g, w in zip(signs, grads, want[1:], strict=True)]
        extra = [0.0, *(float(x.sum()) for x in slack)]
        for name, error, bound, more in zip(names, errors, bounds, extra, strict=True):
            assert error <= bound + more, (f"{how}, {name}: error {error:.3g} > bound "
                                           f"{bound + more:.3g} ({dtype})")

    check(got[0].detach(), got[1:], [torch.zeros(())] * len(signs), "model.loss")
    check(*_applied_update(model, batch, dtype), "train_step")


# ----------------------------------------------------------------------------------------------
# Decoding


def _stepped(model, src, tokens):
    """The search's arithmetic along one hypothesis of one sentence: each step's
    log-probabilities (float32, float64 for a float64 model) and their sum over `tokens` (its
    tokens and eos), added up in that dtype as the search adds them."""
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    state, memory = model.encode(src[None], torch.tensor([src.shape[0]]))
    prev = torch.tensor([model.config.bos_id])
    rows, total = [], torch.zeros((), dtype=dtype)
    for token in tokens:
        out = model.step(prev, state, memory)
        row = torch.log_softmax(out.logits.to(dtype), dim=-1)[0]
        total = total + row[token]
        rows.append(row)
        state, prev = out.state, torch.tensor([token])
    return [torch.stack(rows), total]


def _bounds_along(model, exact, src, tokens, dtype, pick):
    """float64's step log-probabilities along `tokens` and their sum (autocast off: the
    truth), and the bounds of the scalars `pick` makes of the (replayed) rows and sum."""
    with torch.no_grad():
        want = _stepped(exact, src, tokens)
        with _autocast(dtype):
            exact_run, path = record(lambda: _stepped(exact, src, tokens))
            run, _ = record(lambda: _stepped(model, src, tokens))
    replay = Replay(exact_run, list(exact.parameters()), path)
    held, units = roundoffs(exact_run, run, list(exact.parameters()), list(model.parameters()),
                            least_matched=_matched(model))
    scalars = pick(*replay.outputs)
    return want, [b.likely(LAMBDA) for b in replay.bounds(scalars, held, units)]


SOURCES = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_greedy_tokens_within_the_rounding_bound(path, dtype) -> None:
    """Each token of the greedy translation is float64's best next token, or one whose
    float64 log-probability is within the bound of that difference below it; the translation's
    log-probability is float64's of its tokens within its bound."""
    model = _model(path)
    exact = _exact(model)
    src = torch.tensor([s + [0] * (len(SOURCES[0]) - len(s)) for s in SOURCES])
    lengths = torch.tensor([len(s) for s in SOURCES])
    search = BeamSearch(beam_size=1, max_len=6)
    with _autocast(dtype):
        found = search(model, src, lengths)
    never = [model.config.pad_id, model.config.bos_id]
    for sentence, [hyp] in zip(SOURCES, found, strict=True):
        tokens = [*hyp.tokens, model.config.eos_id]
        steps = len(tokens) - 1 if len(hyp.tokens) == search.max_len else len(tokens)
        with torch.no_grad():
            [rows, _] = _stepped(exact, torch.tensor(sentence), tokens)
        allowed = rows.clone()
        allowed[:, never] = float("-inf")
        allowed[: search.min_len, model.config.eos_id] = float("-inf")
        best = allowed.argmax(1).tolist()
        differ = [t for t in range(steps) if best[t] != tokens[t]]     # the cap forces eos

        def pick(rows, total, differ=differ, best=best, tokens=tokens):
            return [total, *(rows[t, best[t]] - rows[t, tokens[t]] for t in differ)]

        (want_rows, want_total), bounds = _bounds_along(
            model, exact, torch.tensor(sentence), tokens, dtype, pick)
        error = abs(hyp.log_prob - float(want_total))
        assert error <= bounds[0], f"log_prob error {error:.3g} > bound {bounds[0]:.3g}"
        for t, bound in zip(differ, bounds[1:], strict=True):
            margin = float(want_rows[t, best[t]] - want_rows[t, tokens[t]])
            assert margin <= bound, (f"step {t}: token {tokens[t]} is {margin:.3g} below "
                                     f"float64's best {best[t]}, beyond the bound {bound:.3g}")


# A target vocabulary of 2 words, unk and eos, and hypotheses of 1 or 2 tokens: 12 in all, and
# a beam of 9 keeps every prefix, so the search is exhaustive.
SMALL_VOCAB, WORDS, BEAM, MAX_LEN = 6, (3, 4, 5), 9, 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_beam_search_within_the_rounding_bound(path, dtype) -> None:
    """An exhaustive beam search finds a hypothesis whose float64 log-probability is within
    the two hypotheses' bounds of the float64 best's (so it is the best unless the two are that
    close), and reports its log-probability within its bound."""
    model = _model(path, tgt_vocab=SMALL_VOCAB)
    exact = _exact(model)
    sentence = torch.tensor(SOURCES[0])
    eos = model.config.eos_id
    with _autocast(dtype):
        [[hyp]] = BeamSearch(beam_size=BEAM, max_len=MAX_LEN)(model, sentence[None],
                                                              torch.tensor([len(sentence)]))
    every = [[*y, eos] for n in range(1, MAX_LEN + 1) for y in itertools.product(WORDS, repeat=n)]
    with torch.no_grad():
        exact_scores = [float(_stepped(exact, sentence, y)[1]) for y in every]
    best = every[max(range(len(every)), key=exact_scores.__getitem__)]
    found = [*hyp.tokens, eos]
    assert found in every

    def pick(rows, total):
        return [total]

    (_, found_exact), [found_bound] = _bounds_along(model, exact, sentence, found, dtype, pick)
    (_, best_exact), [best_bound] = _bounds_along(model, exact, sentence, best, dtype, pick)
    error = abs(hyp.log_prob - float(found_exact))
    assert error <= found_bound, f"log_prob error {error:.3g} > bound {found_bound:.3g}"
    shortfall = float(best_exact - found_exact)
    assert shortfall <= found_bound + best_bound, (
        f"found {found} scores {shortfall:.3g} below float64's best {best}, beyond the bound "
        f"{found_bound + best_bound:.3g}")


# ----------------------------------------------------------------------------------------------
# Training with a GradScaler


@pytest.mark.parametrize("path", PATHS)
def test_float16_training_with_a_grad_scaler_lowers_the_loss_like_float32(path) -> None:
    """A few float16 updates with a GradScaler: finite weights after each; each skipped update
    halves the scale; the float64 loss of the weights falls, as float32's does."""
    batch = _batch()

    def exact_loss(model) -> float:
        with torch.no_grad():
            twin = _exact(model)
            return float(twin.loss(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)[0])

    start = exact_loss(_model(path))
    for amp in (None, torch.float16):
        model = _model(path)
        scaler = torch.amp.GradScaler("cpu") if amp is not None else None
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for _ in range(4):
            before = [p.detach().clone() for p in model.parameters()]
            scale = scaler.get_scale() if scaler is not None else None
            train_step(model, batch, optimizer, clip_norm=None, amp_dtype=amp, scaler=scaler)
            assert all(bool(p.isfinite().all()) for p in model.parameters())
            moved = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before,
                                                             strict=True))
            if scaler is not None:
                assert moved == (scaler.get_scale() >= scale), "a skip is the scaler's backoff"
            else:
                assert moved
        assert exact_loss(model) < start, f"{amp or torch.float32}: the loss did not fall"


# ----------------------------------------------------------------------------------------------
# The library's calls under autocast, and --amp's refusal


def test_library_calls_run_the_model_in_the_autocast_dtype() -> None:
    """torch.autocast around `Translator.translate`, `translate_corpus` and `score_corpus`
    runs the model's matrix products in bfloat16 (in float32 without it)."""
    from training_fixtures import TINY_VOCAB

    from bahdanau.data import DefaultTokenizer
    from bahdanau.evaluate import score_corpus, translate_corpus
    from bahdanau.translate import Translator

    model = _model({"attention_impl": "reference", "engine": "fast"}).eval()
    tokenizer = DefaultTokenizer()
    translator = Translator(model, tokenizer, TINY_VOCAB, TINY_VOCAB)
    search = BeamSearch(beam_size=2, max_len=4)
    calls = {
        "Translator.translate": lambda: translator.translate(["w1 w2 w3"], search=search),
        "translate_corpus": lambda: translate_corpus(model, ["w1 w2"], TINY_VOCAB, TINY_VOCAB,
                                                     tokenizer, search=search, progress=None),
        "score_corpus": lambda: score_corpus(model, ["w1 w2"], ["w3"], TINY_VOCAB, TINY_VOCAB,
                                             tokenizer, progress=None),
    }
    products = {"mm", "addmm", "bmm", "mv", "addmv", "baddbmm"}
    for name, call in calls.items():
        for dtype in (torch.float32, torch.bfloat16):
            with _autocast(dtype):
                run, _ = record(call)
            seen = {op.dtypes[0] for op in run.ops if op.func.overloadpacket.__name__ in products}
            if dtype == torch.bfloat16:
                assert seen == {torch.bfloat16}, (name, seen)
            else:
                assert torch.bfloat16 not in seen, (name, seen)


def test_amp_refused_in_one_line_where_torch_cannot_autocast() -> None:
    with pytest.raises(InputError) as info:
        autocast("bf16", torch.device("meta"))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("--amp bf16: torch cannot autocast to bfloat16 on meta")
    with pytest.raises(InputError, match="--amp must be one of none, bf16, fp16, auto, got 'fp8'"):
        autocast("fp8", torch.device("cpu"))
    assert isinstance(autocast("fp16", torch.device("cpu")), torch.autocast)   # CPU float16
