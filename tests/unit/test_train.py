"""Unit tests for bahdanau.training and bahdanau.checkpoint: steps, configs, checkpoints, resume."""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace

import pytest
import torch
from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

from bahdanau.checkpoint import (
    FORMAT_VERSION,
    CheckpointManager,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    upgrade_payload,
)
from bahdanau.checkpoint import files as checkpoint_module
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import BucketBatchSampler, DefaultTokenizer, Example, Vocab, collate
from bahdanau.evaluate import translate_corpus
from bahdanau.search import BeamSearch
from bahdanau.training import (
    BatchPlan,
    evaluate_loss,
    examples_digest,
    make_optimizer,
    run_step,
    save_run,
    setup_run,
    stop_reason,
    train,
    train_step,
    validate_run,
)
from bahdanau.training.state import TrainState, checkpoint_payload, restore
from bahdanau.training.threads import AdaptiveThreads

VOCAB = TINY_VOCAB


def _equal_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ----------------------------------------------------------------------------------------------
# TrainConfig and optimizers


def test_train_config_defaults_follow_paper() -> None:
    cfg = TrainConfig()
    assert (cfg.optimizer, cfg.learning_rate, cfg.rho, cfg.eps) == ("adadelta", 1.0, 0.95, 1e-6)
    assert (cfg.clip_norm, cfg.batch_size, cfg.bucket) == (1.0, 80, 20)
    assert TrainConfig(optimizer="adam").learning_rate == 1e-3
    assert not hasattr(cfg, "max_len")  # the sentence length is encode_pairs(..., max_len=50)


def test_train_config_dict_round_trip() -> None:
    cfg = TrainConfig(optimizer="adam", lr=3e-4, max_steps=10, patience=2, amp="bf16")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields \['lr_decay'\]"):
        TrainConfig.from_dict({**cfg.to_dict(), "lr_decay": 0.5})


@pytest.mark.parametrize(
    ("field", "value"),
    [("optimizer", "sgd"), ("lr", 0.0), ("rho", 1.0), ("eps", -1e-6), ("clip_norm", 0),
     ("batch_size", 0), ("max_tokens", 0), ("bucket", 0), ("max_steps", 0),
     ("max_epochs", 1.5), ("max_time_s", -1.0), ("eval_every", -1), ("save_every", 0),
     ("keep_last", 0), ("patience", 0), ("label_smoothing", 1.0), ("amp", "fp8"),
     ("log_every", 0), ("seed", "1"), ("lr", float("nan")), ("lr", float("inf")),
     ("clip_norm", True), ("max_steps", True), ("seed", True)],
)
def test_train_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        TrainConfig(**{field: value})


def test_make_optimizer() -> None:
    model = tiny_model()
    opt = make_optimizer(model, TrainConfig())
    assert isinstance(opt, torch.optim.Adadelta)
    group = opt.param_groups[0]
    assert (group["lr"], group["rho"], group["eps"]) == (1.0, 0.95, 1e-6)
    assert len(group["params"]) == len(list(model.parameters()))
    adam = make_optimizer(model, TrainConfig(optimizer="adam", lr=2e-3))
    assert isinstance(adam, torch.optim.Adam) and adam.param_groups[0]["lr"] == 2e-3


# ----------------------------------------------------------------------------------------------
# train_step and evaluate_loss


def test_train_step_matches_hand_computed_adadelta() -> None:
    model, reference = tiny_model(), tiny_model()
    batch = collate(random_examples(5))
    clip, rho, eps, lr = 0.5, 0.95, 1e-6, 1.0
    # Expected: gradient of (summed loss / B), clipped to norm 0.5, one Adadelta update from zero
    # state: v = (1 - rho) g^2, delta = sqrt(eps) / sqrt(v + eps) * g, p <- p - lr * delta.
    loss_sum, n_tokens = reference.loss(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
    (loss_sum / 5).backward()
    grads = [p.grad.double() for p in reference.parameters()]
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    scale = min(1.0, clip / (norm + 1e-6))
    expected = []
    for p, g in zip(reference.parameters(), grads, strict=True):
        g = g * scale
        v = (1 - rho) * g * g
        delta = math.sqrt(eps) / torch.sqrt(v + eps) * g
        expected.append(p.detach().double() - lr * delta)

    opt = torch.optim.Adadelta(model.parameters(), lr=lr, rho=rho, eps=eps)
    stats = train_step(model, batch, opt, clip_norm=clip)
    assert stats.n_tokens == int(n_tokens) == batch.n_tokens
    assert stats.loss_sum == pytest.approx(float(loss_sum.detach()), rel=1e-6)
    assert stats.grad_norm == pytest.approx(norm, rel=1e-5)
    assert norm > clip  # the clipping branch is exercised
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach().double(), e, rtol=1e-5, atol=1e-7)


def test_train_step_clips_gradient_norm() -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = train_step(model, collate(random_examples(6)), opt, clip_norm=1e-3)
    assert stats.grad_norm > 1e-3
    clipped = math.sqrt(sum(float((p.grad ** 2).sum()) for p in model.parameters()))
    assert clipped == pytest.approx(1e-3, rel=1e-3)


def test_train_step_skips_non_finite_gradient() -> None:
    model = tiny_model()
    with torch.no_grad():
        model.encoder.embedding.weight[5:].fill_(float("nan"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adadelta(model.parameters())
    stats = train_step(model, collate([Example(0, [5, 6], [7])]), opt)
    assert not math.isfinite(stats.grad_norm)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], equal_nan=True, rtol=0, atol=0)


def test_train_step_bf16_autocast_close_to_float32() -> None:
    batch = collate(random_examples(6))
    full, half = tiny_model(), tiny_model()
    fp32 = train_step(full, batch, torch.optim.SGD(full.parameters(), lr=0.1))
    bf16 = train_step(half, batch, torch.optim.SGD(half.parameters(), lr=0.1),
                      amp_dtype=torch.bfloat16)
    assert bf16.n_tokens == fp32.n_tokens
    assert bf16.loss_sum == pytest.approx(fp32.loss_sum, rel=0.02)
    assert bf16.grad_norm == pytest.approx(fp32.grad_norm, rel=0.1)
    assert all(p.dtype == torch.float32 and bool(p.isfinite().all()) for p in half.parameters())


def test_evaluate_loss_per_token_and_mode_restored() -> None:
    model = tiny_model(dropout=0.3)
    examples = random_examples(9)
    batches = [collate(examples[:4]), collate(examples[4:])]
    model.eval()
    with torch.no_grad():
        sums = [model.loss(b.src, b.src_lengths, b.tgt_in, b.tgt_out) for b in batches]
    expected = sum(float(s) for s, _ in sums) / sum(int(n) for _, n in sums)
    model.train()
    loss, ppl = evaluate_loss(model, batches)
    assert model.training
    assert loss == pytest.approx(expected, rel=1e-6)
    assert ppl == pytest.approx(math.exp(expected), rel=1e-6)


# ----------------------------------------------------------------------------------------------
# Checkpoint files


def test_checkpoint_round_trip(tmp_path) -> None:
    payload = {"w": torch.arange(6.0).reshape(2, 3), "n": 3, "x": None,
               "nested": {"a": [1, 2.5, "s"], "t": (torch.ones(2, dtype=torch.long),)}}
    save_checkpoint(tmp_path / "c.pt", payload)
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(loaded["w"], payload["w"])
    assert loaded["n"] == 3 and loaded["x"] is None and loaded["nested"]["a"] == [1, 2.5, "s"]
    assert torch.equal(loaded["nested"]["t"][0], torch.ones(2, dtype=torch.long))


def test_checkpoint_refuses_objects_before_writing(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"payload\['cfg'\] is a TrainConfig"):
        save_checkpoint(tmp_path / "c.pt", {"cfg": TrainConfig()})
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"version": 1})

    def broken_save(obj, f):
        f.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"version": 2})
    monkeypatch.undo()
    assert load_checkpoint(path) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_corrupt_and_truncated_checkpoints_name_the_file(tmp_path) -> None:
    good = tmp_path / "good.pt"
    save_checkpoint(good, {"w": torch.randn(100)})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: os.path.getsize(good) // 2])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    for path in (truncated, garbage):
        with pytest.raises(ValueError, match=f"{path.name}: not a readable checkpoint"):
            load_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_manager_keeps_last_and_best(tmp_path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step, metric in [(1, 1.0), (2, 3.0), (3, 2.0), (4, None), (5, 0.5)]:
        manager.save(step, {"step": step}, metric=metric)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.json", "best.pt", "step_00000004.pt", "step_00000005.pt"]
    assert manager.latest() == tmp_path / "step_00000005.pt"
    assert load_checkpoint(manager.best())["step"] == 2
    again = CheckpointManager(tmp_path, keep_last=2)  # a resumed run remembers the best
    assert (again.best_metric, again.best_step) == (3.0, 2)
    again.save(6, {"step": 6}, metric=2.5)
    assert load_checkpoint(again.best())["step"] == 2
    again.save(7, {"step": 7}, metric=3.5)
    assert load_checkpoint(again.best())["step"] == 7


def test_manager_removes_only_its_own_temporary_files(tmp_path) -> None:
    own = [".step_00000003.pt.x1.tmp", ".best.pt.x2.tmp", ".best.json.x3.tmp"]
    foreign = [".notes.tmp", ".model.pt.x.tmp", "step_00000001.pt.bak"]
    for name in own + foreign:
        (tmp_path / name).write_bytes(b"partial")
    CheckpointManager(tmp_path).save(4, {"step": 4}, metric=1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*foreign, "best.json", "best.pt", "step_00000004.pt"])


def test_manager_empty_directory(tmp_path) -> None:
    manager = CheckpointManager(tmp_path / "new")
    assert manager.latest() is None and manager.best() is None
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


# ----------------------------------------------------------------------------------------------
# Payloads and restore


STATE = TrainState(step=7, epoch=1, position=3, best_metric=0.25, best_step=6, bad_evals=1,
                   elapsed_s=12.5)


def _payload(model, optimizer=None, vocab=VOCAB):
    return checkpoint_payload(model, src_vocab=vocab, tgt_vocab=vocab, optimizer=optimizer,
                              train_config=TrainConfig(), train_state=STATE)


def test_payload_round_trip_rebuilds_model(tmp_path) -> None:
    model = tiny_model(1)
    opt = make_optimizer(model, TrainConfig())
    train_step(model, collate(random_examples(4)), opt)
    save_checkpoint(tmp_path / "c.pt", _payload(model, opt))
    payload = load_checkpoint(tmp_path / "c.pt")
    rebuilt, src_vocab, tgt_vocab = model_from_checkpoint(tmp_path / "c.pt")
    assert _equal_weights(rebuilt, model) and src_vocab == VOCAB == tgt_vocab
    assert TrainConfig.from_dict(payload["train_config"]) == TrainConfig()
    other = tiny_model(2)
    other_opt = make_optimizer(other, TrainConfig())
    state = restore(payload, other, other_opt, src_vocab=VOCAB, tgt_vocab=VOCAB)
    assert _equal_weights(other, model)
    assert state == STATE and state is not STATE  # the whole TrainState, as a new object
    assert str(other_opt.state_dict()) == str(opt.state_dict())


def test_restore_refuses_other_vocabulary() -> None:
    payload = _payload(tiny_model())
    other = Vocab([f"w{i}" for i in range(11)] + ["z"])
    with pytest.raises(ValueError, match=r"tgt_vocab: id 15 is 'w11' in the checkpoint but 'z'"):
        restore(payload, tiny_model(), src_vocab=VOCAB, tgt_vocab=other)
    with pytest.raises(ValueError, match="src_vocab: checkpoint has 16 entries, given .* 17"):
        restore(payload, tiny_model(), src_vocab=Vocab([f"w{i}" for i in range(13)]))


def test_restore_refuses_other_model_config() -> None:
    payload = _payload(tiny_model())
    target = tiny_model(hidden_size=10)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match="hidden_size: checkpoint 8 vs given 10"):
        restore(payload, target)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


# ----------------------------------------------------------------------------------------------
# Checkpoint format: version 1 (commit 3647b7e) still loads, later versions are refused

# TrainConfig(batch_size=8, bucket=2, max_steps=5, log_every=100, save_every=100) as format 1
# stored it, with the since removed field max_len.
FORMAT_1_TRAIN_CONFIG = {
    "optimizer": "adadelta", "lr": None, "rho": 0.95, "eps": 1e-06, "clip_norm": 1.0,
    "batch_size": 8, "max_tokens": None, "bucket": 2, "max_len": 50, "max_steps": 5,
    "max_epochs": None, "max_time_s": None, "eval_every": 1000, "save_every": 100,
    "keep_last": 3, "patience": None, "label_smoothing": 0.0, "amp": "none", "log_every": 100,
    "seed": 1234}


def _format_1(payload: dict, *, epoch: int, position: int) -> dict:
    """The dict that `checkpoint_payload` of format 1 wrote for the same run, key for key.

    Model, optimizer, scaler, configs, vocabularies, RNG states and extra are stored alike in
    both formats; format 1 kept the training position at the top level and the sampler state
    apart, and after an epoch's last batch it stored that epoch with position = its length.
    """
    state = payload["train_state"]
    return {
        "format": 1,
        "model": payload["model"],
        "optimizer": payload["optimizer"],
        "scaler": payload["scaler"],
        "model_config": payload["model_config"],
        "train_config": FORMAT_1_TRAIN_CONFIG,
        "src_vocab": payload["src_vocab"],
        "tgt_vocab": payload["tgt_vocab"],
        "step": state["step"],
        "epoch": epoch,
        "sampler": {"epoch": epoch, "position": position},
        "best_metric": state["best_metric"],
        "bad_evals": state["bad_evals"],
        "elapsed_s": state["elapsed_s"],
        "rng": payload["rng"],
        "extra": payload["extra"],
    }


def test_format_1_checkpoint_loads_for_translate_and_evaluate(tmp_path, capsys) -> None:
    model = tiny_model(3)
    opt = make_optimizer(model, TrainConfig())
    train_step(model, collate(random_examples(4)), opt)
    payload = checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=VOCAB, optimizer=opt,
                                 train_state=TrainState(step=1, position=1),
                                 extra={"tokenizer": {"name": "default", "lowercase": False}})
    old = _format_1(payload, epoch=0, position=1)
    save_checkpoint(tmp_path / "old.pt", old)

    rebuilt, src_vocab, tgt_vocab = model_from_checkpoint(tmp_path / "old.pt")
    assert _equal_weights(rebuilt, model) and src_vocab == VOCAB == tgt_vocab
    upgraded = upgrade_payload(load_checkpoint(tmp_path / "old.pt"))
    assert upgraded["format"] == FORMAT_VERSION
    assert TrainState.from_dict(upgraded["train_state"]) == TrainState(
        step=1, epoch=0, position=1, elapsed_s=0.0)
    assert TrainConfig.from_dict(upgraded["train_config"]) == TrainConfig(
        batch_size=8, bucket=2, max_steps=5, log_every=100, save_every=100)  # max_len dropped
    state = restore(load_checkpoint(tmp_path / "old.pt"), tiny_model(4), src_vocab=VOCAB,
                    tgt_vocab=VOCAB)
    assert state == TrainState(step=1, position=1)

    sentences = ["w1 w2 w3", "w4 w5"]
    (tmp_path / "src.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("w1 w2\nw3\n", encoding="utf-8")
    expected = translate_corpus(rebuilt, sentences, VOCAB, VOCAB, DefaultTokenizer(),
                                search=BeamSearch(beam_size=2, max_len=5))
    capsys.readouterr()
    search = ["--beam-size", "2", "--max-len", "5", "--threads", "1"]
    assert main(["translate", "--checkpoint", str(tmp_path / "old.pt"),
                 "--input", str(tmp_path / "src.txt"), *search]) == 0
    assert capsys.readouterr().out.splitlines() == [t.text for t in expected]
    assert main(["evaluate", "--checkpoint", str(tmp_path / "old.pt"), "--src",
                 str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt"), *search]) == 0
    assert "BLEU" in capsys.readouterr().out


def test_format_1_checkpoint_resumes_exactly(tmp_path) -> None:
    """A run checkpointed by the format-1 code at an epoch's end continues bit for bit."""
    examples = random_examples(40)  # 5 batches per epoch: step 5 ends epoch 0
    cfg = TrainConfig(batch_size=8, bucket=2, max_steps=14, log_every=100, save_every=100)
    quiet = {"src_vocab": VOCAB, "tgt_vocab": VOCAB, "log": lambda s: None}
    straight = tiny_model(0, dropout=0.2)
    train(straight, examples, cfg, **quiet)

    train(tiny_model(0, dropout=0.2), examples, replace(cfg, max_steps=5), checkpoint_dir=tmp_path,
          **quiet)
    path = tmp_path / "step_00000005.pt"
    payload = load_checkpoint(path)
    assert payload["train_state"]["epoch"] == 1 and payload["train_state"]["position"] == 0
    save_checkpoint(path, _format_1(payload, epoch=0, position=5))
    lines: list[str] = []
    resumed = tiny_model(99, dropout=0.2)
    result = train(resumed, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                   checkpoint_dir=tmp_path, log=lines.append)
    assert lines[0].endswith("at step 5, epoch 1") and result.step == 14
    assert _equal_weights(resumed, straight)
    assert load_checkpoint(result.last_checkpoint)["format"] == FORMAT_VERSION


def test_newer_format_is_refused_in_one_line(tmp_path, capsys) -> None:
    newer = {**_payload(tiny_model()), "format": FORMAT_VERSION + 1}
    message = (f"checkpoint format {FORMAT_VERSION + 1} is newer than this bahdanau reads "
               f"(formats 1 to {FORMAT_VERSION}); upgrade bahdanau to load it")
    for load in (model_from_checkpoint, lambda p: restore(p, tiny_model())):
        with pytest.raises(ValueError, match=re.escape(message)) as err:
            load(newer)
        assert "\n" not in str(err.value)
    save_checkpoint(tmp_path / "new.pt", newer)
    assert main(["translate", "--checkpoint", str(tmp_path / "new.pt")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"bahdanau: error: {tmp_path / 'new.pt'}: {message}"]
    for bad, match in (({"model": {}}, "not a bahdanau checkpoint: its 'format' is None"),
                       ({"format": "2"}, "its 'format' is '2'"),
                       ({"format": FORMAT_VERSION}, r"lacks \['model', ")):
        with pytest.raises(ValueError, match=match):
            upgrade_payload(bad)


def test_optional_sections_of_a_later_version_are_ignored() -> None:
    model = tiny_model(1)
    payload = {**_payload(model), "ema": model.state_dict(), "weights_digest": "sha256:0"}
    rebuilt, _, _ = model_from_checkpoint(payload)
    assert _equal_weights(rebuilt, model)
    assert restore(payload, tiny_model(2)) == STATE


# ----------------------------------------------------------------------------------------------
# Special ids: the vocabularies' everywhere


def test_train_refuses_config_ids_that_differ_from_vocabularies(tmp_path) -> None:
    """Regression: pad_id=5 used to train while collate padded with 0 and the loss masked 5."""
    model = tiny_model(pad_id=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"^model config pad_id=5 but src_vocab.pad_id=0: ") as err:
        train(model, random_examples(16), TrainConfig(max_steps=2), src_vocab=VOCAB,
              tgt_vocab=VOCAB, checkpoint_dir=tmp_path / "run", log=lambda s: None)
    assert "\n" not in str(err.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="model config bos_id=5 but src_vocab.bos_id=1"):
        checkpoint_payload(tiny_model(bos_id=5), src_vocab=VOCAB, tgt_vocab=VOCAB)


def test_load_refuses_checkpoint_whose_ids_differ_from_its_vocabularies() -> None:
    payload = _payload(tiny_model())
    payload["model_config"] = {**payload["model_config"], "eos_id": 7}
    with pytest.raises(ValueError, match="checkpoint is inconsistent: model config eos_id=7 but "
                                         "src_vocab.eos_id=2"):
        model_from_checkpoint(payload)


# ----------------------------------------------------------------------------------------------
# The loop


def test_train_stops_at_max_epochs_and_logs() -> None:
    lines: list[str] = []
    cfg = TrainConfig(batch_size=8, bucket=2, max_epochs=2, log_every=3)
    result = train(tiny_model(), random_examples(40), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                   log=lines.append)
    assert (result.step, result.epoch, result.stopped) == (10, 2, "max_epochs")  # 5 batches/epoch
    assert [h["step"] for h in result.history] == [3, 6, 9]
    assert all(k in lines[0] for k in ("step 3", "loss", "ppl", "tgt tok/s", "eta"))


def test_train_early_stopping_and_best(tmp_path) -> None:
    metrics = iter([1.0, 2.0, 1.5, 1.9, 5.0])
    modes: list[bool] = []

    def validate(model: torch.nn.Module) -> float:
        modes.append(model.training)
        return next(metrics)

    cfg = TrainConfig(batch_size=8, max_steps=50, eval_every=2, save_every=100, patience=2,
                      log_every=100)
    model = tiny_model()
    examples = random_examples(40)
    result = train(model, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                   checkpoint_dir=tmp_path, validate=validate, log=lambda s: None,
                   extra={"tokenizer": {"lowercase": True}})
    assert modes == [False] * 4 and model.training
    # evals at steps 2 (1.0), 4 (2.0 best), 6 (1.5), 8 (1.9): two without improvement -> stop
    assert (result.step, result.stopped) == (8, "patience")
    assert result.evals == [(2, 1.0), (4, 2.0), (6, 1.5), (8, 1.9)]
    assert (result.best_metric, result.best_step) == (2.0, 4)
    assert load_checkpoint(result.best_checkpoint)["train_state"]["step"] == 4
    last = load_checkpoint(result.last_checkpoint)
    assert last["train_state"]["step"] == 8 and last["extra"] == {"tokenizer": {"lowercase": True}}
    assert TrainState.from_dict(last["train_state"]) == TrainState(
        step=8, epoch=1, position=3, best_metric=2.0, best_step=4, bad_evals=2,
        elapsed_s=last["train_state"]["elapsed_s"], examples_digest=examples_digest(examples),
        run_id=last["train_state"]["run_id"])
    assert len(last["train_state"]["run_id"]) == 32   # a uuid4, as hex


def test_train_time_budget_and_token_batches() -> None:
    cfg = TrainConfig(max_tokens=30, bucket=1, max_time_s=1e-9, log_every=1)
    result = train(tiny_model(), random_examples(40), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                   log=lambda s: None)
    assert (result.step, result.stopped) == (1, "max_time")
    assert result.history[0]["loss"] == pytest.approx(result.train_loss)


def test_time_limit_before_a_linear_schedule_ends_says_so(tmp_path) -> None:
    lines: list[str] = []
    cfg = TrainConfig(max_tokens=30, bucket=1, max_time_s=1e-9, max_steps=100,
                      schedule="linear", lr=0.5, log_every=1)
    # update 1 of 100 took 0.5 * (101 - 1) / 101; the same again, resumed: it trains nothing
    for step in (1, 1):
        result = train(tiny_model(), random_examples(40), cfg, src_vocab=VOCAB,
                       tgt_vocab=VOCAB, checkpoint_dir=tmp_path, log=lines.append)
        assert (result.step, result.stopped) == (step, "max_time")
        assert lines[-1] == (
            "step 1 | the time limit stopped the run 99 updates before max_steps 100: its "
            "linear schedule's learning rate was 0.495, not yet 0; resume it with more time, "
            "or start again with a max_steps the time allows")
    lines.clear()
    train(tiny_model(), random_examples(40), replace(cfg, max_time_s=None, max_steps=2),
          src_vocab=VOCAB, tgt_vocab=VOCAB, log=lines.append)
    assert not any("time limit" in line for line in lines)


def test_train_argument_errors() -> None:
    with pytest.raises(ValueError, match="max_steps, max_epochs or max_time_s"):
        train(tiny_model(), random_examples(4), TrainConfig(), src_vocab=VOCAB, tgt_vocab=VOCAB)
    with pytest.raises(ValueError, match=r"tgt_vocab_size=16 but len\(tgt_vocab\)=14"):
        train(tiny_model(), random_examples(4), TrainConfig(max_steps=1), src_vocab=VOCAB,
              tgt_vocab=Vocab([f"w{i}" for i in range(10)]))


@pytest.mark.parametrize("optimizer", ["adadelta", "adam"])
def test_exact_resume(tmp_path, optimizer: str) -> None:
    """2N steps in one run == N steps, then a fresh model/optimizer resumed for N more."""
    examples = random_examples(40)  # 5 batches per epoch: the run crosses epoch boundaries mid-way
    cfg = TrainConfig(optimizer=optimizer, batch_size=8, bucket=2, max_steps=14, log_every=100,
                      save_every=100)
    quiet = {"src_vocab": VOCAB, "tgt_vocab": VOCAB, "log": lambda s: None}
    straight = tiny_model(0, dropout=0.2)  # dropout: the RNG state matters too
    train(straight, examples, cfg, **quiet)

    first = tiny_model(0, dropout=0.2)
    half = train(first, examples, replace(cfg, max_steps=7), checkpoint_dir=tmp_path, **quiet)
    assert half.step == 7 and not _equal_weights(first, straight)
    torch.manual_seed(12345)  # a new process: other RNG state, other initial weights
    resumed = tiny_model(99, dropout=0.2)
    result = train(resumed, examples, cfg, checkpoint_dir=tmp_path, **quiet)
    assert result.step == 14
    assert _equal_weights(resumed, straight)


def test_a_run_batched_by_tokens_resumes_with_another_batch_size(tmp_path) -> None:
    """With max_tokens before and after, batch_size forms no batch: a resumed run may change
    it (a logged change) and ends with the weights of the run that never stopped; without
    max_tokens on either side, it stays fixed."""
    examples = random_examples(40)
    cfg = TrainConfig(max_tokens=30, batch_size=8, bucket=2, max_steps=10, log_every=100,
                      save_every=100)
    quiet = {"src_vocab": VOCAB, "tgt_vocab": VOCAB, "log": lambda s: None}
    straight = tiny_model(0, dropout=0.2)
    train(straight, examples, cfg, **quiet)
    train(tiny_model(0, dropout=0.2), examples, replace(cfg, max_steps=5),
          checkpoint_dir=tmp_path / "tokens", **quiet)
    resumed = setup_run(tiny_model(99, dropout=0.2), examples, replace(cfg, batch_size=3),
                        src_vocab=VOCAB, tgt_vocab=VOCAB, checkpoint_dir=tmp_path / "tokens")
    assert resumed.resume_changes == ["batch_size: 8 -> 3", "max_steps: 5 -> 10"]
    while not stop_reason(resumed):
        run_step(resumed)
    assert resumed.state.step == 10 and _equal_weights(resumed.model, straight)
    sentences = replace(cfg, max_tokens=None, max_steps=1)
    train(tiny_model(), examples, sentences, checkpoint_dir=tmp_path / "sentences", **quiet)
    for folder, changed in (("sentences", replace(sentences, batch_size=3)),
                            ("sentences", replace(cfg, batch_size=3)),
                            ("tokens", replace(sentences, batch_size=3))):
        one_line_error(lambda f=folder, c=changed: setup_run(
            tiny_model(), examples, c, src_vocab=VOCAB, tgt_vocab=VOCAB,
            checkpoint_dir=tmp_path / f), "trained with batch_size=8, not 3")


def test_resume_after_crash_from_periodic_checkpoint(tmp_path) -> None:
    examples = random_examples(40)
    cfg = TrainConfig(batch_size=8, bucket=2, max_steps=14, log_every=1, save_every=4)
    straight = tiny_model(0, dropout=0.2)
    train(straight, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, log=lambda s: None)

    def crash_at_step_9(line: str) -> None:
        if line.startswith("step 9 "):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(0, dropout=0.2), examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
              checkpoint_dir=tmp_path, log=crash_at_step_9)
    (tmp_path / ".step_00000012.pt.abc.tmp").write_bytes(b"partial")  # killed mid-write
    lines: list[str] = []
    resumed = tiny_model(5, dropout=0.2)
    train(resumed, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, checkpoint_dir=tmp_path,
          log=lines.append)
    assert lines[0].startswith("resumed from") and "at step 8" in lines[0]
    assert _equal_weights(resumed, straight)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000008.pt", "step_00000012.pt", "step_00000014.pt"]


def test_pieces_make_the_same_run_as_train(tmp_path) -> None:
    """The loop of bahdanau.training's docstring, written out, trains exactly as train()."""
    examples = random_examples(40)
    cfg = TrainConfig(batch_size=8, bucket=2, max_steps=9, log_every=100, save_every=4)
    whole = tiny_model(0, dropout=0.2)
    train(whole, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, log=lambda s: None)

    mine = tiny_model(0, dropout=0.2)
    run = setup_run(mine, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=tmp_path)
    while not stop_reason(run):
        stats = run_step(run)
        assert stats.n_tokens > 0
        if run.state.step % cfg.save_every == 0:
            save_run(run)
    assert stop_reason(run) == "max_steps"
    assert (run.state.step, run.state.epoch, run.state.position) == (9, 1, 4)
    assert _equal_weights(mine, whole)
    assert [p.name for p in CheckpointManager(tmp_path).checkpoints()] == [
        "step_00000004.pt", "step_00000008.pt"]


def test_no_resume_refuses_a_directory_with_checkpoints(tmp_path) -> None:
    cfg = TrainConfig(batch_size=8, max_steps=2, log_every=100)
    train(tiny_model(), random_examples(16), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
          checkpoint_dir=tmp_path, log=lambda s: None)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="holds checkpoints of an earlier run"):
        train(tiny_model(), random_examples(16), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
              checkpoint_dir=tmp_path, resume=False, log=lambda s: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_resume_refuses_other_vocabulary(tmp_path) -> None:
    cfg = TrainConfig(batch_size=8, max_steps=2, log_every=100)
    train(tiny_model(), random_examples(16), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
          checkpoint_dir=tmp_path, log=lambda s: None)
    other = Vocab([f"v{i}" for i in range(12)])
    with pytest.raises(ValueError, match="src_vocab: id 4 is 'w0' in the checkpoint but 'v0'"):
        train(tiny_model(), random_examples(16), replace(cfg, max_steps=4), src_vocab=other,
              tgt_vocab=VOCAB, checkpoint_dir=tmp_path, log=lambda s: None)


# ----------------------------------------------------------------------------------------------
# Gradient accumulation and learning-rate schedules


def test_accumulated_update_equals_one_big_batch() -> None:
    """k batches in one update == one update on their concatenation (float64): the gradient
    is their summed loss over their total sentence count."""
    examples = random_examples(12)
    parts = [collate(examples[:4]), collate(examples[4:9]), collate(examples[9:])]
    whole = collate(examples)
    accumulated, big = tiny_model().double(), tiny_model().double()
    assert _equal_weights(accumulated, big)
    stats = train_step(accumulated, parts, torch.optim.SGD(accumulated.parameters(), lr=0.5),
                       clip_norm=None)
    one = train_step(big, whole, torch.optim.SGD(big.parameters(), lr=0.5), clip_norm=None)
    assert stats.n_tokens == one.n_tokens == whole.n_tokens
    assert stats.loss_sum == pytest.approx(one.loss_sum, rel=1e-12)
    assert stats.grad_norm == pytest.approx(one.grad_norm, rel=1e-10)
    for (name, p), q in zip(accumulated.named_parameters(), big.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-14), name
        assert torch.allclose(p, q, rtol=1e-12, atol=1e-14), name
    assert not _equal_weights(accumulated, tiny_model().double())  # the update did something
    with pytest.raises(ValueError, match="empty sequence of batches"):
        train_step(big, [], torch.optim.SGD(big.parameters(), lr=0.5))


@pytest.mark.parametrize(("processes", "accumulation"), [(1, 1), (1, 4), (2, 2), (4, 1), (3, 2)])
def test_batch_plan_shares_consecutive_batches_among_processes(processes, accumulation) -> None:
    """Each update is the next processes x accumulation batches of the one-process list (on
    into the next epoch); rank r takes `accumulation` consecutive ones from r x accumulation;
    every process counts the sentences of the whole update."""
    sampler = BucketBatchSampler([(n % 7 + 1, n % 5 + 1) for n in range(101)], max_tokens=40,
                                 bucket=3, seed=2, num_replicas=1, rank=0)
    flat = [b.tolist() for epoch in range(3) for b in sampler.epoch_batches(epoch)]
    plans = [BatchPlan(sampler, processes=processes, rank=r, accumulation=accumulation)
             for r in range(processes)]
    size, place = processes * accumulation, (0, 0)
    for start in range(0, len(flat) - size + 1, size):           # three epochs of updates
        updates = [plan.update(*place) for plan in plans]
        assert [b.tolist() for u in updates for b in u.batches] == flat[start:start + size]
        assert {u.sentences for u in updates} == {sum(map(len, flat[start:start + size]))}
        assert len({u.after for u in updates}) == 1
        place = updates[0].after


def test_batch_plan_refuses_bad_arguments() -> None:
    sampler = BucketBatchSampler([3, 4, 5, 6], batch_size=2, num_replicas=1, rank=0)
    one_line_error(lambda: BatchPlan(sampler, processes=2, rank=2), "rank must be in [0, 2)")
    one_line_error(lambda: BatchPlan(sampler, accumulation=0), "accumulation must be a positive")
    one_line_error(lambda: BatchPlan(BucketBatchSampler([3, 4], batch_size=1, num_replicas=2,
                                                        rank=0)), "num_replicas=1, not 2")


def test_run_step_takes_accumulation_batches_per_update(tmp_path) -> None:
    examples = random_examples(40)  # 5 batches per epoch: the 2nd update spans two epochs
    cfg = TrainConfig(batch_size=8, bucket=2, accumulation=3, max_steps=2, log_every=100)
    mine = tiny_model()
    run = setup_run(mine, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB)
    batches = [collate([examples[i] for i in b]) for epoch in (0, 1)
               for b in run.plan.sampler.epoch_batches(epoch)]
    run_step(run)
    assert (run.state.step, run.state.epoch, run.state.position) == (1, 0, 3)
    run_step(run)
    assert (run.state.step, run.state.epoch, run.state.position) == (2, 1, 1)
    by_hand = tiny_model()
    optimizer = make_optimizer(by_hand, cfg)
    for group in (batches[:3], batches[3:6]):
        train_step(by_hand, group, optimizer)
    assert _equal_weights(mine, by_hand)


def test_a_dev_evaluation_runs_at_the_chosen_thread_count_not_at_one_on_trial() -> None:
    """The updates try thread counts (`AdaptiveThreads`); a dev evaluation between two of them
    runs at the count chosen so far, and the trial goes on after it."""
    threads = [0]                                   # what the run has set, as torch would
    cfg = TrainConfig(batch_size=8, max_steps=3, eval_every=2, save_every=100, log_every=100)
    run = setup_run(tiny_model(), random_examples(40), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB)
    run.threads = AdaptiveThreads(2, trial=1, warm_up=1, hold=4,
                                  set_threads=lambda n: threads.__setitem__(0, n),
                                  log=lambda line: None)
    during: list[int] = []

    def validate(model) -> float:
        during.append(threads[0])
        return 1.0

    seen: list[int] = []
    for _ in range(3):
        run_step(run)             # update 1 warms up, update 2 measures at 2, then a trial at 1
        seen.append(threads[0])
        if run.state.step % cfg.eval_every == 0:
            validate_run(run, validate)
            seen.append(threads[0])
    assert seen[:3] == [2, 1, 1] and during == [2]


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "plateau"])
def test_exact_resume_with_schedule_and_accumulation(tmp_path, schedule: str) -> None:
    """12 updates of 2 batches in one run == 6, then a fresh model resumed for 6 more: the
    same weights and learning rate (the plateau's decays come back from the checkpoint)."""
    examples = random_examples(40)
    cfg = TrainConfig(batch_size=8, bucket=2, accumulation=2, schedule=schedule,
                      warmup_steps=3, decay_patience=2, max_steps=12, eval_every=2,
                      save_every=100, log_every=100)
    metrics = [1.0, 2.0, 2.0, 2.0, 2.0, 2.0]   # evaluations at steps 2, 4, ..., 12

    def run(model, cfg, directory, scores):
        return train(model, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                     checkpoint_dir=directory, validate=lambda m: next(scores),
                     log=lambda s: None)

    straight = tiny_model(0, dropout=0.2)
    run(straight, cfg, tmp_path / "straight", iter(metrics))
    scores = iter(metrics)
    assert run(tiny_model(0, dropout=0.2), replace(cfg, max_steps=6), tmp_path / "split",
               scores).step == 6
    torch.manual_seed(12345)
    resumed = tiny_model(99, dropout=0.2)
    result = run(resumed, cfg, tmp_path / "split", scores)
    assert result.step == 12 and _equal_weights(resumed, straight)
    states = [load_checkpoint(CheckpointManager(tmp_path / name).latest())
              for name in ("straight", "split")]
    # plateau: 2 bad evaluations (steps 6, 8) decay once, 4 (steps 6-12) twice; update 12
    # ran at 1.0 * 0.5; inverse_sqrt: sqrt(3 / 12) = 0.5 at update 12
    decays = 2 if schedule == "plateau" else 0
    for payload in states:
        assert payload["train_state"]["lr_decays"] == decays
        assert payload["train_state"]["position"] == 24 % 5 and payload["train_state"]["epoch"] == 4
        assert [g["lr"] for g in payload["optimizer"]["param_groups"]] == [pytest.approx(0.5)]


def test_a_run_continued_past_its_limit_is_the_run_that_never_stopped(tmp_path) -> None:
    """A limit between two evaluations ends the run with one more, off the schedule: it may be
    the best, but counts no bad evaluation for the plateau's decays or the patience, so the run
    continued to a later limit takes the rates of a run that never stopped."""
    examples = random_examples(40)
    cfg = TrainConfig(batch_size=8, bucket=2, schedule="plateau", decay_patience=1,
                      patience=2, eval_every=4, max_steps=8, save_every=100, log_every=100)

    def run(model, cfg, directory, metrics):
        return train(model, examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                     checkpoint_dir=directory, validate=lambda m: next(metrics),
                     log=lambda s: None)

    # straight: 1.0 at 4 (the best), 1.0 at 8 (one bad evaluation: one decay, no stop)
    straight = tiny_model(0)
    assert run(straight, cfg, tmp_path / "straight", iter([1.0, 1.0])).stopped == "max_steps"
    # stopped at 6 and continued: were 6's evaluation counted, 8's would be the second bad
    # one, a second decay (updates 7 and 8 at half the rate) and a patience stop
    first = run(tiny_model(0), replace(cfg, max_steps=6), tmp_path / "split", iter([1.0, 1.0]))
    assert first.evals == [(4, 1.0), (6, 1.0)]
    resumed = tiny_model(99)
    result = run(resumed, cfg, tmp_path / "split", iter([1.0]))
    assert (result.step, result.stopped) == (8, "max_steps")
    assert _equal_weights(resumed, straight)
    for name in ("straight", "split"):
        state = load_checkpoint(CheckpointManager(tmp_path / name).latest())["train_state"]
        assert (state["lr_decays"], state["bad_evals"], state["best_step"]) == (1, 1, 4)
    # an off-schedule evaluation that beats the best is the run's best: the result's, best.pt
    # and the best its checkpoint records (which a continued run compares with)
    best = run(tiny_model(0), replace(cfg, max_steps=6), tmp_path / "best", iter([1.0, 3.0]))
    assert (best.best_metric, best.best_step) == (3.0, 6)
    state = load_checkpoint(best.best_checkpoint)["train_state"]
    assert (state["step"], state["best_step"], state["best_metric"], state["bad_evals"]) == (
        6, 6, 3.0, 0)


def test_a_resumed_run_keeps_the_batches_of_an_update(tmp_path) -> None:
    """Processes x accumulation is fixed on resume: the same process count cannot change the
    accumulation, and a run of 2 processes resumes in 1 with twice the accumulation, on the
    updates a 1-process run with that accumulation makes."""
    examples = random_examples(40)
    cfg = TrainConfig(batch_size=8, bucket=2, max_steps=2, log_every=100)
    train(tiny_model(), examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
          checkpoint_dir=tmp_path / "one", log=lambda s: None)
    with pytest.raises(ValueError, match=r"step_00000002.pt: the run's updates are 1 batch "
                                         r"\(1 process x accumulation 1\), not 1 x 2; .* with "
                                         r"1 process, use accumulation 1$"):
        setup_run(tiny_model(), examples, replace(cfg, accumulation=2), src_vocab=VOCAB,
                  tgt_vocab=VOCAB, checkpoint_dir=tmp_path / "one")
    # A checkpoint as 2 processes with accumulation 1 write it (rank 0's RNG and weights).
    accumulated = replace(cfg, accumulation=2, max_steps=4)
    train(tiny_model(), examples, replace(accumulated, max_steps=2), src_vocab=VOCAB,
          tgt_vocab=VOCAB, checkpoint_dir=tmp_path / "two", log=lambda s: None)
    path = CheckpointManager(tmp_path / "two").latest()
    payload = load_checkpoint(path)
    payload["train_state"]["processes"] = 2
    payload["train_config"]["accumulation"] = 1
    save_checkpoint(path, payload)
    with pytest.raises(ValueError, match=r"updates are 2 batches \(2 processes x accumulation "
                                         r"1\), not 1 x 3; .* use accumulation 2$"):
        setup_run(tiny_model(), examples, replace(accumulated, accumulation=3),
                  src_vocab=VOCAB, tgt_vocab=VOCAB, checkpoint_dir=tmp_path / "two")
    resumed = setup_run(tiny_model(), examples, accumulated, src_vocab=VOCAB, tgt_vocab=VOCAB,
                        checkpoint_dir=tmp_path / "two")
    assert "accumulation: 1 -> 2" in resumed.resume_changes
    while not stop_reason(resumed):
        run_step(resumed)
    assert (resumed.state.step, resumed.state.processes) == (4, 1)
    straight = tiny_model()
    train(straight, examples, accumulated, src_vocab=VOCAB, tgt_vocab=VOCAB, log=lambda s: None)
    assert _equal_weights(resumed.model, straight)


def test_plateau_schedule_needs_validate(tmp_path) -> None:
    cfg = TrainConfig(batch_size=8, max_steps=2, schedule="plateau", log_every=100)
    with pytest.raises(ValueError, match="schedule 'plateau' decays .*: give validate"):
        train(tiny_model(), random_examples(16), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
              checkpoint_dir=tmp_path, log=lambda s: None)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_of_an_earlier_version_resumes_with_the_new_defaults(tmp_path) -> None:
    """Checkpoints written before the schedules, accumulation and dropout placements (no such
    fields in their configs and train state) load and resume."""
    examples = random_examples(16)
    cfg = TrainConfig(batch_size=8, max_steps=2, log_every=100)
    train(tiny_model(), examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
          checkpoint_dir=tmp_path, log=lambda s: None)
    path = CheckpointManager(tmp_path).latest()
    payload = load_checkpoint(path)
    for section, later in (("train_state", ["lr_decays"]),
                           ("model_config", ["dropout_rnn_inputs", "dropout_deep_output"]),
                           ("train_config", ["schedule", "warmup_steps", "decay_factor",
                                             "decay_patience", "min_lr", "accumulation"])):
        for key in later:
            del payload[section][key]
    save_checkpoint(path, payload)
    model, _, _ = model_from_checkpoint(path)
    assert model.config == tiny_model().config
    run = setup_run(tiny_model(), examples, replace(cfg, max_steps=3), src_vocab=VOCAB,
                    tgt_vocab=VOCAB, checkpoint_dir=tmp_path)
    assert run.state.step == 2 and run.state.lr_decays == 0 and run.resume_changes == [
        "max_steps: 2 -> 3"]
