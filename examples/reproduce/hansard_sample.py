"""Build the Hansard en-fr sample that the reproduction trains on, from the public release.

The source is the "Aligned Hansards of the 36th Parliament of Canada" (U. Germann, USC/ISI,
2001), sentence-aligned proceedings of the House of Commons and the Senate, 1997-2000, as
published in the GitHub repository ``EKarton/English-French-Translator`` (commit ``da9cecc``),
folder ``Translator/data/Hansard-Multi30k/Training``: 408 pairs of files
``hansard.36.{1,2}.{house,senate}.debates.*.{en,fr}``, one sentence per line, aligned by line.
Get it with::

    git clone https://github.com/EKarton/English-French-Translator
    git -C English-French-Translator checkout da9cecce49498c4f79946a631206985f99daaed3

The recipe, step by step (`build_sample`):

1. the ``hansard.36.*.en`` files in sorted name order, each with its ``.fr`` partner (the same
   number of lines), concatenated;
2. each line stripped of surrounding white space;
3. pairs kept with 1-100 white-space tokens on both sides;
4. duplicate English lines dropped, the first kept (743,088 pairs remain);
5. ``random.Random(9215).sample(pairs, 104000)``: the first 100,000 are train, the next 2,000
   dev, the last 2,000 test, so the three are disjoint by English line.

It writes ``{train,dev,test}.{en,fr}.gz`` (gzip without a name or time stamp, so the bytes are
the same on every machine) and a ``README.md`` with the statistics and digests. Before anything
is written the release is checked against `RELEASE_SHA256` (one digest of every input file's name
and bytes), and what is written is checked against `SAMPLE_SHA256` (the digests of the
uncompressed text), so a sample that this script says it built is the one the reproduction's
numbers come from. Anything else is refused in one line, and nothing is left behind.

Usage, from the repository root (the folder that --out goes into must exist)::

    mkdir -p data
    python examples/reproduce/hansard_sample.py \\
        English-French-Translator/Translator/data/Hansard-Multi30k/Training \\
        --out data/hansard-fr-en-100k

Inputs and --out follow bahdanau's rules (`bahdanau.jobs.files.existing`,
`bahdanau._files.check_destination`): a release file that is a folder, a FIFO or a device, and an
--out that is a dangling link, the current folder, under a file, or inside a folder bahdanau
replaces whole (a model folder, a prepared corpus, an exported folder, a run's checkpoints:
`bahdanau.jobs.run_folder.run_file_owner`), are refused in one line.

The texts carry no stated terms of use: use them for experiments only, and do not commit the
sample into a repository or ship it in a package.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bahdanau._files import check_destination
from bahdanau.errors import InputError
from bahdanau.jobs.files import existing
from bahdanau.jobs.run_folder import run_file_owner

SEED = 9215
SPLITS = (("train", 100_000), ("dev", 2_000), ("test", 2_000))
LANGUAGES = ("en", "fr")
MAX_TOKENS = 100

RELEASE_SHA256 = "4dd88186fe3760500a6077ed3f53a9a47eac6d7e09231756011acebeaac08e15"
"""Digest of the release folder (see `release_digest`): 408 file pairs, about 200 MB."""

SAMPLE_SHA256 = {
    "train.en": "458230daf0724cf27d5ffe62271638eab6a6845383b505cdb06cb70495b5cbcc",
    "train.fr": "ab2eff9261d3748960885952f557f856f9a929d59cd4fdfafbb1979024941d6f",
    "dev.en": "de3e29b24df078af4885a962da9165820fc30ce99fa1e8196205d643c1b3fb8a",
    "dev.fr": "dabe0cdd305e20a89abf977ffab361973f19352ccc94a2f53a8333a2265916ef",
    "test.en": "f936d2f58b39bc4c7cd260c630cce802494607a645ea65205880c3ed205e2244",
    "test.fr": "6e8c4cb4467c47754fbe58430a8ce6540eaeaa04bfba325332b5e5972e4524a0",
}
"""SHA-256 of each written file's uncompressed text."""


class RecipeError(Exception):
    """The input is not the release this recipe was written for, or the output is not the sample."""


@dataclass(frozen=True)
class Expected:
    """The digests a build is held to: the release's, and the sample's (None: not checked)."""

    release: str | None = RELEASE_SHA256
    sample: dict[str, str] | None = None

    @classmethod
    def published(cls) -> Expected:
        return cls(RELEASE_SHA256, SAMPLE_SHA256)


def _checked(check, *args, **kwargs):
    """`check(*args, **kwargs)` (one of bahdanau's checks), its `InputError` a `RecipeError`."""
    try:
        return check(*args, **kwargs)
    except InputError as error:
        raise RecipeError(str(error)) from None


def release_files(release: Path) -> list[tuple[Path, Path]]:
    """The (en, fr) file pairs of the release, in sorted name order, each a regular file (a
    folder, a FIFO or a device of such a name is refused: the files are read twice)."""
    if not release.is_dir():
        raise RecipeError(f"{release} is not a folder (expected the release's Training folder)")
    english = sorted(release.glob("hansard.36.*.en"))
    if not english:
        raise RecipeError(
            f"{release} holds no hansard.36.*.en files: is it the release's Training folder?"
        )
    pairs = []
    for en in english:
        fr = en.with_suffix(".fr")
        if not (fr.exists() or fr.is_symlink()):
            raise RecipeError(f"{en.name} has no French partner {fr.name} in {release}")
        pairs.append((_checked(existing, str(en), "release file", regular=True),
                      _checked(existing, str(fr), "release file", regular=True)))
    return pairs


def release_digest(files: Iterable[tuple[Path, Path]]) -> str:
    """SHA-256 over each file's name and the SHA-256 of its bytes, in order."""
    digest = hashlib.sha256()
    for pair in files:
        for path in pair:
            digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise RecipeError(
            f"{path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def aligned_pairs(files: Iterable[tuple[Path, Path]]) -> list[tuple[str, str]]:
    """Steps 1-4: the concatenated, stripped, length-filtered pairs, English lines deduplicated."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for en_path, fr_path in files:
        english, french = read_lines(en_path), read_lines(fr_path)
        if len(english) != len(french):
            raise RecipeError(
                f"{en_path.name} has {len(english)} lines but {fr_path.name} has "
                f"{len(french)}: not aligned"
            )
        for en, fr in zip(english, french, strict=True):
            en, fr = en.strip(), fr.strip()
            if (
                en in seen
                or not 1 <= len(en.split()) <= MAX_TOKENS
                or not 1 <= len(fr.split()) <= MAX_TOKENS
            ):
                continue
            seen.add(en)
            pairs.append((en, fr))
    return pairs


def split_sample(pairs: Sequence[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Step 5: one seeded sample, cut into train, dev and test."""
    wanted = sum(size for _, size in SPLITS)
    if len(pairs) < wanted:
        raise RecipeError(
            f"the release gives {len(pairs):,} usable pairs, fewer than the {wanted:,} sampled"
        )
    sample = random.Random(SEED).sample(list(pairs), wanted)
    splits, start = {}, 0
    for name, size in SPLITS:
        splits[name] = sample[start : start + size]
        start += size
    return splits


def write_gzip(path: Path, text: bytes) -> None:
    """gzip with no file name and a zero time stamp: the same bytes on every machine."""
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out,
    ):
        out.write(text)


def summary(splits: dict[str, list[tuple[str, str]]], digests: dict[str, str], release: str) -> str:
    rows = []
    for name, part in splits.items():
        words = sorted(len(en.split()) for en, _ in part)
        rows.append(
            f"| {name}.{{en,fr}}.gz | {len(part):,} | {statistics.mean(words):.1f} / "
            f"{words[len(words) // 2]} / {words[int(0.95 * len(words))]} / {words[-1]} "
            f"| {sum(w > 30 for w in words):,} "
            f"| {sum(w > 50 for w in words):,} |"
        )
    lines = [
        "# Canadian Hansard (36th Parliament), English-French: 100k-pair sample",
        "",
        "Built by examples/reproduce/hansard_sample.py (its docstring gives the source and the",
        "recipe).",
        "Do not commit these files into a repository or ship them in a package.",
        "",
        "| file | pairs | English words: mean / median / p95 / max | > 30 words | > 50 words |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Release digest: `{release}`",
        "",
        "SHA-256 of the uncompressed text:",
        "```",
        *(f"{digest}  {name}" for name, digest in digests.items()),
        "```",
        "",
    ]
    return "\n".join(lines)


def build_sample(release: Path, out: Path, expected: Expected | None = None) -> dict[str, str]:
    """Build the sample from `release` into `out` (a new folder); return the text digests.

    `expected` (default: the published digests) is what the release and the written text must
    match; a mismatch raises `RecipeError` and leaves nothing at `out`.
    """
    expected = Expected.published() if expected is None else expected
    out = _checked(check_destination, out, "the sample")   # a link: the folder it names
    owner = run_file_owner(Path(os.path.realpath(out)))
    if owner is not None:                 # its writer replaces it whole, the sample with it
        raise RecipeError(f"--out {out} is inside {owner}, which bahdanau replaces whole "
                          "(release, prepare or train --overwrite): choose a folder outside it")
    if out.exists():
        raise RecipeError(f"{out} already exists: remove it or choose another --out")
    if not out.parent.is_dir():
        raise RecipeError(f"the folder {out.parent} for --out does not exist")
    files = release_files(release)
    found = release_digest(files)
    if expected.release is not None and found != expected.release:
        raise RecipeError(
            f"{release} is not the release this recipe was written for (digest {found[:12]}..., "
            f"expected {expected.release[:12]}...): see the source in this script's docstring"
        )
    splits = split_sample(aligned_pairs(files))
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        digests = {}
        for name, part in splits.items():
            for index, language in enumerate(LANGUAGES):
                text = "".join(pair[index] + "\n" for pair in part).encode("utf-8")
                digests[f"{name}.{language}"] = hashlib.sha256(text).hexdigest()
                write_gzip(staging / f"{name}.{language}.gz", text)
        if expected.sample is not None and digests != expected.sample:
            wrong = sorted(name for name in digests if digests[name] != expected.sample.get(name))
            raise RecipeError(
                f"the sample written differs from the published one in {', '.join(wrong)}"
            )
        (staging / "README.md").write_text(summary(splits, digests, found), encoding="utf-8")
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return digests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "release", type=Path, help="the release's Training folder (hansard.36.*.en/.fr)"
    )
    parser.add_argument("--out", type=Path, required=True, help="the sample folder to create")
    args = parser.parse_args(argv)
    try:
        digests = build_sample(args.release, args.out)
    except RecipeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(digests)} files to {args.out}, each matching its published digest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
