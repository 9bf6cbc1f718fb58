"""The Hansard sample recipe (examples/reproduce/hansard_sample.py), on a release the test writes.

The synthetic release holds 104,100 usable pairs spread over three file pairs, plus lines the
recipe must drop (empty, over 100 tokens on either side, a repeated English line), so the
expected sample follows from the recipe's definition: ``Random(9215).sample(usable, 104000)``
over the usable pairs in file order.
"""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from example_scripts import load_example

recipe = load_example("reproduce/hansard_sample.py")

LONG = " ".join(["mot"] * 101)


def write_release(folder: Path) -> list[tuple[str, str]]:
    """Three file pairs; return the usable pairs in the order the recipe must see them."""
    folder.mkdir()
    usable: list[tuple[str, str]] = []
    names = [
        "hansard.36.2.house.debates.001",
        "hansard.36.1.senate.debates.002",
        "hansard.36.1.house.debates.118a",
    ]
    for file_index, name in enumerate(names):
        en_lines, fr_lines = [], []
        for i in range(34_700):
            en, fr = (
                f"sentence {file_index} {i} of the house",
                f"phrase {file_index} {i} de la chambre",
            )
            en_lines.append(f"  {en} ")  # stripped by the recipe
            fr_lines.append(f"{fr}\t")
            usable.append((en, fr))
        en_lines += ["", "   ", LONG, "a short one", f"sentence {file_index} 0 of the house"]
        fr_lines += ["vide", "", "court", LONG, "un doublon"]
        (folder / f"{name}.en").write_text("\n".join(en_lines) + "\n", encoding="utf-8")
        (folder / f"{name}.fr").write_text("\n".join(fr_lines) + "\n", encoding="utf-8")
    order = sorted(range(len(names)), key=lambda k: names[k])
    return [pair for k in order for pair in usable[k * 34_700 : (k + 1) * 34_700]]


def read(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, list[tuple[str, str]]]:
    folder = tmp_path_factory.mktemp("release") / "Training"
    return folder, write_release(folder)


def test_sample_is_the_seeded_sample_of_the_usable_pairs(release, tmp_path) -> None:
    folder, usable = release
    digests = recipe.build_sample(folder, tmp_path / "sample", recipe.Expected(release=None))
    expected = random.Random(9215).sample(usable, 104_000)
    cuts = {
        "train": expected[:100_000],
        "dev": expected[100_000:102_000],
        "test": expected[102_000:],
    }
    for split, pairs in cuts.items():
        assert read(tmp_path / "sample" / f"{split}.en.gz") == [en for en, _ in pairs]
        assert read(tmp_path / "sample" / f"{split}.fr.gz") == [fr for _, fr in pairs]
    assert sorted(digests) == sorted(recipe.SAMPLE_SHA256)
    assert "| test.{en,fr}.gz | 2,000 |" in (tmp_path / "sample" / "README.md").read_text()


def test_the_same_release_gives_the_same_bytes(release, tmp_path) -> None:
    folder, _ = release
    first = recipe.build_sample(folder, tmp_path / "a", recipe.Expected(release=None))
    digest = recipe.release_digest(recipe.release_files(folder))
    recipe.build_sample(folder, tmp_path / "b", recipe.Expected(release=digest, sample=first))
    for name in ("train.en.gz", "test.fr.gz", "README.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_sample_that_differs_from_the_published_one_is_refused_and_removed(
    release, tmp_path
) -> None:
    folder, _ = release
    wrong = dict.fromkeys(recipe.SAMPLE_SHA256, "0" * 64)
    with pytest.raises(recipe.RecipeError, match="differs from the published one in dev.en"):
        recipe.build_sample(
            folder, tmp_path / "sample", recipe.Expected(release=None, sample=wrong)
        )
    assert list(tmp_path.iterdir()) == []


def test_another_release_is_refused_in_one_line_before_any_work(release, tmp_path) -> None:
    folder, _ = release
    result = subprocess.run(
        [sys.executable, recipe.__file__, str(folder), "--out", str(tmp_path / "sample")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert (
        result.stderr.count("\n") == 1
        and "is not the release this recipe was written for" in result.stderr
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "damage, message",
    [
        ("misaligned", "has 3 lines but hansard.36.1.house.debates.001.fr has 2: not aligned"),
        ("orphan", "has no French partner"),
        ("latin1", "is not UTF-8 text"),
        ("empty", "holds no hansard.36.*.en files"),
    ],
)
def test_a_broken_release_is_named(tmp_path, damage, message) -> None:
    folder = tmp_path / "Training"
    folder.mkdir()
    en, fr = (
        folder / "hansard.36.1.house.debates.001.en",
        folder / "hansard.36.1.house.debates.001.fr",
    )
    if damage != "empty":
        en.write_bytes(
            b"un\ndeux\ntrois\n" if damage != "latin1" else "député\n".encode("latin-1")
        )
    if damage in ("misaligned", "latin1"):
        fr.write_text("one\ntwo\n" if damage == "misaligned" else "deputy\n", encoding="utf-8")
    with pytest.raises(recipe.RecipeError, match=message.replace("*", r"\*").replace(".", r"\.")):
        recipe.build_sample(folder, tmp_path / "sample", recipe.Expected(release=None))
    assert not (tmp_path / "sample").exists()


def test_an_existing_output_is_never_replaced(release, tmp_path) -> None:
    folder, _ = release
    (tmp_path / "sample").mkdir()
    (tmp_path / "sample" / "keep").write_text("mine")
    with pytest.raises(recipe.RecipeError, match="already exists"):
        recipe.build_sample(folder, tmp_path / "sample", recipe.Expected(release=None))
    assert (tmp_path / "sample" / "keep").read_text() == "mine"


def _run_recipe(release: Path, out: Path) -> subprocess.CompletedProcess:
    """The recipe's command line; a read that waits forever (a FIFO) times out the test."""
    return subprocess.run([sys.executable, recipe.__file__, str(release), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


def _small_release(folder: Path) -> tuple[Path, Path]:
    """A release of one file pair (its en and fr paths)."""
    folder.mkdir()
    en, fr = (folder / "hansard.36.1.house.debates.001.en",
              folder / "hansard.36.1.house.debates.001.fr")
    en.write_text("one\n", encoding="utf-8")
    fr.write_text("un\n", encoding="utf-8")
    return en, fr


@pytest.mark.parametrize("side", ["en", "fr"])
def test_a_fifo_named_like_a_release_file_is_refused_in_one_line(tmp_path, side) -> None:
    """A FIFO named like a release file hung the recipe (reading it waits for a writer): it is
    refused in one line, before anything is read or written."""
    pair = dict(zip(("en", "fr"), _small_release(tmp_path / "Training"), strict=True))
    pair[side].unlink()
    os.mkfifo(pair[side])
    result = _run_recipe(tmp_path / "Training", tmp_path / "sample")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{pair[side]} is not a regular file" in result.stderr
    assert not (tmp_path / "sample").exists()


def test_a_folder_named_like_a_release_file_is_refused_in_one_line(tmp_path) -> None:
    """A folder of a release file's name gave an IsADirectoryError traceback."""
    en, _ = _small_release(tmp_path / "Training")
    en.unlink()
    en.mkdir()
    result = _run_recipe(tmp_path / "Training", tmp_path / "sample")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{en} is a folder, not a file" in result.stderr


def test_a_dangling_out_is_refused_before_any_work(release, tmp_path) -> None:
    """An --out that is a symbolic link to nothing gave a traceback once the whole sample was
    written (renaming its folder onto the link): it is refused first, and the link stays."""
    folder, _ = release
    out = tmp_path / "sample"
    out.symlink_to(tmp_path / "nowhere")
    with pytest.raises(recipe.RecipeError, match="is a symbolic link to .* which does not exist"):
        recipe.build_sample(folder, out, recipe.Expected(release=None))
    assert out.is_symlink() and [p.name for p in tmp_path.iterdir()] == ["sample"]


@pytest.mark.parametrize("where", ["model", "prepared", "exported", "run"])
def test_an_out_inside_a_bahdanau_folder_is_refused(release, tmp_path, where) -> None:
    """The sample written into a model folder, a prepared corpus, an exported folder or a run's
    checkpoints was deleted by the next release, prepare or train --overwrite there: such an
    --out is refused before any work, through a symbolic link too, and nothing is written."""
    import json

    from bahdanau._folders import EXPORTED_FORMAT, PREPARED_FORMAT, RELEASE_FORMAT

    folder, _ = release
    owner = tmp_path / where
    formats = {"model": RELEASE_FORMAT, "prepared": PREPARED_FORMAT,
               "exported": EXPORTED_FORMAT}
    if where == "run":
        (owner / "checkpoints").mkdir(parents=True)
        (owner / "checkpoints" / "step_00000004.pt").write_bytes(b"")
        out, what = owner / "checkpoints" / "sample", f"the run in {owner}"
    else:
        owner.mkdir()
        (owner / "manifest.json").write_text(json.dumps({"format": formats[where]}))
        out, what = owner / "sub" / "sample", f" {owner}"
    (tmp_path / "link").symlink_to(out.parent, target_is_directory=True)
    before = sorted(tmp_path.rglob("*"))
    for given in (out, tmp_path / "link" / "sample"):
        with pytest.raises(recipe.RecipeError, match="is inside") as caught:
            recipe.build_sample(folder, given, recipe.Expected(release=None))
        message = str(caught.value)
        assert message.startswith(f"--out {given} is inside") and what in message, message
        assert "\n" not in message and "choose a folder outside it" in message
    assert sorted(tmp_path.rglob("*")) == before
