"""A prepared corpus's manifest (``manifest.json``) and the digest that seals the folder.

`seal` (`bahdanau._sealed`, the seal of every sealed folder) records the SHA-256 of every file
of the folder in the manifest (``files``) and then the SHA-256 of the manifest itself
(``digest``, of its other fields as canonical JSON), so a changed id, offset, vocabulary word,
tokenizer setting or manifest field (a flipped ``lowercase``, a forged ``shipped``) no longer
matches. `read_manifest` checks the type of every field and the manifest's digest,
`verify_digest` the files; each failure is one line naming the file.

`PreparedCorpus` checks it all on every open, so the check must be cheap: SHA-256 (with the
CPU's SHA instructions, faster than BLAKE2b here) ran at 1.7 GB/s on one core of the 2-core
reference machine when idle and 0.5 GB/s under load, and the files of a large folder hash in
parallel threads: a folder of 12M pairs (about 1 GB at 15 tokens a side) adds 0.6 to 2 s once
its files are in the page cache; a first read from disk takes what the disk takes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bahdanau._checks import JSON_ERRORS, describe, is_finite_number, is_int
from bahdanau._files import restore_replaced, sha256_file
from bahdanau._folders import (
    LINES_FILE,
    MANIFEST,
    PREPARED_SENTENCEPIECE,
    SIDES,
    SRC_VOCAB_FILE,
    TGT_VOCAB_FILE,
    TOKENIZER_FILE,
    ids_file,
    offsets_file,
)
from bahdanau._folders import PREPARED_FORMAT as FORMAT
from bahdanau._sealed import file_digests, manifest_digest, seal
from bahdanau.data.text import MULTI30K_LANGS, multi30k_files
from bahdanau.data.vocab import SPECIALS
from bahdanau.errors import InputError

__all__ = ["FORMAT", "MANIFEST", "SIDES", "VERSION", "check_shipped", "format_files",
           "read_manifest", "seal", "verify_digest"]

VERSION = 2                   # 2: the folder is sealed by a digest (version 1 had none)
COUNTS = ("lines", "pairs", "empty", "too_long", "ratio")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def format_files(manifest: dict[str, Any]) -> list[str]:
    """Every file a prepared folder has (the manifest aside): each side's ids, offsets and
    vocabulary, the kept lines, the tokenizer and, when the manifest's tokenizer is
    SentencePiece, its model. The seal must cover them all."""
    names = [name for side, vocab in zip(SIDES, (SRC_VOCAB_FILE, TGT_VOCAB_FILE), strict=True)
             for name in (ids_file(side), offsets_file(side), vocab)]
    names += [LINES_FILE, TOKENIZER_FILE]
    if manifest["options"]["tokenizer"].get("name") == "sentencepiece":
        names.append(PREPARED_SENTENCEPIECE)
    return names


def verify_digest(folder: Path, manifest: dict[str, Any]) -> None:
    """Check the folder's files against a manifest read by `read_manifest` (which checked the
    manifest's own digest). The manifest must seal every file of the format (`format_files`):
    one it leaves out could be changed unseen.

    Raises:
        InputError: the manifest seals not every file of the format, or a file is missing or
            differs from the one prepared, naming it.
    """
    again = "the folder is damaged: prepare it again with --overwrite"
    unsealed = [name for name in format_files(manifest) if name not in manifest["files"]]
    if unsealed:
        raise InputError(f"{folder / MANIFEST} seals no digest of {', '.join(unsealed)}: {again}")
    names = sorted(manifest["files"])
    for name in names:
        if not (folder / name).is_file():
            raise InputError(f"{folder} is damaged: {name} is missing; prepare it again with "
                             "--overwrite")
    for name, digest in file_digests(folder, names).items():
        if digest != manifest["files"][name]:
            raise InputError(f"{folder / name} does not match its digest in {MANIFEST}: {again}")


def check_shipped(shipped: object, inputs: list[dict[str, Any]], name: str) -> None:
    """A corpus is the shipped Multi30k (whose dev and test sets training then scores on) only
    when it was prepared from that corpus's training files of those languages.

    Raises:
        InputError: `shipped` is neither None nor such a record, or the inputs' SHA-256 are
            not those of the shipped files.
    """
    if shipped is None:
        return
    if not _shipped(shipped):
        raise InputError(f"{name} must be None or {{'corpus': 'multi30k', 'src_lang': ..., "
                         f"'tgt_lang': ...}} with two of {MULTI30K_LANGS}, got {_short(shipped)}")
    assert isinstance(shipped, dict)
    langs = (shipped["src_lang"], shipped["tgt_lang"])
    if [record["sha256"] for record in inputs] != [
            sha256_file(multi30k_files("train", lang)) for lang in langs]:
        raise InputError(f"{name} says the shipped Multi30k {langs[0]}->{langs[1]}, but the "
                         "corpus was prepared from other files: its dev and test sets do not "
                         "belong to it")


# ---------------------------------------------------------------------------------------------
# Reading, every field checked


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of the prepared corpus in `folder`, every field of the expected type.

    Raises:
        InputError: no such folder or manifest, a manifest that is not JSON, of another format
            or version (version 1, without a digest, is to be prepared again), a field
            missing or of the wrong type, or fields changed since `seal` wrote them (the
            manifest's own digest, cheap: the files are checked by `verify_digest`); one line
            naming the file and the field.
    """
    path = folder / MANIFEST
    restore_replaced(folder)             # left aside by a writer that died replacing it
    if not folder.is_dir():
        raise InputError(f"{folder}: " + ("not a folder" if folder.exists() else "no such folder")
                         + "; make a prepared corpus with bahdanau prepare")
    if not path.is_file():
        raise InputError(f"{folder} is not a prepared corpus (no {MANIFEST}); make one with "
                         "bahdanau prepare")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except JSON_ERRORS as err:
        raise InputError(f"{path} is damaged ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError(f"{path} is not the manifest of a prepared corpus")
    version = manifest.get("version")
    if version == 1:
        raise InputError(f"{folder} was prepared by an earlier bahdanau and carries no digest to "
                         "check it by: prepare it again with --overwrite")
    if version != VERSION:
        raise InputError(f"{folder} is a prepared corpus of version {version!r}; this bahdanau "
                         f"reads version {VERSION}: prepare it again")
    for key, (check, expected) in _FIELDS.items():
        if key not in manifest:
            raise InputError(f"{path} is damaged: no {key!r}")
        if not check(manifest[key]):
            raise InputError(f"{path} is damaged: {key!r} must be {expected}, got "
                             f"{_short(manifest[key])}")
    if manifest_digest(manifest) != manifest["digest"]:
        raise InputError(f"{path} does not match its digest (a field was changed after prepare): "
                         "the folder is damaged: prepare it again with --overwrite")
    return manifest


def _short(value: object) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else (
        describe(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _count(value: object) -> bool:
    return is_int(value) and value >= 0


def _sha(value: object) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def _pair_of(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and len(value) == 2 and all(map(check, value))


def _input(value: object) -> bool:
    return (isinstance(value, dict) and set(value) == {"file", "bytes", "sha256"}
            and isinstance(value["file"], str) and _count(value["bytes"])
            and _sha(value["sha256"]))


def _options(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    return (isinstance(value.get("tokenizer"), dict)
            and all(value.get(k) is None or _count(value.get(k)) for k in ("vocab_size", "max_len"))
            and all(value.get(k) is None or _sha(value.get(k)) for k in ("src_vocab", "tgt_vocab"))
            and (value.get("max_ratio") is None or is_finite_number(value.get("max_ratio")))
            and isinstance(value.get("strict"), bool))


def _shipped(value: object) -> bool:
    return value is None or (
        isinstance(value, dict) and set(value) == {"corpus", "src_lang", "tgt_lang"}
        and value["corpus"] == "multi30k" and value["src_lang"] in MULTI30K_LANGS
        and value["tgt_lang"] in MULTI30K_LANGS and value["src_lang"] != value["tgt_lang"])


# Each field: (its check, what the message says it must be).
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "inputs": (_pair_of(_input), "two {file, bytes, sha256} records"),
    "options": (_options, "the options prepare was given"),
    "counts": (lambda v: isinstance(v, dict) and set(v) == set(COUNTS)
               and all(map(_count, v.values())), f"counts of {', '.join(COUNTS)}"),
    "tokens": (_pair_of(_count), "two token counts"),
    "vocab_sizes": (_pair_of(lambda v: is_int(v) and v >= len(SPECIALS)), "two vocabulary sizes"),
    "shipped": (_shipped, "null or the shipped Multi30k's corpus and two of its languages"),
    "seconds": (lambda v: is_finite_number(v) and v >= 0, "a number of seconds"),
    "files": (lambda v: isinstance(v, dict) and all(map(_sha, v.values()))
              and all(isinstance(k, str) and "/" not in k and k not in ("", ".", "..", MANIFEST)
                      for k in v), "the SHA-256 of each file"),
    "digest": (_sha, "a SHA-256"),
}
