"""Data files shipped with the package, and a reader for line-aligned text corpora.

The Multi30k English/French splits live in ``bahdanau/_data/multi30k`` (gzipped UTF-8, one sentence
per line; origin, terms and checksums in the README there). Line i of ``X.en.gz`` translates line i
of ``X.fr.gz``, so readers must never merge or split lines.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import os
from importlib import resources
from pathlib import Path

from bahdanau.errors import InputError

__all__ = ["MULTI30K_LANGS", "MULTI30K_SPLITS", "multi30k_files", "read_lines"]

MULTI30K_SPLITS: tuple[str, ...] = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS: tuple[str, ...] = ("en", "fr")

_GZIP_MAGIC = b"\x1f\x8b"
# Keeps files extracted from a zipped install alive until the interpreter exits.
_extracted = contextlib.ExitStack()
atexit.register(_extracted.close)


def multi30k_files(split: str, lang: str) -> Path:
    """Path of one shipped Multi30k file, e.g. ``multi30k_files("train", "en")``.

    Args:
        split: one of ``"train"`` (29,000 lines), ``"val"`` (1,014) or ``"test_2016_flickr"``
            (1,000).
        lang: ``"en"`` or ``"fr"``.
    Returns:
        Path to the gzipped file ``{split}.{lang}.gz``; pass it to :func:`read_lines`.
    Raises:
        InputError: ``split`` or ``lang`` is not one of the values above.
    """
    if split not in MULTI30K_SPLITS:
        raise InputError(f"split must be one of {MULTI30K_SPLITS}, got {split!r}")
    if lang not in MULTI30K_LANGS:
        raise InputError(f"lang must be one of {MULTI30K_LANGS}, got {lang!r}")
    resource = resources.files("bahdanau") / "_data" / "multi30k" / f"{split}.{lang}.gz"
    if isinstance(resource, Path):
        return resource
    # Installed inside a zip archive: extract to a temporary file that lives until exit.
    return _extracted.enter_context(resources.as_file(resource))


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """Read a UTF-8 text file, plain or gzip-compressed, as a list of lines.

    Gzip is recognised by the file's first two bytes, not by its name. Lines are split on ``\\n``
    only, and only the line ending (``\\n`` or ``\\r\\n``) is removed: leading and trailing spaces
    are kept, and characters such as ``\\x0b`` or U+2028 inside a line do not split it, so two
    line-aligned files stay aligned. A final line without a newline is kept; a file that ends
    with a newline yields no extra empty line.

    Args:
        path: file to read.
    Returns:
        The lines, without their line endings; ``[]`` for an empty file.
    Raises:
        InputError: the text is not valid UTF-8; the message names the file and the 1-based line.
        OSError: the file cannot be opened, or its gzip header is damaged.
        EOFError: the gzip stream is truncated.
    """
    path = Path(path)
    with path.open("rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
    if compressed:
        with gzip.open(path, "rb") as f:
            data = f.read()
    else:
        data = path.read_bytes()
    return decode_lines(data, str(path))


def decode_lines(data: bytes, source: str) -> list[str]:  # TEMPORARY until inputs lands
    path = source
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"{path}: line {line} is not valid UTF-8 ({err.reason})") from None
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]
