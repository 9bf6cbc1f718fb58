"""How a model was built: every part records its class and its constructor's arguments.

    model = RNNSearch(BiRNNEncoder(V, E, H), AttentiveDecoder(..., attention=MyAttention(D, 2H, A)))
    record = build_record(model)          # {"part": "bahdanau.models:RNNSearch", "args": {...}}
    same = blueprint(record, trust_code=True).build()   # the same model, newly initialised

Every class of a model's parts (`BiRNNEncoder`, `AttentiveDecoder`, every `Attention`, the
user's own subclasses included, `RNNSearch`) is a `Part`: the one `__init__` that builds an
object records the arguments it was called with, bound to its signature with the defaults
filled in (`Part.__init_subclass__` wraps each class's own `__init__` once). `build_record`
turns a part into the tree that a model folder's ``config.json`` holds: a part is
``{"part": "module:QualName", "args": {...}}``, an argument that is itself a part is recorded
the same way, and any other argument must be JSON (numbers, strings, booleans, None, and lists
and dicts of them); anything else is one `InputError` naming the argument, when the record is
made.

`blueprint` reads a record back without running any of it: every class it names is checked
first. bahdanau's own parts are found among the classes already defined (`Part` registers each
as it is defined), never by importing a module a record names (a record could name any module
of the package, `bahdanau.__main__` among them); a class outside bahdanau is imported only
when the caller says so (`trust_code`, or a `parts` mapping that gives the class itself). Then
`Blueprint.build` calls each class with its arguments, innermost first. Nothing is
unpickled: the record is JSON and the weights are loaded apart (safetensors). Only `Part`
classes are called, so a record cannot name any other callable.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bahdanau._checks import describe
from bahdanau._folders import CONFIG
from bahdanau.errors import InputError

__all__ = ["PART", "Blueprint", "Part", "blueprint", "build_record", "class_path"]

PART = "part"                      # a record node's key for its class's import path
_ARGS = "args"                     # ... and for its constructor's arguments
_LIBRARY = "bahdanau"              # this package's parts are found without being trusted
_LIBRARY_PARTS: dict[str, type] = {}   # class_path -> class, each of the package's parts
_JSON = "numbers, strings, booleans, None, lists and dicts of them, and parts"


class Part:
    """A class whose objects record how they were built (`built_with`), for `build_record`.

    Each subclass's own `__init__` is wrapped once: after it has run, the outermost one (the
    `__init__` of the object's own class, or the nearest one it inherits) records its bound
    arguments, defaults included. A subclass needs nothing more.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _in_library(cls.__module__):
            _LIBRARY_PARTS[class_path(cls)] = cls
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_records", False):
            cls.__init__ = _recording(init)  # type: ignore[method-assign]

    @property
    def built_with(self) -> dict[str, Any] | None:
        """The arguments its `__init__` was called with, by parameter name (None: no record)."""
        return self.__dict__.get("_built_with")


def _recording(init: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(init)

    @functools.wraps(init)
    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if type(self).__init__ is recording:         # the object's own, outermost __init__
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            arguments.pop(next(iter(signature.parameters)))           # self
            object.__setattr__(self, "_built_with", arguments)

    recording._records = True  # type: ignore[attr-defined]
    return recording


def class_path(cls: type) -> str:
    """``module:QualName``, the import path a record names a class by."""
    return f"{cls.__module__}:{cls.__qualname__}"


def build_record(part: object, name: str = "model") -> dict[str, Any]:
    """The record of `part` and, recursively, of the parts it was built from.

    Raises:
        InputError: a part that records no arguments (not a `Part`), a class defined inside
            a function (it cannot be imported again), or an argument that is none of {_JSON};
            one line naming the argument (``model.decoder.attention.scale``).
    """
    built = part.built_with if isinstance(part, Part) else None
    if built is None:
        raise InputError(f"{name} is a {type(part).__name__}, which does not record how it was "
                         "built: a model's parts subclass bahdanau's (BiRNNEncoder, "
                         "AttentiveDecoder, Attention, RNNSearch)")
    path = class_path(type(part))
    if "<locals>" in path:
        raise InputError(f"{name} is a {type(part).__qualname__}, a class defined inside a "
                         "function: define it at the top of a module, so that it can be "
                         "imported again")
    return {PART: path, _ARGS: {key: _value(value, f"{name}.{key}")
                                for key, value in built.items()}}


def _value(value: Any, name: str) -> Any:
    if isinstance(value, Part):
        return build_record(value, name)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, (list, tuple)):
        return [_value(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if (isinstance(value, dict) and PART not in value
            and all(isinstance(k, str) for k in value)):
        return {k: _value(v, f"{name}[{k!r}]") for k, v in value.items()}
    raise InputError(f"{name} is {describe(value)}: a model folder's config.json records "
                     f"constructor arguments that are {_JSON}; pass such values to __init__ "
                     "and build the rest inside it")


@dataclass(frozen=True)
class Blueprint:
    """A record whose classes are found: `build` makes the model it describes."""

    record: dict[str, Any]
    classes: dict[str, type]          # every class path of the record, resolved
    name: str = CONFIG                # where the record is kept, for messages

    @property
    def root(self) -> type:
        """The class of the outermost part (the model's)."""
        return self.classes[self.record[PART]]

    def build(self) -> Any:
        """The model of the record, newly initialised (the weights are loaded apart).

        Raises:
            InputError: a constructor that refuses its recorded arguments (naming the part).
        """
        return self._build(self.record, self.name)

    def _build(self, node: Any, name: str) -> Any:
        if isinstance(node, list):
            return [self._build(v, f"{name}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        if PART not in node:
            return {k: self._build(v, f"{name}[{k!r}]") for k, v in node.items()}
        cls = self.classes[node[PART]]
        args = {k: self._build(v, f"{name}.{k}") for k, v in node[_ARGS].items()}
        try:
            return _call(cls, args)
        except (InputError, TypeError, ValueError) as err:
            raise InputError(f"{name}: {node[PART]} refuses its recorded arguments: "
                             f"{' '.join(str(err).split())}") from None


def _call(cls: type, args: dict[str, Any]) -> Any:
    """`cls` called with recorded arguments, each passed as its parameter's kind asks."""
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    parameters = inspect.signature(cls.__init__).parameters    # type: ignore[misc]
    for key, value in args.items():
        kind = parameters[key].kind if key in parameters else inspect.Parameter.KEYWORD_ONLY
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            positional.extend(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update(value)
        else:
            keywords[key] = value
    return cls(*positional, **keywords)


def _paths(node: Any, name: str, found: dict[str, str]) -> None:
    """Every class path of a record (with where it is first named), its shape checked."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            _paths(v, f"{name}[{i}]", found)
    elif isinstance(node, dict) and PART not in node:
        for k, v in node.items():
            _paths(v, f"{name}[{k!r}]", found)
    elif isinstance(node, dict):
        path, args = node[PART], node.get(_ARGS)
        if (not isinstance(path, str) or path.count(":") != 1 or not isinstance(args, dict)
                or set(node) != {PART, _ARGS}):
            raise InputError(f"{name}: a part is recorded as {{\"part\": \"module:QualName\", "
                             f"\"args\": {{...}}}}, got {describe(node)}")
        found.setdefault(path, name)
        for k, v in args.items():
            _paths(v, f"{name}.{k}", found)


def _in_library(module: str) -> bool:
    return module == _LIBRARY or module.startswith(_LIBRARY + ".")


def _allowed(path: str, trust_code: bool, parts: Mapping[str, type]) -> bool:
    return path in parts or trust_code or _in_library(path.partition(":")[0])


def _class(path: str, name: str, trust_code: bool, parts: Mapping[str, type]) -> type:
    """The class of `path`: given in `parts`, one of the package's own parts (never imported
    by name), or, trusted, imported."""
    if path in parts:
        return parts[path]
    if path in _LIBRARY_PARTS:
        return _LIBRARY_PARTS[path]
    if not trust_code:
        raise InputError(f"{name}: names {path}, which is not one of bahdanau's parts (a "
                         "model's encoder, decoder, attention or model class)")
    return _import(path, name)


def _import(path: str, name: str) -> type:
    module_name, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise InputError(f"{name}: names {path}, but module {module_name} cannot be imported "
                         f"({type(err).__name__}: {err})") from None
    for attribute in qualname.split("."):
        found = getattr(found, attribute, None)
        if found is None:
            raise InputError(f"{name}: names {path}, but module {module_name} has no "
                             f"{qualname}")
    return found


def blueprint(record: object, *, trust_code: bool = False,
              parts: Mapping[str, type] | None = None, name: str = CONFIG) -> Blueprint:
    """The `Blueprint` of a record (from `build_record`, as config.json holds it).

    Every class path is checked before any is imported: bahdanau's own parts are found
    without importing anything (a path under bahdanau that is none of them is refused), any
    other class only with `trust_code` (importing a module runs its code) or when `parts`
    gives the class for its path. Each class found must be a `Part`.

    Args:
        record: the record, as read from JSON.
        trust_code: import the classes outside bahdanau that the record names.
        parts: classes by import path (``{"my_module:MyAttention": MyAttention}``), used as
            given, without importing anything.
        name: where the record is kept, which messages name (a model folder's config.json,
            an exported folder's ``manifest.json model_config``).
    Raises:
        InputError: a malformed record, a class outside bahdanau without permission (nothing
            is imported then), a module or class that is not there, or one that is not a
            part; one line naming the class and, for permission, how to give it.
    """
    parts = dict(parts or {})
    for key, given in parts.items():
        if not isinstance(given, type):
            raise InputError(f"parts[{key!r}] must be a class, got {describe(given)}")
    if not isinstance(record, dict) or PART not in record:
        raise InputError(f"{name}: a model assembled from parts is recorded as "
                         '{"part": "module:QualName", "args": {...}}, got '
                         f"{describe(record)}")
    found: dict[str, str] = {}
    _paths(record, name, found)
    for path, named in found.items():
        if not _allowed(path, trust_code, parts):
            raise InputError(f"{named}: builds {path}, a class outside bahdanau, whose module "
                             "runs code when imported: pass trust_code=True (--trust-code) "
                             f"if you trust it, or parts={{{path!r}: the class}}")
    classes = {path: _class(path, named, trust_code, parts) for path, named in found.items()}
    for path, cls in classes.items():
        if not (isinstance(cls, type) and issubclass(cls, Part)):
            raise InputError(f"{found[path]}: names {path}, which is not a part of a model "
                             "(a class built on bahdanau's parts)")
    return Blueprint(record, classes, name)
