"""A model folder to share: weights as safetensors, config, vocabularies and tokenizer as plain
files, a model card, and a manifest with the SHA-256 of every file.

    write_release(load_checkpoint("runs/default/checkpoints/best.pt"), "my-model", card=text)
    payload = read_release("my-model")           # what model_from_checkpoint reads

docs/release-format.md describes the folder. `write_release` writes it atomically (into a
temporary folder beside it, renamed into place when whole); `read_release` checks the manifest
and every file's digest before it reads anything, and gives back a checkpoint payload of the
current format without a training state, so every reader of checkpoints reads a release folder
too (`load_checkpoint` hands a folder with a ``manifest.json`` to it). Only the weights a
checkpoint translates with are kept (`translation_weights`: the moving average when it has
one), so a release is the size of the weights, and bit for bit those weights.

The safetensors package is an optional extra (``pip install 'bahdanau[share]'``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from bahdanau._checks import check_path
from bahdanau._files import fsync_dir, fsync_file
from bahdanau.checkpoint.files import FORMAT_VERSION
from bahdanau.checkpoint.payload import (
    stored_parts,
    tokenizer_of,
    translation_weights,
)
from bahdanau.data.tokenizers import tokenizer_to_payload
from bahdanau.errors import InputError

__all__ = ["MANIFEST", "RELEASE_FORMAT", "RELEASE_VERSION", "is_release", "read_release",
           "write_release"]

MANIFEST = "manifest.json"
RELEASE_FORMAT = "bahdanau-model"     # the manifest's "format"
RELEASE_VERSION = 1                   # the manifest's "version": what this code reads
WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
SRC_VOCAB, TGT_VOCAB = "src_vocab.json", "tgt_vocab.json"
TOKENIZER, TOKENIZER_MODEL = "tokenizer.json", "tokenizer.model"
REQUIRED = (WEIGHTS, CONFIG, SRC_VOCAB, TGT_VOCAB, TOKENIZER)


def _safetensors() -> Any:
    """The safetensors.torch module, or one line saying how to install it."""
    try:
        import safetensors.torch
    except ImportError:
        raise InputError("a model folder keeps its weights as safetensors: pip install "
                         "'bahdanau[share]' (or pip install safetensors)") from None
    return safetensors.torch


def is_release(path: str | os.PathLike[str]) -> bool:
    """`path` is a model folder (a folder holding a ``manifest.json``)."""
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            hasher.update(block)
    return hasher.hexdigest()


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def release_files(payload: dict[str, Any], card: str) -> dict[str, bytes]:
    """Every file of the model folder of `payload` but the weights and the manifest, by name."""
    config, src_vocab, tgt_vocab = stored_parts(payload)
    tokenizer = tokenizer_to_payload(tokenizer_of(payload))
    files = {CONFIG: _json_bytes(config.to_dict()), SRC_VOCAB: _json_bytes(src_vocab.to_dict()),
             TGT_VOCAB: _json_bytes(tgt_vocab.to_dict()), CARD: card.encode("utf-8")}
    if tokenizer["name"] == "sentencepiece":
        files[TOKENIZER_MODEL] = tokenizer["model"].numpy().tobytes()
        tokenizer = {**tokenizer, "model": TOKENIZER_MODEL}
    files[TOKENIZER] = _json_bytes(tokenizer)
    return files


def write_release(payload: dict[str, Any], out: str | os.PathLike[str], *, card: str,
                  overwrite: bool = False) -> Path:
    """Write the model folder of a checkpoint payload.

    Args:
        payload: a checkpoint of the current format (`upgrade_payload`), checked whole
            (`bahdanau.checkpoint.model_from_checkpoint` takes it) before anything is written.
        out: the folder to write; it must not exist or be empty, unless `overwrite`.
        card: the model card, written as README.md.
        overwrite: replace what `out` holds (only once the new folder is whole).
    Returns:
        The folder.
    Raises:
        InputError: `out` is a file, or a non-empty folder without `overwrite`; safetensors is
            not installed; or the payload is one that `model_from_checkpoint` refuses.
    """
    out = check_path("--out", out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InputError(f"--out {out} is not empty: choose another folder, or --overwrite it")
    save_file = _safetensors().save_file
    _, weights = translation_weights(payload)
    files = release_files(payload, card)
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        # safetensors stores each tensor once: shared storage is cloned apart
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in weights.items()},
                  str(temp / WEIGHTS), metadata={"format": RELEASE_FORMAT})
        for name, data in files.items():
            (temp / name).write_bytes(data)
        digests = {name: sha256_of(temp / name) for name in sorted([WEIGHTS, *files])}
        (temp / MANIFEST).write_bytes(_json_bytes(
            {"format": RELEASE_FORMAT, "version": RELEASE_VERSION, "files": digests}))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o777 & ~umask)          # as mkdir and open() would, not mkdtemp's 0700
        for name in [*digests, MANIFEST]:
            os.chmod(temp / name, 0o666 & ~umask)
            fsync_file(temp / name)
        _replace_folder(temp, out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return out


def _replace_folder(temp: Path, out: Path) -> None:
    """Rename the whole folder `temp` to `out`; an old `out` is moved aside first and deleted
    after, so `out` is at every moment the old folder, absent, or the new one whole."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
        os.replace(out, old / out.name)
    os.replace(temp, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old)


def _manifest(folder: Path) -> dict[str, str]:
    """The manifest's {file: sha256}, checked: its format, version and shape."""
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing: a model folder lists its files there") from None
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not a readable manifest ({type(err).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != RELEASE_FORMAT:
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
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        raise InputError(f"{path}: lists no {missing[0]}, which a model folder holds")
    return files


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not readable JSON ({type(err).__name__})") from None


def read_release(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint payload of a model folder, once every file matches the manifest.

    Args:
        folder: a folder written by `write_release`.
    Returns:
        A payload of the current format (docs/checkpoint-format.md): the weights as `model`,
        the model config, vocabularies and tokenizer; no training state, optimizer or RNG
        states (it translates and fine-tunes, it does not resume); extra["release"] names the
        folder.
    Raises:
        InputError: naming the file: a missing or malformed manifest, a manifest of another
            version, a listed file that is missing or whose SHA-256 differs from the
            manifest's (changed or damaged), or safetensors is not installed.
    """
    folder = check_path("model folder", folder)
    files = _manifest(folder)
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise InputError(f"{path}: missing: the model folder's manifest lists it")
        if sha256_of(path) != digest:
            raise InputError(f"{path}: its SHA-256 differs from the one in {MANIFEST}: the file "
                             "was changed or damaged")
    tokenizer = _read_json(folder / TOKENIZER)
    if isinstance(tokenizer, dict) and tokenizer.get("name") == "sentencepiece":
        if tokenizer.get("model") not in files:
            raise InputError(f"{folder / TOKENIZER}: names the SentencePiece model "
                             f"{tokenizer.get('model')!r}, which the manifest does not list")
        proto = (folder / str(tokenizer["model"])).read_bytes()
        tokenizer = {**tokenizer, "model": torch.frombuffer(bytearray(proto), dtype=torch.uint8)}
    try:
        weights = _safetensors().load_file(str(folder / WEIGHTS))
    except InputError:
        raise
    except Exception as err:       # safetensors raises its own SafetensorError, OSError, ...
        raise InputError(f"{folder / WEIGHTS}: not readable safetensors "
                         f"({type(err).__name__})") from None
    return {
        "format": FORMAT_VERSION, "model": weights,
        "model_config": _read_json(folder / CONFIG),
        "src_vocab": _read_json(folder / SRC_VOCAB), "tgt_vocab": _read_json(folder / TGT_VOCAB),
        "train_config": None, "train_state": None, "optimizer": None, "optimizer_class": None,
        "scaler": None, "rng": None, "extra": {"release": str(folder)}, "tokenizer": tokenizer,
    }
