"""`bahdanau prepare` and `bahdanau train --data`: the prepared corpus trains the same model
as the text files it was made from."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from training_fixtures import write_multi30k_slice

from bahdanau.checkpoint import CheckpointManager, load_checkpoint
from bahdanau.cli import main
from bahdanau.data import multi30k_files, read_lines


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepare")
    write_multi30k_slice(root, 200, 20)
    return root


TRAIN = ["--preset", "tiny", "--max-steps", "3", "--time-budget", "0", "--beam-size", "1",
         "--max-len", "5", "--threads", "1", "--max-train-len", "20"]


def _weights(run):
    return load_checkpoint(CheckpointManager(run / "checkpoints").latest())["model"]


def test_train_on_a_prepared_corpus_equals_train_on_its_files(files, capsys) -> None:
    prepared = files / "prepared"
    assert main(["prepare", "--train-src", str(files / "tr.en"), "--train-tgt",
                 str(files / "tr.fr"), "--out", str(prepared), "--vocab-size", "300",
                 "--workers", "2"]) == 0
    assert "prepared" in capsys.readouterr().err
    test = ["--test-src", str(files / "te.en"), "--test-tgt", str(files / "te.fr")]
    assert main(["train", "--data", str(prepared), *test, *TRAIN,
                 "--out", str(files / "from-data")]) == 0
    assert main(["train", "--train-src", str(files / "tr.en"), "--train-tgt",
                 str(files / "tr.fr"), "--vocab-size", "300", *test, *TRAIN,
                 "--out", str(files / "from-text")]) == 0
    a, b = _weights(files / "from-data"), _weights(files / "from-text")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    metrics = json.loads((files / "from-data" / "metrics.json").read_text())
    assert metrics["sentences"] == 20 and metrics["updates"] == 3
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(files / "from-data"), "--input",
                 str(files / "te.en"), "--max-len", "5"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 20


def test_prepared_shipped_multi30k_keeps_its_dev_and_test_sets(tmp_path, capsys) -> None:
    prepared = tmp_path / "multi30k"
    assert main(["prepare", "--out", str(prepared), "--workers", "1"]) == 0
    assert json.loads((prepared / "manifest.json").read_text())["shipped"] == {
        "corpus": "multi30k", "src_lang": "en", "tgt_lang": "fr"}
    assert main(["prepare", "--out", str(prepared), "--workers", "1"]) == 0
    assert "up to date" in capsys.readouterr().err
    assert main(["train", "--data", str(prepared), *TRAIN, "--max-steps", "1",
                 "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["sentences"] == 1000


@pytest.mark.parametrize("argv, message", [
    (["train", "--data", "{p}", "--vocab-size", "50"],
     "--vocab-size is fixed by the prepared corpus"),
    (["train", "--data", "{p}", "--train-src", "{f}/tr.en", "--train-tgt", "{f}/tr.fr"],
     "--data is the training corpus: give it or --train-src"),
    (["train", "--data", "{f}", "--max-steps", "1"], "is not a prepared corpus"),
    (["prepare", "--out", "{f}/x", "--tokenizer", "bpe", "--lowercase"],
     "--lowercase and --joiners set the default tokenizer"),
    (["prepare", "--out", "{f}/x", "--tokenizer", "char", "--joiners", "punctuation"],
     "--lowercase and --joiners set the default tokenizer, which neither side uses"),
    (["prepare", "--out", "{f}/x", "--tokenizer", "unigram", "--target-tokenizer", "char"],
     "--target-tokenizer char: a SentencePiece model tokenizes both sides"),
    (["prepare", "--out", "{f}/x", "--train-src", "{f}/tr.en"],
     "give both --train-src and --train-tgt"),
    (["prepare", "--out", "{f}", "--train-src", "{f}/tr.en", "--train-tgt", "{f}/tr.fr"],
     "holds --train-src"),                   # replacing the folder would delete the input
    (["prepare", "--out", "{f}", "--train-src", "{f}/tr.en", "--train-tgt", "{f}/tr.fr",
      "--overwrite"], "holds --train-src"),
])
def test_bad_prepare_and_data_options(files, capsys, argv, message) -> None:
    prepared = files / "prepared-bad"
    if not prepared.exists():
        assert main(["prepare", "--train-src", str(files / "tr.en"), "--train-tgt",
                     str(files / "tr.fr"), "--out", str(prepared), "--workers", "1"]) == 0
        capsys.readouterr()                      # its log: the error is the only line after
    argv = [a.format(p=prepared, f=files) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_characters_in_words_out_prepare_train_translate(tmp_path, capsys) -> None:
    """Letters in, space-separated "phonemes" out: each side keeps its own tokenizer, in the
    prepared corpus, in the trained checkpoint and when translating."""
    words = ["cab", "bad", "dab", "ace", "bead", "cede", "a b"]
    (tmp_path / "w").write_text("".join(w + "\n" for w in words), encoding="utf-8")
    (tmp_path / "p").write_text("".join(" ".join(w.upper()) + "\n" for w in words),
                                encoding="utf-8")
    prepared = tmp_path / "prepared"
    assert main(["prepare", "--train-src", str(tmp_path / "w"), "--train-tgt",
                 str(tmp_path / "p"), "--out", str(prepared), "--tokenizer", "char",
                 "--target-tokenizer", "whitespace", "--workers", "1"]) == 0
    assert json.loads((prepared / "tokenizer.json").read_text()) == {
        "name": "pair", "source": {"name": "char"}, "target": {"name": "whitespace"}}
    src_words = json.loads((prepared / "src_vocab.json").read_text())
    assert sorted(src_words["tokens"]) == sorted("abcde\u2581")
    assert main(["train", "--data", str(prepared), *TRAIN, "--out", str(tmp_path / "run"),
                 "--dev-src", str(tmp_path / "w"), "--dev-tgt", str(tmp_path / "p"),
                 "--eval-every", "3", "--early-stopping-metric", "wer"]) == 0
    assert " wer " in capsys.readouterr().err.split("| best wer")[0]   # ranked by dev WER
    assert main(["translate", "--checkpoint", str(tmp_path / "run"), "--input",
                 str(tmp_path / "w"), "--max-len", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(words)
    targets = {"A", "B", "C", "D", "E", "<unk>"}
    assert all(set(line.split()) <= targets for line in lines)   # phonemes, not characters


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_prepare_train_translate(tmp_path, capsys, model_type) -> None:
    pytest.importorskip("sentencepiece")
    en = read_lines(multi30k_files("train", "en"))[:2020]
    fr = read_lines(multi30k_files("train", "fr"))[:2020]
    for name, lines in (("tr.en", en[:2000]), ("tr.fr", fr[:2000]), ("te.en", en[2000:])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepared = tmp_path / "prepared"
    assert main(["prepare", "--train-src", str(tmp_path / "tr.en"), "--train-tgt",
                 str(tmp_path / "tr.fr"), "--out", str(prepared), "--tokenizer", model_type,
                 "--subword-vocab", "400", "--workers", "2"]) == 0
    assert (prepared / "sentencepiece.model").is_file()
    assert main(["train", "--data", str(prepared), *TRAIN, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(tmp_path / "run"), "--input",
                 str(tmp_path / "te.en"), "--max-len", "8", "--beam-size", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 20
    assert not any("\u2581" in line for line in lines)      # detokenised: plain text
    # the model file trained here serves a second corpus as it is
    again = tmp_path / "again"
    assert main(["prepare", "--train-src", str(tmp_path / "tr.en"), "--train-tgt",
                 str(tmp_path / "tr.fr"), "--out", str(again), "--sentencepiece-model",
                 str(prepared / "sentencepiece.model"), "--workers", "1"]) == 0
    assert np.array_equal(np.load(prepared / "src.ids.npy"), np.load(again / "src.ids.npy"))


def test_a_file_size_limit_is_one_line_naming_the_file(files, tmp_path) -> None:
    """Under a file-size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with
    EFBIG) `prepare` said only "[Errno 27] File too large": the spooled ids were written
    outside `atomic_file`. It is one line naming the file, and nothing is left behind."""
    import resource
    import subprocess
    import sys

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))

    out = tmp_path / "prep"
    child = subprocess.run([sys.executable, "-m", "bahdanau", "prepare", "--train-src",
                            str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"), "--out",
                            str(out), "--workers", "1"], capture_output=True, text=True,
                           timeout=300, preexec_fn=limited)
    assert child.returncode == 2, child.stderr
    assert child.stderr.count("\n") == 1 and "Traceback" not in child.stderr, child.stderr
    assert "failed: File too large" in child.stderr and ".src.spool" in child.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failed_write_of_the_id_arrays_names_the_file(files, tmp_path, monkeypatch) -> None:
    """The variant: the memory-mapped id array (written outside `atomic_file` too) that cannot
    be extended to its size is named."""
    import errno

    from bahdanau.data import prepare_corpus

    def too_large(path, *args, **kwargs):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(np.lib.format, "open_memmap", too_large)
    with pytest.raises(OSError, match=r"writing \S+src\.ids\.npy failed: File too large"):
        prepare_corpus(files / "tr.en", files / "tr.fr", tmp_path / "prep", workers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
