"""Learning-rate schedules (bahdanau.training.schedules) against hand-computed rates."""

from __future__ import annotations

import math

import pytest
import torch

from bahdanau import InputError, TrainConfig
from bahdanau.training import LRSchedule
from bahdanau.training.schedules import set_lr


def rates(cfg: TrainConfig, steps: list[int], decays: int = 0) -> list[float]:
    schedule = LRSchedule.from_config(cfg)
    return [schedule(step, decays) for step in steps]


def test_constant_is_the_configured_rate_at_every_step() -> None:
    assert rates(TrainConfig(), [1, 2, 10**6]) == [1.0, 1.0, 1.0]            # Adadelta's 1.0
    assert rates(TrainConfig(optimizer="adam"), [1, 7]) == [1e-3, 1e-3]
    assert rates(TrainConfig(schedule="plateau"), [1, 9], decays=0) == [1.0, 1.0]


def test_linear_warmup_then_constant() -> None:
    # lr 0.4 over W = 4 updates: 0.1, 0.2, 0.3, 0.4, then 0.4
    got = rates(TrainConfig(lr=0.4, warmup_steps=4), [1, 2, 3, 4, 5, 100])
    assert got == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4], rel=1e-12)


def test_inverse_sqrt_with_warmup() -> None:
    # W = 4: step / 4 up to 4, then sqrt(4 / step): 0.5 at 16, 0.2 at 100
    cfg = TrainConfig(optimizer="adam", lr=2e-3, schedule="inverse_sqrt", warmup_steps=4)
    got = rates(cfg, [1, 2, 4, 9, 16, 100])
    expected = [2e-3 * x for x in (0.25, 0.5, 1.0, 2 / 3, 0.5, 0.2)]
    assert got == pytest.approx(expected, rel=1e-12)


def test_inverse_sqrt_without_warmup_is_one_over_sqrt_step() -> None:
    got = rates(TrainConfig(schedule="inverse_sqrt"), [1, 4, 25])
    assert got == pytest.approx([1.0, 0.5, 0.2], rel=1e-12)


def test_plateau_decays_every_patience_bad_evaluations_down_to_the_floor() -> None:
    cfg = TrainConfig(schedule="plateau", decay_factor=0.5, decay_patience=2, min_lr=0.2)
    schedule = LRSchedule.from_config(cfg)
    # bad evaluations since the last improvement: a decay after the 2nd, 4th, 6th, ...
    assert [schedule.decays_after(n) for n in range(7)] == [
        False, False, True, False, True, False, True]
    # 1.0, 0.5, 0.25, then the floor 0.2 (not 0.125)
    assert [schedule(50, d) for d in range(4)] == pytest.approx([1.0, 0.5, 0.25, 0.2])
    # the warm-up scales the decayed (floored) rate: 3 of 10 warm-up updates
    warm = LRSchedule.from_config(TrainConfig(schedule="plateau", min_lr=0.2, warmup_steps=10))
    assert warm(3, 3) == pytest.approx(0.3 * 0.2)


def test_linear_falls_to_zero_one_update_after_the_last() -> None:
    # T = 9 updates, no warm-up: (10 - step) / 10, the last update takes a tenth of the rate
    cfg = TrainConfig(optimizer="adam", lr=2e-3, schedule="linear", max_steps=9)
    got = rates(cfg, [1, 5, 9, 10, 50])
    assert got == pytest.approx([2e-3 * x for x in (0.9, 0.5, 0.1, 0.0, 0.0)], abs=1e-15)


def test_linear_after_warmup_and_above_the_floor() -> None:
    # W = 2, T = 7: 0.5 and 1 while warming up, then (8 - step) / 6: 5/6 at 3, 1/6 at 7
    cfg = TrainConfig(lr=0.6, schedule="linear", warmup_steps=2, max_steps=7)
    got = rates(cfg, [1, 2, 3, 5, 7])
    assert got == pytest.approx([0.3, 0.6, 0.5, 0.3, 0.1], rel=1e-12)
    floored = TrainConfig(lr=0.6, schedule="linear", warmup_steps=2, max_steps=7, min_lr=0.2)
    assert rates(floored, [5, 7, 30]) == pytest.approx([0.3, 0.2, 0.2])


@pytest.mark.parametrize("schedule", ["constant", "inverse_sqrt"])
def test_only_plateau_decays_on_evaluations(schedule: str) -> None:
    cfg = TrainConfig(schedule=schedule, decay_patience=1)
    assert not any(LRSchedule.from_config(cfg).decays_after(n) for n in range(5))


def test_min_lr_floors_the_inverse_sqrt_decay() -> None:
    cfg = TrainConfig(schedule="inverse_sqrt", min_lr=0.25)
    assert rates(cfg, [4, 16, 64]) == pytest.approx([0.5, 0.25, 0.25])


def test_set_lr_writes_every_group() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.1}], lr=1.0)
    set_lr(optimizer, 0.25)
    assert [g["lr"] for g in optimizer.param_groups] == [0.25, 0.25]


def test_from_config_needs_a_train_config() -> None:
    with pytest.raises(InputError, match="cfg must be a TrainConfig"):
        LRSchedule.from_config({"schedule": "constant"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"schedule": "cosine"}, "schedule"), ({"warmup_steps": -1}, "warmup_steps"),
     ({"warmup_steps": 1.5}, "warmup_steps"), ({"decay_factor": 0.0}, "decay_factor"),
     ({"decay_factor": 1.0}, "decay_factor"), ({"decay_factor": math.nan}, "decay_factor"),
     ({"decay_patience": 0}, "decay_patience"), ({"min_lr": -1e-4}, "min_lr"),
     ({"optimizer": "adam", "min_lr": 1e-3}, "min_lr"), ({"lr": 0.5, "min_lr": 0.6}, "min_lr"),
     ({"min_lr": "0"}, "min_lr"), ({"accumulation": 0}, "accumulation"),
     ({"accumulation": True}, "accumulation"), ({"schedule": "linear"}, "schedule"),
     ({"schedule": "linear", "max_steps": 5, "warmup_steps": 5}, "warmup_steps"),
     # the plateau without evaluations, or with a patience that stops the run at or before its
     # first decay: no update would ever take a decayed rate
     ({"schedule": "plateau", "eval_every": 0}, "schedule"),
     ({"schedule": "plateau", "decay_patience": 3, "patience": 3}, "patience")],
)
def test_bad_schedule_and_accumulation_settings_are_one_line_errors(changes, field) -> None:
    with pytest.raises(InputError, match=f"^{field} ") as info:
        TrainConfig(**changes)
    assert "\n" not in str(info.value)


def test_a_patience_above_the_decay_patience_leaves_the_plateau_time_to_act() -> None:
    assert TrainConfig(schedule="plateau", decay_patience=2, patience=3).patience == 3
