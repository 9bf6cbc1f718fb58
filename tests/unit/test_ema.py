"""The moving average of the weights (bahdanau.training.ema) in training, checkpoints and loading.

Expectations: the average after k steps is the recursion e_0 = w_0, e_t = d e_{t-1} + (1 - d) w_t
computed by hand in float64 from the weights recorded after each step; a resumed run ends with
the same average, bit for bit, as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from training_fixtures import TINY_VOCAB, random_examples, tiny_model

from bahdanau.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from bahdanau.config import TrainConfig
from bahdanau.errors import InputError
from bahdanau.training import WeightEMA, run_step, setup_run, train, validate_run
from bahdanau.training.loop import ema_note
from bahdanau.training.state import checkpoint_payload, restore
from bahdanau.translate import load

VOCAB = TINY_VOCAB
CFG = TrainConfig(batch_size=8, bucket=2, max_steps=14, log_every=100, save_every=100,
                  ema_decay=0.9)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_ema_after_k_steps_is_the_float64_recursion() -> None:
    model = tiny_model(0)
    run = setup_run(model, random_examples(40), replace(CFG, ema_decay=0.7), src_vocab=VOCAB,
                    tgt_vocab=VOCAB)
    seen = [_weights(model)]                              # w_0, then w_1 .. w_k
    for _ in range(5):
        run_step(run)
        seen.append(_weights(model))
    d = 0.7
    for key in seen[0]:
        expected = seen[0][key].double()
        for weights in seen[1:]:
            expected = d * expected + (1 - d) * weights[key].double()
        actual = run.ema.state_dict()[key]
        assert actual.dtype == torch.float32
        torch.testing.assert_close(actual.double(), expected, rtol=1e-6, atol=1e-7)
    # the tolerance is far below how much the average differs from the last weights
    gap = max(float((run.ema.state_dict()[k].double() - seen[-1][k].double()).abs().max())
              for k in seen[0])
    assert gap > 1e-4


def test_ema_survives_resume_exactly(tmp_path) -> None:
    examples = random_examples(40)
    quiet = {"src_vocab": VOCAB, "tgt_vocab": VOCAB, "log": lambda s: None}
    straight = train(tiny_model(0, dropout=0.2), examples, CFG,
                     checkpoint_dir=tmp_path / "straight", **quiet)
    half = train(tiny_model(0, dropout=0.2), examples, replace(CFG, max_steps=7),
                 checkpoint_dir=tmp_path / "resumed", **quiet)
    assert half.step == 7
    torch.manual_seed(12345)                 # a new process: other RNG state and weights
    resumed = train(tiny_model(99, dropout=0.2), examples, CFG,
                    checkpoint_dir=tmp_path / "resumed", **quiet)
    assert resumed.step == straight.step == 14
    a = load_checkpoint(straight.last_checkpoint)
    b = load_checkpoint(resumed.last_checkpoint)
    assert a["ema"].keys() == a["model"].keys()
    assert all(torch.equal(a["ema"][k], b["ema"][k]) for k in a["ema"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert not all(torch.equal(a["ema"][k], a["model"][k]) for k in a["ema"])


def test_validation_scores_the_average_and_keeps_the_trained_weights() -> None:
    model = tiny_model(0)
    run = setup_run(model, random_examples(40), CFG, src_vocab=VOCAB, tgt_vocab=VOCAB)
    for _ in range(3):
        run_step(run)
    trained = _weights(model)
    scored = {}

    def validate(m: torch.nn.Module) -> float:
        scored.update(_weights(m))
        return 1.0

    validate_run(run, validate)
    assert all(torch.equal(scored[k], run.ema.state_dict()[k]) for k in scored)
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    assert model.training


def test_checkpoints_translate_with_the_average(tmp_path) -> None:
    model = tiny_model(0)
    ema = WeightEMA(model, 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)                                   # e = w_0 + 0.5
    path = tmp_path / "c.pt"
    save_checkpoint(path, checkpoint_payload(model, src_vocab=VOCAB, tgt_vocab=VOCAB, ema=ema))
    averaged, _, _ = model_from_checkpoint(path)
    trained, _, _ = model_from_checkpoint(path, ema=False)
    with pytest.raises(InputError, match="^ema must be True or False, got"):
        model_from_checkpoint(path, ema="no")        # a str is true: it would take the average
    for key, value in averaged.state_dict().items():
        assert torch.equal(value, ema.state_dict()[key])
        assert torch.equal(trained.state_dict()[key], model.state_dict()[key])
    translator = load(path)
    assert all(torch.equal(v, ema.state_dict()[k])
               for k, v in translator.model.state_dict().items())


def test_restore_takes_the_section_or_starts_from_the_restored_weights() -> None:
    source = tiny_model(0)
    source_ema = WeightEMA(source, 0.9)
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(2.0)
    source_ema.update(source)
    with_section = checkpoint_payload(source, src_vocab=VOCAB, tgt_vocab=VOCAB, ema=source_ema)
    target = tiny_model(1)
    ema = WeightEMA(target, 0.9)
    restore(with_section, target, ema=ema, restore_rng=False)
    assert all(torch.equal(v, source_ema.state_dict()[k]) for k, v in ema.state_dict().items())
    without = checkpoint_payload(source, src_vocab=VOCAB, tgt_vocab=VOCAB)
    restore(without, target, ema=ema, restore_rng=False)
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in ema.state_dict().items())


def test_a_bad_ema_section_is_refused_before_anything_changes() -> None:
    source = tiny_model(0)
    payload = checkpoint_payload(source, src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 ema=WeightEMA(source, 0.9))
    key = next(iter(payload["ema"]))
    payload["ema"][key] = torch.zeros(3)
    target = tiny_model(1)
    before = _weights(target)
    with pytest.raises(InputError, match=f"checkpoint ema weights do not fit the model: "
                                         f"'{key}' has shape") as err:
        restore(payload, target, ema=WeightEMA(target, 0.9), restore_rng=False)
    assert "\n" not in str(err.value)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    with pytest.raises(InputError, match="checkpoint ema weights do not fit"):
        model_from_checkpoint(payload)
    assert model_from_checkpoint(payload, ema=False)[0] is not None


def test_a_run_too_short_for_its_average_is_noted_at_the_start() -> None:
    """0.9 over 5 updates keeps 0.9^5 = 59% of the initial weights; the note names the decay
    that keeps at most 5% (0.05^(1/5) = 0.5493, rounded down) and is not repeated on resume.
    Over 40 updates (1.5%) there is none."""
    lines: list[str] = []
    cfg = replace(CFG, max_steps=5, ema_decay=0.9)
    train(tiny_model(0), random_examples(40), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
          log=lines.append)
    notes = [line for line in lines if line.startswith("note:")]
    assert notes == ["note: after this run's 5 updates the moving average of the weights "
                     "(ema_decay 0.9) still holds 59% of the initial weights, which every "
                     "translation from its checkpoints uses; ema_decay 0.549 or less suits a "
                     "run this short (or none)"]
    assert ema_note(0.9, 40) is None and ema_note(0.9, None) is None
    assert ema_note(0.998, 2270) is None and ema_note(0.998, 1000) is not None


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1, float("nan"), True, "0.9"])
def test_bad_decays_are_refused(decay) -> None:
    with pytest.raises(InputError, match="^ema_decay must be"):
        TrainConfig(ema_decay=decay)
    with pytest.raises(InputError, match="decay must be a number in"):
        WeightEMA(tiny_model(), decay)
