"""Outputs that never destroy, run files that belong to the run, and faults mid-write, through the
command line on two tiny runs.

* Every output (`evaluate --json/--output`, `translate --alignments`, `average --output`) keeps
  what its path is: a device is written into (a full one is one error line), a FIFO's reader
  gets the data, a link to /proc/self/fd/1 (what /dev/stdout is) prints, a symlink keeps its
  link; ``-`` is stdout where a user expects it.
* A file of a run (its checkpoints, best.*, options.json, train.log, the lock), also reached
  through a symlink, is refused as an output of another command, before any work; averaging
  refuses checkpoints of two runs unless --allow-different-runs. So is a file of a model
  folder, a prepared corpus or an exported folder (of either format).
* A folder writer (release, prepare, export, train) replaces only a folder of its own kind:
  a folder of another kind, or of a user's own files, is refused whatever --overwrite says,
  in one line naming what it is, every file left byte for byte.
* Ctrl-C or a full disk while `average` writes, or while training saves a checkpoint, is one
  line and leaves the files as they were; a killed --loader-workers process stops training
  with a checkpoint at its step.

Errors are asserted as `main`'s exit status and exactly one ``bahdanau: error:`` line.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from training_fixtures import (
    TINY_VOCAB,
    failing_writes,
    logged,
    random_examples,
    tiny_model,
    unlogged,
    write_multi30k_slice,
)

import bahdanau.training.loop as loop
import bahdanau.training.plan as plan
import bahdanau.training.run as run_module
from bahdanau._files import writes_in_place
from bahdanau._folders import Kind, folder_kind
from bahdanau.checkpoint import load_checkpoint, save_checkpoint
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.training import LoaderWorkerError, run_step, save_run, setup_run, train, train_run

TRAIN = ["--preset", "tiny", "--max-steps", "4", "--time-budget", "0", "--eval-every", "2",
         "--save-every", "2", "--keep-last", "3", "--max-len", "6", "--beam-size", "1",
         "--train-batch-size", "16", "--threads", "1", "--log-every", "2"]


def _train_argv(root: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-src", str(root / "tr.en"), "--train-tgt", str(root / "tr.fr"),
            "--dev-src", str(root / "te.en"), "--dev-tgt", str(root / "te.fr"), *TRAIN,
            "--out", str(out), *extra]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Two finished tiny runs of one corpus, `run` (seed 1) and `other` (seed 2)."""
    root = write_multi30k_slice(tmp_path_factory.mktemp("outputs"), 40, 6)
    for name, seed in (("run", "1"), ("other", "2")):
        assert main(_train_argv(root, root / name, "--seed", seed)) == 0
    return root


def _one_error(capsys, code: int, *fragments: str) -> str:
    captured = capsys.readouterr()
    assert code == 2, f"exit {code}, expected 2 ({captured.err!r})"
    err = unlogged(captured.err)                     # a run's log lines go to stderr too
    assert err.startswith("bahdanau: error: ") and err.count("\n") == 1, captured.err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    message = err.removeprefix("bahdanau: error: ").rstrip("\n")
    assert not any(message in line for line in logged(captured.err)), captured.err  # once
    return err


def _evaluate(root: Path, *extra: str) -> list[str]:
    return ["evaluate", "--checkpoint", str(root / "run"), "--src", str(root / "te.en"),
            "--ref", str(root / "te.fr"), "--beam-size", "1", "--max-len", "6",
            "--threads", "1", *extra]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- 1. outputs


@pytest.mark.parametrize("flag", ["--json", "--output"])
def test_a_full_device_is_one_error_and_stays_a_device(root, tmp_path, capsys, flag) -> None:
    """`evaluate --json /dev/full` as root replaced the device with a regular file and exited 0.
    The machine's /dev/full is used only once the writer says it writes it in place, so a
    regression fails here instead of replacing it; the variant writes a clone of it."""
    if os.geteuid() != 0:
        pytest.skip("only root can replace /dev/full, which the fixed writer must not do")
    if flag == "--json":
        full = Path("/dev/full")
        assert writes_in_place(full)
    else:
        full = tmp_path / "full"
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    code = main(_evaluate(root, flag, str(full)))
    _one_error(capsys, code, f"writing {full} failed: No space left on device")
    assert stat.S_ISCHR(os.lstat(full).st_mode)


@pytest.mark.parametrize("link_to", ["/proc/self/fd/1", "/dev/stdout"])
def test_json_to_a_link_to_stdout_prints_it(root, tmp_path, capfd, link_to) -> None:
    """`--json` to a symlink to /proc/self/fd/1 printed nothing and replaced the link by a file."""
    link = tmp_path / "stdout.json"
    link.symlink_to(link_to)
    assert main(_evaluate(root, "--json", str(link))) == 0
    out = capfd.readouterr().out
    assert json.loads(out[out.index("{"):])["sentences"] == 6
    assert link.is_symlink() and os.readlink(link) == link_to


@pytest.mark.parametrize("command", ["evaluate --json", "translate --alignments"])
def test_a_fifo_output_reaches_its_reader(root, tmp_path, capsys, command) -> None:
    """A FIFO output was replaced while its reader waited forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as reader:
            got.append(reader.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    if command == "evaluate --json":
        argv = _evaluate(root, "--json", str(fifo))
    else:
        argv = ["translate", "--checkpoint", str(root / "run"), "--input", str(root / "te.en"),
                "--beam-size", "1", "--max-len", "6", "--threads", "1",
                "--alignments", str(fifo)]
    assert main(argv) == 0
    thread.join(timeout=30)
    assert got and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    lines = got[0].decode().splitlines()
    if command == "evaluate --json":
        assert json.loads(got[0])["sentences"] == 6
    else:
        assert len(lines) == 6 and all("weights" in json.loads(line) for line in lines)
    capsys.readouterr()


@pytest.mark.parametrize("flag", ["--json", "--output"])
def test_a_symlinked_output_keeps_its_link(root, tmp_path, capsys, flag) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "result"
    target.write_text("old\n")
    link = tmp_path / "link"
    link.symlink_to(os.path.join("real", "result"))          # a relative link
    assert main(_evaluate(root, flag, str(link))) == 0
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "result")
    text = target.read_text()
    assert (json.loads(text)["sentences"] if flag == "--json" else len(text.splitlines())) == 6
    assert os.listdir(tmp_path / "real") == ["result"]
    capsys.readouterr()


def test_dash_is_stdout_for_evaluate(root, capsys) -> None:
    """`--json -` prints only the JSON on stdout (the report goes to stderr); `--output -`
    prints only the translations."""
    assert main(_evaluate(root, "--json", "-")) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["sentences"] == 6 and "BLEU" in captured.err
    assert main(_evaluate(root, "--output", "-")) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 6 and "BLEU" in captured.err
    assert not Path("-").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["average", "--checkpoint", "{run}", "--last", "2", "--output", "-"],
     "--output -: a checkpoint is a binary file"),
    (["translate", "--checkpoint", "{run}", "--input", "{root}/te.en", "--alignments", "-"],
     "--alignments -: stdout carries the translations"),
    (["evaluate", "--checkpoint", "{run}", "--src", "{root}/te.en", "--ref", "{root}/te.fr",
      "--json", "-", "--output", "-"], "--output - and --json - both ask for stdout"),
    # other names of stdout are `-`: /dev/stdout was accepted and mixed the alignments into
    # the translations; two of them for evaluate got a wrong message
    (["average", "--checkpoint", "{run}", "--last", "2", "--output", "/proc/self/fd/1"],
     "--output -: a checkpoint is a binary file"),
    (["translate", "--checkpoint", "{run}", "--input", "{root}/te.en", "--alignments",
      "/dev/stdout"], "--alignments -: stdout carries the translations"),
    (["evaluate", "--checkpoint", "{run}", "--src", "{root}/te.en", "--ref", "{root}/te.fr",
      "--json", "/dev/fd/1", "--output", "/dev/stdout"],
     "--output - and --json - both ask for stdout"),
    (["plot", "--checkpoint", "{run}", "--sentence", "a dog", "--output", "-"],
     "--output -: a plot is an image file; give a file name"),
    (["plot", "--checkpoint", "{run}", "--sentence", "a dog", "--output", "/dev/stdout"],
     "--output -: a plot is an image file"),
])
def test_dash_where_stdout_makes_no_sense_is_refused(root, capsys, argv, message) -> None:
    argv = [a.replace("{run}", str(root / "run")).replace("{root}", str(root)) for a in argv]
    _one_error(capsys, main(argv), message)
    assert not Path("-").exists()


# ----------------------------------------------------------------------------- 2. run files


@pytest.mark.parametrize("name", ["checkpoints/best.pt", "options.json", "config.yaml",
                                  "checkpoints/step_00000099.pt", "train.log", ".lock"])
def test_average_refuses_to_write_a_file_of_the_run(root, capsys, name) -> None:
    """`average --checkpoint RUN --last 2 --output RUN/checkpoints/best.pt` exited 0 and the
    best model was gone; `--output RUN/config.yaml` made the run unresumable (options.json
    now; an earlier version's name is the run's too)."""
    run = root / "run"
    before = _snapshot(run)
    code = main(["average", "--checkpoint", str(run), "--last", "2",
                 "--output", str(run / name)])
    _one_error(capsys, code, f"--output {run / name} is a file of the run in {run}")
    assert _snapshot(run) == before


def test_other_commands_refuse_run_files_through_symlinks_too(root, tmp_path, capsys) -> None:
    run = root / "run"
    before = _snapshot(run)
    link = tmp_path / "innocent.json"
    link.symlink_to(run / "options.json")
    _one_error(capsys, main(_evaluate(root, "--json", str(link))),
               f"is a file of the run in {run}", str(run / "options.json"))
    _one_error(capsys, main(_evaluate(root, "--output", str(run / "checkpoints" / "best.json"))),
               "is a file of the run")
    # a folder of checkpoints without a run around it is kept as well
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "step_00000004.pt").write_bytes((run / "checkpoints" / "step_00000004.pt")
                                              .read_bytes())
    _one_error(capsys, main(["average", "--checkpoint", str(folder / "step_00000004.pt"),
                             "--output", str(folder / "best.pt")]), "is a file of the run")
    assert _snapshot(run) == before and not (folder / "best.pt").exists()
    # the user's own files in a run folder stay theirs to write
    assert main(_evaluate(root, "--json", str(run / "my-scores.json"))) == 0
    (run / "my-scores.json").unlink()
    capsys.readouterr()


def test_a_project_config_yaml_or_damaged_best_json_is_no_run(root, tmp_path, capsys) -> None:
    """Any folder with a config.yaml counted as a run, so `evaluate --output dev/hyp.txt` in a
    project with one was refused; a damaged best.json in an unrelated ancestor raised."""
    project = tmp_path / "project"
    (project / "dev").mkdir(parents=True)
    (project / "config.yaml").write_text("name: my project\nlr: 0.1\n")
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "best.json").write_text("{damaged")
    assert main(_evaluate(root, "--output", str(project / "dev" / "hyp.txt"))) == 0
    assert len((project / "dev" / "hyp.txt").read_text().splitlines()) == 6
    (project / "config.yaml").write_text(json.dumps({"other": "tool", "keys": 1}))
    assert main(_evaluate(root, "--output", str(project / "dev" / "hyp2.txt"))) == 0
    capsys.readouterr()
    # a run record is a run, checkpoints or not, under an earlier version's name too
    # (planted: the check does fail)
    (project / "config.yaml").write_text((root / "run" / "options.json").read_text())
    _one_error(capsys, main(_evaluate(root, "--output", str(project / "dev" / "hyp3.txt"))),
               f"is a file of the run in {project}")


def test_a_model_or_prepared_folder_is_no_other_command_s_output(root, tmp_path,
                                                                  capsys) -> None:
    """`evaluate --output MODEL/model.safetensors` and `average --output PREP/src_vocab.json`
    were written, and the folder's digests no longer matched."""
    pytest.importorskip("safetensors")
    from bahdanau.data import prepare_corpus

    model, prep = tmp_path / "model", tmp_path / "prep"
    assert main(["release", "--checkpoint", str(root / "run"), "--out", str(model)]) == 0
    prepare_corpus(root / "tr.en", root / "tr.fr", prep, workers=1)
    before = {**_snapshot(model), **_snapshot(prep)}
    capsys.readouterr()
    _one_error(capsys, main(_evaluate(root, "--output", str(model / "model.safetensors"))),
               f"is a file of the model folder {model}")
    _one_error(capsys, main(["average", "--checkpoint", str(root / "run"), "--last", "2",
                             "--output", str(prep / "src_vocab.json")]),
               f"is a file of the prepared corpus {prep}")
    _one_error(capsys, main(["export", "--checkpoint", str(root / "run"), "--out",
                             str(model / "export")]), f"is inside the model folder {model}")
    assert {**_snapshot(model), **_snapshot(prep)} == before


@pytest.mark.parametrize(("argv", "message"), [
    (["export", "--checkpoint", "{run}", "--out", "{run}/dev"], "is inside the run in {run}"),
    (["prepare", "--train-src", "{root}/tr.en", "--train-tgt", "{root}/tr.fr", "--out",
      "{run}"], "holds a run"),
    (["prepare", "--train-src", "{root}/tr.en", "--train-tgt", "{root}/tr.fr", "--out",
      "{run}/checkpoints", "--overwrite"], "is inside the run in {run}"),
    (["prepare", "--train-src", "{root}/tr.en", "--train-tgt", "{root}/tr.fr", "--out",
      "{root}", "--overwrite"], "holds --train-src"),
])
def test_folder_outputs_keep_off_runs_and_inputs(root, capsys, argv, message) -> None:
    """`export --out RUN/dev` (before the run's first evaluation made it) was accepted, and a
    prepare --out refused a run's folder only by accident."""
    run = root / "run"
    argv = [a.replace("{run}", str(run)).replace("{root}", str(root)) for a in argv]
    before = _snapshot(root)
    _one_error(capsys, main(argv), message.replace("{run}", str(run)))
    assert _snapshot(root) == before


def test_export_follows_the_folder_rules_of_prepare(root, tmp_path, monkeypatch,
                                                    capsys) -> None:
    """export checked only that --out did not exist and its parent did: a dangling link was
    replaced by the folder. It has prepare's refusals now (one helper writes both)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    _one_error(capsys, main(["export", "--checkpoint", str(root / "run"), "--out",
                             str(tmp_path / "link")]), "is a symbolic link to",
               "which does not exist")
    (tmp_path / "file").write_text("x")
    _one_error(capsys, main(["export", "--checkpoint", str(root / "run"), "--out",
                             str(tmp_path / "file" / "out")]), "cannot be created:",
               "file is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link"]


@pytest.fixture(scope="module")
def kinds(root, tmp_path_factory) -> dict[str, Path]:
    """A folder of each kind the commands write, from the run in `root`: "model" (release),
    "prep" (prepare), "exported" (export), "old" (an exported folder of the first format: its
    manifest's "format" the integer 1), and "data", a folder of a user's own 12 files."""
    pytest.importorskip("safetensors")
    from bahdanau.data import prepare_corpus

    base = tmp_path_factory.mktemp("kinds")
    assert main(["release", "--checkpoint", str(root / "run"), "--out", str(base / "model")]) == 0
    prepare_corpus(root / "tr.en", root / "tr.fr", base / "prep", workers=1)
    assert main(["export", "--checkpoint", str(root / "run"), "--out", str(base / "exported")]) == 0
    shutil.copytree(base / "exported", base / "old")
    manifest = json.loads((base / "old" / "manifest.json").read_text())
    del manifest["version"]
    (base / "old" / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    (base / "data").mkdir()
    for i in range(12):
        (base / "data" / f"part{i:02d}.txt").write_text(f"the user's line {i}\n")
    return {name: base / name for name in ("model", "prep", "exported", "old", "data")}


_WRITERS = {"release": ["release", "--checkpoint", "{run}", "--overwrite"],
            "prepare": ["prepare", "--train-src", "{root}/tr.en", "--train-tgt", "{root}/tr.fr",
                        "--overwrite"],
            "export": ["export", "--checkpoint", "{run}"]}
_OTHER_FILES = ("is a folder of other files (12 entries): {writer} writes {writes} whole and never "
                "replaces other files; choose a new folder")


# (the writer, the kind of folder its --out names, what the error says it is)
_FOREIGN = [
    ("release", "data", _OTHER_FILES),
    ("release", "prep", "is a prepared corpus: release writes a model folder; choose another "
                        "folder"),
    ("release", "old", "is an exported folder: release writes a model folder; choose another "
                       "folder"),
    ("prepare", "data", _OTHER_FILES),
    ("prepare", "model", "is a model folder: prepare writes a prepared corpus; choose another "
                         "folder"),
    ("prepare", "exported", "is an exported folder: prepare writes a prepared corpus; choose "
                            "another folder"),
    ("prepare", "old", "is an exported folder: prepare writes a prepared corpus; choose another "
                       "folder"),
    ("export", "data", _OTHER_FILES),
    ("export", "model", "is a model folder: export writes an exported folder; choose another "
                        "folder"),
    ("export", "prep", "is a prepared corpus: export writes an exported folder; choose another "
                       "folder"),
]


@pytest.mark.parametrize(("writer", "kind", "message"), _FOREIGN,
                         ids=[f"{writer}-{kind}" for writer, kind, _ in _FOREIGN])
def test_no_folder_writer_replaces_a_folder_of_another_kind(root, kinds, capsys, writer, kind,
                                                            message) -> None:
    """`release --out data --overwrite` deleted every file of a folder of the user's own, exit 0;
    `prepare --overwrite` replaced a model folder or an exported folder, calling it "a damaged
    prepared corpus". A writer replaces only a folder of its own kind, whatever the flag."""
    writes = {"release": "a model folder", "prepare": "a prepared corpus",
              "export": "an exported folder"}[writer]
    argv = [a.replace("{run}", str(root / "run")).replace("{root}", str(root))
            for a in _WRITERS[writer]]
    out = kinds[kind]
    before, around = _snapshot(out), sorted(p.name for p in out.parent.iterdir())
    capsys.readouterr()
    err = _one_error(capsys, main([*argv, "--out", str(out)]))
    assert err == f"bahdanau: error: --out {out} {message.format(writer=writer, writes=writes)}\n"
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == around       # nothing left beside


def test_an_input_inside_the_folder_a_writer_replaces(root, kinds, tmp_path, capsys) -> None:
    """`prepare --train-src P/x --out P --overwrite` over a prepared corpus P of its own kind
    read P/x and then deleted it with the old corpus; `release` of a model folder over itself
    reads it whole first and stays allowed."""
    prep = tmp_path / "prep"
    shutil.copytree(kinds["prep"], prep)
    for side in ("en", "fr"):
        shutil.copy(root / f"tr.{side}", prep / f"tr.{side}")
    before = _snapshot(prep)
    capsys.readouterr()
    _one_error(capsys, main(["prepare", "--train-src", str(prep / "tr.en"), "--train-tgt",
                             str(root / "tr.fr"), "--out", str(prep), "--overwrite"]),
               f"--out {prep} holds --train-src {prep / 'tr.en'}: writing it would replace it")
    assert _snapshot(prep) == before
    model = tmp_path / "model"
    shutil.copytree(kinds["model"], model)
    assert main(["release", "--checkpoint", str(model), "--out", str(model), "--overwrite"]) == 0
    assert (model / "model.safetensors").read_bytes() == (
        kinds["model"] / "model.safetensors").read_bytes()


@pytest.mark.parametrize(("kind", "inside", "flags"), [
    ("model", False, ["--overwrite"]), ("prep", False, ["--overwrite"]),
    ("exported", False, []), ("old", False, ["--overwrite"]),
    ("model", True, []), ("exported", True, ["--overwrite"]),
])
def test_train_writes_no_run_into_a_folder_of_another_kind(root, kinds, capsys, kind, inside,
                                                           flags) -> None:
    """`train --out` wrote a run (checkpoints, config.yaml, train.log) inside a prepared corpus,
    a model folder or an exported folder; a folder of other files stays a place for a run."""
    folder = kinds[kind]
    out = folder / "run" if inside else folder
    what = {"model": "a model folder", "prep": "a prepared corpus"}.get(kind, "an exported folder")
    expected = (f"--out {out} is inside the {what.split(' ', 1)[1]} {folder}: writing it would "
                "damage it; choose a folder outside it" if inside else
                f"--out {out} is {what}: train writes a run folder; choose another folder")
    before = _snapshot(folder)
    capsys.readouterr()
    err = _one_error(capsys, main(_train_argv(root, out, *flags)))
    assert err == f"bahdanau: error: {expected}\n"
    assert _snapshot(folder) == before and not (folder / "run").exists()


@pytest.mark.parametrize(("inside", "flags"), [("checkpoints", []), ("dev", ["--overwrite"])])
def test_train_writes_no_run_into_another_run_s_files(root, capsys, inside, flags) -> None:
    """`train --out RUN/checkpoints` put a second run among the first one's checkpoints, where
    its --overwrite would remove what it took for its own."""
    run = root / "run"
    before = _snapshot(run)
    capsys.readouterr()
    err = _one_error(capsys, main(_train_argv(root, run / inside, *flags)))
    assert err == (f"bahdanau: error: --out {run / inside} is inside the run in {run}: writing "
                   "a run there would damage it; choose a folder outside it\n")
    assert _snapshot(run) == before


@pytest.mark.parametrize(("case", "foreign"), [
    ("user config", "config.yaml"), ("user file in checkpoints", "checkpoints/notes.txt"),
    ("user file in a run's checkpoints", "checkpoints/mine.txt")])
def test_train_overwrite_deletes_nothing_that_is_not_the_run_s(root, tmp_path, capsys, case,
                                                              foreign) -> None:
    """`train --overwrite` deleted a user's file in checkpoints/ with the run, and replaced a
    user's own config.yaml that was no run's record."""
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    if case == "user config":
        (out / "config.yaml").write_text("my: app\n")
        (out / "notes.txt").write_text("mine\n")
        (out / "checkpoints").rmdir()
    elif case == "user file in checkpoints":
        (out / "checkpoints" / "notes.txt").write_text("mine\n")
        (out / "checkpoints" / "step_00000001.pt").write_text("mine\n")
    else:
        shutil.copytree(root / "run", out, dirs_exist_ok=True)
        (out / "checkpoints" / "mine.txt").write_text("mine\n")
    before = _snapshot(out)
    capsys.readouterr()
    err = _one_error(capsys, main(_train_argv(root, out, "--overwrite")))
    assert err == (f"bahdanau: error: --out {out} holds {foreign}, which is not a run's: move "
                   "it out or choose another --out\n")
    assert _snapshot(out) == before


# (the kind of folder, a command line without its output, the file of the folder it names)
_EXPORTED_OUTPUTS = [
    ("exported", ["translate", "--checkpoint", "{run}", "--input", "{root}/te.en",
                  "--alignments"], "manifest.json"),
    ("old", ["translate", "--checkpoint", "{run}", "--input", "{root}/te.en", "--alignments"],
     "manifest.json"),
    ("exported", ["score", "--checkpoint", "{run}", "--src", "{root}/te.en", "--tgt",
                  "{root}/te.fr", "--output"], "encoder.pt2"),
    ("exported", ["average", "--checkpoint", "{run}", "--last", "2", "--output"], "step.pt2"),
    ("old", ["evaluate", "--checkpoint", "{run}", "--src", "{root}/te.en", "--ref",
             "{root}/te.fr", "--output"], "README.md"),
    ("exported", ["export", "--checkpoint", "{run}", "--out"], "again"),
]


@pytest.mark.parametrize(("kind", "argv", "name"), _EXPORTED_OUTPUTS,
                         ids=[f"{argv[0]}-{kind}" for kind, argv, _ in _EXPORTED_OUTPUTS])
def test_an_exported_folder_is_no_other_command_s_output(root, kinds, capsys, kind, argv,
                                                         name) -> None:
    """`translate --alignments EXP/manifest.json`, `score --output`, `average --output` wrote
    over an exported folder's files, exit 0, and the folder no longer loaded."""
    folder = kinds[kind]
    argv = [a.replace("{run}", str(root / "run")).replace("{root}", str(root)) for a in argv]
    before = _snapshot(folder)
    capsys.readouterr()
    err = _one_error(capsys, main([*argv, str(folder / name)]))
    flag = argv[-1]
    expected = (f"{flag} {folder / name} is inside the exported folder {folder}: writing it "
                "would damage it; choose a folder outside it" if name == "again" else
                f"{flag} {folder / name} is a file of the exported folder {folder}: writing it "
                "would damage it; choose a path outside it")
    assert err == f"bahdanau: error: {expected}\n"
    assert _snapshot(folder) == before


def test_a_damaged_folder_of_a_writer_s_kind_is_still_its_kind(root, kinds, tmp_path,
                                                              capsys) -> None:
    """A folder whose manifest.json is damaged (not JSON) is known by the files its writer
    wrote, when it holds nothing else, so `release --overwrite` still replaces a damaged model
    folder (and prepare a damaged corpus, tests/unit/test_folders.py)."""
    for name, kind in (("model", Kind.MODEL), ("prep", Kind.PREPARED),
                       ("exported", Kind.EXPORTED)):
        shutil.copytree(kinds[name], tmp_path / name)
        (tmp_path / name / "manifest.json").write_text('{"format": ')
        assert folder_kind(tmp_path / name) is kind, name
    assert main(["release", "--checkpoint", str(root / "run"), "--out", str(tmp_path / "model"),
                 "--overwrite"]) == 0
    assert json.loads((tmp_path / "model" / "manifest.json").read_text())["format"] == (
        "bahdanau-model")
    capsys.readouterr()


def test_a_folder_a_writer_replaces_holds_nothing_but_its_files(root, kinds, tmp_path,
                                                                capsys) -> None:
    """`release --out hf --overwrite` deleted another tool's folder whose manifest.json is
    JSON without our "format" (it was taken for a damaged model folder by its config.json and
    model.safetensors); `prepare --out npdata --overwrite` deleted labels.csv beside arrays and
    a text manifest.json; `release --overwrite` onto a real model folder deleted the user's
    NOTES.txt in it. Each is refused in one line and left byte for byte."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "manifest.json").write_text('{"name":"my-hf-export","files":["config.json"]}')
    for name in ("config.json", "model.safetensors", "NOTES.md"):
        (hf / name).write_text(name)
    npdata = tmp_path / "npdata"
    npdata.mkdir()
    (npdata / "manifest.json").write_text("dataset manifest")
    for name in ("src.ids.npy", "tgt.ids.npy", "labels.csv"):
        (npdata / name).write_text(name)
    model = tmp_path / "model"
    shutil.copytree(kinds["model"], model)
    (model / "NOTES.txt").write_text("mine")
    prep = tmp_path / "prep"
    shutil.copytree(kinds["prep"], prep)
    (prep / "NOTES.txt").write_text("mine")
    before = _snapshot(tmp_path)
    release = ["release", "--checkpoint", str(root / "run"), "--overwrite", "--out"]
    prepare = ["prepare", "--train-src", str(root / "tr.en"), "--train-tgt", str(root / "tr.fr"),
               "--out"]
    _one_error(capsys, main([*release, str(hf)]), f"--out {hf} is a folder of other files "
               "(4 entries): release writes a model folder whole")
    for extra in ((), ("--overwrite",)):
        _one_error(capsys, main([*prepare, str(npdata), *extra]), f"{npdata} is a folder of "
                   "other files (4 entries): prepare writes a prepared corpus whole")
        _one_error(capsys, main([*prepare, str(prep), *extra]), f"{prep} holds NOTES.txt, "
                   "which is not the prepared corpus's: move it out or choose another folder")
    _one_error(capsys, main([*release, str(model)]), f"--out {model} holds NOTES.txt, which is "
               "not the model folder's: move it out or choose another folder")
    assert _snapshot(tmp_path) == before


def test_an_ensemble_refuses_one_checkpoint_twice(root, tmp_path, capsys) -> None:
    """A hard link (a run's best.pt is one to its step file) made an ensemble of one model
    with itself."""
    step = root / "run" / "checkpoints" / "step_00000004.pt"
    os.link(step, tmp_path / "same.pt")
    _one_error(capsys, main(["translate", "--checkpoint", str(step), str(tmp_path / "same.pt"),
                             "--input", str(root / "te.en")]),
               f"--checkpoint {tmp_path / 'same.pt'} is listed twice (also as {step})")


def test_average_refuses_checkpoints_of_two_runs_unless_allowed(root, tmp_path, capsys) -> None:
    """Averaging two independently trained runs (different seeds) was accepted."""
    ours = root / "run" / "checkpoints" / "step_00000004.pt"
    theirs = root / "other" / "checkpoints" / "step_00000004.pt"
    out = tmp_path / "mixed.pt"
    code = main(["average", "--checkpoint", str(ours), str(theirs), "--output", str(out)])
    _one_error(capsys, code, f"{theirs} and {ours} come from different runs",
               "--allow-different-runs")
    assert not out.exists()
    assert main(["average", "--checkpoint", str(ours), str(theirs), "--output", str(out),
                 "--allow-different-runs"]) == 0
    members = load_checkpoint(out)["extra"]["averaged_from"]
    assert len({m["run_id"] for m in members}) == 2 and None not in {m["run_id"] for m in members}
    # one run's files given by name: accepted without a note
    capsys.readouterr()
    same = root / "run" / "checkpoints" / "step_00000002.pt"
    assert main(["average", "--checkpoint", str(same), str(ours), "--output", str(out)]) == 0
    assert capsys.readouterr().err == ""


def test_average_takes_checkpoints_without_a_run_id_with_a_note(root, tmp_path, capsys) -> None:
    """A checkpoint saved before runs had an id cannot be checked: it is averaged, and the
    command says (a logged warning) that the check was not made."""
    ours = root / "run" / "checkpoints" / "step_00000004.pt"
    old = tmp_path / "old.pt"
    payload = load_checkpoint(root / "other" / "checkpoints" / "step_00000004.pt")
    del payload["train_state"]["run_id"]
    save_checkpoint(old, payload)
    assert main(["average", "--checkpoint", str(ours), str(old),
                 "--output", str(tmp_path / "avg.pt")]) == 0
    err = capsys.readouterr().err
    # a warning of the logger: its time, and no bar drawn across it
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d WARNING: {re.escape(str(old))} "
                        r"record no run id .* is not checked\n", err), err


def test_a_resumed_run_keeps_its_run_id(root, tmp_path, capsys) -> None:
    out = tmp_path / "resumed"
    assert main(_train_argv(root, out, "--max-steps", "2")) == 0
    first = load_checkpoint(out / "checkpoints" / "step_00000002.pt")["train_state"]["run_id"]
    assert main(_train_argv(root, out, "--max-steps", "4")) == 0
    again = load_checkpoint(out / "checkpoints" / "step_00000004.pt")["train_state"]["run_id"]
    other = load_checkpoint(root / "other" / "checkpoints" / "step_00000004.pt")
    assert first == again != other["train_state"]["run_id"]
    capsys.readouterr()


# ----------------------------------------------------------------------------- 7. faults


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left "
                                                                              "on device")])
def test_a_fault_while_average_writes_keeps_the_target(root, tmp_path, capsys, monkeypatch,
                                                       error) -> None:
    """Ctrl-C while `average` wrote gave `RuntimeError: [enforce fail at inline_container.cc]`."""
    out = tmp_path / "average.pt"
    out.write_bytes(b"the user's earlier average")
    failing_writes(monkeypatch, error, after=4096)
    code = main(["average", "--checkpoint", str(root / "run"), "--last", "2",
                 "--output", str(out)])
    if isinstance(error, KeyboardInterrupt):
        assert code == 130 and capsys.readouterr().err == "bahdanau: interrupted\n"
    else:
        _one_error(capsys, code, f"writing {out} failed: No space left on device; {out} is "
                                 "left as it was")
    assert out.read_bytes() == b"the user's earlier average"
    assert os.listdir(tmp_path) == ["average.pt"]                 # no temporary file


@pytest.mark.parametrize(("name", "error"), [
    ("encoder.pt2", OSError(errno.ENOSPC, "No space left on device")),
    ("step.pt2", OSError(errno.EIO, "Input/output error")),
])
def test_a_fault_while_export_writes_leaves_nothing(root, tmp_path, capsys, monkeypatch, name,
                                                    error) -> None:
    """export onto a full disk aborted Python (rc 134, torch's archive writer failing in a
    C++ destructor): a program is archived in memory and written as every file is, so a full
    disk (an I/O error) is one line naming the file, and the partial folder is removed."""
    out = tmp_path / "served"
    failing_writes(monkeypatch, error, after=4096, name=name)
    code = main(["export", "--checkpoint", str(root / "run"), "--out", str(out)])
    _one_error(capsys, code, f"/.served.partial-{os.getpid()}/{name} failed: {error.strerror}")
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_export_past_the_file_size_limit_is_one_line_in_a_process(root, tmp_path) -> None:
    """The kernel's own refusal (EFBIG past RLIMIT_FSIZE, SIGXFSZ ignored, as a full disk's
    ENOSPC) met by torch's writer in a real process: exit 2 with one line, not an abort."""
    import resource

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = tmp_path / "served"
    child = subprocess.run([sys.executable, "-m", "bahdanau", "export", "--checkpoint",
                            str(root / "run"), "--out", str(out)], capture_output=True,
                           text=True, preexec_fn=limited, timeout=300)
    assert child.returncode == 2, child.stderr[-2000:]
    assert child.stderr.startswith("bahdanau: error: ") and child.stderr.count("\n") == 1
    assert "encoder.pt2 failed: File too large" in child.stderr
    assert os.listdir(tmp_path) == []


def test_a_full_disk_while_training_saves_keeps_the_last_checkpoint(root, tmp_path, capsys,
                                                                    monkeypatch) -> None:
    """The checkpoints of step 2 (and best.pt) are written; the save of step 4 meets ENOSPC
    (EIO in the API variant below): one line naming the file, step 2 untouched, no temporary
    file left."""
    out = tmp_path / "run"
    failing_writes(monkeypatch, OSError(errno.ENOSPC, "No space left on device"), after=4096,
                   name="step_00000004.pt")
    code = main(_train_argv(root, out))
    step4 = out / "checkpoints" / "step_00000004.pt"
    _one_error(capsys, code, f"writing {step4} failed: No space left on device")
    assert sorted(os.listdir(out / "checkpoints")) == ["best.json", "best.pt",
                                                       "step_00000002.pt"]
    assert load_checkpoint(out / "checkpoints" / "step_00000002.pt")["train_state"]["step"] == 2


VOCAB = TINY_VOCAB


def test_an_io_error_while_saving_is_one_oserror_from_train(tmp_path, monkeypatch) -> None:
    cfg = TrainConfig(max_steps=4, batch_size=4, save_every=2, log_every=100)
    failing_writes(monkeypatch, OSError(errno.EIO, "Input/output error"), after=4096,
                   name="step_00000004.pt")
    with pytest.raises(OSError) as info:
        train(tiny_model(), random_examples(16), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
              checkpoint_dir=tmp_path, log=lambda line: None)
    assert info.value.errno == errno.EIO and "\n" not in str(info.value)
    assert str(tmp_path / "step_00000004.pt") in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["step_00000002.pt"]


def test_a_killed_loader_worker_stops_training_with_a_checkpoint(tmp_path) -> None:
    """A real run with one loader worker, SIGKILLed after step 3 (as the OOM killer does): one
    line naming the worker, a checkpoint of step 3 (saving every 100 steps), and resuming it
    trains on to the end."""
    cfg = TrainConfig(max_steps=6, batch_size=2, loader_workers=1, log_every=1, save_every=100)
    examples = random_examples(64)

    def kill_after_step_3(line: str) -> None:
        if line.startswith("step 3 "):
            for child in multiprocessing.active_children():
                os.kill(child.pid, 9)

    with pytest.raises(LoaderWorkerError) as info:
        train(tiny_model(), examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
              checkpoint_dir=tmp_path, log=kill_after_step_3)
    message = str(info.value)
    assert message.startswith("DataLoader worker (pid ") and "\n" not in message
    assert f"stopped at step 3 with its checkpoint {tmp_path / 'step_00000003.pt'}" in message
    assert os.listdir(tmp_path) == ["step_00000003.pt"]
    result = train(tiny_model(), examples, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                   checkpoint_dir=tmp_path, log=lambda line: None)
    assert (result.start_step, result.step) == (3, 6)


def test_a_dead_loader_worker_under_ddp_does_not_save_alone(tmp_path, monkeypatch) -> None:
    """Under torch.distributed a save gathers every process's RNG states: the one process whose
    worker died must not start it alone (it would wait forever). Step 1 is saved, step 2 is
    trained, the worker dies before step 3: one line naming step 1's checkpoint, nothing
    written."""
    cfg = TrainConfig(max_steps=6, batch_size=2, log_every=100, save_every=100)
    run = setup_run(tiny_model(), random_examples(16), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=tmp_path)
    run_step(run)
    save_run(run)
    run.distributed = True                 # as under torchrun, without the other processes

    def collective(*args, **kwargs):
        raise AssertionError("a collective of one process: the others never join it")

    def one_step_then_dead_worker(run):
        if run.state.step == 2:
            raise LoaderWorkerError("DataLoader worker (pid 4242) is killed by signal: Killed.")
        run.distributed = False            # the step itself, as one process trains it
        try:
            return run_step(run)
        finally:
            run.distributed = True

    monkeypatch.setattr(loop, "stop_reason", lambda run: "")       # its all-reduce
    monkeypatch.setattr(run_module, "gather", collective)
    monkeypatch.setattr(loop, "run_step", one_step_then_dead_worker)
    with pytest.raises(LoaderWorkerError) as info:
        train_run(run, log=lambda line: None)
    assert str(info.value) == (
        "DataLoader worker (pid 4242) is killed by signal: Killed. (a --loader-workers process, "
        "killed or out of memory); the run stopped at step 2 without saving it (one of several "
        "processes cannot save alone): run the same command to continue from "
        f"{tmp_path / 'step_00000001.pt'}")
    assert os.listdir(tmp_path) == ["step_00000001.pt"]


def test_a_dead_loader_worker_is_one_line_from_the_command(root, tmp_path, capsys,
                                                          monkeypatch) -> None:
    """The command-line variant, with the worker's death as torch reports it (from its SIGCHLD
    handler, here before the batches of step 3): exit 2, one line, a checkpoint of step 2."""
    calls = []
    real = plan.BatchLoader._dead_worker

    def dead_at_step_3(self, wait: float = 0.0):
        calls.append(wait)
        if len(calls) == 3:
            plan._worker_failure.append("DataLoader worker (pid 4242) is killed by signal: "
                                        "Killed. ")
        return real(self, wait)

    monkeypatch.setattr(plan.BatchLoader, "_dead_worker", dead_at_step_3)
    out = tmp_path / "run"
    code = main(_train_argv(root, out, "--loader-workers", "1", "--save-every", "100"))
    err = _one_error(capsys, code, "DataLoader worker (pid 4242) is killed by signal: Killed.",
                     "stopped at step 2 with its checkpoint "
                     f"{out / 'checkpoints' / 'step_00000002.pt'}")
    error = err.removeprefix("bahdanau: error: ").rstrip("\n")
    assert logged((out / "train.log").read_text())[-1] == f"ERROR: {error}"
    assert load_checkpoint(out / "checkpoints" / "step_00000002.pt")["train_state"]["step"] == 2
    torch.set_num_threads(1)
