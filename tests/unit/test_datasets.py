"""Tests for bahdanau.data: the shipped Multi30k files, read_lines() and decode_lines()."""

from __future__ import annotations

import gzip
import hashlib
import io
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bahdanau.data import (
    MULTI30K_LANGS,
    MULTI30K_SPLITS,
    decode_lines,
    iter_lines,
    multi30k_files,
    read_lines,
)
from bahdanau.errors import InputError

# Line counts stated by the upstream Multi30k README for Task 1.
EXPECTED_LINES = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}


@pytest.mark.parametrize("split", MULTI30K_SPLITS)
def test_multi30k_line_counts_match_across_languages(split: str) -> None:
    en = read_lines(multi30k_files(split, "en"))
    fr = read_lines(multi30k_files(split, "fr"))
    assert len(en) == EXPECTED_LINES[split]
    assert len(fr) == EXPECTED_LINES[split]
    assert all(line.strip() for line in en + fr), "no empty lines in Multi30k"
    assert not any("\n" in line or "\r" in line for line in en + fr)


def test_multi30k_files_are_gzip_and_listed_in_readme() -> None:
    readme = (multi30k_files("train", "en").parent / "README.md").read_text(encoding="utf-8")
    for split in MULTI30K_SPLITS:
        for lang in MULTI30K_LANGS:
            path = multi30k_files(split, lang)
            assert path.name == f"{split}.{lang}.gz"
            assert path.read_bytes()[:2] == b"\x1f\x8b"
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert f"{digest}  {path.name}" in readme


def test_multi30k_first_line_is_a_translation_pair() -> None:
    en = read_lines(multi30k_files("val", "en"))
    fr = read_lines(multi30k_files("val", "fr"))
    assert en[0].startswith("A group of men")
    assert fr[0].startswith("Un groupe d'hommes")


@pytest.mark.parametrize(
    ("split", "lang", "bad"),
    [("dev", "en", "'dev'"), ("train", "de", "'de'"), ("test", "fr", "'test'")],
)
def test_multi30k_files_rejects_unknown_values(split: str, lang: str, bad: str) -> None:
    with pytest.raises(ValueError, match=bad) as info:
        multi30k_files(split, lang)
    message = str(info.value)
    options = MULTI30K_LANGS if lang not in MULTI30K_LANGS else MULTI30K_SPLITS
    assert all(option in message for option in options)


def test_read_lines_gzip_and_plain_agree(tmp_path: Path) -> None:
    gz = multi30k_files("test_2016_flickr", "fr")
    plain = tmp_path / "test_2016_flickr.fr"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    assert read_lines(plain) == read_lines(gz)
    assert read_lines(str(plain)) == read_lines(gz)


def test_read_lines_sniffs_gzip_regardless_of_name(tmp_path: Path) -> None:
    path = tmp_path / "no_suffix.txt"
    path.write_bytes(gzip.compress("é\nb\n".encode()))
    assert read_lines(path) == ["é", "b"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", []),
        (b"\n", [""]),
        (b"a\nb", ["a", "b"]),
        (b"a\nb\n", ["a", "b"]),
        (b" a \r\n\nb\n", [" a ", "", "b"]),
        ("x\x0by\u2028z\n".encode(), ["x\x0by\u2028z"]),
    ],
)
def test_read_lines_strips_only_line_endings(
    tmp_path: Path, data: bytes, expected: list[str]
) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    assert read_lines(path) == expected


@pytest.mark.parametrize("compress", [False, True])
def test_read_lines_bad_utf8_names_file_and_line(tmp_path: Path, compress: bool) -> None:
    data = "première\ndeuxième\n".encode() + b"bad \xff byte\nlast\n"
    path = tmp_path / ("bad.txt.gz" if compress else "bad.txt")
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(ValueError, match=r"line 3 is not valid UTF-8") as info:
        read_lines(path)
    assert str(path) in str(info.value)


def test_read_lines_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_lines(tmp_path / "absent.txt")


# ----------------------------------------------------------------------------------------------
# Damaged gzip files, built by hand from RFC 1952: header, raw deflate data, CRC-32, length.

TEXT = b"le chat\nla maison bleue\n" * 20


def _member(data: bytes = TEXT) -> bytes:
    """One gzip member: magic, method 8 (deflate), no flags, mtime 0, xfl 0, OS 255."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)                  # raw deflate, no wrapper
    body = deflate.compress(data) + deflate.flush()
    trailer = struct.pack("<II", zlib.crc32(data), len(data) % 2**32)
    return b"\x1f\x8b\x08\x00" + b"\0\0\0\0" + b"\x00\xff" + body + trailer


def _changed(data: bytes, index: int, value: int) -> bytes:
    return data[:index] + bytes([value]) + data[index + 1:]


def _read_file(tmp_path: Path, data: bytes) -> list[str]:
    path = tmp_path / "corpus.en.gz"
    path.write_bytes(data)
    return read_lines(path)


def test_hand_built_gzip_reads() -> None:
    """The builder is right: the stdlib reads it, and so do we (several members, zero padding)."""
    assert gzip.decompress(_member()) == TEXT
    expected = ["le chat", "la maison bleue"] * 20
    assert decode_lines(_member(), "x") == expected
    assert decode_lines(_member() + _member(b"fin\n"), "x") == expected + ["fin"]
    assert decode_lines(_member() + b"\0" * 5, "x") == expected


@pytest.mark.parametrize("cut", [2, 3, 9, 10, 11, 30, -9, -8, -4, -1])
def test_truncated_gzip_names_the_file(tmp_path: Path, cut: int) -> None:
    """Cut in the magic, the header, the deflate data, before or inside the trailer."""
    data = _member()
    assert len(data) > 40
    with pytest.raises(InputError, match=r"corpus\.en\.gz: truncated gzip data"):
        _read_file(tmp_path, data[:cut])


def test_truncated_second_member_is_truncated_too(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="truncated gzip data"):
        _read_file(tmp_path, _member() + _member()[:12])


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda d: _changed(d, len(d) - 8, d[-8] ^ 0x01), "CRC-32 mismatch"),
    (lambda d: d[:-4] + struct.pack("<I", len(TEXT) + 1), "length mismatch"),
    (lambda d: _changed(d, 2, 0x07), "unknown compression method"),    # bad byte after magic
    (lambda d: _changed(d, 3, 0xE0), "header flags"),                   # reserved flag bits
    (lambda d: _changed(d, 10, 0xFF), "invalid block type"),            # deflate block type 3
])
def test_damaged_gzip_names_the_file_and_the_damage(tmp_path: Path, damage, reason: str) -> None:
    with pytest.raises(InputError, match=rf"corpus\.en\.gz: damaged gzip data \(.*{reason}"):
        _read_file(tmp_path, damage(_member()))


def test_trailing_garbage_after_gzip(tmp_path: Path) -> None:
    match = r"corpus\.en\.gz: trailing data after the gzip data \(7 bytes\)"
    with pytest.raises(InputError, match=match):
        _read_file(tmp_path, _member() + b"garbage")


def test_gzip_errors_are_one_line_and_name_stdin() -> None:
    for data in (_member()[:20], _changed(_member(), 2, 0x07), _member() + b"junk"):
        with pytest.raises(InputError) as info:
            decode_lines(data, "<stdin>")
        assert str(info.value).startswith("<stdin>: ")
        assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------------------------
# One set of rules for files and standard input

BOM = "\ufeff".encode()


@pytest.mark.parametrize(("data", "expected"), [
    (BOM + b"a\nb\n", ["a", "b"]),
    (BOM + b"a\r\nb", ["a", "b"]),
    (BOM, []),
    (BOM + b"\n", [""]),
    (BOM + BOM + b"a\n", ["\ufeffa"]),                   # only the first mark is removed
    (b"a\n" + BOM + b"b\n", ["a", "\ufeffb"]),          # a mark inside the text is kept
    (_member(BOM + b"x\ny\n"), ["x", "y"]),               # compressed: removed after gunzip
])
def test_leading_bom_is_removed(tmp_path: Path, data: bytes, expected: list[str]) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes(data)
    assert read_lines(path) == expected
    assert decode_lines(data, "<stdin>") == expected


@pytest.mark.parametrize("data", [
    b"", b"\n", b"a", b"a\r\n\r\nb\n", " é \x0b\u2028\n".encode(), BOM + b"z",
    _member(), _member(b"") + _member(b"a\n"),
])
def test_file_and_stdin_read_the_same(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    assert read_lines(path) == decode_lines(data, "<stdin>")


@pytest.mark.parametrize(("data", "line"), [
    (b"\xff", 1),
    (BOM + b"ok\n\xc3\n", 2),                              # lone lead byte
    (b"a\nb\nc\xe9t\xe9\n", 3),                            # Latin-1, not UTF-8
    (b"ligne\n" * 4 + b"\xed\xa0\x80\n", 5),                # an encoded surrogate
    (b"\xff\xfea\x00\n\x00", 1),                           # UTF-16 with its BOM
    (_member(b"x\n\x80\n"), 2),                            # compressed
])
def test_invalid_utf8_on_stdin_names_it_and_the_line(data: bytes, line: int) -> None:
    with pytest.raises(InputError, match=rf"^<stdin>: line {line} is not valid UTF-8 \("):
        decode_lines(data, "<stdin>")


def test_decode_lines_refuses_str() -> None:
    with pytest.raises(InputError, match="bytes"):
        decode_lines("a\n", "<stdin>")                    # type: ignore[arg-type]


@pytest.mark.parametrize("data", [b"", BOM, _member(b"")])
def test_non_empty_refuses_no_lines(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(data)
    assert read_lines(path) == []
    with pytest.raises(InputError, match=r"empty\.txt is empty"):
        read_lines(path, non_empty=True)
    with pytest.raises(InputError, match=r"^<stdin> is empty"):
        decode_lines(data, "<stdin>", non_empty=True)
    assert decode_lines(b"\n", "<stdin>", non_empty=True) == [""]


def _split_text(text: str) -> list[str]:
    """The rules of iter_lines stated on a whole str: BOM, split on \\n, no extra last line, \\r."""
    text = text.removeprefix("\ufeff")
    lines = text.split("\n") if text else []
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


@given(st.text(alphabet=st.sampled_from(["a", "é", "\n", "\r", "\ufeff", " ", "\x0b", "\u2028",
                                         "\x00", "😀"]), max_size=40),
       st.booleans(), st.integers(1, 9))
def test_iter_lines_in_any_chunk_size_equals_splitting_the_whole_text(text, compress,
                                                                      chunk_size) -> None:
    data = text.encode()
    if compress:   # two members and zero padding, as gunzip reads them
        half = len(data) // 2
        data = gzip.compress(data[:half]) + gzip.compress(data[half:]) + b"\0\0"
    got = list(iter_lines(io.BytesIO(data), "<test>", chunk_size=chunk_size))
    assert got == _split_text(text)


class _Pipe(io.RawIOBase):
    """A stream that hands out `parts` one read at a time, then fails: what has not been sent
    yet must not be needed."""

    def __init__(self, *parts: bytes) -> None:
        self.parts = list(parts)

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        if not self.parts:
            raise AssertionError("read past what the pipe has sent")
        return self.parts.pop(0)


@pytest.mark.parametrize("compress", [False, True])
def test_iter_lines_yields_each_line_as_soon_as_it_is_complete(compress) -> None:
    if compress:   # a member per line, as a gzip stream flushed after each line
        lines = iter_lines(_Pipe(gzip.compress(b"one\n"), gzip.compress(b"two\n")), "<pipe>")
    else:
        lines = iter_lines(_Pipe(b"one\ntw", b"o\n"), "<pipe>")
    assert next(lines) == "one"
    assert next(lines) == "two"


@pytest.mark.parametrize(("data", "match"), [
    (b"ok\n\xff\n", "<s>: line 2 is not valid UTF-8"),
    (gzip.compress(b"ok\n")[:-3], "<s>: truncated gzip data"),
    (gzip.compress(b"ok\n") + b"\0\0xy", r"<s>: trailing data after the gzip data \(2 bytes\)"),
])
def test_iter_lines_errors_name_the_source(data, match) -> None:
    for chunk_size in (1, 3, 1 << 20):
        with pytest.raises(InputError, match=match):
            list(iter_lines(io.BytesIO(data), "<s>", chunk_size=chunk_size))
