"""A model's half of a model folder: ``config.json`` that rebuilds it, ``model.safetensors``.

    model.save_pretrained("my-model")                    # RNNSearch, RNNEncDec, or parts
    model = RNNSearch.from_pretrained("my-model")        # eval mode, the weights it was saved with
    RNNSearch.from_pretrained("my-model", trust_code=True)   # parts of one's own imported

Every model class (`bahdanau.models.RNNSearch` and its subclasses) is `Pretrained`: it writes
its own folder (`Pretrained.save_pretrained`: its config.json, its weights as safetensors and
the ``manifest.json`` with every file's SHA-256) and reads one back
(`Pretrained.from_pretrained`), a folder of the model alone or the model half of a
Translator's (``bahdanau release``, `bahdanau.Translator.save_pretrained`, which add the
vocabularies, tokenizer and card through `write_model_folder`'s `files`). This module is the
one copy of that half of the format (docs/release-format.md), on the model floor so that the
model classes have it; `bahdanau.checkpoint.release` writes and reads the rest.

config.json is the model's `ModelConfig` (a preset's model, which has `.config`) or its build
record (a model assembled from parts: `bahdanau.parts.build_record`; read back through
`bahdanau.parts.blueprint`, which imports a class outside bahdanau only when trusted).
Stored weights are checked against the model they are for before they are loaded
(`check_weights`, against `model_skeleton`: the model on the meta device, nothing allocated).

The safetensors package is an optional extra (``pip install 'bahdanau[share]'``).
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from bahdanau._about import versions
from bahdanau._checks import JSON_ERRORS, check_path, resolve_device
from bahdanau._files import (
    check_destination,
    held,
    new_folder,
    process_umask,
    restore_replaced,
    sha256_file,
    write_failure,
)
from bahdanau._folders import (
    CONFIG,
    MANIFEST,
    RELEASE_FORMAT,
    WEIGHTS,
    Kind,
    check_folder_to_write,
    manifest_kind,
)
from bahdanau.config import ModelConfig
from bahdanau.errors import InputError
from bahdanau.parts import PART, Blueprint, blueprint, build_record

__all__ = ["CONFIG", "MANIFEST", "RELEASE_FORMAT", "RELEASE_VERSION", "WEIGHTS", "Pretrained",
           "check_model_folder_to_write", "check_weights", "json_bytes", "model_config_json",
           "model_skeleton", "open_model_folder", "read_json", "read_weights", "safetensors",
           "write_model_folder"]

RELEASE_VERSION = 1                   # the manifest's "version": what this code reads


def safetensors() -> Any:
    """The safetensors.torch module, or one line saying how to install it."""
    try:
        import safetensors.torch
    except ImportError:
        raise InputError("a model folder keeps its weights as safetensors: pip install "
                         "'bahdanau[share]' (or pip install safetensors)") from None
    return safetensors.torch


def json_bytes(data: Any) -> bytes:
    """`data` as a model folder's JSON files hold it (indented, UTF-8, a final newline); its
    ``tokenizer.json`` is `bahdanau.data.tokenizers.tokenizer_files`'s, as in every folder."""
    return (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def model_config_json(model: nn.Module) -> dict[str, Any]:
    """What config.json holds for `model`: its `ModelConfig` as a dict when it has one (a
    preset's model), else its build record (`bahdanau.parts.build_record`).

    Raises:
        InputError: a part that records no arguments, or an argument that is not JSON (named);
            a model whose parts are not those its config builds.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        return build_record(model)
    _check_config_builds(model, config)
    return config.to_dict()


def _check_config_builds(model: nn.Module, config: ModelConfig) -> None:
    """Refuse a model whose parts are not those its config builds (an attention swapped in
    after `from_config`, or parts given with a `config=` of other parts): saved as its config,
    it would load as another model."""
    from_config = getattr(type(model), "from_config", None)
    if from_config is None:
        return
    built = dict(model_skeleton(lambda: from_config(config)).named_modules())
    for name, part in model.named_modules():
        expected = built.get(name)
        if type(part) is not type(expected):
            what = f"model.{name}" if name else "the model"
            builds = "nothing there" if expected is None else type(expected).__name__
            raise InputError(f"{what} is {type(part).__name__}, but its config builds "
                             f"{builds}: saved as its config it would load as another model; "
                             "build it from its parts without config= to record them")


# --- writing -------------------------------------------------------------------------------

def check_model_folder_to_write(out: Path, overwrite: bool) -> Path:
    """The folder `write_model_folder` writes for `out` (`check_destination`), checked before
    any work by the rule of every folder writer (`bahdanau._folders.check_folder_to_write`):
    absent, empty, or a model folder already, replaced only with `overwrite`.

    Raises:
        InputError: as `write_model_folder` says.
    """
    folder = check_destination(out, "a model folder")
    if check_folder_to_write(folder, Kind.MODEL, name=f"--out {out}") and not overwrite:
        raise InputError(f"--out {out} is a model folder already: replace it with --overwrite "
                         "or choose another folder")
    return folder


def write_model_folder(out: str | os.PathLike[str], weights: Mapping[str, Tensor],
                       config: dict[str, Any], *, files: Mapping[str, bytes] | None = None,
                       run_id: str | None = None, recorded: dict[str, Any] | None = None,
                       overwrite: bool = False) -> Path:
    """Write a model folder: `config` as config.json, `weights` as model.safetensors, the
    other `files` by name, and the manifest (format, version, `run_id`, the `recorded`
    versions, every file's SHA-256), atomically.

    The folder is written beside `out` and renamed into place once whole
    (`bahdanau._files.new_folder`, `held` against a second writer); a symbolic link keeps
    linking.

    Args:
        out: absent, empty, or a model folder to replace with `overwrite`; a folder of
            another kind or of other files is never replaced.
        weights: the state_dict to store (on any device; written from the CPU).
        config: config.json (`model_config_json`).
        files: the other files (vocabularies, tokenizer, card), by file name.
        run_id, recorded: what the manifest says of the run and the versions that wrote it.
        overwrite: replace the model folder `out` holds (only once the new one is whole).
    Returns:
        The folder.
    Raises:
        InputError: `out` is a file, a model folder without `overwrite`, a folder of another
            kind or of other files or inside a model folder, a place that cannot be replaced
            or is being written by another process; safetensors is not installed.
        OSError: a file could not be written (a full disk): one line naming `out`, which is
            left as it was.
    """
    out = check_path("--out", out)
    folder = check_model_folder_to_write(out, overwrite)
    save_file = safetensors().save_file
    files = {CONFIG: json_bytes(config), **(files or {})}
    with held(folder, f"--out {out} is being written by another process: wait for it to "
                      "finish or choose another folder"):
        check_model_folder_to_write(out, overwrite)     # as it is now that the folder is held
        with new_folder(folder) as temp:
            try:
                _save_weights(save_file, weights, temp / WEIGHTS)
                for name, data in files.items():
                    (temp / name).write_bytes(data)
                digests = {name: sha256_file(temp / name) for name in sorted([WEIGHTS, *files])}
                manifest = {"format": RELEASE_FORMAT, "version": RELEASE_VERSION,
                            "run_id": run_id, "versions": recorded, "files": digests}
                (temp / MANIFEST).write_bytes(json_bytes(manifest))
            except BaseException as err:         # new_folder removes the temporary folder
                raise write_failure(out, err, kept=True) from None
    return out


def _save_weights(save_file: Any, weights: Mapping[str, Tensor], path: Path) -> None:
    """Write `weights` as safetensors at `path` (with the mode open() gives a new file); a
    failed write (a full disk, a file-size limit), which safetensors raises as its own
    SafetensorError ("I/O error: File too large (os error 27)"), is an `OSError` of that
    number."""
    try:
        # safetensors stores each tensor once: shared storage is cloned apart
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in weights.items()},
                  str(path), metadata={"format": RELEASE_FORMAT})
    except Exception as err:
        code = re.search(r"os error (\d+)", str(err))
        if code is None:
            raise OSError(errno.EIO, " ".join(str(err).split())) from err
        raise OSError(int(code[1]), os.strerror(int(code[1]))) from err
    os.chmod(path, 0o666 & ~process_umask())                 # as open(), not its 0600


# --- reading -------------------------------------------------------------------------------

def _other_folder(folder: Path) -> str | None:
    """What a folder whose manifest.json is not a model folder's is, and what reads it, in
    words: a prepared corpus, or an exported model (of any version,
    `bahdanau._folders.manifest_kind`); None for a folder of neither kind."""
    kind = manifest_kind(folder)
    if kind is Kind.PREPARED:
        return ("this is a prepared corpus (bahdanau prepare), not a model: bahdanau train "
                "--data reads it")
    if kind is Kind.EXPORTED:
        return ("this is an exported model (bahdanau export), not a checkpoint: load it with "
                "bahdanau.serving.load_exported")
    return None


def _manifest(folder: Path) -> dict[str, Any]:
    """The manifest, checked: its format, version and shape, and the model's two files."""
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing: a model folder lists its files there") from None
    except (OSError, *JSON_ERRORS) as err:
        raise InputError(f"{path}: not a readable manifest ({type(err).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != RELEASE_FORMAT:
        other = _other_folder(folder)
        if other is not None:
            raise InputError(f"{folder}: {other}; a checkpoint is read from a checkpoint file, "
                             "a run folder or a model folder (bahdanau release)")
        raise InputError(f"{path}: not a bahdanau model folder's manifest (its format is not "
                         f"{RELEASE_FORMAT!r})")
    if data.get("version") != RELEASE_VERSION:
        raise InputError(f"{path}: model folder version {data.get('version')!r}; this bahdanau "
                         f"reads version {RELEASE_VERSION} (upgrade bahdanau for a newer one)")
    files = data.get("files")
    if not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str)
                                            and "/" not in k and k not in ("", ".", "..")
                                            for k, v in files.items())):
        raise InputError(f'{path}: its "files" must map file names to SHA-256 hex digests')
    missing = [name for name in (WEIGHTS, CONFIG) if name not in files]
    if missing:
        raise InputError(f"{path}: lists no {missing[0]}, which a model folder holds")
    if not isinstance(data.get("run_id"), (str, type(None))):
        raise InputError(f'{path}: its "run_id" must be a string or null')
    if not isinstance(data.get("versions"), (dict, type(None))):
        raise InputError(f'{path}: its "versions" must be an object or null')
    return data


def open_model_folder(folder: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """(the folder, its manifest), once the manifest is checked and every file it lists is
    there with the SHA-256 it records.

    Raises:
        InputError: naming the file: a missing or malformed manifest, a manifest of another
            version or one that lists no config.json or model.safetensors, a listed file that
            is missing or whose SHA-256 differs (changed or damaged).
    """
    path = check_path("model folder", folder)
    restore_replaced(path)                       # a model folder left aside by a dead writer
    manifest = _manifest(path)
    for name, digest in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise InputError(f"{file}: missing: the model folder's manifest lists it")
        if sha256_file(file) != digest:
            raise InputError(f"{file}: its SHA-256 differs from the one in {MANIFEST}: the file "
                             "was changed or damaged")
    return path, manifest


def read_json(path: Path) -> Any:
    """The JSON of a model folder's file; InputError naming it when it is not readable JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, *JSON_ERRORS) as err:
        raise InputError(f"{path}: not readable JSON ({type(err).__name__})") from None


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The weights of a model folder (`open_model_folder` has checked it), on the CPU.

    Raises:
        InputError: safetensors is not installed, or the file is not safetensors.
    """
    load_file = safetensors().load_file
    try:
        return load_file(str(folder / WEIGHTS))
    except Exception as err:       # safetensors raises its own SafetensorError, OSError, ...
        raise InputError(f"{folder / WEIGHTS}: not readable safetensors "
                         f"({type(err).__name__})") from None


# --- checking weights against the model they are for ------------------------------------

class _WithoutInit(TorchFunctionMode):
    """Inside, `torch.nn.init`'s functions leave their tensor as it is: on the meta device no
    value is drawn then (drawing one there imports torch._dynamo, seconds)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def model_skeleton(build: Callable[[], nn.Module]) -> nn.Module:
    """The model `build` makes (``Blueprint.build``, or a `ModelConfig`'s builder), made on
    the meta device: its weights' names and shapes, and no memory.

    What stored weights are checked against (`check_weights`) before the model is built: a
    config that claims sizes its stored tensors do not have (a small file claiming
    embed_size 10**7) is refused before anything is allocated.
    """
    with torch.device("meta"), _WithoutInit():
        return build()


def check_weights(stored: Any, model: nn.Module, what: str = "checkpoint") -> None:
    """Refuse stored weights that `model.load_state_dict` would refuse or that are not finite.

    Checked before loading because `load_state_dict` copies the weights that fit before it
    raises for the ones that do not.

    Args:
        what: whose weights the messages name ("checkpoint", "checkpoint ema").
    """
    if not isinstance(stored, dict):
        raise InputError(f"{what} weights are a {type(stored).__name__}, not a state_dict")
    expected = model.state_dict()
    for key, ours in expected.items():
        if key not in stored:
            raise InputError(f"{what} weights do not fit the model: {key!r} is missing")
        theirs = stored[key]
        if not isinstance(theirs, Tensor):
            raise InputError(f"{what} weights do not fit the model: {key!r} is a "
                             f"{type(theirs).__name__}, not a tensor")
        if theirs.shape != ours.shape:
            raise InputError(f"{what} weights do not fit the model: {key!r} has shape "
                             f"{tuple(theirs.shape)}, the model's has {tuple(ours.shape)}")
    for key in stored:
        if key not in expected:
            raise InputError(f"{what} weights do not fit the model: {key!r} is not one of "
                             "its weights")
    for key, tensor in stored.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InputError(f"{what} weight {key!r} holds NaN or inf")


# --- the model classes' two methods ------------------------------------------------------

class Pretrained:
    """`save_pretrained` and `from_pretrained` for a model class (`bahdanau.models.RNNSearch`).

    A class that builds from a `ModelConfig` names its ``arch`` and has ``from_config``.
    """

    def save_pretrained(self, folder: str | os.PathLike[str], *,
                        overwrite: bool = False) -> Path:
        """Write the model as a model folder of its own: config.json (`model_config_json`),
        model.safetensors and the manifest; no vocabularies (a `bahdanau.Translator` saves
        those too: `bahdanau.Translator.save_pretrained`).

        Args:
            folder: absent, empty, or a model folder to replace with `overwrite`.
        Returns:
            The folder.
        Raises:
            InputError: as `model_config_json` and `write_model_folder` say.
        """
        model: nn.Module = self            # type: ignore[assignment]
        config = model_config_json(model)
        device = next(iter(model.parameters()), torch.empty(0)).device
        return write_model_folder(folder, model.state_dict(), config,
                                  recorded=versions(device), overwrite=overwrite)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str], *,
                        device: str | torch.device = "cpu", trust_code: bool = False,
                        parts: Mapping[str, type] | None = None) -> Any:
        """The model of a model folder (its own, or a Translator's), in eval mode.

        Args:
            folder: a folder of `save_pretrained`, `bahdanau.Translator.save_pretrained` or
                ``bahdanau release``.
            device: where the model goes.
            trust_code, parts: for a model assembled from parts that names classes outside
                bahdanau: import them, or take them as given (`bahdanau.parts.blueprint`).
        Returns:
            The model, an object of this class (or of a subclass of it that the folder
            names), with the folder's weights.
        Raises:
            InputError: what `open_model_folder` refuses, a config.json that is neither a
                ModelConfig nor a build record (or names classes without trust), a folder
                holding a model of another class, weights that do not fit the model or are
                not finite; one line starting with the folder.
        """
        device = resolve_device(device)
        path, _ = open_model_folder(folder)
        config = read_json(path / CONFIG)
        try:
            build = _builder(cls, config, trust_code, parts)
            weights = read_weights(path)
            check_weights(weights, model_skeleton(build), "its")
        except InputError as err:
            message = str(err)
            raise InputError(message if message.startswith(str(path))
                             else f"{path}: {message}") from None
        model = build()
        model.load_state_dict(weights)
        return model.to(device).eval()


def _builder(cls: type, config: object, trust_code: bool,
             parts: Mapping[str, type] | None) -> Callable[[], nn.Module]:
    """How to build the model config.json describes, refused when it is not a `cls`."""
    if isinstance(config, dict) and PART in config:
        plan: Blueprint = blueprint(config, trust_code=trust_code, parts=parts)
        if not (issubclass(plan.root, cls)
                and getattr(plan.root, "arch", None) == getattr(cls, "arch", None)):
            raise InputError(f"its model is {plan.root.__qualname__} ({CONFIG}: "
                             f"{config[PART]}), not {cls.__qualname__}: load it with "
                             f"{plan.root.__qualname__}.from_pretrained")
        return plan.build
    if not isinstance(config, dict):
        raise InputError(f"{CONFIG} is a {type(config).__name__}: it holds a ModelConfig or "
                         "a build record (a JSON object)")
    try:
        cfg = ModelConfig.from_dict(config)
    except (TypeError, ValueError) as err:     # InputError is a ValueError
        raise InputError(f"{CONFIG} is no model config: {' '.join(str(err).split())}") from None
    if cfg.arch != getattr(cls, "arch", None):
        other = _class_of_arch(cfg.arch)
        raise InputError(f"its model is {other} ({CONFIG}: arch {cfg.arch!r}), not "
                         f"{cls.__qualname__}: load it with {other}.from_pretrained")
    return lambda: cls.from_config(cfg)          # type: ignore[attr-defined]


def _class_of_arch(arch: str) -> str:
    """The name of bahdanau's model class of `arch` (`RNNEncDec` for "rnnencdec")."""
    found, seen = list(Pretrained.__subclasses__()), []
    while found:
        cls = found.pop(0)
        seen.append(cls)
        found.extend(cls.__subclasses__())
    return next((cls.__qualname__ for cls in seen if getattr(cls, "arch", None) == arch
                 and cls.__module__.startswith("bahdanau.")), arch)
