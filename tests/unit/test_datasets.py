"""Tests for bahdanau.datasets: the shipped Multi30k files and read_lines()."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from bahdanau.datasets import MULTI30K_LANGS, MULTI30K_SPLITS, multi30k_files, read_lines

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
