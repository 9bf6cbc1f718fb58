"""Checks of the optimizer and GradScaler states a checkpoint stores, before they are loaded.

`torch.optim.Optimizer.load_state_dict` checks only the sizes of the parameter groups: a
moment (Adam's `exp_avg`) of another shape or dtype loads, and the first step then aborts the
process, corrupts memory or allocates without bound; a NaN moment trains on silently. So
`bahdanau.training.state.restore` runs `check_optimizer_state` and `check_scaler_state` first,
and each problem is one `InputError` naming the entry.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from bahdanau._checks import describe, is_finite_number, is_int
from bahdanau.checkpoint.sections import OPTIMIZER, OPTIMIZER_CLASS
from bahdanau.errors import InputError

# The state entries of each parameter, for the optimizers `make_optimizer` builds: every one
# but "step" is a tensor of the parameter's shape and dtype. Adam with amsgrad also keeps
# "max_exp_avg_sq".
STATE_KEYS = {"Adadelta": ("step", "square_avg", "acc_delta"),
              "Adam": ("step", "exp_avg", "exp_avg_sq")}


def check_optimizer_state(payload: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Refuse a stored optimizer state that `optimizer.load_state_dict` would take wrongly or
    refuse: another optimizer type (where the checkpoint records it), other parameter groups,
    hyperparameters of another type, and, for the optimizers of `STATE_KEYS`, a parameter's
    state with other entries, a moment of another shape or dtype than its parameter or not
    finite, or a step counter that is not a finite number >= 0. Any other optimizer's stored
    tensors are only checked to be finite.

    Args:
        payload: the checkpoint, with its `optimizer` and `optimizer_class` sections.
        optimizer: the optimizer that will load it.
    Raises:
        InputError: one line naming the entry.
    """
    given = type(optimizer).__name__
    stored_class = payload.get(OPTIMIZER_CLASS)   # None in checkpoints of earlier versions
    if stored_class is not None and stored_class != given:
        raise InputError(f"checkpoint optimizer state is of {stored_class}, the given optimizer "
                         f"is {given}")
    stored = payload[OPTIMIZER]
    groups = stored.get("param_groups") if isinstance(stored, dict) else None
    if not (isinstance(groups, list) and isinstance(stored.get("state"), dict) and all(
            isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)):
        raise InputError("checkpoint optimizer is not an optimizer's state_dict")
    theirs = [len(g["params"]) for g in groups]
    ours = [len(g["params"]) for g in optimizer.param_groups]
    if theirs != ours:
        raise InputError(f"checkpoint optimizer state has parameter groups of sizes {theirs}, "
                         f"the given {given} has {ours}")
    ids = [i for g in groups for i in g["params"]]
    if not all(is_int(i) for i in ids) or len(set(ids)) != len(ids):
        raise InputError(f"checkpoint optimizer param_groups must list distinct int ids, got "
                         f"{describe(ids)}")
    for index, (group, our_group) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        _check_hyperparameters(group, our_group, index)
    params = dict(zip(ids, (p for g in optimizer.param_groups for p in g["params"]),
                      strict=True))
    group_of = {i: g for g in groups for i in g["params"]}
    for key, entry in stored["state"].items():
        if key not in params:
            raise InputError(f"checkpoint optimizer state[{key!r}] is of no parameter of "
                             "its param_groups")
        if not isinstance(entry, dict):
            raise InputError(f"checkpoint optimizer state[{key!r}] is a "
                             f"{type(entry).__name__}, not a dict")
        _check_parameter_state(entry, params[key], given, group_of[key], f"state[{key!r}]")


def _check_hyperparameters(stored: dict[str, Any], ours: dict[str, Any], index: int) -> None:
    """A stored parameter group has every hyperparameter of ours, each of its kind (a number,
    a flag, a tuple of numbers), which `load_state_dict` would take over unchecked."""
    for name, value in ours.items():
        if name == "params" or value is None:
            continue
        where = f"checkpoint optimizer param_groups[{index}][{name!r}]"
        if name not in stored:
            raise InputError(f"{where} is missing")
        theirs = stored[name]
        if isinstance(value, bool):         # None: a flag left to torch (fused, foreach)
            ok = theirs is None or isinstance(theirs, bool)
        elif isinstance(value, (int, float)):
            ok = is_finite_number(theirs) or isinstance(theirs, Tensor) and theirs.numel() == 1
        elif isinstance(value, (tuple, list)):
            ok = (isinstance(theirs, (tuple, list)) and len(theirs) == len(value)
                  and all(is_finite_number(x) for x in theirs))
        else:
            ok = True
        if not ok:
            raise InputError(f"{where} must be like {value!r}, got {describe(theirs)}")


def _check_parameter_state(entry: dict[str, Any], param: Tensor, optimizer: str,
                           group: dict[str, Any], where: str) -> None:
    """One parameter's stored optimizer state against the parameter (see
    `check_optimizer_state`)."""
    where = f"checkpoint optimizer {where}"
    expected: tuple[str, ...] | None = STATE_KEYS.get(optimizer)
    if expected is not None:
        expected = expected + (("max_exp_avg_sq",) if group.get("amsgrad") is True else ())
        if set(entry) != set(expected):
            raise InputError(f"{where} has the entries {sorted(map(str, entry))}, {optimizer} "
                             f"keeps {sorted(expected)}")
        _check_step(entry["step"], f"{where}['step']")
    for name, value in entry.items():
        if expected is not None and name != "step":
            if not isinstance(value, Tensor):
                raise InputError(f"{where}[{name!r}] is a {type(value).__name__}, not a tensor")
            if value.shape != param.shape or value.dtype != param.dtype:
                raise InputError(f"{where}[{name!r}] is {value.dtype} {tuple(value.shape)}, its "
                                 f"parameter {param.dtype} {tuple(param.shape)}")
        if (isinstance(value, Tensor) and value.is_floating_point()
                and not bool(torch.isfinite(value).all())):
            raise InputError(f"{where}[{name!r}] holds NaN or inf")


def _check_step(step: Any, where: str) -> None:
    """A step counter: a finite number >= 0, or a one-element tensor of one."""
    if isinstance(step, Tensor) and step.numel() == 1 and not step.is_complex() \
            and step.dtype != torch.bool:
        value = float(step)
    elif is_finite_number(step):
        value = float(step)
    else:
        raise InputError(f"{where} must be a number or a one-element tensor, got "
                         f"{describe(step)}")
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"{where} must be a finite number >= 0, got {value}")


# What `torch.amp.GradScaler.state_dict` holds, and the kind of each entry.
_SCALER_KEYS = {"scale": float, "growth_factor": float, "backoff_factor": float,
                "growth_interval": int, "_growth_tracker": int}


def check_scaler_state(stored: Any) -> None:
    """Refuse a stored GradScaler state that is not `torch.amp.GradScaler.state_dict`'s: its
    five entries, a positive finite scale and factors, counts that are ints >= 0.

    Raises:
        InputError: one line naming the entry.
    """
    if not (isinstance(stored, dict) and set(stored) == set(_SCALER_KEYS)):
        keys = sorted(map(str, stored)) if isinstance(stored, dict) else describe(stored)
        raise InputError(f"checkpoint scaler must hold {sorted(_SCALER_KEYS)}, got {keys}")
    for name, kind in _SCALER_KEYS.items():
        value = stored[name]
        ok = (is_int(value) and value >= (1 if name == "growth_interval" else 0)
              if kind is int else is_finite_number(value) and value > 0)
        if not ok:
            raise InputError(f"checkpoint scaler[{name!r}] must be "
                             f"{'an int' if kind is int else 'a finite number > 0'}, got "
                             f"{describe(value)}")
