"""Unit tests for the model folder (bahdanau.checkpoint.release, bahdanau.jobs.release and
``bahdanau release``).

Expectations: the folder's weights are, bit for bit, the weights the checkpoint translates with
(its EMA section here); what loads from the folder translates exactly as the checkpoint does;
the manifest's digests are the files' SHA-256 computed here with hashlib; a changed, missing or
unknown-version file is one line naming that file; writes are all or nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from training_fixtures import one_line_error

import bahdanau
from bahdanau import presets
from bahdanau.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    read_checkpoint,
    translation_weights,
)
from bahdanau.checkpoint.release import read_release, write_release
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import (
    DefaultTokenizer,
    SentencePieceTokenizer,
    Vocab,
    encode_pairs,
    multi30k_files,
    read_lines,
)
from bahdanau.errors import InputError
from bahdanau.models import build_model
from bahdanau.training import train
from bahdanau.training.state import checkpoint_payload

safetensors_torch = pytest.importorskip("safetensors.torch")

SOURCES = read_lines(multi30k_files("val", "en"))[:5]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny model trained 4 steps (with a moving average) on 200 Multi30k pairs."""
    en = read_lines(multi30k_files("train", "en"))[:200]
    fr = read_lines(multi30k_files("train", "fr"))[:200]
    tok = DefaultTokenizer(lowercase=True)
    src_vocab = Vocab.build(tok.tokenize(s) for s in en)
    tgt_vocab = Vocab.build(tok.tokenize(t) for t in fr)
    examples = encode_pairs(list(zip(en, fr, strict=True)), src_vocab, tgt_vocab, tok,
                            max_len=50)
    torch.manual_seed(0)
    model = build_model(presets.tiny(len(src_vocab), len(tgt_vocab)))
    out = tmp_path_factory.mktemp("release") / "run"
    cfg = TrainConfig(optimizer="adam", batch_size=16, max_steps=4, save_every=2, log_every=2,
                      ema_decay=0.5)
    train(model, examples, cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
          checkpoint_dir=out / "checkpoints", tokenizer=tok, log=lambda line: None,
          extra={"options": {"max_steps": 4, "lowercase": True, "preset": "tiny"}})
    return out


@pytest.fixture
def folder(run, tmp_path) -> Path:
    assert main(["release", "--checkpoint", str(run), "--out", str(tmp_path / "model")]) == 0
    return tmp_path / "model"


def test_weights_round_trip_bit_exactly(run, folder) -> None:
    payload = load_checkpoint(find_checkpoint(run))
    section, expected = translation_weights(payload)
    assert section == "ema"                       # what the checkpoint translates with
    stored = safetensors_torch.load_file(str(folder / "model.safetensors"))
    assert stored.keys() == expected.keys()
    for key, tensor in expected.items():
        assert stored[key].dtype == tensor.dtype
        assert torch.equal(stored[key], tensor), key
    back = read_release(folder)
    assert back["model_config"] == payload["model_config"]
    assert back["src_vocab"] == payload["src_vocab"] and back["tgt_vocab"] == payload["tgt_vocab"]
    assert back["tokenizer"] == {"name": "default", "lowercase": True, "joiners": "prefix"}


@pytest.mark.parametrize("command", ["score", "export", "release", "translate"])
def test_commands_that_read_a_model_say_they_take_a_model_folder(command, capsys) -> None:
    """score and export, like translate, read a model folder as --checkpoint; their --help
    said only "a checkpoint file, or a training output folder"."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a model folder (bahdanau release)" in text, text


def test_score_and_export_read_a_model_folder(run, folder, tmp_path, capsys) -> None:
    """What their --help says: a model folder scores as its run's checkpoint, and exports."""
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    scores = []
    for checkpoint in (run, folder):
        capsys.readouterr()
        assert main(["score", "--checkpoint", str(checkpoint), "--src", str(src), "--tgt",
                     str(src)]) == 0
        scores.append(capsys.readouterr().out)
    assert scores[0] == scores[1] and len(scores[0].splitlines()) == len(SOURCES)
    assert main(["export", "--checkpoint", str(folder), "--out", str(tmp_path / "served")]) == 0
    assert (tmp_path / "served" / "manifest.json").is_file()


def test_the_folder_translates_exactly_as_the_checkpoint(run, folder, tmp_path, capsys) -> None:
    assert bahdanau.load(folder).translate(SOURCES) == bahdanau.load(run).translate(SOURCES)
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    outputs = []
    for checkpoint in (run, folder):
        capsys.readouterr()
        assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(src),
                     "--max-len", "12"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == len(SOURCES)
    scores = []
    for checkpoint in (run, folder):
        json_path = tmp_path / f"{checkpoint.name}.json"
        assert main(["evaluate", "--checkpoint", str(checkpoint), "--src", str(src), "--ref",
                     str(src), "--max-len", "12", "--json", str(json_path)]) == 0
        scores.append(json.loads(json_path.read_text())["bleu"])
    assert scores[0] == scores[1]


def _left_aside(folder: Path) -> tuple[dict[str, bytes], Path]:
    """`folder` as a writer killed between `replace_folder`'s renames leaves it: moved aside as
    ``.NAME.old-PID`` of a process that is gone, nothing at its place. Returns its files'
    bytes and where it went."""
    before = _snapshot(folder)
    aside = folder.parent / f".{folder.name}.old-{2**22 + 7}"   # above pid_max: no such process
    os.replace(folder, aside)
    return before, aside


def test_a_model_folder_left_aside_by_a_dead_writer_is_read(run, folder, tmp_path,
                                                            capsys) -> None:
    """A release killed between its two renames left the old model folder aside: translate
    --checkpoint said "no such file" until another release ran; now every reader puts it back
    (translate, bahdanau.load), byte for byte, and nothing is left beside it."""
    before, aside = _left_aside(folder)
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(folder), "--input", str(src),
                 "--max-len", "12"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(SOURCES)
    assert _snapshot(folder) == before and not aside.exists()
    _left_aside(folder)
    assert bahdanau.load(folder).translate(SOURCES[:1])                    # the library too
    assert _snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "src.txt"]


def test_an_old_folder_is_put_back_into_an_empty_folder_made_since(run, folder, tmp_path,
                                                                   capsys) -> None:
    """After a crash left the old model folder aside, an empty folder made at its place (by
    hand, `mkdir`) let `release` write there and delete the old folder, the only copy of the
    previous model, silently: it is put back into the empty folder, for a writer (which then
    finds a model folder, replaced only with --overwrite) and for a reader; with two old
    folders neither is put back, and neither is deleted while the place is still empty."""
    before, aside = _left_aside(folder)
    folder.mkdir()
    code = main(["release", "--checkpoint", str(run), "--out", str(folder)])
    assert code == 2 and "is a model folder already" in capsys.readouterr().err
    assert _snapshot(folder) == before and not aside.exists()
    _left_aside(folder)
    folder.mkdir()
    assert bahdanau.load(folder).translate(SOURCES[:1])                    # a reader too
    assert _snapshot(folder) == before and not aside.exists()
    # two old folders: which one to put back is the user's choice; neither is lost
    _, aside = _left_aside(folder)
    second = shutil.copytree(aside, folder.parent / f".{folder.name}.old-{2**22 + 8}")
    folder.mkdir()
    assert main(["release", "--checkpoint", str(run), "--out", str(folder)]) == 0
    capsys.readouterr()
    assert {k.replace(str(aside), str(folder)): v for k, v in _snapshot(aside).items()} == before
    assert {k.replace(str(second), str(folder)): v for k, v in _snapshot(second).items()} == before


def test_a_model_folder_that_cannot_be_put_back_says_where_it_is(run, folder, monkeypatch,
                                                                 capsys) -> None:
    """Where the reader may not write beside the folder, one line names the old folder and
    the command that puts it back; the old folder is left as it is."""
    before, aside = _left_aside(folder)
    rename = os.replace

    def refused(src, dst, **kwargs):
        if Path(src) == aside:
            raise PermissionError(13, "Permission denied")
        return rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", refused)
    assert main(["translate", "--checkpoint", str(folder), "--input", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder} is missing" in err, err
    assert f"put it back with: mv {aside} {folder}" in err
    monkeypatch.undo()
    assert _snapshot(aside) == {k.replace(str(folder), str(aside)): v for k, v in before.items()}
    assert not folder.exists()


def test_average_takes_a_folder_as_a_member(run, folder, tmp_path, capsys) -> None:
    """The mean of a checkpoint and its own model folder is its weights, unchanged."""
    best = find_checkpoint(run)
    out = tmp_path / "avg.pt"
    assert main(["average", "--checkpoint", str(best), str(folder), "--output", str(out)]) == 0
    _, expected = translation_weights(load_checkpoint(best))
    averaged = load_checkpoint(out)["model"]
    assert all(torch.equal(averaged[k], v) for k, v in expected.items())


def test_a_sentencepiece_model_travels_as_its_own_file(tmp_path) -> None:
    pytest.importorskip("sentencepiece")
    en = read_lines(multi30k_files("train", "en"))[:200]
    tok = SentencePieceTokenizer.train(en, vocab_size=200, model_type="bpe")
    vocab = Vocab.build(tok.tokenize(s) for s in en)
    torch.manual_seed(0)
    model = build_model(presets.tiny(len(vocab), len(vocab)))
    payload = checkpoint_payload(model, src_vocab=vocab, tgt_vocab=vocab, tokenizer=tok)
    write_release(payload, tmp_path / "sp", card="card")
    assert (tmp_path / "sp" / "tokenizer.model").read_bytes() == tok.model_proto
    assert json.loads((tmp_path / "sp" / "tokenizer.json").read_text()) == {
        "name": "sentencepiece", "model": "tokenizer.model"}
    loaded = bahdanau.load(tmp_path / "sp")
    assert loaded.tokenizer.model_proto == tok.model_proto
    assert loaded.tokenizer.tokenize(SOURCES[0]) == tok.tokenize(SOURCES[0])
    # a tokenizer.json naming its model by something other than a file name (digest made to
    # match, as an editor would): one line, not an unhashable-type traceback
    path, manifest_path = tmp_path / "sp" / "tokenizer.json", tmp_path / "sp" / "manifest.json"
    path.write_text(json.dumps({"name": "sentencepiece", "model": [1]}))
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["tokenizer.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    one_line_error(lambda: bahdanau.load(tmp_path / "sp"), "names the SentencePiece model [1], "
                   "which the manifest does not list")


def test_manifest_holds_every_file_digest_and_the_card_its_facts(run, folder) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == "bahdanau-model" and manifest["version"] == 1
    on_disk = sorted(p.name for p in folder.iterdir())
    assert sorted(manifest["files"]) == [n for n in on_disk if n != "manifest.json"]
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask     # others may read it
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    card = (folder / "README.md").read_text()
    model = bahdanau.load(folder).model
    assert f"parameters: {sum(p.numel() for p in model.parameters()):,}" in card
    assert "`bahdanau train --max-steps 4 --lowercase --preset tiny`" in card
    digest = load_checkpoint(find_checkpoint(run))["train_state"]["examples_digest"]
    assert f"training data digest (SHA-256 of the examples' ids): {digest}" in card
    assert "## License" in card


@pytest.mark.parametrize("damage", ["tampered", "missing", "version"])
def test_a_damaged_folder_is_one_line_naming_the_file(folder, damage) -> None:
    if damage == "tampered":
        path = folder / "src_vocab.json"
        path.write_bytes(path.read_bytes().replace(b'"tokens"', b'"tokens" '))
        fragments = [str(path), "SHA-256 differs", "changed or damaged"]
    elif damage == "missing":
        path = folder / "tokenizer.json"
        path.unlink()
        fragments = [str(path), "missing"]
    else:
        path = folder / "manifest.json"
        manifest = json.loads(path.read_text())
        path.write_text(json.dumps({**manifest, "version": 2}))
        fragments = [str(path), "version 2", "reads version 1"]
    one_line_error(lambda: bahdanau.load(folder), *fragments)
    assert main(["translate", "--checkpoint", str(folder), "--input", str(path)]) == 2


def test_a_folder_without_its_manifest_is_named(folder) -> None:
    (folder / "manifest.json").unlink()
    one_line_error(lambda: bahdanau.load(folder), "without its manifest.json")


def test_out_is_refused_when_not_empty_and_replaced_whole(run, folder, monkeypatch) -> None:
    payload = load_checkpoint(find_checkpoint(run))
    one_line_error(lambda: write_release(payload, folder, card="x"),
                   f"--out {folder} is a model folder already: replace it with --overwrite")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def dies(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors_torch, "save_file", dies)
    with pytest.raises(OSError, match=f"writing {folder} failed: disk full; {folder} is left"):
        write_release(payload, folder, card="x", overwrite=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before   # untouched
    assert sorted(p.name for p in folder.parent.iterdir()) == ["model"]   # no temporary left
    monkeypatch.undo()
    write_release(payload, folder, card="new card", overwrite=True)
    assert (folder / "README.md").read_text() == "new card"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["model"]
    read_release(folder)


def _release_under_a_size_limit(*args: str) -> subprocess.CompletedProcess:
    """`bahdanau release ARGS` in a child process whose files may not grow past 4 KiB
    (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write past it fails with EFBIG): the
    weights cannot be written, the small files could."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    return subprocess.run([sys.executable, "-m", "bahdanau", "release", *args],
                          capture_output=True, text=True, timeout=300, preexec_fn=limited)


def test_a_release_that_cannot_write_its_weights_is_one_line(run, tmp_path) -> None:
    """Under a file-size limit the safetensors write failed with a SafetensorError traceback:
    it is one error line naming the folder, and no temporary folder is left."""
    out = tmp_path / "model"
    child = _release_under_a_size_limit("--checkpoint", str(run), "--out", str(out))
    assert child.returncode == 2, child.stderr
    assert child.stderr.count("\n") == 1 and "Traceback" not in child.stderr, child.stderr
    assert f"writing {out} failed: File too large" in child.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_overwrite_that_cannot_write_keeps_the_old_folder(run, folder) -> None:
    """The same with --overwrite of a model folder: the old folder stays, byte for byte."""
    before = _snapshot(folder)
    child = _release_under_a_size_limit("--checkpoint", str(run), "--out", str(folder),
                                        "--overwrite")
    assert child.returncode == 2, child.stderr
    assert child.stderr.count("\n") == 1 and "Traceback" not in child.stderr, child.stderr
    assert f"writing {folder} failed: File too large; {folder} is left as it was" in child.stderr
    assert _snapshot(folder) == before
    assert sorted(p.name for p in folder.parent.iterdir()) == ["model"]


def test_without_safetensors_the_command_says_what_to_install(run, tmp_path, monkeypatch,
                                                              capsys) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    assert main(["release", "--checkpoint", str(run), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'bahdanau[share]'" in err
    assert not (tmp_path / "m").exists()
    with pytest.raises(InputError, match="safetensors"):
        write_release(load_checkpoint(find_checkpoint(run)), tmp_path / "m", card="x")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_release_refuses_an_out_that_would_replace_a_run(run, tmp_path, capsys) -> None:
    """`release --checkpoint RUN --out RUN --overwrite` replaced the run folder with the model
    folder (its checkpoints gone); so did --out RUN/checkpoints, or a folder holding RUN."""
    before = _snapshot(run)
    for out, fragment in ((run, "holds a run"),
                          (run / "checkpoints", f"is inside the run in {run}"),
                          (run / "model", f"is inside the run in {run}"),
                          (run.parent, "holds --checkpoint")):
        code = main(["release", "--checkpoint", str(run), "--out", str(out), "--overwrite"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert _snapshot(run) == before and not (run / "model").exists()


def test_release_out_follows_the_folder_rules(run, folder, tmp_path, monkeypatch,
                                             capsys) -> None:
    """An --out that is a model folder already may be replaced; `--out .` is refused; a link
    keeps linking (the folder it names is replaced); temporary folders of dead processes go."""
    assert main(["release", "--checkpoint", str(folder), "--out", str(folder),
                 "--overwrite"]) == 0                  # a model folder over itself
    read_release(folder)
    link = tmp_path / "link"
    link.symlink_to(folder)
    dead = tmp_path / f".model.partial-{2**22 + 7}"     # above pid_max: no such process
    dead.mkdir()
    assert main(["release", "--checkpoint", str(run), "--out", str(link), "--overwrite"]) == 0
    assert link.is_symlink() and os.readlink(link) == str(folder)
    assert read_release(link)["extra"]["release"] == str(link) and not dead.exists()
    monkeypatch.chdir(folder)
    capsys.readouterr()
    assert main(["release", "--checkpoint", str(run), "--out", ".", "--overwrite"]) == 2
    assert "is the current folder or holds it" in capsys.readouterr().err
    read_release(folder)


def test_a_model_folder_keeps_the_run_id_and_versions(run, folder, tmp_path) -> None:
    """read_release gave train_state None and so no run id: averaging a model folder with a
    checkpoint of another run was accepted silently."""
    payload = load_checkpoint(find_checkpoint(run))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["run_id"] == payload["train_state"]["run_id"] is not None
    assert manifest["versions"] == payload["versions"]
    read = read_release(folder)
    assert read["extra"]["run_id"] == payload["train_state"]["run_id"]
    assert read["versions"] == payload["versions"]
    averaged = bahdanau.average_checkpoints(
        [run / "checkpoints" / f"step_0000000{s}.pt" for s in (2, 4)])
    write_release(averaged, tmp_path / "avg", card="x")       # an average keeps its run's id
    assert read_release(tmp_path / "avg")["extra"]["run_id"] == manifest["run_id"]
    stranger = {**payload, "train_state": {**payload["train_state"], "run_id": "f" * 32}}
    torch.save(stranger, tmp_path / "stranger.pt")
    one_line_error(lambda: bahdanau.average_checkpoints([folder, tmp_path / "stranger.pt"]),
                   "come from different runs")


def test_the_card_has_test_scores_only_of_the_final_weights(run, tmp_path) -> None:
    """metrics.json scores the run's final weights; the card of an earlier checkpoint showed
    them as its own. The dev score names its metric; the card says what trained the model."""
    from bahdanau.jobs.release import model_card, own_test_scores

    bleu_signature = "nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.6.0"
    metrics = {"bleu": 12.5, "chrf": 40.0, "sentences": 6, "beam_size": 1, "updates": 4,
               "bleu_signature": bleu_signature, "chrf_signature": None}
    (run / "metrics.json").write_text(json.dumps(metrics))
    try:
        last, earlier = (read_checkpoint(run / "checkpoints" / f"step_0000000{s}.pt")
                         for s in (4, 2))
    finally:
        (run / "metrics.json").unlink()
    assert own_test_scores(last) == metrics
    assert own_test_scores(earlier) is None
    payload = {**earlier.payload,
               "train_state": {**earlier.payload["train_state"], "best_metric": 4.7391,
                               "best_step": 2},
               "train_config": {**earlier.payload["train_config"],
                                "early_stopping_metric": "chrf"}}
    card = model_card(dataclasses.replace(earlier, payload=payload))
    assert "- best dev chrf 4.74 at update 2" in card and "- test:" not in card
    assert "model-index" not in card
    assert (f"- trained with: bahdanau {payload['versions']['bahdanau']}, torch "
            f"{payload['versions']['torch']}") in card
    assert "- test: BLEU 12.50, chrF 40.00 (6 sentences, beam 1)" in model_card(last)


def _front_matter(card: str) -> dict:
    """The YAML metadata block that opens a Hugging Face model card."""
    yaml = pytest.importorskip("yaml")
    assert card.startswith("---\n"), card[:40]
    block, _, body = card[4:].partition("\n---\n")
    assert body.startswith("\n# rnnsearch translation model")    # a blank line, then the text
    return yaml.safe_load(block)


def test_the_card_of_an_average_says_what_its_run_measured(run, tmp_path, capsys) -> None:
    """A release of an averaged checkpoint said "command: not recorded", and had no scores,
    no language pair, no data set and no licence: the average keeps its members' run record
    (the run's report included, even once the run folder is gone), and the card holds it in
    its YAML metadata and its text, with the licence given to --license."""
    bleu_signature = "nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.6.0"
    metrics = {"bleu": 12.5, "chrf": 40.0, "sentences": 6, "beam_size": 1, "updates": 4,
               "bleu_signature": bleu_signature, "chrf_signature": None}
    (run / "metrics.json").write_text(json.dumps(metrics))
    average = tmp_path / "average.pt"
    try:
        assert main(["average", "--checkpoint", str(run), "--last", "2", "--output",
                     str(average)]) == 0
    finally:
        (run / "metrics.json").unlink()
    assert main(["release", "--checkpoint", str(average), "--out", str(tmp_path / "m"),
                 "--license", "cc-by-4.0"]) == 0
    card = (tmp_path / "m" / "README.md").read_text()
    meta = _front_matter(card)
    command = "bahdanau train --max-steps 4 --lowercase --preset tiny"
    assert meta["language"] == ["en", "fr"] and meta["datasets"] == ["multi30k"]
    assert meta["license"] == "cc-by-4.0" and meta["pipeline_tag"] == "translation"
    assert meta["tags"] == ["translation", "bahdanau", "rnnsearch"]
    assert meta["bahdanau"]["command"] == command
    assert meta["bahdanau"]["averaged_steps"] == [2, 4]
    assert meta["bahdanau"]["run_test"] == metrics                   # the run's, not its own
    assert meta["bahdanau"]["test"] is None and "model-index" not in meta
    assert meta["bahdanau"]["run_id"] == load_checkpoint(
        find_checkpoint(run))["train_state"]["run_id"]
    for line in ("- language pair: en -> fr", f"- command: `{command}`",
                 "- training data: Multi30k en-fr, shipped with bahdanau",
                 "- weights: the average of 2 checkpoints (updates 2, 4)",
                 "- the run's test scores (its final weights, update 4; this average is not "
                 "scored): BLEU 12.50, chrF 40.00 (6 sentences, beam 1)",
                 "cc-by-4.0 (as stated by whoever released the model"):
        assert line in card, line
    assert main(["release", "--checkpoint", str(average), "--out", str(tmp_path / "n")]) == 0
    unstated = (tmp_path / "n" / "README.md").read_text()
    assert "license" not in _front_matter(unstated) and "\nNot stated." in unstated
    capsys.readouterr()
    assert main(["release", "--checkpoint", str(average), "--out", str(tmp_path / "o"),
                 "--license", "see the data"]) == 2
    assert "--license 'see the data' is not an SPDX licence id" in capsys.readouterr().err


def test_the_card_of_a_final_checkpoint_holds_its_own_scores(run, tmp_path) -> None:
    """The model-index (the Hugging Face card's results) holds only a checkpoint's own test
    scores: those of the run's final weights, for its last checkpoint."""
    bleu_signature = "nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.6.0"
    metrics = {"bleu": 12.5, "chrf": 40.0, "sentences": 6, "beam_size": 1, "updates": 4,
               "bleu_signature": bleu_signature, "chrf_signature": None}
    (run / "metrics.json").write_text(json.dumps(metrics))
    try:
        assert main(["release", "--checkpoint", str(run), "--out", str(tmp_path / "m"),
                     "--license", "MIT OR Apache-2.0"]) == 0
    finally:
        (run / "metrics.json").unlink()
    meta = _front_matter((tmp_path / "m" / "README.md").read_text())
    assert meta["license"] == "MIT OR Apache-2.0" and meta["bahdanau"]["updates"] == 4
    [result] = meta["model-index"][0]["results"]
    assert result["task"] == {"type": "translation", "name": "Translation en-fr"}
    assert result["dataset"]["type"] == "multi30k"
    assert [(m["type"], m["value"]) for m in result["metrics"]] == [("bleu", 12.5),
                                                                    ("chrf", 40.0)]
    # each score says how it was computed, where the report says so (no chrF signature here)
    assert [m.get("args") for m in result["metrics"]] == [{"signature": bleu_signature}, None]
