"""Unit tests for bahdanau.translate (`load`, `Translator`) and the tokenizer a checkpoint keeps.

Expectations: a translator loaded from a checkpoint translates as `translate_corpus` does with
the objects that were trained (model, vocabularies, tokenizer), and a checkpoint gives back the
tokenizer it was given (or, for older payloads, the settings written by hand below).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import threading

import pytest
import torch
from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

import bahdanau
from bahdanau import presets
from bahdanau.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint, tokenizer_of
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import (
    DefaultTokenizer,
    SentencePieceTokenizer,
    Vocab,
    WhitespaceTokenizer,
    encode_pairs,
    multi30k_files,
    read_lines,
)
from bahdanau.evaluate import translate_corpus
from bahdanau.models import build_model
from bahdanau.search import BeamSearch
from bahdanau.training import setup_run, train
from bahdanau.training.state import checkpoint_payload

VOCAB = TINY_VOCAB
SEARCH = BeamSearch(beam_size=2, max_len=8)


@pytest.fixture(scope="module")
def sp_run(tmp_path_factory):
    """A tiny model trained 4 steps on SentencePiece pieces of 200 Multi30k pairs."""
    pytest.importorskip("sentencepiece")
    en = read_lines(multi30k_files("train", "en"))[:200]
    fr = read_lines(multi30k_files("train", "fr"))[:200]
    pairs = list(zip(en, fr, strict=True))
    tok = SentencePieceTokenizer.train(en + fr, vocab_size=250, model_type="bpe")
    src_vocab = Vocab.build(tok.tokenize(s) for s in en)
    tgt_vocab = Vocab.build(tok.tokenize(t) for t in fr)
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tok, max_len=80)
    torch.manual_seed(0)
    model = build_model(presets.tiny(len(src_vocab), len(tgt_vocab)))
    out = tmp_path_factory.mktemp("sp") / "run"
    cfg = TrainConfig(optimizer="adam", batch_size=16, max_steps=4, save_every=2, log_every=2)
    train(model, examples, cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
          checkpoint_dir=out / "checkpoints", tokenizer=tok, log=lambda line: None)
    model.eval()
    return {"out": out, "tok": tok, "src_vocab": src_vocab, "tgt_vocab": tgt_vocab,
            "model": model, "sources": read_lines(multi30k_files("val", "en"))[:6]}


def _through_torch(payload: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# ----------------------------------------------------------------------------------------------
# The tokenizer section


def test_every_checkpoint_of_a_run_keeps_its_sentencepiece_tokenizer(sp_run) -> None:
    files = sorted((sp_run["out"] / "checkpoints").glob("step_*.pt"))
    assert [f.name for f in files] == ["step_00000002.pt", "step_00000004.pt"]
    for path in files:
        payload = load_checkpoint(path)
        assert payload["tokenizer"]["name"] == "sentencepiece"
        assert payload["tokenizer"]["model"].numpy().tobytes() == sp_run["tok"].model_proto
        assert payload["extra"] == {}
        assert tokenizer_of(payload) == sp_run["tok"]


def test_sentencepiece_payload_round_trips_through_torch(sp_run) -> None:
    payload = checkpoint_payload(sp_run["model"], src_vocab=sp_run["src_vocab"],
                                 tgt_vocab=sp_run["tgt_vocab"], tokenizer=sp_run["tok"])
    assert tokenizer_of(_through_torch(payload)) == sp_run["tok"]


@pytest.mark.parametrize("tokenizer", [DefaultTokenizer(lowercase=True, joiners="punctuation"),
                                       WhitespaceTokenizer()], ids=["default", "whitespace"])
def test_simple_payload_round_trips_through_torch(tokenizer) -> None:
    payload = checkpoint_payload(tiny_model(), src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 tokenizer=tokenizer)
    back = tokenizer_of(_through_torch(payload))
    assert type(back) is type(tokenizer) and vars(back) == vars(tokenizer)


def test_without_a_tokenizer_there_is_no_section_and_the_default_is_read() -> None:
    payload = checkpoint_payload(tiny_model(), src_vocab=VOCAB, tgt_vocab=VOCAB)
    assert "tokenizer" not in payload
    back = tokenizer_of(payload)
    assert type(back) is DefaultTokenizer
    assert (back.lowercase, back.joiners) == (False, "prefix")


@pytest.mark.parametrize(("settings", "expected"), [
    ({"name": "default", "lowercase": True, "joiners": "punctuation"}, (True, "punctuation")),
    ({"name": "default", "lowercase": False}, (False, "prefix")),    # before joiners existed
    ({"lowercase": True}, (True, "prefix")),
])
def test_older_payloads_give_the_default_tokenizer_of_their_extra(settings, expected) -> None:
    payload = checkpoint_payload(tiny_model(), src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 extra={"tokenizer": settings})
    back = tokenizer_of(_through_torch(payload))
    assert type(back) is DefaultTokenizer and (back.lowercase, back.joiners) == expected


def test_the_section_wins_over_extra() -> None:
    payload = checkpoint_payload(tiny_model(), src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 extra={"tokenizer": {"lowercase": True}},
                                 tokenizer=WhitespaceTokenizer())
    assert type(tokenizer_of(payload)) is WhitespaceTokenizer


def test_unknown_tokenizers_are_one_line() -> None:
    payload = checkpoint_payload(tiny_model(), src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 extra={"tokenizer": {"name": "sentencepiece",
                                                      "src": "sp_en.model"}})
    one_line_error(lambda: tokenizer_of(payload), "checkpoint extra['tokenizer']:", "keys")
    payload = {**payload, "tokenizer": {"name": "moses"}}
    one_line_error(lambda: tokenizer_of(payload),
                   "checkpoint tokenizer: unknown tokenizer 'moses'")


def test_sentencepiece_with_foreign_vocabularies_is_one_line(sp_run, tmp_path) -> None:
    payload = checkpoint_payload(tiny_model(), src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 tokenizer=sp_run["tok"])
    expected = ("checkpoint tokenizer does not fit its vocabularies: src vocabulary entry 'w0' "
                "(id 4) is not a piece of the SentencePiece model")
    one_line_error(lambda: tokenizer_of(payload), expected)
    save_checkpoint(tmp_path / "bad.pt", payload)
    message = one_line_error(lambda: bahdanau.load(tmp_path / "bad.pt"), expected)
    assert message.startswith(str(tmp_path / "bad.pt"))


def test_setup_run_refuses_a_tokenizer_it_cannot_store_or_that_misfits(sp_run, tmp_path) -> None:
    args = (tiny_model(), random_examples(4), TrainConfig(max_steps=1))
    kwargs = {"src_vocab": VOCAB, "tgt_vocab": VOCAB, "checkpoint_dir": tmp_path / "c"}
    one_line_error(lambda: setup_run(*args, **kwargs, tokenizer=object()),
                   "only bahdanau's tokenizers")
    one_line_error(lambda: setup_run(*args, **kwargs, tokenizer=sp_run["tok"]),
                   "src vocabulary entry 'w0' (id 4) is not a piece")
    assert not (tmp_path / "c").exists()


# ----------------------------------------------------------------------------------------------
# load and Translator


def test_load_translates_as_the_trained_objects_do(sp_run) -> None:
    expected = [t.text for t in translate_corpus(
        sp_run["model"], sp_run["sources"], sp_run["src_vocab"], sp_run["tgt_vocab"],
        sp_run["tok"], search=SEARCH)]
    latest = sp_run["out"] / "checkpoints" / "step_00000004.pt"
    for where in (sp_run["out"], sp_run["out"] / "checkpoints", latest):
        translator = bahdanau.load(where)
        assert translator.tokenizer == sp_run["tok"]
        assert (translator.src_vocab, translator.tgt_vocab) == (sp_run["src_vocab"],
                                                                 sp_run["tgt_vocab"])
        assert not translator.model.training
        assert translator.translate(sp_run["sources"], search=SEARCH, batch_size=4) == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        translator.tokenizer = DefaultTokenizer()


def test_translate_command_restores_the_sentencepiece_tokenizer(sp_run, tmp_path,
                                                                capsys) -> None:
    source, align = tmp_path / "in.en", tmp_path / "al.jsonl"
    source.write_text("\n".join(sp_run["sources"]) + "\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(sp_run["out"]), "--input", str(source),
                 "--beam-size", "2", "--max-len", "8", "--alignments", str(align),
                 "--threads", "1"]) == 0
    expected = bahdanau.load(sp_run["out"]).translate(sp_run["sources"], search=SEARCH)
    assert capsys.readouterr().out.splitlines() == expected
    records = [json.loads(line) for line in align.read_text().splitlines()]
    assert [r["source"] for r in records] == [sp_run["tok"].tokenize(s)
                                              for s in sp_run["sources"]]


def test_load_without_a_checkpoint_is_one_line(tmp_path) -> None:
    one_line_error(lambda: bahdanau.load(tmp_path), f"checkpoint {tmp_path}: no checkpoint "
                   "in this folder")
    one_line_error(lambda: bahdanau.load(tmp_path / "x.pt"), "no such file")
    one_line_error(lambda: bahdanau.load(bytes(tmp_path)),     # not a list of byte values
                   "checkpoint must be a path or a non-empty list of paths, got bytes")
    one_line_error(lambda: find_checkpoint(tmp_path, "--checkpoint"),
                   f"--checkpoint {tmp_path}: no checkpoint in this folder")
    (tmp_path / "x.pt").write_bytes(b"not a checkpoint")
    assert find_checkpoint(tmp_path / "x.pt") == tmp_path / "x.pt"
    message = one_line_error(lambda: bahdanau.load(tmp_path / "x.pt"))
    assert message.startswith(str(tmp_path / "x.pt"))


def test_translate_reads_a_fifo_as_input(tmp_path, capsys) -> None:
    """--input a FIFO (what /dev/stdin or <(zcat x.gz) is): no size and no position, so its
    lines are counted; three windows of 20 x --batch-size 1 translate as the same lines read
    from a regular file (the FIFO crashed with 'Illegal seek' after the first window)."""
    checkpoint, regular, fifo = tmp_path / "m.pt", tmp_path / "in.txt", tmp_path / "in.fifo"
    save_checkpoint(checkpoint, checkpoint_payload(tiny_model(), src_vocab=VOCAB,
                                                   tgt_vocab=VOCAB,
                                                   tokenizer=WhitespaceTokenizer()))
    text = "".join(f"w{i % 12} w{(3 * i) % 12}\n" for i in range(45))
    regular.write_text(text, encoding="utf-8")
    argv = ["translate", "--checkpoint", str(checkpoint), "--beam-size", "1", "--max-len", "4",
            "--batch-size", "1", "--threads", "1", "--device", "cpu", "--input"]
    assert main([*argv, str(regular)]) == 0
    expected = capsys.readouterr().out
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=(text,), kwargs={"encoding": "utf-8"})
    writer.start()
    try:
        assert main([*argv, str(fifo)]) == 0
    finally:
        writer.join(timeout=60)
    out = capsys.readouterr().out
    assert out == expected and len(out.splitlines()) == 45
