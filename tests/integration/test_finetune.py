"""``bahdanau train --init-from``: fine-tuning a trained model on new data.

Expectation (independent of any earlier run's numbers): a tiny Multi30k en->fr model is
fine-tuned on a shifted corpus, the same kind of sentences with every French sentence's words in
reverse order. Before, the model finds the original French references more likely than the
reversed ones (it learned French word order); after, the reversed ones, and its dev loss on the
shifted dev set is clearly lower than the starting model's. A run whose model or vocabularies do
not fit the starting weights is refused in one line before anything is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from training_fixtures import one_line_error

import bahdanau
from bahdanau.checkpoint import load_checkpoint
from bahdanau.cli import main
from bahdanau.data import collate, encode_pairs, multi30k_files, read_lines
from bahdanau.jobs import train_job
from bahdanau.jobs.options import TrainOptions
from bahdanau.jobs.train_job import run_train_job
from bahdanau.training import evaluate_loss

EN = read_lines(multi30k_files("train", "en"))
FR = read_lines(multi30k_files("train", "fr"))


def _write(root: Path, name: str, lines: list[str]) -> str:
    path = root / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _reversed(sentence: str) -> str:
    """The systematic shift: the words of a sentence in reverse order."""
    return " ".join(reversed(sentence.split()))


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("finetune")
    return {
        "tr.en": _write(root, "tr.en", EN[:600]), "tr.fr": _write(root, "tr.fr", FR[:600]),
        # the shifted corpus: other sentences, their French reversed
        "sh.en": _write(root, "sh.en", EN[600:1200]),
        "sh.fr": _write(root, "sh.fr", [_reversed(t) for t in FR[600:1200]]),
        "dev.en": _write(root, "dev.en", EN[1200:1260]),
        "dev.fr": _write(root, "dev.fr", FR[1200:1260]),
        "shdev.fr": _write(root, "shdev.fr", [_reversed(t) for t in FR[1200:1260]]),
        "root": str(root),
    }


# Runs of 60 updates, too few for the default job's moving average of the weights (0.998^60:
# 89% of the starting weights): these runs keep none, so that their checkpoints' weights are
# what the updates made.
NO_AVERAGE = ["--ema-decay", "none"]


def _train(*args: str) -> None:
    assert main(["train", "--preset", "tiny", "--threads", "1", "--batch-size", "32",
                 *NO_AVERAGE, *args]) == 0


@pytest.fixture(scope="module")
def base(corpora) -> Path:
    out = Path(corpora["root"]) / "base"
    _train("--train-src", corpora["tr.en"], "--train-tgt", corpora["tr.fr"], "--max-steps",
           "60", "--lr", "0.01", "--out", str(out))
    return out


def _dev_loss(model_path: Path, corpora: dict[str, str], references: str) -> float:
    """Per-token loss of `model_path`'s model on the dev sources with these references."""
    t = bahdanau.load(model_path)
    pairs = list(zip(read_lines(Path(corpora["dev.en"])), read_lines(Path(references)),
                     strict=True))
    examples = encode_pairs(pairs, t.src_vocab, t.tgt_vocab, t.tokenizer, max_len=100)
    return evaluate_loss(t.model, [collate(examples)])[0]


@pytest.mark.slow
def test_fine_tuning_on_a_shifted_corpus_learns_the_shift(base, corpora) -> None:
    out = Path(corpora["root"]) / "tuned"
    _train("--init-from", str(base), "--train-src", corpora["sh.en"], "--train-tgt",
           corpora["sh.fr"], "--dev-src", corpora["dev.en"], "--dev-tgt", corpora["shdev.fr"],
           "--eval-every", "30", "--max-steps", "60", "--lr", "0.01", "--out", str(out))
    assert "(--init-from); the optimizer starts afresh" in (out / "train.log").read_text()
    before = {ref: _dev_loss(base, corpora, corpora[ref]) for ref in ("dev.fr", "shdev.fr")}
    after = {ref: _dev_loss(out, corpora, corpora[ref]) for ref in ("dev.fr", "shdev.fr")}
    print(f"dev loss per token, before: {before}, after: {after}")
    assert before["dev.fr"] < before["shdev.fr"]           # the base model: French word order
    assert after["shdev.fr"] < after["dev.fr"]             # fine-tuned: the shift learned
    assert after["shdev.fr"] < 0.95 * before["shdev.fr"]   # the shifted dev loss moved down
    # the new run has its own fresh state: a fresh optimizer, its own steps, its own data
    tuned = load_checkpoint(out / "checkpoints" / "step_00000060.pt")
    assert tuned["train_state"]["step"] == 60
    assert tuned["src_vocab"] == load_checkpoint(base / "checkpoints" / "step_00000060.pt")[
        "src_vocab"]
    # and it resumes as any run (the same command, a higher limit)
    result = run_train_job(TrainOptions.from_mapping({
        "preset": "tiny", "threads": 1, "batch_size": 32, "init_from": str(base),
        "train_src": corpora["sh.en"], "train_tgt": corpora["sh.fr"],
        "dev_src": corpora["dev.en"], "dev_tgt": corpora["shdev.fr"], "eval_every": 30,
        "max_steps": 62, "lr": 0.01, "ema_decay": "none", "out": str(out)}))
    assert result.step == 62 and result.trained


def test_the_first_weights_are_the_models(base, corpora, tmp_path) -> None:
    """After one update at a learning rate of 1e-30, the new run's checkpoint holds the
    starting model's weights (read here from its release folder)."""
    pytest.importorskip("safetensors")
    folder = tmp_path / "released"
    assert main(["release", "--checkpoint", str(base), "--out", str(folder)]) == 0
    out = tmp_path / "tuned"
    _train("--init-from", str(folder), "--train-src", corpora["sh.en"], "--train-tgt",
           corpora["sh.fr"], "--max-steps", "1", "--lr", "1e-30", "--out", str(out))
    start = bahdanau.load(folder).model.state_dict()
    tuned = load_checkpoint(out / "checkpoints" / "step_00000001.pt")["model"]
    for key, value in start.items():
        torch.testing.assert_close(tuned[key], value, rtol=0, atol=1e-20)


def test_a_resumed_run_does_not_read_its_init_model_again(base, corpora, tmp_path,
                                                          monkeypatch) -> None:
    """Resuming restores the run's own checkpoint over whatever the model gives: the model
    (here a copy, deleted after the first start) is not read again, and the vocabularies and
    tokenizer come from the run's checkpoint, so the run resumes without it."""
    start = tmp_path / "start.pt"
    shutil.copy(base / "checkpoints" / "step_00000060.pt", start)
    options = {"preset": "tiny", "threads": 1, "batch_size": 32, "init_from": str(start),
               "train_src": corpora["sh.en"], "train_tgt": corpora["sh.fr"], "lr": 0.01,
               "out": str(tmp_path / "tuned")}
    assert run_train_job(TrainOptions.from_mapping({**options, "max_steps": 2})).step == 2
    start.unlink()
    monkeypatch.setattr(train_job, "read_init_model", None)          # never called
    result = run_train_job(TrainOptions.from_mapping({**options, "max_steps": 3}))
    assert result.step == 3 and result.trained
    tuned = load_checkpoint(tmp_path / "tuned" / "checkpoints" / "step_00000003.pt")
    first = load_checkpoint(base / "checkpoints" / "step_00000060.pt")
    assert (tuned["src_vocab"], tuned["tgt_vocab"]) == (first["src_vocab"], first["tgt_vocab"])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _fine_tuned(base: Path, corpora: dict[str, str], tmp_path: Path) -> tuple[Path, list[str]]:
    """A run fine-tuned 2 steps from a copy of `base`'s checkpoint (start.pt), and the flags
    it was started with but --init-from and --max-steps."""
    start = tmp_path / "start.pt"
    shutil.copy(base / "checkpoints" / "step_00000060.pt", start)
    flags = ["--train-src", corpora["sh.en"], "--train-tgt", corpora["sh.fr"], "--lr", "0.01",
             "--out", str(tmp_path / "tuned"), "--quiet"]
    _train("--init-from", str(start), *flags, "--max-steps", "2")
    return start, flags


def test_a_fine_tuned_run_resumes_without_its_init_from(base, corpora, tmp_path,
                                                        capsys) -> None:
    """`bahdanau train --out RUN ...` without --init-from resumes a fine-tuned run (its
    checkpoints hold the weights, and its options.json the model it began from): it was
    refused, with advice to --overwrite (delete) the run."""
    start, flags = _fine_tuned(base, corpora, tmp_path)
    capsys.readouterr()
    _train(*flags, "--max-steps", "3")
    assert capsys.readouterr().err == ""
    out = tmp_path / "tuned"
    assert load_checkpoint(out / "checkpoints" / "step_00000003.pt")["train_state"]["step"] == 3
    assert f"resumed from {out / 'checkpoints' / 'step_00000002.pt'}" in (
        out / "train.log").read_text()
    assert json.loads((out / "options.json").read_text())["init_from"] == str(start)


def test_another_init_from_on_resume_says_what_the_run_began_with(base, corpora, tmp_path,
                                                                  capsys) -> None:
    """A resumed fine-tuned run given another --init-from (the model moved, say) is refused in
    one line naming the model it began with and how to resume it, not with advice to
    --overwrite it; the run is left as it was."""
    start, flags = _fine_tuned(base, corpora, tmp_path)
    moved = tmp_path / "moved.pt"
    shutil.copy(start, moved)
    before = _snapshot(tmp_path / "tuned")
    capsys.readouterr()
    assert main(["train", "--preset", "tiny", "--threads", "1", "--batch-size", "32",
                 "--init-from", str(moved), *flags, "--max-steps", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"this run began with --init-from {start}" in err, err
    assert "leave --init-from out" in err and "--overwrite" not in err
    assert _snapshot(tmp_path / "tuned") == before


@pytest.mark.parametrize("given, fragments", [
    ({}, ["its model has embed_size", "give the model's preset and sizes"]),   # small, not tiny
    ({"preset": "tiny", "layer_norm": False},
     ["its model has layer_norm True, this run's False: give --layer-norm"]),
    ({"preset": "tiny", "init_vocab": False},
     ["its source vocabulary", "is not this run's", "keeps the model's vocabularies"]),
    ({"preset": "tiny", "vocab_size": 50}, ["--vocab-size is fixed by the --init-from model"]),
])
def test_a_model_that_does_not_fit_is_refused_in_one_line(base, corpora, tmp_path, given,
                                                          fragments) -> None:
    out = tmp_path / "tuned"
    options = {"init_from": str(base), "train_src": corpora["sh.en"],
               "train_tgt": corpora["sh.fr"], "max_steps": 2, "out": str(out), **given}
    one_line_error(lambda: run_train_job(TrainOptions.from_mapping(options)), *fragments)
    assert not out.exists()                    # refused before anything was written


def test_a_prepared_corpus_with_other_vocabularies_is_refused(base, corpora, tmp_path) -> None:
    data = tmp_path / "prepared"
    assert main(["prepare", "--train-src", corpora["sh.en"], "--train-tgt", corpora["sh.fr"],
                 "--out", str(data), "--workers", "1"]) == 0
    out = tmp_path / "tuned"
    one_line_error(lambda: run_train_job(TrainOptions.from_mapping(
        {"init_from": str(base), "data": str(data), "preset": "tiny", "max_steps": 2,
         "out": str(out)})), "its source vocabulary", "a prepared --data must be encoded")
    assert not out.exists()


def test_no_init_vocab_needs_init_from() -> None:
    one_line_error(lambda: TrainOptions(init_vocab=False), "--no-init-vocab",
                   "without --init-from")
