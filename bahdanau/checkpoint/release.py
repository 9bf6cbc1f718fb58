"""A model folder to share: weights as safetensors, config, vocabularies and tokenizer as plain
files, a model card, and a manifest with the SHA-256 of every file.

    write_release(load_checkpoint("runs/default/checkpoints/best.pt"), "my-model", card=text)
    payload = read_release("my-model")           # what model_from_checkpoint reads

docs/release-format.md describes the folder. `write_release` writes it atomically, by the rules
of every folder the commands write (`bahdanau._folders.check_folder_to_write`: it replaces only
a model folder; `bahdanau._files.check_destination`, `bahdanau._files.held`,
`bahdanau._files.new_folder`: a temporary folder beside it, renamed into place when whole; a
symbolic link keeps linking); `read_release` checks the manifest
and every file's digest before it reads anything, and gives back a checkpoint payload of the
current format without a training state, so every reader of checkpoints reads a release folder
too: the door (`bahdanau.checkpoint.reader`) hands a folder with a ``manifest.json`` to it, as
one of its `bahdanau.checkpoint.reader.FOLDER_KINDS`. Only the weights a
checkpoint translates with are kept (`translation_weights`: the moving average when it has
one), so a release is the size of the weights, and bit for bit those weights.

The safetensors package is an optional extra (``pip install 'bahdanau[share]'``).
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bahdanau._about import versions
from bahdanau._checks import JSON_ERRORS, check_path
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
    MANIFEST,
    RELEASE_FORMAT,
    Kind,
    check_folder_to_write,
    manifest_kind,
)
from bahdanau.checkpoint.files import FORMAT_VERSION
from bahdanau.checkpoint.payload import (
    check_built_vocabs,
    parse_tokenizer,
    stored_parts,
    translation_weights,
)
from bahdanau.checkpoint.sections import (
    BUILD,
    EXTRA,
    FORMAT,
    MODEL,
    MODEL_CONFIG,
    SRC_VOCAB,
    TGT_VOCAB,
    TOKENIZER,
    TRAIN_STATE,
    TRAINING,
    VERSIONS,
)
from bahdanau.config import ModelConfig
from bahdanau.data.tokenizers import Tokenizer, tokenizer_to_payload
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.parts import PART, build_record

__all__ = ["MANIFEST", "RELEASE_FORMAT", "RELEASE_VERSION", "is_release", "model_payload",
           "parts_card", "read_release", "write_release"]

RELEASE_VERSION = 1                   # the manifest's "version": what this code reads
WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
SRC_VOCAB_FILE, TGT_VOCAB_FILE = "src_vocab.json", "tgt_vocab.json"
TOKENIZER_FILE, TOKENIZER_MODEL = "tokenizer.json", "tokenizer.model"
REQUIRED = (WEIGHTS, CONFIG, SRC_VOCAB_FILE, TGT_VOCAB_FILE, TOKENIZER_FILE)


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


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def release_files(payload: dict[str, Any], card: str) -> dict[str, bytes]:
    """Every file of the model folder of `payload` but the weights and the manifest, by name."""
    config, src_vocab, tgt_vocab = stored_parts(payload)
    tokenizer = tokenizer_to_payload(parse_tokenizer(payload))
    files = {CONFIG: _json_bytes(payload[BUILD] if config is None else config.to_dict()),
             SRC_VOCAB_FILE: _json_bytes(src_vocab.to_dict()),
             TGT_VOCAB_FILE: _json_bytes(tgt_vocab.to_dict()), CARD: card.encode("utf-8")}
    if tokenizer["name"] == "sentencepiece":
        files[TOKENIZER_MODEL] = tokenizer["model"].numpy().tobytes()
        tokenizer = {**tokenizer, "model": TOKENIZER_MODEL}
    files[TOKENIZER_FILE] = _json_bytes(tokenizer)
    return files


def model_payload(model: nn.Module, src_vocab: Vocab, tgt_vocab: Vocab,
                  tokenizer: Tokenizer) -> dict[str, Any]:
    """The payload of a model in memory, to write as a model folder (`write_release`).

    A model built from a `ModelConfig` (a preset's: it has `.config`) is stored by its config;
    any other, assembled from parts, by its build record (`bahdanau.parts.build_record`: every
    part's class and constructor arguments), as the `BUILD` section.

    Raises:
        InputError: a part that records no arguments or an argument that is not JSON
            (`build_record`), vocabularies that do not fit the model, or a tokenizer that is
            not bahdanau's.
    """
    config = getattr(model, "config", None)
    sections: dict[str, Any] = {MODEL_CONFIG: None}
    if isinstance(config, ModelConfig):
        config.check_vocabs(src_vocab, tgt_vocab)
        sections[MODEL_CONFIG] = config.to_dict()
    else:
        sections[BUILD] = build_record(model)
        check_built_vocabs(model, src_vocab, tgt_vocab)
    device = next(iter(model.parameters()), torch.empty(0)).device
    return {FORMAT: FORMAT_VERSION, MODEL: model.state_dict(), **sections,
            SRC_VOCAB: src_vocab.to_dict(), TGT_VOCAB: tgt_vocab.to_dict(),
            **dict.fromkeys(TRAINING), EXTRA: {}, TOKENIZER: tokenizer_to_payload(tokenizer),
            VERSIONS: versions(device)}


def parts_card(payload: dict[str, Any]) -> str:
    """A short model card (README.md, in the Hugging Face card format) for a model saved from
    memory (`bahdanau.Translator.save_pretrained`): what it is built of and how to load it;
    ``bahdanau release`` of a run's checkpoint writes the full card of its run instead."""
    record = payload.get(BUILD)
    built = (f"assembled from parts: `{record[PART]}` (config.json records every part's "
             "class and arguments)" if record is not None
             else f"built from a ModelConfig ({payload[MODEL_CONFIG].get('arch')})")
    return "\n".join([
        "---", 'library_name: "bahdanau"', 'pipeline_tag: "translation"',
        'tags: ["translation", "bahdanau"]', "---", "", "# bahdanau translation model", "",
        f"A model {built}, with its weights (`model.safetensors`), vocabularies and tokenizer.",
        "", "Load it with `bahdanau.load(FOLDER)` (add `trust_code=True` when config.json names "
        "classes of your own, importable from where you load it), translate with "
        "`bahdanau translate --checkpoint FOLDER` (`--trust-code`).", "",
        "## License", "", "Not stated.", ""])


def write_release(payload: dict[str, Any], out: str | os.PathLike[str], *, card: str,
                  overwrite: bool = False) -> Path:
    """Write the model folder of a checkpoint payload.

    Args:
        payload: a checkpoint of the current format (`upgrade_payload`), checked whole
            (`bahdanau.checkpoint.model_from_checkpoint` takes it) before anything is written.
        out: the folder to write: absent, empty, or a model folder to replace with
            `overwrite`; a folder of another kind or of other files is never replaced. A
            symbolic link keeps linking: the folder it names is replaced.
        card: the model card, written as README.md.
        overwrite: replace the model folder `out` holds (only once the new folder is whole).
    Returns:
        The folder.
    Raises:
        InputError: `out` is a file, a model folder without `overwrite`, a folder of
            another kind or of other files or inside a model folder, a prepared corpus or an
            exported folder (`check_new_release`), a place that cannot be replaced
            (`check_destination`) or is being written by another process;
            safetensors is not installed; or the payload is one that `model_from_checkpoint`
            refuses.
        OSError: a file could not be written (a full disk, a file-size limit): one line
            naming `out`, which is left as it was (the temporary folder is removed).
    """
    out = check_path("--out", out)
    folder = check_new_release(out, overwrite)
    save_file = _safetensors().save_file
    _, weights = translation_weights(payload)
    files = release_files(payload, card)
    with held(folder, f"--out {out} is being written by another process: wait for it to "
                      "finish or choose another folder"):
        check_new_release(out, overwrite)       # as it is now that the folder is held
        with new_folder(folder) as temp:
            try:
                _save_weights(save_file, weights, temp / WEIGHTS)
                for name, data in files.items():
                    (temp / name).write_bytes(data)
                digests = {name: sha256_file(temp / name) for name in sorted([WEIGHTS, *files])}
                (temp / MANIFEST).write_bytes(_json_bytes(release_manifest(payload, digests)))
            except BaseException as err:         # new_folder removes the temporary folder
                raise write_failure(out, err, kept=True) from None
    return out


def _save_weights(save_file: Any, weights: dict[str, torch.Tensor], path: Path) -> None:
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


def check_new_release(out: Path, overwrite: bool) -> Path:
    """The folder `write_release` writes for `out` (`check_destination`), checked before any
    work by the rule of every folder writer (`bahdanau._folders.check_folder_to_write`):
    absent, empty, or a model folder already, replaced only with `overwrite`.

    Raises:
        InputError: as `write_release` says.
    """
    folder = check_destination(out, "a model folder")
    if check_folder_to_write(folder, Kind.MODEL, name=f"--out {out}") and not overwrite:
        raise InputError(f"--out {out} is a model folder already: replace it with --overwrite "
                         "or choose another folder")
    return folder


def release_manifest(payload: dict[str, Any], digests: dict[str, str]) -> dict[str, Any]:
    """The manifest of a model folder: its format, the run id and versions of the checkpoint
    (when it records them; an average's run id is its members' when they share one) and the
    SHA-256 of every file."""
    state, extra = payload.get(TRAIN_STATE), payload.get(EXTRA)
    run_id = state.get("run_id") if isinstance(state, dict) else None
    members = extra.get("averaged_from") if isinstance(extra, dict) else None
    if run_id is None and isinstance(members, list):
        ids = {m.get("run_id") for m in members if isinstance(m, dict)}
        run_id = ids.pop() if len(ids) == 1 else None
    if not isinstance(run_id, str):
        run_id = None
    return {"format": RELEASE_FORMAT, "version": RELEASE_VERSION, "run_id": run_id,
            "versions": payload.get(VERSIONS), "files": digests}


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
    """The manifest, checked: its format, version and shape."""
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
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        raise InputError(f"{path}: lists no {missing[0]}, which a model folder holds")
    if not isinstance(data.get("run_id"), (str, type(None))):
        raise InputError(f'{path}: its "run_id" must be a string or null')
    if not isinstance(data.get("versions"), (dict, type(None))):
        raise InputError(f'{path}: its "versions" must be an object or null')
    return data


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, *JSON_ERRORS) as err:
        raise InputError(f"{path}: not readable JSON ({type(err).__name__})") from None


def read_release(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint payload of a model folder, once every file matches the manifest.

    Args:
        folder: a folder written by `write_release`.
    Returns:
        A payload of the current format (docs/checkpoint-format.md): the weights as `model`,
        the model config, vocabularies and tokenizer, and the ``versions`` that trained it; no
        training state, optimizer or RNG states (it translates and fine-tunes, it does not
        resume); extra["release"] names the folder and extra["run_id"] the run it comes from
        (None when the checkpoint recorded none), which averaging checks.
    Raises:
        InputError: naming the file: a missing or malformed manifest, a manifest of another
            version, a listed file that is missing or whose SHA-256 differs from the
            manifest's (changed or damaged), or safetensors is not installed.
    """
    folder = check_path("model folder", folder)
    restore_replaced(folder)
    manifest = _manifest(folder)
    files = manifest["files"]
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise InputError(f"{path}: missing: the model folder's manifest lists it")
        if sha256_file(path) != digest:
            raise InputError(f"{path}: its SHA-256 differs from the one in {MANIFEST}: the file "
                             "was changed or damaged")
    tokenizer = _read_json(folder / TOKENIZER_FILE)
    if isinstance(tokenizer, dict) and tokenizer.get("name") == "sentencepiece":
        if tokenizer.get("model") not in files:
            raise InputError(f"{folder / TOKENIZER_FILE}: names the SentencePiece model "
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
    config = _read_json(folder / CONFIG)
    built = isinstance(config, dict) and PART in config       # a model assembled from parts
    return {
        FORMAT: FORMAT_VERSION, MODEL: weights,
        MODEL_CONFIG: None if built else config, **({BUILD: config} if built else {}),
        SRC_VOCAB: _read_json(folder / SRC_VOCAB_FILE),
        TGT_VOCAB: _read_json(folder / TGT_VOCAB_FILE),
        **dict.fromkeys(TRAINING), TOKENIZER: tokenizer,
        EXTRA: {"release": str(folder), "run_id": manifest.get("run_id")},
        **({VERSIONS: manifest["versions"]} if manifest.get("versions") is not None else {}),
    }
