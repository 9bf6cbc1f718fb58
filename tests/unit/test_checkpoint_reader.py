"""Unit tests for the door that reads checkpoints (bahdanau.checkpoint.reader).

Expectations: every reader (translate, ensembles, averaging, release, --init-from, resume)
upgrades what it reads exactly once per checkpoint read, counted by a wrapper around
`upgrade_payload` wherever the package holds it; a file, its run folder and its model folder
give the same parts; the parts are those of the objects the checkpoint was saved from; every
error starts with the path; a run's own checkpoint knows its run folder and test report.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

import bahdanau
from bahdanau.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    upgrade_payload,
)
from bahdanau.checkpoint import files as checkpoint_files
from bahdanau.checkpoint.sections import EMA, MODEL, TRAIN_STATE
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import DefaultTokenizer
from bahdanau.jobs.init_from import read_init_model
from bahdanau.training import train
from bahdanau.training.state import checkpoint_payload

TOKENIZER = DefaultTokenizer(lowercase=True)
OPTIONS = {"max_steps": 4, "lowercase": True, "preset": "tiny"}


def _train(out: Path, steps: int) -> None:
    cfg = TrainConfig(optimizer="adam", batch_size=8, max_steps=steps, save_every=2,
                      log_every=2, ema_decay=0.5)
    train(tiny_model(), random_examples(32), cfg, src_vocab=TINY_VOCAB, tgt_vocab=TINY_VOCAB,
          checkpoint_dir=out / "checkpoints", tokenizer=TOKENIZER, log=lambda line: None,
          extra={"options": OPTIONS})


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny model trained 4 updates (checkpoints at 2 and 4, with a moving average)."""
    out = tmp_path_factory.mktemp("reader") / "run"
    _train(out, 4)
    return out


@pytest.fixture
def upgrades(monkeypatch) -> Iterator[list[int]]:
    """The number of `upgrade_payload` calls, counted wherever a module of the package holds
    the function (a module that imported it by name holds its own reference)."""
    original = checkpoint_files.upgrade_payload
    calls: list[int] = []

    def counted(payload):
        calls.append(1)
        return original(payload)

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "bahdanau" and getattr(module, "upgrade_payload",
                                                         None) is original:
            monkeypatch.setattr(module, "upgrade_payload", counted)
    yield calls


def _format_1(run: Path, path: Path) -> Path:
    """A format-1 file of the run's last checkpoint (the training position at the top)."""
    payload = load_checkpoint(run / "checkpoints" / "step_00000004.pt")
    state = payload.pop(TRAIN_STATE)
    for key in ("train_config", "optimizer_class", "tokenizer", "versions", "rng_by_rank",
                "best_n"):
        payload.pop(key, None)
    payload.update(format=1, step=state["step"], epoch=state["epoch"], train_config=None,
                   sampler={"epoch": state["epoch"], "position": state["position"]})
    torch.save(payload, path)
    return path


# ----------------------------------------------------------------------------------------------
# Once per read


def test_translating_reads_and_upgrades_each_checkpoint_once(run, tmp_path, upgrades) -> None:
    """bahdanau.load (translate, evaluate, score, export) upgraded each payload three times."""
    bahdanau.load(run)
    assert len(upgrades) == 1
    bahdanau.load([run / "checkpoints" / "step_00000002.pt", run])       # an ensemble of two
    assert len(upgrades) == 3
    old = _format_1(run, tmp_path / "old.pt")
    assert bahdanau.load(old).translate(["w1 w2"]) == bahdanau.load(run).translate(["w1 w2"])
    assert len(upgrades) == 5


def test_every_other_reader_upgrades_once(run, tmp_path, upgrades) -> None:
    members = [run / "checkpoints" / "step_00000002.pt", run / "checkpoints" / "step_00000004.pt"]
    average_checkpoints(members)
    assert len(upgrades) == 2
    read_init_model(str(run))                                          # train --init-from
    assert len(upgrades) == 3
    pytest.importorskip("safetensors", reason="a model folder needs the share extra")
    assert main(["release", "--checkpoint", str(run), "--out", str(tmp_path / "m")]) == 0
    assert len(upgrades) == 4
    bahdanau.load(tmp_path / "m")              # a model folder is of the current format
    assert len(upgrades) == 4


def test_a_resumed_run_upgrades_its_checkpoint_once(run, tmp_path, upgrades) -> None:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    _train(out, 6)                             # resumes at update 4
    assert load_checkpoint(out / "checkpoints" / "step_00000006.pt")[TRAIN_STATE]["step"] == 6
    assert len(upgrades) == 1


# ----------------------------------------------------------------------------------------------
# The parts


def test_a_file_its_run_folder_and_its_model_folder_give_the_same_parts(run, tmp_path) -> None:
    pytest.importorskip("safetensors")
    best = run / "checkpoints" / "best.pt"
    last = run / "checkpoints" / "step_00000004.pt"
    assert not best.exists()                   # no dev set: the run folder stands for its last
    assert main(["release", "--checkpoint", str(run), "--out", str(tmp_path / "m")]) == 0
    stored = load_checkpoint(last)
    file, folder, model = (read_checkpoint(p) for p in (last, run, tmp_path / "m"))
    assert (file.kind, folder.kind, model.kind) == ("checkpoint file", "checkpoint file",
                                                    "model folder")
    assert file.path == folder.path == last and model.path == tmp_path / "m"
    for read in (file, folder, model):
        assert read.config == tiny_model().config
        assert read.src_vocab == read.tgt_vocab == TINY_VOCAB
        assert vars(read.tokenizer) == vars(TOKENIZER)
        section, weights = read.translation_weights()
        assert all(torch.equal(weights[k], v) for k, v in stored[EMA].items())
    assert file.translation_weights()[0] == EMA and model.translation_weights()[0] == MODEL
    assert file.step == 4 and model.step is None and file.train_state == stored[TRAIN_STATE]
    assert file.run.run_id == model.run.run_id == stored[TRAIN_STATE]["run_id"] is not None


def test_a_runs_checkpoint_knows_its_run_and_report(run, tmp_path) -> None:
    report = {"bleu": 12.5, "chrf": 40.0, "sentences": 6, "beam_size": 1, "updates": 4}
    (run / "metrics.json").write_text(json.dumps(report))
    try:
        record = read_checkpoint(run).run
        moved = tmp_path / "step_00000004.pt"
        shutil.copy(run / "checkpoints" / "step_00000004.pt", moved)
        elsewhere = read_checkpoint(moved).run
    finally:
        (run / "metrics.json").unlink()
    assert record.folder == str(run) and record.report == report
    assert record.options == OPTIONS and record.examples_digest is not None
    assert elsewhere.folder is None and elsewhere.report is None      # no run folder around it
    assert elsewhere.run_id == record.run_id and elsewhere.options == OPTIONS


def test_a_payload_in_memory_is_read_through_the_same_parts() -> None:
    payload = checkpoint_payload(tiny_model(), src_vocab=TINY_VOCAB, tgt_vocab=TINY_VOCAB,
                                 tokenizer=TOKENIZER)
    read = bahdanau.checkpoint.checkpoint_of(payload)
    assert read.path is None and read.kind == "payload" and read.step is None
    model, src, tgt = bahdanau.model_from_checkpoint(read)
    assert src == tgt == TINY_VOCAB
    assert all(torch.equal(model.state_dict()[k], v) for k, v in payload[MODEL].items())


# ----------------------------------------------------------------------------------------------
# Errors name the path


def test_every_error_starts_with_the_path(run, tmp_path) -> None:
    newer = tmp_path / "newer.pt"
    save_checkpoint(newer, {**upgrade_payload(load_checkpoint(run / "checkpoints" /
                                                              "step_00000002.pt")), "format": 9})
    one_line_error(lambda: read_checkpoint(newer), f"{newer}: checkpoint format 9 is newer")
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a checkpoint")
    one_line_error(lambda: read_checkpoint(damaged), f"{damaged}: not a readable checkpoint")
    inconsistent = tmp_path / "inconsistent.pt"
    payload = load_checkpoint(run / "checkpoints" / "step_00000002.pt")
    save_checkpoint(inconsistent, {**payload, "src_vocab": {"specials": [], "tokens": []}})
    one_line_error(lambda: read_checkpoint(inconsistent), f"{inconsistent}: checkpoint")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(lambda: read_checkpoint(empty, name="--init-from"),
                   f"--init-from {empty}: no checkpoint in this folder")
    one_line_error(lambda: read_checkpoint(tmp_path / "gone.pt"), "gone.pt: no such file")
