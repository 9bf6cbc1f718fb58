"""Export for serving: `bahdanau.serving` and `bahdanau export`.

Expectations: decoding from the exported programs alone gives the token ids that `translate`
(`translate_corpus`) gives, sentence for sentence, on 300 sentences of the shipped Multi30k test
set: the plain-torch greedy loop against beam size 1, and `BeamSearch` over the programs
against the default beam of 5. The programs are loaded back from the folder `bahdanau export`
wrote, so what is tested is what a user ships.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest
import torch
from serving_fixtures import shared_checkpoint
from training_fixtures import one_line_error

from bahdanau import __version__, presets
from bahdanau.cli import main
from bahdanau.data import multi30k_files, pad_sources, read_lines
from bahdanau.evaluate import translate_corpus
from bahdanau.models import build_model
from bahdanau.search import BeamSearch, greedy_search
from bahdanau.serving import (
    ExportedDecoder,
    beam_decode,
    export_programs,
    greedy_decode,
    load_exported,
)
from bahdanau.serving.folder import _readme
from bahdanau.translate import load

N_SENTENCES = 300


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    checkpoint = shared_checkpoint(tmp_path_factory)
    folder = tmp_path_factory.mktemp("export") / "served"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(folder)]) == 0
    sentences = read_lines(multi30k_files("test_2016_flickr", "en"))[:N_SENTENCES]
    return load(checkpoint), load_exported(folder), folder, sentences


def test_greedy_loop_gives_translate_tokens(exported) -> None:
    translator, served, _, sentences = exported
    want = [t.hypothesis.tokens for t in translate_corpus(
        translator.model, sentences, translator.src_vocab, translator.tgt_vocab,
        translator.tokenizer, search=BeamSearch(beam_size=1, max_len=50))]
    ids = [served.src_vocab.encode(served.tokenizer.tokenize(s)) for s in sentences]
    got = []
    for start in range(0, len(ids), 64):                 # batches in input order, any lengths
        src, lengths = pad_sources(ids[start:start + 64], served.manifest["pad_id"])
        got += greedy_decode(served.encoder, served.step, src, lengths, max_len=50,
                             **{k: served.manifest[k] for k in ("bos_id", "eos_id", "pad_id")})
    assert got == want
    assert len({tuple(tokens) for tokens in got}) > 1       # not one answer for everything


def test_beam_search_over_the_programs_gives_translate_tokens(exported) -> None:
    translator, served, _, sentences = exported
    model = ExportedDecoder(served.encoder, served.step, served.manifest)
    args = (sentences, served.src_vocab, served.tgt_vocab, served.tokenizer)
    got = translate_corpus(model, *args)                   # the default search: beam 5
    want = translate_corpus(translator.model, *args)
    assert [t.hypothesis.tokens for t in got] == [t.hypothesis.tokens for t in want]
    for g, w in zip(got[:20], want[:20], strict=True):
        assert g.hypothesis.log_prob == pytest.approx(w.hypothesis.log_prob, abs=1e-4)
        torch.testing.assert_close(g.hypothesis.attention, w.hypothesis.attention,
                                   rtol=1e-4, atol=1e-5)


def test_one_sentence_of_one_token(exported) -> None:
    """Dynamic B and S hold down to 1 (the programs were traced at B = 2, S = 5)."""
    translator, served, _, _ = exported
    src, lengths = torch.tensor([[7]]), torch.tensor([1])
    ids = {k: served.manifest[k] for k in ("bos_id", "eos_id", "pad_id")}
    got = greedy_decode(served.encoder, served.step, src, lengths, max_len=20, **ids)
    assert got == [h.tokens for h in greedy_search(translator.model, src, lengths, max_len=20)]


def test_bad_requests_are_refused_before_the_programs_run(exported) -> None:
    """Lengths that disagree with the padding would decode another sentence (row 1 read as 4
    tokens, two of them pads); the others fail inside the programs or loop. Every one is one
    line, from the two loops and from `ExportedDecoder` (which also knows the vocabulary)."""
    _, served, _, _ = exported
    ids = {k: served.manifest[k] for k in ("bos_id", "eos_id", "pad_id")}
    src, lengths = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]]), torch.tensor([4, 4])
    loops = (greedy_decode, beam_decode)
    for loop in loops:
        one_line_error(lambda loop=loop: loop(served.encoder, served.step, src, lengths, **ids),
                       "sentence 1: src_lengths and the padding (pad_id=0) disagree")
    for kwargs, fragment in (({"src_lengths": torch.tensor([2, 0])}, "src_lengths must be in"),
                             ({"src": src[:0], "src_lengths": lengths[:0]}, "no sentence"),
                             ({"src": src.int()}, "src must be a (B, S) int64 tensor"),
                             ({"max_len": 0}, "max_len must be an int >= 1"),
                             ({"beam_size": 0}, "beam_size must be an int >= 1"),
                             ({"length_penalty": "gmnt"}, "length_penalty must be one of")):
        request = {"src": src, "src_lengths": torch.tensor([4, 2]), **ids, **kwargs}
        one_line_error(lambda r=request: beam_decode(served.encoder, served.step, **r),
                       fragment)
    decoder = ExportedDecoder(served.encoder, served.step, served.manifest)
    search = BeamSearch(beam_size=2, max_len=5)
    one_line_error(lambda: search(decoder, src, lengths), "lengths and padding (pad_id=0) "
                   "disagree")
    size = served.manifest["src_vocab_size"]
    one_line_error(lambda: search(decoder, torch.tensor([[size, 6]]), torch.tensor([2])),
                   f"src holds token id {size}, outside the vocabulary of size {size}")


def test_folder_files_and_errors(exported, tmp_path, capsys, tmp_path_factory) -> None:
    _, served, folder, _ = exported
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md", "decode.py", "encoder.pt2", "manifest.json", "src_vocab.json", "step.pt2",
        "tgt_vocab.json", "tokenizer.json"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["memory_tensors"] >= 2 and manifest["attention"] is True
    assert manifest["versions"]["bahdanau"] == __version__       # what exported it
    readme = (folder / "README.md").read_text()
    assert "decode.beam_decode(" in readme and "eos 2" in readme
    assert "encoder.onnx" not in readme
    assert manifest["onnx"] is False
    assert "log_probs (N, V) float32" in readme and "weights (N, S) float32" in readme
    assert "`tokenizer_from_payload` of `bahdanau.data.tokenizers` rebuilds it" in readme
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(folder / "missing.pt"), "--out",
                 str(tmp_path / "x")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(shared_checkpoint(tmp_path_factory)), "--out",
                 str(folder)]) == 2
    assert capsys.readouterr().err == (f"bahdanau: error: {folder} exists: export writes a "
                                       "new folder\n")
    (tmp_path / "partial").mkdir()
    one_line_error(lambda: load_exported(tmp_path / "partial"), "not an exported model",
                   "manifest.json")


def test_an_exported_folder_left_aside_by_a_dead_writer_is_loaded(exported) -> None:
    """load_exported of a folder that an export killed between its renames left aside
    (``.NAME.old-PID``, nothing at its place) puts it back and loads it."""
    _, served, folder, _ = exported
    aside = folder.parent / f".{folder.name}.old-{2**22 + 7}"   # above pid_max: no such process
    os.replace(folder, aside)
    assert load_exported(folder).manifest == served.manifest
    assert folder.is_dir() and not aside.exists()


@pytest.mark.parametrize("command", [
    ["translate", "--checkpoint", "{folder}", "--input", "{tmp}/src.txt"],
    ["score", "--checkpoint", "{folder}", "--src", "{tmp}/src.txt", "--tgt", "{tmp}/src.txt"],
    ["release", "--checkpoint", "{folder}", "--out", "{tmp}/released"],
    ["average", "--checkpoint", "{checkpoint}", "{folder}", "--output", "{tmp}/avg.pt"],
    ["train", "--init-from", "{folder}", "--preset", "tiny", "--max-steps", "1", "--out",
     "{tmp}/run"],
])
def test_an_exported_folder_given_for_a_checkpoint_says_what_it_is(exported, tmp_path, capsys,
                                                                   tmp_path_factory,
                                                                   command) -> None:
    """An exported folder given to --checkpoint (or --init-from) was "not a bahdanau model
    folder's manifest": it is named for what it is, with what loads it and what the option
    takes; nothing is written."""
    folder = exported[2]
    (tmp_path / "src.txt").write_text("a man .\n", encoding="utf-8")
    argv = [arg.format(folder=folder, tmp=tmp_path,
                       checkpoint=shared_checkpoint(tmp_path_factory)) for arg in command]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{folder}: this is an exported model (bahdanau export)" in err, err
    assert "load it with bahdanau.serving.load_exported" in err
    assert "a checkpoint file, a run folder or a model folder" in err
    assert [p.name for p in tmp_path.iterdir()] == ["src.txt"]


def test_an_exported_folder_of_version_1_is_named_too(exported, tmp_path) -> None:
    """The first exported folders' manifest had an integer "format" (1); `bahdanau.load` of one
    names it as an exported model all the same."""
    old = tmp_path / "old-export"
    shutil.copytree(exported[2], old)
    manifest = json.loads((old / "manifest.json").read_text())
    (old / "manifest.json").write_text(json.dumps({**manifest, "format": 1, "version": None}))
    one_line_error(lambda: load(old), f"{old}: this is an exported model (bahdanau export)",
                   "bahdanau.serving.load_exported")


def test_readme_names_the_models_dtype_and_its_sentencepiece_model() -> None:
    """A float64 model's programs give float64 (the manifest's dtype), and a SentencePiece
    tokenizer is rebuilt from tokenizer.model, not from tokenizer.json alone."""
    manifest = {"arch": "rnnsearch", "memory_tensors": 4, "attention": True, "dtype": "float64",
                "pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}
    readme = _readme(manifest, sentencepiece=True)
    assert "log_probs (N, V) float64" in readme and "weights (N, S) float64" in readme
    assert "float32" not in readme
    assert "SentencePiece model `tokenizer.model`" in readme
    assert "tokenizer_from_payload" not in readme


@pytest.mark.slow
@pytest.mark.parametrize("changes", [
    {"engine": "reference", "attention": "luong_general"},
    {"arch": "rnnencdec"},
    {"gru_form": "paper"},
    {"layer_norm": True},
    {"gru_form": "paper", "encoder_layers": 2},
])
def test_other_models_export(changes) -> None:
    """Every engine, attention, architecture and GRU form, layer-normalised or not, with a
    deeper encoder too, exports,
    and greedy decoding from the programs equals `greedy_search` (float64, random weights, a
    batch of other lengths)."""
    torch.manual_seed(0)
    model = build_model(replace(presets.tiny(), **changes)).double().eval()
    for p in model.parameters():
        p.data.normal_(0, 0.5)
    model.decoder.output.bias.data[2] += 4.0        # eos likely early: min_len and caps matter
    programs = export_programs(model)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 10, (32,), generator=gen)
    lengths[0] = 9
    src = torch.randint(4, 16, (32, 9), generator=gen)
    src[torch.arange(9) >= lengths[:, None]] = 0
    got = greedy_decode(programs.encoder.module(), programs.step.module(), src, lengths,
                        bos_id=1, eos_id=2, pad_id=0, max_len=12, min_len=2)
    want = greedy_search(model, src, lengths, max_len=12, min_len=2)
    assert got == [h.tokens for h in want]
    assert len({tuple(tokens) for tokens in got}) > 8       # varied, not one answer
    assert min(map(len, got)) == 2 and max(map(len, got)) == 12   # min_len and the cap bind
    # the step program's first output is the log-softmax of the model's step
    hidden, *memory = programs.encoder.module()(src, lengths)
    state, model_memory = model.encode(src, lengths)
    tokens = torch.full((32,), 1)
    log_probs, next_hidden, *_ = programs.step.module()(tokens, hidden, *memory)
    out = model.step(tokens, state, model_memory)
    torch.testing.assert_close(log_probs, torch.log_softmax(out.logits, -1), rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(next_hidden, out.state.hidden, rtol=1e-10, atol=1e-10)
    assert programs.manifest["attention"] is (changes.get("arch") != "rnnencdec")
