"""What a resumed training run keeps and refuses of the options it is given.

A run folder stores `bahdanau.jobs.options.TrainOptions.to_record()` as its ``options.json``.
On resume, `resumed_options` completes the given options with what the run needs of its own
(its limits, its --time-budget, a fine-tuned run's --init-from), and `resume_changes` sorts what
still differs into the options it must refuse (declared ``on_resume="fixed"``: the model, the
data and its tokenisation, the batches, the seed, the optimizer type; but not one that neither
run reads, --train-batch-size where both batch by --max-tokens) and those it applies and
records ("applied"), which the run logs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bahdanau.config import UNNAMED_METRIC, unused_settings
from bahdanau.errors import InputError
from bahdanau.jobs.flags import NONE, FlatSetting, flag, flag_words, flat_settings, value_of
from bahdanau.jobs.options import TrainOptions

__all__ = ["resume_changes", "resumed_options"]

# Options that options.json records only since a later version, and the value that the runs
# written before then had: a missing one is compared as that (any other missing option is not).
# The model's attention, how it is computed, layer norm and the encoder's depth became options
# later too: before, every run trained ModelConfig's defaults (no layer norm, now the job's
# default; one encoder layer).
_BEFORE_RECORDED = {"early_stopping_metric": UNNAMED_METRIC, "attention": "additive",
                    "attention_impl": "auto", "engine": "fast", "layer_norm": False,
                    "encoder_layers": 1}


def resume_changes(stored: Mapping[str, Any], given: TrainOptions) -> list[str]:
    """What a resumed run changes, as "--flag old -> new" lines; refuses fixed options.

    Args:
        stored: the options the run was last started with (its ``options.json``).
        given: the options of this start.
    Returns:
        One line per changed "applied" option, to log ("--threads 2 -> default" when it is
        no longer given).
    Raises:
        InputError: a "fixed" option differs (named, with both values), unless neither run
            reads it (`bahdanau.config.unused_settings`: --train-batch-size where both batch
            by --max-tokens).
    """
    changes = []
    unused = _unused_training(stored, given)
    for s in flat_settings(type(given)):
        if s.spec.on_resume == "not_recorded" or s.key not in {*stored, *_BEFORE_RECORDED}:
            continue
        old, new = stored.get(s.key, _BEFORE_RECORDED.get(s.key)), value_of(given, s)
        if old == new:
            continue
        if s.key == "init_from" and old is not None:
            raise InputError(f"this run began with --init-from {old}, and resuming takes its "
                             "weights from its own checkpoints: leave --init-from out (or give "
                             f"{old} again) to resume it, or start a new run with another --out")
        if s.spec.on_resume == "fixed" and not (s.section == "training"
                                               and s.field.name in unused):
            again = "" if old is None else f"{flag_words(s.key, old)} resumes it; "
            raise InputError(f"{flag(s.key)} was {old!r} when this run began and is {new!r} "
                             f"now; a resumed run keeps it ({again}start a new run with another "
                             "--out, or --overwrite this one)")
        changes.append(f"{flag(s.key)} {_shown(old, s)} -> {_shown(new, s)}")
    return changes


def _unused_training(stored: Mapping[str, Any], given: TrainOptions) -> frozenset[str]:
    """The training settings (`TrainConfig` fields) that neither the stored run nor `given`
    reads (`bahdanau.config.unused_settings`)."""
    before = {s.field.name: stored.get(s.key, s.default) for s in flat_settings(type(given))
              if s.section == "training"}
    return unused_settings(before) & unused_settings(given.training.to_dict())


def _shown(value: Any, s: FlatSetting) -> str:
    """An option's value in a resume change: "default" for an option left unset, `NONE` for
    one turned off."""
    if value is None:
        return "default" if s.default is None else NONE
    return repr(value)


def resumed_options(stored: Mapping[str, Any], given: TrainOptions) -> TrainOptions:
    """`given` as it resumes the run that recorded `stored`, with the run's own values of what
    it leaves out and the run's start alone needed: its limits when `given` names none
    (--max-steps, --max-epochs, a non-zero --time-budget: ``bahdanau train --out RUN``
    continues an interrupted ``--max-steps 200`` run to step 200, not for the default job's
    length), a --time-budget not given (so that a run begun under an older default, 12
    minutes, keeps the length it had), and the --init-from model of a fine-tuned run, with its
    --init-vocab (its checkpoints hold the weights now: ``bahdanau train --out RUN ...``
    resumes it without naming the model again).

    Raises:
        InputError: a stored value is not a valid one (a damaged options.json).
    """
    kept: dict[str, Any] = {}
    training: dict[str, Any] = {}
    if not any(given.limits_given.values()):
        training = {name: stored[name] for name in ("max_steps", "max_epochs")
                    if stored.get(name) is not None}
    if given.time_budget is None and stored.get("time_budget") is not None:
        kept["time_budget"] = stored["time_budget"]
    if given.init_from is None and stored.get("init_from") is not None:
        kept["init_from"] = stored["init_from"]
        kept["init_vocab"] = stored.get("init_vocab", True)
    if training:
        kept["training"] = dataclasses.replace(given.training, **training)
    return dataclasses.replace(given, **kept) if kept else given
