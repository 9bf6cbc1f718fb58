"""Old checkpoint formats, one test per fix-up (`bahdanau.checkpoint.files`, where they all live).

Format 1 (docs/checkpoint-format.md) kept the training position at the top level, its
train_config held the never-read `max_len`, the best evaluation's step was only in best.json,
and a position after an epoch's last batch was stored as that epoch's end. Each expectation
below is written out by hand from that description.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bahdanau.checkpoint import FORMAT_VERSION, complete_old_state, upgrade_payload
from bahdanau.config import TrainConfig
from bahdanau.errors import InputError
from bahdanau.training import TrainState


def _format_1(**changes) -> dict:
    old = {"format": 1, "model": {}, "model_config": {}, "src_vocab": {}, "tgt_vocab": {},
           "train_config": {"batch_size": 8, "max_len": 50, "max_steps": 5},
           "step": 7, "epoch": 1, "sampler": {"epoch": 1, "position": 3},
           "best_metric": 12.5, "bad_evals": 2, "elapsed_s": 4.0,
           "optimizer": None, "scaler": None, "rng": None, "extra": {"note": "kept"}}
    return {**old, **changes}


def test_the_top_level_training_position_becomes_the_train_state() -> None:
    new = upgrade_payload(_format_1())
    assert new["format"] == FORMAT_VERSION
    assert new["train_state"] == {"step": 7, "epoch": 1, "position": 3, "best_metric": 12.5,
                                  "bad_evals": 2, "elapsed_s": 4.0}
    assert not {"step", "epoch", "sampler", "best_metric", "bad_evals", "elapsed_s"} & set(new)
    assert new["extra"] == {"note": "kept"}
    state = TrainState.from_dict(new["train_state"])      # what a resumed run parses
    assert (state.step, state.epoch, state.position, state.best_step) == (7, 1, 3, None)
    # without a sampler entry, format 1 was at the start of its epoch
    assert upgrade_payload(_format_1(sampler=None))["train_state"]["position"] == 0


def test_a_malformed_training_position_is_one_line() -> None:
    with pytest.raises(InputError, match="^checkpoint of format 1 has a malformed training "
                                         "position: ValueError"):
        upgrade_payload(_format_1(step="seven"))


def test_max_len_leaves_the_train_config() -> None:
    config = upgrade_payload(_format_1())["train_config"]
    assert config == {"batch_size": 8, "max_steps": 5}
    assert TrainConfig.from_dict(config).batch_size == 8
    with pytest.raises(InputError, match=r"unknown TrainConfig fields \['max_len'\]"):
        TrainConfig.from_dict({"max_len": 50})           # format 2 never holds it


def test_the_best_step_comes_from_best_json() -> None:
    state = SimpleNamespace(epoch=0, position=1, best_metric=12.5, best_step=None)
    complete_old_state(state, recorded_best_step=6, epoch_batches=lambda epoch: 10)
    assert state.best_step == 6
    current = SimpleNamespace(epoch=0, position=1, best_metric=12.5, best_step=4)
    complete_old_state(current, recorded_best_step=6, epoch_batches=lambda epoch: 10)
    assert current.best_step == 4                          # format 2 records its own


@pytest.mark.parametrize(("position", "after"), [(9, (2, 9)), (10, (3, 0)), (11, (3, 0))])
def test_an_epochs_end_is_the_next_epochs_start(position, after) -> None:
    state = SimpleNamespace(epoch=2, position=position, best_metric=None, best_step=None)
    complete_old_state(state, recorded_best_step=None, epoch_batches=lambda epoch: 10)
    assert (state.epoch, state.position) == after
