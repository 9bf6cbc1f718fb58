"""The kinds of folder bahdanau writes (`bahdanau._folders`), and the one rule of what each
writer may replace, held by the library's writers: `write_release`, `prepare_corpus`,
`export_folder` (through their checks) and train's run folder.

Folders are faked by their manifest and empty files: what makes a folder of a kind is what
`folder_kind` reads, and the writers refuse before they read anything else. The commands, on
real folders, are tests/integration/test_outputs.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from training_fixtures import one_line_error

from bahdanau._folders import (
    _FILES,
    EXPORTED_FORMAT,
    PREPARED_FORMAT,
    RELEASE_FORMAT,
    Kind,
    check_folder_to_write,
    enclosing_kind,
    folder_kind,
    manifest_kind,
)
from bahdanau.data import prepare_corpus
from bahdanau.jobs.run_folder import check_run_out, run_file_owner
from bahdanau.model_folder import check_model_folder_to_write
from bahdanau.serving import check_new_folder


def _folder(path: Path, manifest: object, *names: str) -> Path:
    """A fake folder: `manifest` as its manifest.json (a str: written as it is), empty `names`."""
    path.mkdir(parents=True)
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (path / "manifest.json").write_text(text)
    for name in names:
        (path / name).write_bytes(b"")
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("manifest", "names", "kind"), [
    ({"format": RELEASE_FORMAT, "version": 1}, (), Kind.MODEL),
    ({"format": PREPARED_FORMAT, "version": 2}, (), Kind.PREPARED),
    ({"format": EXPORTED_FORMAT, "version": 2}, (), Kind.EXPORTED),
    # an exported folder of the first format: "format" 1, beside its two programs
    ({"format": 1, "arch": "rnnsearch"}, ("encoder.pt2", "step.pt2"), Kind.EXPORTED),
    ({"format": 1}, ("encoder.pt2",), Kind.OTHER),
    ({"format": True}, ("encoder.pt2", "step.pt2"), Kind.OTHER),       # not the integer 1
    ({"format": "someone else's"}, ("model.safetensors", "config.json"), Kind.OTHER),
    # a damaged manifest (not JSON at all): the folder's files, and only they, say what it
    # was written as
    ('{"format": ', ("model.safetensors", "config.json"), Kind.MODEL),
    ("[" * 200000 + "]" * 200000, ("src.ids.npy", "tgt.ids.npy"), Kind.PREPARED),   # too deep
    ("not JSON", ("encoder.pt2", "step.pt2"), Kind.EXPORTED),
    ('{"format": ', ("notes.txt",), Kind.OTHER),
    ("dataset manifest", ("src.ids.npy", "tgt.ids.npy", "labels.csv"), Kind.OTHER),
    ('{"format": ', ("model.safetensors", "config.json", "NOTES.txt"), Kind.OTHER),
    # JSON without our "format": another tool's manifest, whatever files are beside it
    ({"name": "my-hf-export", "files": ["config.json"]}, ("config.json", "model.safetensors"),
     Kind.OTHER),
    ("[]", ("src.ids.npy", "tgt.ids.npy"), Kind.OTHER),
    ({"format": None}, ("model.safetensors", "config.json"), Kind.OTHER),
])
def test_a_folder_s_kind_is_what_its_manifest_says(tmp_path, manifest, names, kind) -> None:
    assert folder_kind(_folder(tmp_path / "f", manifest, *names)) is kind


def test_a_json_bomb_manifest_is_a_damaged_one(tmp_path) -> None:
    """A manifest nested too deeply to parse raised RecursionError from `manifest_kind`, which
    never raises; a valid one with a deeply nested field too."""
    bomb = _folder(tmp_path / "bomb", "[" * 200000 + "]" * 200000, "notes.txt")
    assert manifest_kind(bomb) is Kind.OTHER
    nested = _folder(tmp_path / "nested", '{"format": 1, "x": ' + "[" * 100000 + "]" * 100000
                     + "}", "encoder.pt2", "step.pt2")
    assert manifest_kind(nested) is Kind.EXPORTED          # damaged, and only its files in it


def test_the_kinds_files_are_their_writers_names() -> None:
    """Every name a writer writes is one of its kind's (`_folders._FILES`): a damaged folder
    of its own is still known, and none of its files is taken for the user's."""
    from bahdanau import model_folder
    from bahdanau.checkpoint import release
    from bahdanau.data.manifest import format_files
    from bahdanau.serving.folder import DECODE_FILE, FILES, ONNX_FILES, SENTENCEPIECE_FILE

    assert ({model_folder.WEIGHTS, model_folder.CONFIG, *release.TRANSLATOR_FILES, release.CARD,
             release.FOLDER_SENTENCEPIECE} == _FILES[Kind.MODEL])
    spm = {"options": {"tokenizer": {"name": "sentencepiece"}}}
    assert set(format_files(spm)) == _FILES[Kind.PREPARED]
    assert ({*FILES.values(), SENTENCEPIECE_FILE, DECODE_FILE, *ONNX_FILES.values()}
            - {"manifest.json"}) == _FILES[Kind.EXPORTED]


def test_the_folders_file_names_are_those_folders_already_written_hold() -> None:
    """File names are a format: folders written by earlier versions hold these, so a name
    changed in `_folders` would leave them unreadable (or others' files taken for ours)."""
    vocabs = {"src_vocab.json", "tgt_vocab.json", "tokenizer.json"}
    assert _FILES[Kind.MODEL] == vocabs | {"README.md", "config.json", "model.safetensors",
                                            "tokenizer.model"}
    assert _FILES[Kind.PREPARED] == vocabs | {"lines.npy", "sentencepiece.model", "src.ids.npy",
                                               "src.offsets.npy", "tgt.ids.npy",
                                               "tgt.offsets.npy"}
    assert _FILES[Kind.EXPORTED] == vocabs | {"README.md", "decode.py", "encoder.onnx",
                                               "encoder.pt2", "step.onnx", "step.pt2",
                                               "tokenizer.model"}


def test_a_writer_replaces_its_kind_only_holding_nothing_else(tmp_path) -> None:
    """`release --overwrite` onto a model folder into which the user put NOTES.txt deleted it;
    so did `prepare --overwrite` a damaged corpus's labels.csv (now a folder of other files).
    The first entry that is not the kind's is named; nothing is touched."""
    model = _folder(tmp_path / "model", {"format": RELEASE_FORMAT,
                                         "files": {"model.safetensors": "0" * 64}},
                    "model.safetensors", "NOTES.txt")
    prep = _folder(tmp_path / "prep", '{"format": ', "src.ids.npy", "tgt.ids.npy")
    (prep / "runs").mkdir()                              # a folder is never a kind's file
    exported = _folder(tmp_path / "exp", {"format": EXPORTED_FORMAT}, "encoder.pt2",
                       "step.pt2", "mine.py")
    before = _snapshot(tmp_path)
    one_line_error(lambda: check_model_folder_to_write(model, True),
                   f"--out {model} holds NOTES.txt, which is not the model folder's: move it out "
                   "or choose another folder")
    one_line_error(lambda: check_folder_to_write(model, Kind.MODEL, name="--out M"),
                   "--out M holds NOTES.txt, which is not the model folder's")
    one_line_error(lambda: check_folder_to_write(prep, Kind.MODEL, name="P"),
                   "P is a folder of other files (4 entries)")
    one_line_error(lambda: check_folder_to_write(exported, Kind.EXPORTED, name="E"),
                   "E holds mine.py, which is not the exported folder's")
    # a file the kind writes but its manifest does not list is not its either
    (model / "NOTES.txt").unlink()
    (model / "config.json").write_text("{}")
    one_line_error(lambda: check_folder_to_write(model, Kind.MODEL, name="M"),
                   "M holds config.json, which is not the model folder's")
    (model / "config.json").unlink()
    assert check_folder_to_write(model, Kind.MODEL) is True
    assert _snapshot(tmp_path) == {k: v for k, v in before.items()
                                   if not k.endswith("NOTES.txt")}


def test_absent_empty_and_other_folders(tmp_path) -> None:
    assert folder_kind(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    assert folder_kind(tmp_path / "empty") is None
    (tmp_path / "file").write_text("x")
    assert folder_kind(tmp_path / "file") is None
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    assert folder_kind(tmp_path / "mine") is Kind.OTHER          # no manifest: the user's


def test_a_writer_replaces_only_its_own_kind(tmp_path) -> None:
    model = _folder(tmp_path / "model", {"format": RELEASE_FORMAT})
    prep = _folder(tmp_path / "prep", {"format": PREPARED_FORMAT})
    (tmp_path / "data").mkdir()
    for i in range(3):
        (tmp_path / "data" / f"{i}.txt").write_text(str(i))
    (tmp_path / "empty").mkdir()
    assert check_folder_to_write(model, Kind.MODEL) is True        # the writer's rules decide
    assert check_folder_to_write(tmp_path / "empty", Kind.MODEL) is False
    assert check_folder_to_write(tmp_path / "new", Kind.PREPARED) is False
    assert check_new_folder(tmp_path / "empty") == tmp_path / "empty"   # export writes it too
    one_line_error(lambda: check_folder_to_write(prep, Kind.MODEL, name="--out P"),
                   "--out P is a prepared corpus: release writes a model folder; choose "
                   "another folder")
    one_line_error(lambda: check_folder_to_write(tmp_path / "data", Kind.EXPORTED),
                   f"{tmp_path / 'data'} is a folder of other files (3 entries): export writes "
                   "an exported folder whole and never replaces other files; choose a new folder")
    # train writes beside other files, never into a folder of another kind
    assert check_folder_to_write(tmp_path / "data", Kind.RUN, beside_other_files=True) is False
    one_line_error(lambda: check_folder_to_write(model, Kind.RUN, beside_other_files=True),
                   "is a model folder: train writes a run folder")


def test_nothing_is_written_inside_a_folder_of_a_kind(tmp_path) -> None:
    """A folder or file anywhere under a model folder, a prepared corpus or an exported folder
    (symbolic links resolved) is theirs."""
    exported = _folder(tmp_path / "exp", {"format": EXPORTED_FORMAT}, "encoder.pt2")
    (exported / "a").mkdir()
    (tmp_path / "link").symlink_to(exported / "a")
    assert enclosing_kind(exported / "a" / "b" / "c") == (Kind.EXPORTED, exported)
    assert enclosing_kind(tmp_path / "link" / "x") == (Kind.EXPORTED, exported)
    assert enclosing_kind(exported) is None
    assert run_file_owner(exported / "a" / "hyp.txt") == f"the exported folder {exported}"
    assert run_file_owner(exported / "encoder.pt2") == f"the exported folder {exported}"
    one_line_error(lambda: check_folder_to_write(exported / "a" / "b", Kind.PREPARED),
                   f"is inside the exported folder {exported}: writing it would damage it")


def test_the_library_writers_refuse_other_kinds_whatever_the_flag(tmp_path) -> None:
    """`write_release(..., overwrite=True)` (through `check_model_folder_to_write`) and
    `prepare_corpus(..., overwrite=True)` replaced any folder; `export_folder` (through
    `check_new_folder`) and a run refuse them too."""
    model = _folder(tmp_path / "model", {"format": RELEASE_FORMAT}, "model.safetensors")
    old = _folder(tmp_path / "old", {"format": 1}, "encoder.pt2", "step.pt2")
    prep = _folder(tmp_path / "prep", {"format": PREPARED_FORMAT}, "src.ids.npy")
    data = tmp_path / "data"
    data.mkdir()
    (data / "mine.txt").write_text("keep me")
    before = _snapshot(tmp_path)
    one_line_error(lambda: check_model_folder_to_write(data, True),
                   f"--out {data} is a folder of other files (1 entry): release writes a model "
                   "folder whole")
    one_line_error(lambda: check_model_folder_to_write(old, True),
                   f"--out {old} is an exported folder: release writes a model folder")
    src = tmp_path / "s.txt"
    src.write_text("a b\n")
    for out, what in ((model, "a model folder"), (old, "an exported folder")):
        one_line_error(lambda out=out: prepare_corpus(src, src, out, workers=1, overwrite=True),
                       f"{out} is {what}: prepare writes a prepared corpus; choose another folder")
    one_line_error(lambda: check_new_folder(prep), f"{prep} is a prepared corpus: export writes "
                   "an exported folder")
    one_line_error(lambda: check_run_out(prep / "run"), f"--out {prep / 'run'} is inside the "
                   f"prepared corpus {prep}")
    src.unlink()
    assert _snapshot(tmp_path) == before


def test_prepare_still_rebuilds_its_own_damaged_corpus(tmp_path) -> None:
    """A prepared corpus whose manifest is no longer JSON is still one (its arrays say so):
    --overwrite rebuilds it, as before; a folder of a user's with a broken manifest.json of its
    own is not one, and is never replaced."""
    src = tmp_path / "s.txt"
    src.write_text("a b\nc d e\n")
    out = tmp_path / "prep"
    prepare_corpus(src, src, out, workers=1)
    (out / "manifest.json").write_text('{"format": ')
    one_line_error(lambda: prepare_corpus(src, src, out, workers=1),
                   f"{out} holds a damaged prepared corpus")
    assert len(prepare_corpus(src, src, out, workers=1, overwrite=True)) == 2
    mine = _folder(tmp_path / "mine", '{"format": ', "notes.txt")
    before = _snapshot(mine)
    one_line_error(lambda: prepare_corpus(src, src, mine, workers=1, overwrite=True),
                   f"{mine} is a folder of other files (2 entries)")
    assert _snapshot(mine) == before
