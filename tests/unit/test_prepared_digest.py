"""Prepared folders are sealed like checkpoints: any change after `prepare_corpus` (an id within
range, an offset, a vocabulary word, a tokenizer setting, a manifest field) is refused on open
and never reused; `overwrite` rebuilds; every manifest field is type-checked in one line; the
special ids never stand inside a sentence; a folder of the earlier format is to be prepared
again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from training_fixtures import one_line_error

from bahdanau.cli import main
from bahdanau.config import BOS_ID, EOS_ID, PAD_ID
from bahdanau.data import (
    DefaultTokenizer,
    PreparedCorpus,
    TrainSentencePiece,
    multi30k_files,
    prepare_corpus,
)
from bahdanau.data import corpus as corpus_module
from bahdanau.data.manifest import MANIFEST, seal


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def texts(tmp_path):
    src = _write(tmp_path / "s.txt", ["a b c", "c d", "B e a", "a"])
    tgt = _write(tmp_path / "t.txt", ["x y", "y z w", "x", "w w"])
    return src, tgt


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def _edit_manifest(folder: Path, **fields) -> None:
    (folder / MANIFEST).write_text(json.dumps({**_manifest(folder), **fields}))


def _reseal(folder: Path) -> None:
    """Seal the folder again as it is now: what a forger who knows the format would do."""
    manifest = {k: v for k, v in _manifest(folder).items() if k not in ("files", "digest")}
    seal(folder, manifest)


def _damage(folder: Path, damage: str) -> str:
    """Damage the folder as `damage` says; the file the refusal must name."""
    if damage in ("id", "offset", "line"):
        name = {"id": "tgt.ids.npy", "offset": "src.offsets.npy", "line": "lines.npy"}[damage]
        array = np.load(folder / name)
        array[1] += 1                  # within range: offsets still increase, ids in the vocab
        np.save(folder / name, array)
        return name
    if damage == "vocab":              # two words swapped
        data = json.loads((folder / "src_vocab.json").read_text())
        words = data["tokens"] if isinstance(data, dict) else data
        words[0], words[1] = words[1], words[0]
        (folder / "src_vocab.json").write_text(json.dumps(data))
        return "src_vocab.json"
    if damage == "tokenizer":          # lowercase flipped
        data = json.loads((folder / "tokenizer.json").read_text())
        data["lowercase"] = not data["lowercase"]
        (folder / "tokenizer.json").write_text(json.dumps(data))
        return "tokenizer.json"
    if damage == "options":            # the option recorded, flipped in the manifest
        options = _manifest(folder)["options"]
        options["tokenizer"]["lowercase"] = True
        _edit_manifest(folder, options=options)
        return MANIFEST
    assert damage == "shipped"         # makes train --data score on the shipped test set
    _edit_manifest(folder, shipped={"corpus": "multi30k", "src_lang": "fr", "tgt_lang": "en"})
    return MANIFEST


DAMAGES = ["id", "offset", "line", "vocab", "tokenizer", "options", "shipped"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_changed_folder_is_refused_and_overwrite_rebuilds_it(texts, tmp_path, damage) -> None:
    out = tmp_path / "prep"
    prepare_corpus(*texts, out, workers=1)
    fresh = {p.name: p.read_bytes() for p in out.iterdir()}
    name = _damage(out, damage)
    one_line_error(lambda: PreparedCorpus(out), f"{out / name} does not match its digest",
                   "prepare it again with --overwrite")
    lines: list[str] = []
    message = one_line_error(lambda: prepare_corpus(*texts, out, workers=1, log=lines.append),
                             f"{out} holds a damaged prepared corpus", "--overwrite")
    assert not lines and "up to date" not in message
    rebuilt = prepare_corpus(*texts, out, workers=1, overwrite=True, log=lines.append)
    assert lines[0] == f"{out} holds a damaged prepared corpus: preparing it again"
    again = {p.name: p.read_bytes() for p in out.iterdir()}
    assert again.keys() == fresh.keys()
    assert all(again[n] == fresh[n] for n in fresh if n != MANIFEST)     # damage repaired
    assert [ex.tgt for ex in rebuilt] == [ex.tgt for ex in PreparedCorpus(out)]


def test_an_intact_folder_is_reused_with_its_digest_checked(texts, tmp_path) -> None:
    out = tmp_path / "prep"
    prepare_corpus(*texts, out, workers=1)
    stamp = (out / "src.ids.npy").stat().st_mtime_ns
    lines: list[str] = []
    prepare_corpus(*texts, out, workers=1, overwrite=True, log=lines.append)
    assert lines == [f"{out} is up to date (same inputs and options, digest checked): reusing it"]
    assert (out / "src.ids.npy").stat().st_mtime_ns == stamp


def test_a_forged_shipped_key_is_refused_even_with_a_new_digest(tmp_path, capsys) -> None:
    """An en->fr corpus of other files that claims to be the shipped Multi30k fr->en (resealed,
    so its digest matches) would make train score on the shipped fr->en test set."""
    src = _write(tmp_path / "s.txt", ["a b", "c d"])
    tgt = _write(tmp_path / "t.txt", ["x y", "z"])
    out = tmp_path / "prep"
    prepare_corpus(src, tgt, out, workers=1)
    _damage(out, "shipped")
    _reseal(out)
    one_line_error(lambda: PreparedCorpus(out), "shipped says the shipped Multi30k fr->en, "
                   "but the corpus was prepared from other files")
    assert main(["train", "--data", str(out), "--preset", "tiny", "--max-steps", "1",
                 "--out", str(tmp_path / "run")]) == 2
    assert "prepared from other files" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()
    one_line_error(lambda: prepare_corpus(src, tgt, tmp_path / "other", workers=1,
                                          shipped={"corpus": "multi30k", "src_lang": "en",
                                                   "tgt_lang": "fr"}),
                   "prepared from other files")


def test_the_shipped_corpus_keeps_its_shipped_key(tmp_path) -> None:
    en, fr = multi30k_files("train", "en"), multi30k_files("train", "fr")
    shipped = {"corpus": "multi30k", "src_lang": "fr", "tgt_lang": "en"}
    corpus = prepare_corpus(fr, en, tmp_path / "prep", shipped=shipped, max_len=6, workers=1)
    assert PreparedCorpus(tmp_path / "prep").manifest["shipped"] == shipped == (
        corpus.manifest["shipped"])


@pytest.mark.parametrize("field, value, expected", [
    ("counts", "many", "'counts' must be counts of lines, pairs"),
    ("counts", {"lines": 4, "pairs": 4}, "'counts' must be counts of"),
    ("counts", {"lines": 4, "pairs": -1, "empty": 0, "too_long": 0, "ratio": 0}, "'counts'"),
    ("tokens", ["7", 5], "'tokens' must be two token counts"),
    ("vocab_sizes", None, "'vocab_sizes' must be two vocabulary sizes"),
    ("inputs", 3, "'inputs' must be two {file, bytes, sha256} records"),
    ("options", [], "'options' must be the options prepare was given"),
    ("shipped", {"corpus": "multi30k"}, "'shipped' must be null or the shipped Multi30k"),
    ("shipped", {"corpus": "multi30k", "src_lang": "en", "tgt_lang": "en"}, "'shipped'"),
    ("seconds", "1.0", "'seconds' must be a number of seconds"),
    ("files", {"../x": "0" * 64}, "'files' must be the SHA-256 of each file"),
    ("digest", 5, "'digest' must be a SHA-256, got 5"),
    ("digest", None, "no 'digest'"),
])
def test_every_manifest_field_is_type_checked(texts, tmp_path, field, value, expected) -> None:
    out = tmp_path / "prep"
    prepare_corpus(*texts, out, workers=1)
    manifest = _manifest(out)
    if value is None and field == "digest":
        del manifest[field]
    else:
        manifest[field] = value
    (out / MANIFEST).write_text(json.dumps(manifest))
    one_line_error(lambda: PreparedCorpus(out), f"{out / MANIFEST} is damaged: {expected}")
    one_line_error(lambda: prepare_corpus(*texts, out, workers=1),
                   f"{out} holds a damaged prepared corpus ({out / MANIFEST} is damaged: "
                   f"{expected}")
    assert len(prepare_corpus(*texts, out, workers=1, overwrite=True)) == 4


@pytest.mark.parametrize("special", [PAD_ID, BOS_ID, EOS_ID])
def test_a_special_id_written_inside_a_sentence_is_never_sealed(texts, tmp_path, monkeypatch,
                                                                special) -> None:
    """The ids are checked before the folder is sealed (opening relies on the seal): a special
    id planted inside a sentence as the array is written is refused, naming the file and the
    sentence, and the corpus already in `out` stays."""
    out = tmp_path / "prep"
    old = [ex.src for ex in prepare_corpus(*texts, out, workers=1)]
    write = corpus_module._Side.write

    def write_planted(side, folder, name, vocab):
        tokens = write(side, folder, name, vocab)
        if name == "src":
            ids = np.load(folder / "src.ids.npy")
            offsets = np.load(folder / "src.offsets.npy")
            ids[offsets[2] + 1] = special                 # the second token of sentence 2
            np.save(folder / "src.ids.npy", ids)
        return tokens

    monkeypatch.setattr(corpus_module._Side, "write", write_planted)
    name = ["<pad>", "<s>", "</s>"][[PAD_ID, BOS_ID, EOS_ID].index(special)]
    one_line_error(lambda: prepare_corpus(*texts, out, max_len=9, workers=1, overwrite=True),
                   f"src.ids.npy holds the special id {special} ({name}) inside sentence 2")
    assert [ex.src for ex in PreparedCorpus(out)] == old
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_folder_without_a_digest_is_to_be_prepared_again(texts, tmp_path) -> None:
    """Folders of the first format (version 1) carry no digest: refused, never trusted."""
    out = tmp_path / "prep"
    prepare_corpus(*texts, out, workers=1)
    manifest = _manifest(out)
    del manifest["files"], manifest["digest"]
    (out / MANIFEST).write_text(json.dumps({**manifest, "version": 1}))
    one_line_error(lambda: PreparedCorpus(out), "was prepared by an earlier bahdanau and carries "
                   "no digest", "prepare it again with --overwrite")
    one_line_error(lambda: prepare_corpus(*texts, out, workers=1), "--overwrite")
    assert _manifest(prepare_corpus(*texts, out, workers=1, overwrite=True).folder)["version"] == 2


@pytest.mark.parametrize("name, value", [("overwrite", "no"), ("overwrite", 1),
                                         ("strict", "yes")])
def test_flags_must_be_bools(texts, tmp_path, name, value) -> None:
    out = tmp_path / "prep"
    prepare_corpus(*texts, out, workers=1, max_len=2)
    stamp = (out / MANIFEST).read_bytes()
    one_line_error(lambda: prepare_corpus(*texts, out, workers=1, **{name: value}),
                   f"{name} must be True or False, got")
    assert (out / MANIFEST).read_bytes() == stamp      # 'no' never overwrote it


def test_a_sentencepiece_vocabulary_below_its_pieces_is_refused(texts, tmp_path) -> None:
    message = one_line_error(
        lambda: prepare_corpus(*texts, tmp_path / "prep", vocab_size=50,
                               tokenizer=TrainSentencePiece(vocab_size=60)),
        "vocab_size 50 is below the 59 pieces of the SentencePiece model", "<unk>")
    assert "vocab_size None" in message and not (tmp_path / "prep").exists()


def test_cli_sentencepiece_model_keeps_every_piece(tmp_path, capsys) -> None:
    pytest.importorskip("sentencepiece")
    from bahdanau.data import SentencePieceTokenizer, read_lines

    en = read_lines(multi30k_files("train", "en"))[:600]
    fr = read_lines(multi30k_files("train", "fr"))[:600]
    model = SentencePieceTokenizer.train(en + fr, vocab_size=300, model_type="bpe")
    model.save(tmp_path / "m.model")
    src, tgt = _write(tmp_path / "s.txt", en), _write(tmp_path / "t.txt", fr)
    base = ["prepare", "--train-src", str(src), "--train-tgt", str(tgt), "--sentencepiece-model",
            str(tmp_path / "m.model"), "--workers", "1"]
    assert main([*base, "--out", str(tmp_path / "small"), "--vocab-size", "50"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--vocab-size 50" not in err and "vocab_size 50 is below" in err
    assert not (tmp_path / "small").exists()
    assert main([*base, "--out", str(tmp_path / "all")]) == 0        # no --vocab-size: every piece
    corpus = PreparedCorpus(tmp_path / "all")
    unk = corpus.src_vocab.unk_id
    assert all(unk not in ex.src and unk not in ex.tgt for ex in corpus)


@pytest.mark.parametrize("left_out", ["src.ids.npy", "tgt_vocab.json", "lines.npy",
                                      "sentencepiece.model"])
def test_a_manifest_must_seal_every_file_of_the_format(texts, tmp_path, left_out) -> None:
    """A manifest resealed without a file's digest would let that file change unseen."""
    out = tmp_path / "prep"
    if left_out == "sentencepiece.model":
        pytest.importorskip("sentencepiece", reason="a SentencePiece folder needs the extra")
    tokenizer = TrainSentencePiece(vocab_size=12) if left_out == "sentencepiece.model" else None
    prepare_corpus(*texts, out, workers=1, tokenizer=tokenizer, vocab_size=None)
    manifest = _manifest(out)
    del manifest["files"][left_out], manifest["digest"]
    # the manifest's own digest, by hand: SHA-256 of its other fields as canonical JSON
    text = json.dumps(manifest, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    manifest["digest"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    (out / MANIFEST).write_text(json.dumps(manifest))
    one_line_error(lambda: PreparedCorpus(out), f"{out / MANIFEST} seals no digest of "
                   f"{left_out}: the folder is damaged")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_special_token_is_refused_while_encoding_before_out_is_replaced(
        texts, tmp_path, monkeypatch, workers) -> None:
    """A tokenizer that gives "</s>" (here DefaultTokenizer without its escape) is refused at
    the line that gives it, and the corpus already in `out` stays, even with overwrite."""
    out = tmp_path / "prep"
    old = [ex.tgt for ex in prepare_corpus(*texts, out, workers=1)]
    monkeypatch.setattr(DefaultTokenizer, "tokenize", lambda self, text: text.split())
    tgt = _write(tmp_path / "t2.txt", ["x y", "y z w", "x </s> y", "w w"])
    one_line_error(lambda: prepare_corpus(texts[0], tgt, out, workers=workers, overwrite=True),
                   f"{tgt}: line 3: the target's tokenizer gives the token '</s>', the "
                   "vocabulary's special")
    assert [ex.tgt for ex in PreparedCorpus(out)] == old
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
