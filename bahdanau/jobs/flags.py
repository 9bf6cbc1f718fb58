"""How an options dataclass becomes command-line flags, and flags become options again.

An options class (`Options`, see `bahdanau.jobs.options`) declares each option once, as a field
made with `bahdanau.settings.setting`, or as a `section` of settings declared elsewhere whose
settings are options of their own. `flat_settings` lists them as the command line sees them,
`add_arguments` makes the argparse options, in the --help groups of `GROUPS`, and
`Options.from_mapping` turns parsed flags or a config file back into the options.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any, Literal

from typing_extensions import Self

from bahdanau.errors import InputError
from bahdanau.settings import (
    Setting,
    base_type,
    check_settings,
    declared,
    describe_type,
    is_list,
    naming_fields,
)


def flag(name: str) -> str:
    """The command-line flag of the option `name`: ``--train-batch-size``."""
    return "--" + name.replace("_", "-")


# What an optional number is given as, on the command line or in a config file, to be None:
# ``--ema-decay none`` (no moving average), ``--clip-norm none`` (no clipping). A None in a
# mapping means "not given", the declared default.
NONE = "none"


def flag_words(name: str, value: Any) -> str:
    """The command-line words that give the option `name` this value: ``--no-layer-norm``,
    ``--decoder-size 256``, ``--ema-decay none``."""
    if isinstance(value, bool):
        return flag(name) if value else flag(f"no_{name}")
    return f"{flag(name)} {NONE if value is None else shlex.quote(str(value))}"


def _key(field: dataclasses.Field) -> str:
    """An option's name on the command line and in config files (without the dashes)."""
    spec: Setting = field.metadata["setting"]
    return spec.flag or field.name


def _flag_of(field: dataclasses.Field) -> str:
    return flag(_key(field))


# The sections of a command's --help, in order: a setting names its own (`Setting.group`), or
# takes that of the section it is declared in (`section`); a setting of neither is listed first.
GROUPS: dict[str, str] = {
    "data": "the corpus, its tokenisation and vocabularies",
    "model": "architecture and sizes (a preset, and changes to it)",
    "optimisation": "the optimizer, its schedule and the batches",
    "limits": "when training stops, and the dev evaluations that may stop it",
    "decoding": "beam search settings",
    "scoring": "how BLEU reads the text: its case and tokenisation (sacrebleu's, or Moses')",
    "machine": "device, threads, precision and loader processes",
    "output": "the run folder, checkpoints and logs",
}


def section(default: Any, group: str, prefix: str = "") -> Any:
    """A field holding a section of settings declared elsewhere (a frozen dataclass), whose
    settings are options of their own (flattened: ``--lr``, not ``--training-lr``), shown in
    --help under `group` unless a setting names its own; `prefix` goes before each of their
    names where a command holds the section apart from options of the same name
    (``--test-lowercase`` beside train's own ``--lowercase``)."""
    return dataclasses.field(default=default,
                             metadata={"section": True, "group": group, "prefix": prefix})


class FlatSetting(typing.NamedTuple):
    """One option as the command line sees it."""

    key: str                      # its name on the command line (``train_batch_size``)
    field: dataclasses.Field      # its field, in `section` or in the options class itself
    annotation: Any               # its resolved type
    spec: Setting
    section: str | None           # the options' field holding its section; None: its own
    group: str | None             # its section of --help (`GROUPS`); None: none
    default: Any                  # its value when not given (a section's default's)

    @property
    def takes_none(self) -> bool:
        """An optional number: `NONE` gives it None."""
        base, optional = base_type(self.annotation)
        return optional and base in (int, float)


def flat_settings(cls: type) -> Iterator[FlatSetting]:
    """Every option of the options class `cls`, sections flattened, in declaration order."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get("section"):
            for inner, annotation, spec in declared(hints[field.name]):
                if spec.flag != "":                    # "": kept off the command line
                    yield FlatSetting(field.metadata["prefix"] + _key(inner), inner,
                                      annotation, spec, field.name,
                                      spec.group or field.metadata["group"],
                                      getattr(field.default, inner.name))
        else:
            spec = field.metadata["setting"]
            yield FlatSetting(field.name, field, hints[field.name], spec, None, spec.group,
                              field.default)


def value_of(options: Any, s: FlatSetting) -> Any:
    """The value of one flattened option of `options`."""
    holder = options if s.section is None else getattr(options, s.section)
    return getattr(holder, s.field.name)


class Options:
    """Construction, validation and conversion shared by the option dataclasses."""

    def __post_init__(self) -> None:
        with naming_fields(_flag_of):
            check_settings(self)
        self.check()

    def check(self) -> None:
        """Checks that involve several options; raise `InputError`."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, text: bool = False) -> Self:
        """The options from `values` (option name -> value); absent or None means the default.

        Args:
            values: e.g. `vars(argparse_namespace)` or a parsed config file.
            text: the values are command-line strings to convert (numbers are parsed);
                otherwise they must already have the declared type (a config file).
        Raises:
            InputError: an unknown name, or a value of the wrong type or out of range (named).
        """
        settings = {s.key: s for s in flat_settings(cls)}
        unknown = sorted(set(values) - set(settings))
        if unknown:
            raise InputError(f"unknown option {unknown[0]!r} (known: "
                             f"{', '.join(sorted(settings))})")
        own: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            if value is None:
                continue
            s = settings[key]
            if isinstance(value, list) and is_list(base_type(s.annotation)[0]):
                value = tuple(value)                        # argparse's nargs, a JSON list
            if value == NONE and s.takes_none:
                value = None
            elif text:
                value = _from_text(key, s.annotation, value)
            target = own if s.section is None else sections.setdefault(s.section, {})
            target[s.field.name] = value
        # Options is a mixin of dataclasses, which mypy cannot see from here
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for name, given in sections.items():             # a section's errors name the flag too
            with naming_fields(_prefixed(fields[name].metadata["prefix"])):
                default: Any = fields[name].default           # a section's frozen dataclass
                own[name] = replace(default, **given)
        with naming_fields(_flag_of):
            return cls(**own)

    def to_record(self) -> dict[str, Any]:
        """Every option's value by its name, sections flattened, but those that say where and
        how to start (declared ``on_resume="not_recorded"``: --out, --resume, --overwrite)."""
        return {s.key: value_of(self, s) for s in flat_settings(type(self))
                if s.spec.on_resume != "not_recorded"}


def _prefixed(prefix: str) -> Callable[[dataclasses.Field], str]:
    """How messages name a setting of a section whose flags take `prefix`."""
    return lambda field: flag(prefix + _key(field))


def _from_text(name: str, annotation: Any, value: Any) -> Any:
    """A command-line string converted to the declared type (booleans come parsed)."""
    base, _ = base_type(annotation)
    if not isinstance(value, str) or base in (str, bool) or typing.get_origin(base) is Literal:
        return value
    try:
        return int(value) if base is int else float(value)
    except ValueError:
        raise InputError(f"{flag(name)} must be {describe_type(base)}, got {value!r}") from None


def add_arguments(parser: argparse.ArgumentParser, cls: type[Options]) -> None:
    """Add one argparse option per option of `cls` (sections flattened), in argument groups
    (`GROUPS`, in that order; the options of no group first).

    Every option's argparse default is None ("not given"), so that `from_mapping` fills in the
    declared default and a config file can be overridden only by what was given; an optional
    number is given None as `NONE`.
    """
    order: dict[str | None, int] = {name: i for i, name in enumerate(GROUPS)}
    settings = sorted(flat_settings(cls), key=lambda s: order.get(s.group, -1))  # ungrouped first
    used = {s.group for s in settings}
    groups: dict[str | None, Any] = {None: parser}
    for name, title in GROUPS.items():                      # in this order, those used
        if name in used:
            groups[name] = parser.add_argument_group(name, title)
    for s in settings:
        default = s.default
        base, _ = base_type(s.annotation)
        shown = "" if default is None else f" (default {default})"
        if default is not None and s.takes_none:
            shown = f" (default {default}; {NONE} turns it off)"
        kwargs: dict[str, Any] = {"default": None, "help": s.spec.help + shown}
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
            kwargs["help"] = s.spec.help + f" (default {'yes' if default else 'no'})"
        elif typing.get_origin(base) is Literal:
            kwargs["choices"] = typing.get_args(base)
        else:
            kwargs["metavar"] = s.spec.metavar or s.key.split("_")[-1].upper()
            if is_list(base):
                kwargs["nargs"] = "+"
        groups[s.group].add_argument(flag(s.key), dest=s.key, **kwargs)
