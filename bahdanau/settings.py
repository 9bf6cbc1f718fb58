"""A setting declared once: its type, default, help, bounds and resume rule, and its checks.

A setting is a dataclass field made by `setting(default, help, ...)`. Its `Setting` says what
the command line shows (help, metavar, and its flag where it differs from the field's name),
which values are allowed (bounds), and what a resumed run may do with it (`on_resume`).
`check_settings` checks every declared field of a dataclass instance against its declaration,
with one `InputError` naming the field, so a value is checked the same way whatever it came from
(Python, a command line, a config file, a checkpoint).

The configs (`bahdanau.config.TrainConfig`, `bahdanau.config.ModelChoices`) and the commands'
options (`bahdanau.jobs.options`) are declared with it; `bahdanau.jobs.options` builds the
command line from these declarations and names a setting by its flag (`naming_fields`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from bahdanau._checks import is_finite_number, is_int
from bahdanau.errors import InputError

__all__ = ["OnResume", "Setting", "check_settings", "declared", "like", "naming_fields",
           "setting"]

# What a resumed run may do with a setting: refuse a change ("fixed": the model, the data, the
# batches, the seed, the optimizer type), apply and log it ("applied"), or not record it at all
# ("not_recorded": where and how to start, e.g. --out).
OnResume = Literal["fixed", "applied", "not_recorded"]
# The largest integer setting unless declared otherwise (thread counts, lengths and steps are C
# ints somewhere below).
INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class Setting:
    """What a declaration says about one setting besides its type and default."""

    help: str
    low: float | None = None      # smallest allowed value (numbers)
    high: float | None = None     # largest allowed value (numbers)
    above: bool = False           # the value must be strictly greater than `low`
    below: bool = False           # the value must be strictly less than `high`
    required: bool = False        # must be given (its default None means "missing")
    on_resume: OnResume = "applied"
    metavar: str | None = None
    flag: str | None = None       # its command-line name, where it is not the field's name;
                                  # "" keeps it off the command line
    group: str | None = None      # its section of --help, where it is not its options' section's


def setting(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field declaring a setting (see `Setting` for the keywords)."""
    return dataclasses.field(default=default, metadata={"setting": Setting(help, **kwargs)})


def like(cls: type, name: str, **default: Any) -> Any:
    """A field declared as the setting `name` of dataclass `cls` (its help, bounds and resume
    rule), with its default, or `default=...` where given: a section of settings chosen from
    another declaration (`bahdanau.presets.ModelChoices`)."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    return dataclasses.field(default=default.get("default", field.default),
                             metadata=field.metadata)


_DECLARED: dict[type, tuple[tuple[dataclasses.Field, Any, Setting], ...]] = {}


def declared(cls: type) -> tuple[tuple[dataclasses.Field, Any, Setting], ...]:
    """(field, resolved type annotation, `Setting`) of each declared setting of dataclass `cls`."""
    if cls not in _DECLARED:
        hints = typing.get_type_hints(cls)
        _DECLARED[cls] = tuple((f, hints[f.name], f.metadata["setting"])
                               for f in dataclasses.fields(cls) if "setting" in f.metadata)
    return _DECLARED[cls]


def base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


def is_list(base: Any) -> bool:
    """A `tuple[str, ...]` setting: one or more strings."""
    return typing.get_origin(base) is tuple


def describe_type(base: Any) -> str:
    """How a message names the values of a type: "an integer", "one of a, b", ..."""
    if is_list(base):
        return "one or more strings"
    if typing.get_origin(base) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(base)))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[base]


_NAMING: contextvars.ContextVar[Callable[[dataclasses.Field], str]] = contextvars.ContextVar(
    "naming", default=lambda field: field.name)


@contextmanager
def naming_fields(name_of: Callable[[dataclasses.Field], str]) -> Iterator[None]:
    """Inside, `check_settings` names a field `name_of(field)` (a command line: its flag)."""
    token = _NAMING.set(name_of)
    try:
        yield
    finally:
        _NAMING.reset(token)


def field_name(field: dataclasses.Field) -> str:
    """What a message calls `field` here (see `naming_fields`)."""
    return _NAMING.get()(field)


def check_settings(obj: Any) -> None:
    """Check every declared setting of the dataclass instance `obj` against its declaration.

    Raises:
        InputError: the first value of the wrong type or out of bounds, named (`naming_fields`).
    """
    for field, annotation, spec in declared(type(obj)):
        _check_value(field_name(field), spec, annotation, getattr(obj, field.name))


def _check_value(name: str, spec: Setting, annotation: Any, value: Any) -> None:
    base, optional = base_type(annotation)
    if value is None:
        if spec.required:
            raise InputError(f"{name} is required")
        if optional:
            return
        raise InputError(f"{name} must be {describe_type(base)}, got None")
    if typing.get_origin(base) is Literal:
        if value not in typing.get_args(base):
            raise InputError(f"{name} must be {describe_type(base)}, got {value!r}")
        return
    if is_list(base):
        if not (isinstance(value, tuple) and value
                and all(isinstance(v, str) and v.strip() for v in value)):
            raise InputError(f"{name} must be {describe_type(base)} (not empty), got {value!r}")
        return
    kind_ok = {int: is_int, float: is_finite_number, bool: lambda v: isinstance(v, bool),
               str: lambda v: isinstance(v, str)}[base](value)
    if not kind_ok:
        what = "a finite number" if base is float else describe_type(base)
        raise InputError(f"{name} must be {what}, got {value!r}")
    if base is str and not value.strip():
        raise InputError(f"{name} must not be empty")
    if spec.low is not None:
        if value < spec.low or (spec.above and value == spec.low):
            bound = f"> {spec.low:g}" if spec.above else f">= {spec.low:g}"
            raise InputError(f"{name} must be {bound}, got {value!r}")
    high = spec.high if spec.high is not None or base is not int else INT_MAX
    if high is not None and (value > high or (spec.below and value == high)):
        bound = f"< {high:g}" if spec.below else f"<= {high:g}"
        raise InputError(f"{name} must be {bound}, got {value!r}")
