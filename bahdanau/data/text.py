"""Data files shipped with the package, and the reader of line-aligned text (files and stdin).

The Multi30k English/French splits live in ``bahdanau/_data/multi30k`` (gzipped UTF-8, one sentence
per line; origin, terms and checksums in the README there). Line i of ``X.en.gz`` translates line i
of ``X.fr.gz``, so readers must never merge or split lines. Every text the library reads goes
through :func:`iter_lines` (:func:`read_lines` for a file, :func:`decode_lines` for bytes), which
states the rules once.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import os
import zlib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import BinaryIO

from bahdanau._checks import check_path
from bahdanau.errors import InputError

__all__ = ["MULTI30K_LANGS", "MULTI30K_SPLITS", "decode_lines", "iter_lines", "multi30k_files",
           "normalize_whitespace", "read_lines", "read_parallel"]

MULTI30K_SPLITS: tuple[str, ...] = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS: tuple[str, ...] = ("en", "fr")

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff".encode()
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

    The bytes are decoded by the rules of :func:`iter_lines` (gzip recognised by its first two
    bytes, a leading BOM removed, lines split on ``\\n`` only).

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
    with path.open("rb") as stream:
        return _all_lines(iter_lines(stream, str(path)), str(path), non_empty)


def decode_lines(data: bytes, source: str, *, non_empty: bool = False) -> list[str]:
    """Decode UTF-8 text, plain or gzip-compressed, into lines, by the rules of
    :func:`iter_lines`.

    Args:
        data: the raw bytes.
        source: what the bytes came from (a file name, ``"<stdin>"``), for error messages.
        non_empty: refuse input that holds no line at all.
    Returns:
        The lines, without their line endings; ``[]`` for empty input.
    Raises:
        InputError: what :func:`iter_lines` raises; no line while `non_empty` is set; `data`
            that is not bytes (e.g. a str).
    """
    if not isinstance(data, (bytes, bytearray)):
        raise InputError(f"decode_lines takes bytes (e.g. sys.stdin.buffer.read()), "
                         f"got {type(data).__name__}")
    return _all_lines(iter_lines(io.BytesIO(data), source), source, non_empty)


def _all_lines(lines: Iterator[str], source: str, non_empty: bool) -> list[str]:
    out = list(lines)
    if non_empty and not out:
        raise InputError(f"{source} is empty: at least one line is needed")
    return out


def iter_lines(stream: BinaryIO, source: str, *, chunk_size: int = 1 << 20) -> Iterator[str]:
    """Decode UTF-8 text, plain or gzip-compressed, from a binary stream, one line at a time:
    the one reader of text input, holding one chunk and one line in memory.

    Files (:func:`read_lines`), standard input (``iter_lines(sys.stdin.buffer, "<stdin>")``) and
    bytes (:func:`decode_lines`) go through here, so all follow the same rules:

    * gzip is recognised by the first two bytes (``1f 8b``, which cannot start UTF-8 text), not
      by a name; several concatenated gzip members are read one after the other, and zero bytes
      after the last are ignored, as ``gunzip`` does;
    * one UTF-8 byte order mark (U+FEFF) at the very start is removed; anywhere else it is kept;
    * lines are split on ``\\n`` only, and only the line ending (``\\n`` or ``\\r\\n``) is
      removed: leading and trailing spaces are kept, and characters such as ``\\x0b`` or U+2028
      inside a line do not split it, so two line-aligned inputs stay aligned. A final line
      without a newline is kept; input that ends with a newline yields no extra empty line.

    Args:
        stream: a binary stream (an open file, ``sys.stdin.buffer``, ``io.BytesIO``).
        source: what the bytes come from (a file name, ``"<stdin>"``), for error messages.
        chunk_size: bytes read at a time.
    Yields:
        The lines, without their line endings, as soon as each is complete.
    Raises:
        InputError: naming `source`, when the reader gets there: truncated or damaged gzip data
            (bad header, CRC-32 or length mismatch, trailing bytes that are not gzip), or text
            that is not valid UTF-8 (with the 1-based line).
    """
    # read1 returns what is there (at most one system read), so a line typed on a terminal or
    # sent down a pipe comes out at once instead of after chunk_size more bytes
    read = getattr(stream, "read1", stream.read)
    chunks = iter(lambda: read(chunk_size), b"")
    first = next(chunks, b"")
    while 0 < len(first) < 2:           # a short read: make sure two bytes decide about gzip
        more = next(chunks, b"")
        if not more:
            break
        first += more
    data: Iterator[bytes] = itertools.chain([first], chunks)
    if first[:2] == _GZIP_MAGIC:
        data = _gunzip(data, source)
    pending, number, start = b"", 0, True
    for chunk in data:
        pending += chunk
        if start:
            if len(pending) < len(_BOM) and _BOM.startswith(pending):
                continue                # wait: the chunk may end inside the BOM
            pending, start = pending.removeprefix(_BOM), False
        *lines, pending = pending.split(b"\n")
        for line in lines:
            number += 1
            yield _decode_line(line, number, source)
    if start:
        pending = pending.removeprefix(_BOM)
    if pending:
        yield _decode_line(pending, number + 1, source)


def _decode_line(line: bytes, number: int, source: str) -> str:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{source}: line {number} is not valid UTF-8 ({err.reason})") from None
    return text[:-1] if text.endswith("\r") else text


def _gunzip(chunks: Iterator[bytes], source: str) -> Iterator[bytes]:
    """Decompress every gzip member of the byte stream `chunks`, one chunk at a time;
    InputError naming `source` if any member is damaged."""
    # 16 + MAX_WBITS: a gzip header and trailer. zlib._Decompress is the stubs' name for what
    # decompressobj returns (a local annotation, never evaluated)
    inflater: zlib._Decompress | None = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    rest = b""
    for chunk in chunks:
        rest += chunk
        while rest:
            if inflater is None:        # between members: zero padding, then the next member
                rest = rest.lstrip(b"\0")
                if len(rest) < 2:
                    break
                if rest[:2] != _GZIP_MAGIC:
                    size = len(rest) + sum(len(c) for c in chunks)
                    raise InputError(f"{source}: trailing data after the gzip data "
                                     f"({size} bytes)")
                inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            try:
                out = inflater.decompress(rest)
            except zlib.error as err:
                reason = str(err).rpartition(": ")[2]
                reason = _ZLIB_REASONS.get(reason, reason)
                raise InputError(f"{source}: damaged gzip data ({reason})") from None
            if out:
                yield out
            if inflater.eof:
                rest, inflater = inflater.unused_data, None
            else:
                rest = b""
    if inflater is not None:
        raise InputError(f"{source}: truncated gzip data (the compressed stream ends early)")
    if rest.lstrip(b"\0"):
        raise InputError(f"{source}: trailing data after the gzip data ({len(rest)} bytes)")


def read_parallel(src_path: str | os.PathLike[str], tgt_path: str | os.PathLike[str], *,
                  non_empty: bool = False) -> list[tuple[str, str]]:
    """Read two line-aligned UTF-8 files (plain or gzip) into (source, target) pairs.

    Each file is read by `bahdanau.data.read_lines` (same rules as standard input: gzip
    recognised by its first bytes, a leading BOM removed, lines split on ``\\n`` only).

    Args:
        src_path: source-language file; line i translates to line i of `tgt_path`.
        tgt_path: target-language file.
        non_empty: refuse empty files (where sentences are needed, e.g. training data); by
            default two empty files give ``[]``.
    Returns:
        The pairs, in file order, lines as read (line endings removed).
    Raises:
        InputError: naming the file: different line counts (both files named), a line that is
            empty or only whitespace (1-based line named), text that is not valid UTF-8 (line
            named), truncated or damaged gzip data, or an empty file with `non_empty`.
        OSError: a file cannot be opened or read.
    """
    src_file, tgt_file = check_path("src_path", src_path), check_path("tgt_path", tgt_path)
    src_lines = read_lines(src_file, non_empty=non_empty)
    tgt_lines = read_lines(tgt_file, non_empty=non_empty)
    if len(src_lines) != len(tgt_lines):
        raise InputError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}: "
            "the files are not line-aligned"
        )
    for path, lines in ((src_path, src_lines), (tgt_path, tgt_lines)):
        for i, line in enumerate(lines):
            if not line.strip():
                raise InputError(f"{path}: line {i + 1} is empty")
    return list(zip(src_lines, tgt_lines, strict=True))


def normalize_whitespace(text: str) -> str:
    """Runs of whitespace (as `str.split` sees it) become one space; ends are stripped."""
    return " ".join(text.split())
