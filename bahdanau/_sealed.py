"""A folder sealed by its manifest: the SHA-256 of every file, and of the manifest's own fields.

`seal` writes ``manifest.json`` with ``files`` (each file's SHA-256) and ``digest`` (the SHA-256
of every other field as canonical JSON), so a changed file or a changed manifest field (a
flipped setting, another special id) no longer matches; `check_sealed` checks the manifest
before a reader takes anything from the folder, and the reader each file's digest on the bytes
it reads. A prepared corpus (`bahdanau.data.manifest`) and an exported model
(`bahdanau.serving`) are sealed so.

Large folders hash in parallel threads: hashlib releases the GIL on large blocks, and SHA-256
(with the CPU's SHA instructions) runs at 0.5 to 1.7 GB/s on one core of the 2-core reference
machine, so sealing is cheap enough to check on every open.
"""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bahdanau._files import atomic_write, sha256_file
from bahdanau._folders import MANIFEST
from bahdanau.errors import InputError

__all__ = ["MANIFEST", "check_sealed", "file_digests", "manifest_digest", "seal"]

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PER_THREAD = 1 << 28       # bytes worth a hashing thread of their own (about 0.15 s of hashing)


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The SHA-256 of every field but ``digest``, as canonical JSON."""
    fields = {key: value for key, value in manifest.items() if key != "digest"}
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digests(folder: Path, names: list[str]) -> dict[str, str]:
    """The SHA-256 of each named file of `folder`. A large folder hashes in threads; a small
    one here, as starting threads would cost more than it saves."""
    size = sum((folder / name).stat().st_size for name in names)
    threads = min(4, len(names), 1 + size // _PER_THREAD)
    if threads <= 1:
        return {name: sha256_file(folder / name) for name in names}
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return dict(zip(names, pool.map(lambda name: sha256_file(folder / name), names),
                        strict=True))


def seal(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write `manifest` into `folder` with the digests of the folder's files and its own.

    Returns:
        The manifest written (with ``files`` and ``digest``).
    """
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
    sealed = {**manifest, "files": file_digests(folder, names)}
    sealed["digest"] = manifest_digest(sealed)
    text = json.dumps(sealed, indent=2, ensure_ascii=False) + "\n"
    atomic_write(folder / MANIFEST, lambda f: f.write(text.encode("utf-8")))
    return sealed


def check_sealed(folder: Path, manifest: dict[str, Any], required: list[str], again: str
                 ) -> dict[str, str]:
    """Check a sealed manifest read from `folder`: its own digest, a digest for every file of
    `required`, and each listed name a file directly in the folder (no path, no symbolic link:
    a reader never leaves the folder). The files' digests are the caller's to check, on the
    bytes it reads (so that what is checked is what is used).

    Args:
        again: the safe next step, ending each message ("export it again").
    Returns:
        The manifest's ``files`` (name -> SHA-256).
    Raises:
        InputError: one line naming the file and what differs.
    """
    path = folder / MANIFEST
    files, digest = manifest.get("files"), manifest.get("digest")
    if not (isinstance(files, dict) and all(isinstance(name, str) and isinstance(sha, str)
                                            and _SHA256.fullmatch(sha)
                                            for name, sha in files.items())):
        raise InputError(f'{path}: its "files" must map file names to SHA-256 digests: {again}')
    if not isinstance(digest, str) or manifest_digest(manifest) != digest:
        raise InputError(f"{path} does not match its digest (a field was changed after it was "
                         f"written): {again}")
    for name in files:
        if name in ("", ".", "..", MANIFEST) or "/" in name or "\\" in name:
            raise InputError(f"{path} lists {name!r}, which is not a file name in the folder: "
                             f"{again}")
    unsealed = [name for name in required if name not in files]
    if unsealed:
        raise InputError(f"{path} seals no digest of {', '.join(unsealed)}: {again}")
    for name in files:
        file = folder / name
        if file.is_symlink() or not file.is_file():
            what = "a symbolic link" if file.is_symlink() else "missing"
            raise InputError(f"{file} is {what}: the folder's files are its own; {again}")
    return files
