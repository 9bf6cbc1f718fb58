"""A model folder to share: weights as safetensors, config, vocabularies and tokenizer as plain
files, a model card, and a manifest with the SHA-256 of every file.

    write_release(load_checkpoint("runs/default/checkpoints/best.pt"), "my-model", card=text)
    payload = read_release("my-model")           # what model_from_checkpoint reads

docs/release-format.md describes the folder. The model's half of it (config.json,
model.safetensors, the manifest) is `bahdanau.model_folder`'s, which the model classes write and
read themselves (`RNNSearch.save_pretrained`, `RNNSearch.from_pretrained`); this module adds a
Translator's half: the vocabularies, the tokenizer and the card. `write_release` writes the
folder atomically through `bahdanau.model_folder.write_model_folder`, by the rules of every
folder the commands write (`bahdanau._folders.check_folder_to_write`: it replaces only a model
folder; a temporary folder beside it, renamed into place when whole; a symbolic link keeps
linking); `read_release` checks the manifest and every file's digest before it reads anything
(`bahdanau.model_folder.open_model_folder`), and gives back a checkpoint payload of the
current format without a training state, so every reader of checkpoints reads a release folder
too: the door (`bahdanau.checkpoint.reader`) hands a folder with a ``manifest.json`` to it, as
one of its `bahdanau.checkpoint.reader.FOLDER_KINDS`. Only the weights a
checkpoint translates with are kept (`translation_weights`: the moving average when it has
one), so a release is the size of the weights, and bit for bit those weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bahdanau._about import versions
from bahdanau._checks import check_path
from bahdanau._folders import (
    CARD,
    FOLDER_SENTENCEPIECE,
    SRC_VOCAB_FILE,
    TGT_VOCAB_FILE,
    TOKENIZER_FILE,
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
from bahdanau.data.tokenizers import Tokenizer, tokenizer_files, tokenizer_to_payload
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.model_folder import (
    CONFIG,
    MANIFEST,
    RELEASE_FORMAT,
    RELEASE_VERSION,
    check_model_folder_to_write,
    json_bytes,
    model_config_json,
    open_model_folder,
    read_json,
    read_weights,
    write_model_folder,
)
from bahdanau.parts import PART

__all__ = ["MANIFEST", "RELEASE_FORMAT", "RELEASE_VERSION", "is_release", "model_payload",
           "parts_card", "read_release", "write_release"]

TRANSLATOR_FILES = (SRC_VOCAB_FILE, TGT_VOCAB_FILE, TOKENIZER_FILE)   # beside the model's two


def is_release(path: str | os.PathLike[str]) -> bool:
    """`path` is a model folder (a folder holding a ``manifest.json``)."""
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def release_files(payload: dict[str, Any], card: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(config.json, every other file of the Translator's half of the model folder of
    `payload`, by name): the vocabularies, the tokenizer and the card."""
    config, src_vocab, tgt_vocab = stored_parts(payload)
    files = {SRC_VOCAB_FILE: json_bytes(src_vocab.to_dict()),
             TGT_VOCAB_FILE: json_bytes(tgt_vocab.to_dict()), CARD: card.encode("utf-8"),
             **tokenizer_files(parse_tokenizer(payload), FOLDER_SENTENCEPIECE)}
    return (payload[BUILD] if config is None else config.to_dict()), files


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
    config = model_config_json(model)              # a ModelConfig's dict, or a build record
    sections: dict[str, Any] = {MODEL_CONFIG: None}
    if PART in config:
        sections[BUILD] = config
        check_built_vocabs(model, src_vocab, tgt_vocab)
    else:
        ModelConfig.from_dict(config).check_vocabs(src_vocab, tgt_vocab)
        sections[MODEL_CONFIG] = config
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
    """Write the model folder of a checkpoint payload: the model's half
    (`bahdanau.model_folder.write_model_folder`: config.json, model.safetensors, the manifest)
    with the vocabularies, tokenizer and card beside it.

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
            exported folder (`check_model_folder_to_write`), a place that cannot be replaced
            (`check_destination`) or is being written by another process;
            safetensors is not installed; or the payload is one that `model_from_checkpoint`
            refuses.
        OSError: a file could not be written (a full disk, a file-size limit): one line
            naming `out`, which is left as it was (the temporary folder is removed).
    """
    check_model_folder_to_write(check_path("--out", out), overwrite)   # before any work
    _, weights = translation_weights(payload)
    config, files = release_files(payload, card)
    return write_model_folder(out, weights, config, files=files, run_id=release_run_id(payload),
                              recorded=payload.get(VERSIONS), overwrite=overwrite)


def release_run_id(payload: dict[str, Any]) -> str | None:
    """The run id a model folder's manifest records: the checkpoint's, or an average's members'
    when they share one; None when it records none."""
    state, extra = payload.get(TRAIN_STATE), payload.get(EXTRA)
    run_id = state.get("run_id") if isinstance(state, dict) else None
    members = extra.get("averaged_from") if isinstance(extra, dict) else None
    if run_id is None and isinstance(members, list):
        ids = {m.get("run_id") for m in members if isinstance(m, dict)}
        run_id = ids.pop() if len(ids) == 1 else None
    return run_id if isinstance(run_id, str) else None


def read_release(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint payload of a model folder, once every file matches the manifest.

    Args:
        folder: a folder written by `write_release` (or `bahdanau.Translator.save_pretrained`).
    Returns:
        A payload of the current format (docs/checkpoint-format.md): the weights as `model`,
        the model config, vocabularies and tokenizer, and the ``versions`` that trained it; no
        training state, optimizer or RNG states (it translates and fine-tunes, it does not
        resume); extra["release"] names the folder and extra["run_id"] the run it comes from
        (None when the checkpoint recorded none), which averaging checks.
    Raises:
        InputError: naming the file: what `bahdanau.model_folder.open_model_folder` refuses
            (a missing or malformed manifest, another version, a changed or damaged file), a
            folder of a model alone (`RNNSearch.save_pretrained`: no vocabularies, so no
            Translator), or safetensors is not installed.
    """
    folder, manifest = open_model_folder(folder)
    files = manifest["files"]
    missing = [name for name in TRANSLATOR_FILES if name not in files]
    if len(missing) == len(TRANSLATOR_FILES):
        raise InputError(f"{folder}: holds a model alone (model.save_pretrained), without the "
                         "vocabularies and tokenizer a Translator needs: save the Translator "
                         "(Translator.save_pretrained), or load the model with "
                         "RNNSearch.from_pretrained")
    if missing:
        raise InputError(f"{folder / MANIFEST}: lists no {missing[0]}, which a model folder "
                         "holds")
    tokenizer = read_json(folder / TOKENIZER_FILE)
    if isinstance(tokenizer, dict) and tokenizer.get("name") == "sentencepiece":
        if not isinstance(tokenizer.get("model"), str) or tokenizer["model"] not in files:
            raise InputError(f"{folder / TOKENIZER_FILE}: names the SentencePiece model "
                             f"{tokenizer.get('model')!r}, which the manifest does not list")
        proto = (folder / str(tokenizer["model"])).read_bytes()
        tokenizer = {**tokenizer, "model": torch.frombuffer(bytearray(proto), dtype=torch.uint8)}
    weights = read_weights(folder)
    config = read_json(folder / CONFIG)
    built = isinstance(config, dict) and PART in config       # a model assembled from parts
    return {
        FORMAT: FORMAT_VERSION, MODEL: weights,
        MODEL_CONFIG: None if built else config, **({BUILD: config} if built else {}),
        SRC_VOCAB: read_json(folder / SRC_VOCAB_FILE),
        TGT_VOCAB: read_json(folder / TGT_VOCAB_FILE),
        **dict.fromkeys(TRAINING), TOKENIZER: tokenizer,
        EXTRA: {"release": str(folder), "run_id": manifest.get("run_id")},
        **({VERSIONS: manifest["versions"]} if manifest.get("versions") is not None else {}),
    }
