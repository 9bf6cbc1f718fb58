"""The sync-free update (`bahdanau.training.update.SyncFreeUpdate`): the same update as
`train_step`, on padded batches, with nothing read back to the host while it runs.

* equal to `train_step` in float64 over several updates (weights, optimizer state, stats), for
  both optimizers, both engines, both architectures, accumulation and label smoothing;
* `pad_to_multiple` changes no loss and no gradient;
* a non-finite loss or gradient skips the update on the device, bit for bit, as `train_step`
  skips it; a GradScaler's overflow is skipped and not counted;
* no host read while it runs (`host_reads.host_reads_refused`), in float32, bf16 and fp16;
* the whole update is one graph for `torch.compile(fullgraph=True)`;
* `adadelta_step` is torch's Adadelta step, bit for bit;
* what needs CUDA (the captured graphs, TF32) is refused on a CPU with one line.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch._dynamo
from host_reads import HostRead, host_reads_refused
from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

from bahdanau.captured_step import replay_eagerly
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import collate, pad_to_multiple
from bahdanau.kernels import triton_unavailable_reason
from bahdanau.training import setup_run, train
from bahdanau.training.step import make_optimizer, train_step
from bahdanau.training.update import SyncFreeUpdate, adadelta_step

BATCHES = [collate(random_examples(7, seed=s)) for s in range(3)]


def float64_model(seed: int = 0, **changes) -> torch.nn.Module:
    """A tiny float64 model with N(0, 0.5^2) weights: gradients well above rounding."""
    model = tiny_model(seed, **changes).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def assert_same_training(model, other, optimizer, other_optimizer) -> None:
    for (name, p), q in zip(model.named_parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        mine, theirs = optimizer.state[p], other_optimizer.state[q]
        assert mine.keys() == theirs.keys()
        for key in mine:
            torch.testing.assert_close(mine[key].cpu(), theirs[key].cpu(), rtol=1e-10,
                                       atol=1e-12, check_dtype=False, msg=key)


def assert_same_stats(got, want) -> None:
    assert got.n_tokens == want.n_tokens and got.non_finite == want.non_finite
    assert got.loss_sum == pytest.approx(want.loss_sum, rel=1e-12)
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-10)


# ---------------------------------------------------------------------------------- padding
def test_padding_to_multiples_changes_no_loss_and_no_gradient() -> None:
    model = float64_model()
    batch = BATCHES[0]
    padded = pad_to_multiple(batch, 8)
    assert padded.src.shape == (8, 8) and padded.tgt_in.shape == (8, 8)
    assert padded.indices.tolist()[-1] == -1 and padded.src_lengths.tolist()[-1] == 1
    params = list(model.parameters())
    loss, n = model.loss(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
    want = torch.autograd.grad(loss, params)
    loss_p, n_p = model.loss(padded.src, padded.src_lengths, padded.tgt_in, padded.tgt_out,
                             sync_free=True)
    got = torch.autograd.grad(loss_p, params)
    assert int(n_p) == int(n) == batch.n_tokens
    torch.testing.assert_close(loss_p, loss, rtol=1e-13, atol=0)
    for (name, _), g, w in zip(model.named_parameters(), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-13, msg=name)
    assert pad_to_multiple(padded, 8) is padded and pad_to_multiple(batch, 1) is batch
    one_line_error(lambda: pad_to_multiple(batch, 0), "multiple", ">= 1")


# ---------------------------------------------------------------------------------- equality
CASES = {
    "adadelta-fast": dict(optimizer="adadelta"),
    "adam-fast": dict(optimizer="adam"),
    "adadelta-reference-engine": dict(optimizer="adadelta", model=dict(engine="reference")),
    "adam-rnnencdec": dict(optimizer="adam", model=dict(arch="rnnencdec")),
    "adam-luong-paper-gru": dict(optimizer="adam",
                                 model=dict(attention="luong_general", gru_form="paper")),
    "adadelta-no-clip-smoothing": dict(optimizer="adadelta", clip_norm=None,
                                       label_smoothing=0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_equal_to_train_step_in_float64(case) -> None:
    options = dict(CASES[case])
    changes = options.pop("model", {})
    cfg = TrainConfig(**options)
    model = float64_model(**changes)
    other = copy.deepcopy(model)
    optimizer, other_optimizer = make_optimizer(model, cfg), make_optimizer(other, cfg)
    update = SyncFreeUpdate(model, optimizer, clip_norm=cfg.clip_norm,
                            label_smoothing=cfg.label_smoothing)
    updates = [BATCHES[0], BATCHES[1], BATCHES[2], BATCHES[:2]]     # the last: accumulation
    for batches in updates:
        want = train_step(other, batches, other_optimizer, clip_norm=cfg.clip_norm,
                          label_smoothing=cfg.label_smoothing)
        padded = ([pad_to_multiple(b, 8) for b in batches] if isinstance(batches, list)
                  else pad_to_multiple(batches, 8))
        assert_same_stats(update(padded).read(), want)
    assert_same_training(model, other, optimizer, other_optimizer)


@pytest.mark.parametrize("optimizer", ["adadelta", "adam"])
def test_a_non_finite_update_is_skipped_on_the_device_as_train_step_skips_it(optimizer) -> None:
    cfg = TrainConfig(optimizer=optimizer)
    model = float64_model()
    other = copy.deepcopy(model)
    opt, other_opt = make_optimizer(model, cfg), make_optimizer(other, cfg)
    update = SyncFreeUpdate(model, opt)
    update(pad_to_multiple(BATCHES[0], 8))                  # some optimizer state first
    train_step(other, BATCHES[0], other_opt)
    before = copy.deepcopy((model.state_dict(), opt.state_dict()))
    for m in (model, other):
        with torch.no_grad():
            m.decoder.output.bias[5] = float("inf")         # logits of inf - inf: NaN loss
    stats = update(pad_to_multiple(BATCHES[1], 8))
    want = train_step(other, BATCHES[1], other_opt)
    got = stats.read()
    assert got.non_finite and want.non_finite and bool(stats.skipped)
    with torch.no_grad():
        model.decoder.output.bias[5] = before[0]["decoder.output.bias"][5]
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[0][key]), key
    after = opt.state_dict()["state"]
    for index, state in before[1]["state"].items():
        for key, value in state.items():
            assert torch.equal(after[index][key].cpu(), value.cpu()), (index, key)


def test_a_gradscaler_overflow_is_skipped_and_not_counted_as_divergence() -> None:
    model = tiny_model()
    opt = make_optimizer(model, TrainConfig(optimizer="adam"))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)   # scaled fp16 grads overflow
    update = SyncFreeUpdate(model, opt, amp_dtype=torch.float16, scaler=scaler)
    weights = copy.deepcopy(model.state_dict())
    stats = update(pad_to_multiple(BATCHES[0], 8))
    assert bool(stats.skipped) and not stats.read().non_finite
    assert scaler.get_scale() < 2.0**40                       # backed off
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_recorded_shapes_replay_the_same_updates_as_the_eager_sync_free_update() -> None:
    """The bookkeeping of `cuda_graphs` (one recording per batch shape, static inputs copied
    in, the recorder's own runs taken back out of the gradients, outputs cloned), with
    `replay_eagerly` standing in for a CUDA graph: the same training as without it."""
    cfg = TrainConfig(optimizer="adam")
    model = float64_model()
    other = copy.deepcopy(model)
    opt, other_opt = make_optimizer(model, cfg), make_optimizer(other, cfg)
    captured = SyncFreeUpdate(model, opt, cuda_graphs=True, record=replay_eagerly)
    eager = SyncFreeUpdate(other, other_opt)
    shapes = set()
    for batches in [BATCHES[0], BATCHES[1], BATCHES[0], BATCHES[2], BATCHES[:2], BATCHES[1]]:
        padded = ([pad_to_multiple(b, 8) for b in batches] if isinstance(batches, list)
                  else [pad_to_multiple(batches, 8)])
        shapes |= {(tuple(b.src.shape), tuple(b.tgt_in.shape)) for b in padded}
        got, want = captured(padded), eager(padded)
        assert_same_stats(got.read(), want.read())
    assert captured.captured_shapes == len(shapes) and eager.captured_shapes == 0
    assert_same_training(model, other, opt, other_opt)


# ---------------------------------------------------------------------------------- no sync
NO_SYNC = {
    "adadelta-float32": (dict(), "adadelta", None),
    "adam-bf16": (dict(), "adam", torch.bfloat16),
    "adam-fp16-scaler": (dict(), "adam", torch.float16),
    "adadelta-rnnencdec-bf16": (dict(arch="rnnencdec"), "adadelta", torch.bfloat16),
    "adam-reference-engine-luong": (dict(engine="reference", attention="luong_general"),
                                    "adam", None),
    "adam-paper-gru": (dict(gru_form="paper"), "adam", None),
    "adam-fused-kernel-bf16": (dict(attention_impl="triton"), "adam", torch.bfloat16),
}


@pytest.mark.parametrize("case", list(NO_SYNC))
def test_the_update_reads_nothing_back_to_the_host(case) -> None:
    changes, optimizer, amp = NO_SYNC[case]
    if changes.get("attention_impl") == "triton" and triton_unavailable_reason(
            torch.empty(0)) is not None:
        pytest.skip(f"the fused kernel cannot run: {triton_unavailable_reason(torch.empty(0))}")
    model = tiny_model(**changes)
    opt = make_optimizer(model, TrainConfig(optimizer=optimizer))
    scaler = torch.amp.GradScaler("cpu") if amp is torch.float16 else None
    update = SyncFreeUpdate(model, opt, amp_dtype=amp, scaler=scaler)
    batches = [pad_to_multiple(b, 8) for b in BATCHES]
    losses = []
    for batch in batches:
        with host_reads_refused():
            stats = update(batch)
        losses.append(stats.read().loss_sum)                  # read after the window
    assert all(torch.isfinite(torch.tensor(losses)))
    with pytest.raises(HostRead), host_reads_refused():       # the guard sees train_step's
        train_step(model, BATCHES[0], opt, amp_dtype=amp, scaler=scaler)


# ---------------------------------------------------------------------------------- one graph
def test_the_whole_update_compiles_as_one_graph_equal_to_train_step() -> None:
    """Forward, backward, clipping and the optimizer step traced whole: no graph break.

    (Dynamo's graph run by the eager backend: the encoder's op differentiates its recomputed
    GRU with `torch.func.vjp`, which a graph of AOT autograd cannot call yet.)
    """
    cfg = TrainConfig(optimizer="adadelta")
    model = float64_model()
    other = copy.deepcopy(model)
    opt, other_opt = make_optimizer(model, cfg), make_optimizer(other, cfg)
    update = SyncFreeUpdate(model, opt)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True, trace_autograd_ops=True):
        compiled = torch.compile(update.__call__, fullgraph=True, backend="eager")
        for batch in BATCHES[:2]:
            got = compiled(pad_to_multiple(batch, 8)).read()
            assert_same_stats(got, train_step(other, batch, other_opt))
    assert_same_training(model, other, opt, other_opt)


# ---------------------------------------------------------------------------------- Adadelta
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adadelta_step_is_torch_s_step_bit_for_bit_and_nothing_when_skipped(dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(5, 3, generator=gen, dtype=dtype).requires_grad_(),
              torch.randn(4, generator=gen, dtype=dtype).requires_grad_()]
    twins = [p.detach().clone().requires_grad_() for p in params]
    ours = torch.optim.Adadelta(params, lr=0.7, rho=0.9, eps=1e-5)
    torchs = torch.optim.Adadelta(twins, lr=0.7, rho=0.9, eps=1e-5, foreach=True)
    for step in range(4):
        grads = [torch.randn(p.shape, generator=gen, dtype=dtype) for p in params]
        for p, q, g in zip(params, twins, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        if step == 2:                                # skipped: nothing changes
            before = copy.deepcopy(ours.state_dict()), [p.detach().clone() for p in params]
            adadelta_step(ours, torch.tensor(False))
            assert all(torch.equal(p, b) for p, b in zip(params, before[1], strict=True))
            assert str(ours.state_dict()) == str(before[0])
            continue
        adadelta_step(ours, torch.tensor(True))
        torchs.step()
        for p, q in zip(params, twins, strict=True):
            assert torch.equal(p, q)
            for key in ("square_avg", "acc_delta", "step"):
                assert torch.equal(ours.state[p][key], torchs.state[q][key].to(dtype)), key
    one_line_error(lambda: adadelta_step(torch.optim.SGD(params, lr=0.1), torch.tensor(True)),
                   "Adadelta")


# ---------------------------------------------------------------------------------- refusals
def test_what_needs_cuda_or_one_process_is_refused_in_one_line() -> None:
    model = tiny_model()
    adam = make_optimizer(model, TrainConfig(optimizer="adam"))
    one_line_error(lambda: SyncFreeUpdate(model, adam, cuda_graphs=True), "CUDA", "cpu")
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    one_line_error(lambda: SyncFreeUpdate(model, sgd), "Adadelta", "fused", "SGD")
    one_line_error(lambda: SyncFreeUpdate(model, adam, record=replay_eagerly), "cuda_graphs")
    plain = torch.nn.Linear(3, 3)
    one_line_error(lambda: SyncFreeUpdate(plain, make_optimizer(plain, TrainConfig())),
                   "sync_free", "Linear")
    ddp_free = one_line_error(lambda: setup_run(
        model, random_examples(4), replace(TrainConfig(max_steps=1), cuda_graphs=True),
        src_vocab=TINY_VOCAB, tgt_vocab=TINY_VOCAB), "--cuda-graphs", "CUDA")
    assert "cpu" in ddp_free


class _Unread(list):
    """Examples that fail the test when anything reads one (their count may be taken)."""

    def __iter__(self):
        raise AssertionError("the examples were read")

    def __getitem__(self, index):
        raise AssertionError("the examples were read")


def test_captured_updates_off_cuda_are_refused_before_any_work(tmp_path, capsys) -> None:
    """`cuda_graphs` on a CPU is refused at `train`'s entry, in one line, before the examples
    are read (checked, digested) or a checkpoint folder is made; ``bahdanau train --device cpu
    --cuda-graphs`` before its data are read (files that do not exist) or --out is made."""
    folder = tmp_path / "checkpoints"
    one_line_error(lambda: train(
        tiny_model(), _Unread(random_examples(4)), TrainConfig(max_steps=1, cuda_graphs=True),
        src_vocab=TINY_VOCAB, tgt_vocab=TINY_VOCAB, checkpoint_dir=folder, device="cpu"),
        "--cuda-graphs needs a CUDA device, training is on cpu")
    assert not folder.exists()
    missing, out = tmp_path / "missing", tmp_path / "run"
    code = main(["train", "--out", str(out), "--device", "cpu", "--cuda-graphs",
                 "--max-steps", "1", "--train-src", f"{missing}.en", "--train-tgt",
                 f"{missing}.fr"])
    assert (code, capsys.readouterr().err) == (
        2, "bahdanau: error: --cuda-graphs needs a CUDA device, training is on cpu\n")
    assert not out.exists()
