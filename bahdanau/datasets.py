"""Data files shipped with the package, and the reader of line-aligned text (files and stdin).

The Multi30k English/French splits live in ``bahdanau/_data/multi30k`` (gzipped UTF-8, one sentence
per line; origin, terms and checksums in the README there). Line i of ``X.en.gz`` translates line i
of ``X.fr.gz``, so readers must never merge or split lines. Every text the library reads goes
through :func:`decode_lines` (:func:`read_lines` for a file), which states the rules once.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import zlib
from importlib import resources
from pathlib import Path

from bahdanau.errors import InputError

__all__ = ["MULTI30K_LANGS", "MULTI30K_SPLITS", "decode_lines", "multi30k_files", "read_lines"]

MULTI30K_SPLITS: tuple[str, ...] = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS: tuple[str, ...] = ("en", "fr")

_GZIP_MAGIC = b"\x1f\x8b"
# zlib's words for a gzip trailer that does not match the data.
_ZLIB_REASONS = {"incorrect data check": "CRC-32 mismatch",
                 "incorrect length check": "length mismatch"}
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


def read_lines(path: str | os.PathLike[str], *, non_empty: bool = False) -> list[str]:
    """Read a UTF-8 text file, plain or gzip-compressed, as a list of lines.

    The bytes are decoded by :func:`decode_lines`, by the rules given there (gzip recognised by
    its first two bytes, a leading BOM removed, lines split on ``\\n`` only).

    Args:
        path: file to read.
        non_empty: refuse a file that holds no line at all.
    Returns:
        The lines, without their line endings; ``[]`` for an empty file.
    Raises:
        InputError: the gzip data is truncated or damaged, the text is not valid UTF-8, or the
            file is empty and `non_empty` is set; the message names the file (and the 1-based
            line for UTF-8).
        OSError: the file cannot be opened or read.
    """
    path = Path(path)
    return decode_lines(path.read_bytes(), str(path), non_empty=non_empty)


def decode_lines(data: bytes, source: str, *, non_empty: bool = False) -> list[str]:
    """Decode UTF-8 text, plain or gzip-compressed, into lines: the one reader of text input.

    Files (:func:`read_lines`) and standard input (``decode_lines(sys.stdin.buffer.read(),
    "<stdin>")``) go through here, so both follow the same rules:

    * gzip is recognised by the first two bytes (``1f 8b``, which cannot start UTF-8 text), not
      by a name; several concatenated gzip members are read one after the other, and zero bytes
      after the last are ignored, as ``gunzip`` does;
    * one UTF-8 byte order mark (U+FEFF) at the very start is removed; anywhere else it is kept;
    * lines are split on ``\\n`` only, and only the line ending (``\\n`` or ``\\r\\n``) is
      removed: leading and trailing spaces are kept, and characters such as ``\\x0b`` or U+2028
      inside a line do not split it, so two line-aligned inputs stay aligned. A final line
      without a newline is kept; input that ends with a newline yields no extra empty line.

    Args:
        data: the raw bytes.
        source: what the bytes came from (a file name, ``"<stdin>"``), for error messages.
        non_empty: refuse input that holds no line at all.
    Returns:
        The lines, without their line endings; ``[]`` for empty input.
    Raises:
        InputError: naming `source`: truncated or damaged gzip data (bad header, CRC-32 or
            length mismatch, trailing bytes that are not gzip), text that is not valid UTF-8
            (with the 1-based line), or no line while `non_empty` is set; `data` that is not
            bytes (e.g. a str).
    """
    if not isinstance(data, (bytes, bytearray)):
        raise InputError(f"decode_lines takes bytes (e.g. sys.stdin.buffer.read()), "
                         f"got {type(data).__name__}")
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip(data, source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"{source}: line {line} is not valid UTF-8 ({err.reason})") from None
    text = text.removeprefix("\ufeff")
    lines = text.split("\n") if text else []
    if lines and lines[-1] == "":
        lines.pop()
    if non_empty and not lines:
        raise InputError(f"{source} is empty: at least one line is needed")
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _gunzip(data: bytes, source: str) -> bytes:
    """Decompress every gzip member of `data`; InputError naming `source` if any is damaged."""
    parts, rest = [], data
    while rest:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)    # gzip header and trailer
        try:
            parts.append(inflater.decompress(rest))
        except zlib.error as err:
            reason = str(err).rpartition(": ")[2]
            reason = _ZLIB_REASONS.get(reason, reason)
            raise InputError(f"{source}: damaged gzip data ({reason})") from None
        if not inflater.eof:
            raise InputError(f"{source}: truncated gzip data (the compressed stream ends early)")
        rest = inflater.unused_data.lstrip(b"\0")
        if rest and rest[:2] != _GZIP_MAGIC:
            raise InputError(f"{source}: trailing data after the gzip data ({len(rest)} bytes)")
    return b"".join(parts)
