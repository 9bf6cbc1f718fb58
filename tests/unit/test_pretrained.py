"""Any model saves and loads: `Translator.save_pretrained`, `bahdanau.load` of the folder, and
a model alone: `RNNSearch.save_pretrained`, `RNNSearch.from_pretrained`.

A model assembled from parts with the attention of docs/guides/own-attention.md (its code read
from the guide and written out as an importable module) is trained a few updates, saved, and
reloaded in a fresh process, where Python, ``bahdanau translate --trust-code`` and the model
folder that ``bahdanau release`` makes of it all decode as the model did before it was saved;
``bahdanau export --trust-code --onnx`` of it decodes the same beams with the folder's
``decode.py`` over torch and over onnxruntime in a process without bahdanau, and
`load_exported` reads it in a fresh process with trust_code (one line naming the class
without). A preset model round-trips bit for bit. The refusals are one line each: a class
outside bahdanau without trust (nothing imported), a class that is not there or is not a part,
a weight of another shape, a constructor argument that is not JSON. A model saved alone (a
preset's, and one with the guide's attention) reloads in a fresh process with the same weights
and beams; a folder of another class, a folder of a model alone where a Translator is wanted,
and a missing safetensors package are one line each.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from training_fixtures import one_line_error

import bahdanau
from bahdanau import (
    AttentiveDecoder,
    BeamSearch,
    BiRNNEncoder,
    LuongAttention,
    RNNEncDec,
    RNNSearch,
    Translator,
    presets,
    train_step,
)
from bahdanau.cli import main
from bahdanau.data import Batch, DefaultTokenizer, Vocab, pad_sources
from bahdanau.errors import InputError
from bahdanau.model_folder import write_model_folder
from bahdanau.models import build_model
from bahdanau.parts import blueprint, build_record
from bahdanau.serving.onnx_programs import ONNX_PACKAGES

pytest.importorskip("safetensors", reason="model folders keep their weights as safetensors: "
                    "the share extra")

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "own-attention.md"
if not GUIDE.is_file():
    pytest.skip("docs/ is not next to the tests (installed package)", allow_module_level=True)

SOURCES = ["a b c d", "b a", "c d a", "d c b a"]
HAS_ONNX = all(importlib.util.find_spec(name) for name in ONNX_PACKAGES)
GUIDE_MODULE = "own_attention_guide"


@pytest.fixture(scope="module")
def guide_dir(tmp_path_factory) -> Path:
    """A folder holding the guide's first runnable block as the module `own_attention_guide`,
    importable here (sys.path) and in a fresh process (PYTHONPATH)."""
    blocks = [body for tag, body in re.findall(r"^```([^\n]*)\n(.*?)^```",
                                               GUIDE.read_text(encoding="utf-8"), re.S | re.M)
              if tag.strip() == "python"]
    folder = tmp_path_factory.mktemp("guide")
    (folder / f"{GUIDE_MODULE}.py").write_text(blocks[0], encoding="utf-8")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop(GUIDE_MODULE, None)


def vocabularies() -> tuple[Vocab, Vocab]:
    words = [s.split() for s in SOURCES]
    return Vocab.build(words), Vocab.build(words)


def assembled(attention: torch.nn.Module, src: Vocab, tgt: Vocab) -> RNNSearch:
    return RNNSearch(BiRNNEncoder(len(src), 8, 6),
                     AttentiveDecoder(len(tgt), 8, 10, 12, 4, attention=attention))


def trained(model: RNNSearch, src_vocab: Vocab, steps: int = 5) -> RNNSearch:
    """A few updates of learning to copy SOURCES."""
    ids = [src_vocab.encode(s.split()) for s in SOURCES]
    longest = max(map(len, ids))
    pad = [[0] * (longest - len(s)) for s in ids]
    batch = Batch(torch.tensor([s + p for s, p in zip(ids, pad, strict=True)]),
                  torch.tensor([len(s) for s in ids]),
                  torch.tensor([[1, *s, *p] for s, p in zip(ids, pad, strict=True)]),
                  torch.tensor([[*s, 2, *p] for s, p in zip(ids, pad, strict=True)]),
                  torch.arange(len(ids)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(steps):
        train_step(model, batch, optimizer)
    return model.eval()


def beam_tokens(translator: Translator) -> list[list[int]]:
    return model_beams(translator.model, translator.src_vocab)


def model_beams(model: torch.nn.Module, src_vocab: Vocab) -> list[list[int]]:
    """The best beam of each of SOURCES (beam 3, at most 8 tokens)."""
    out = []
    for sentence in (src_vocab.encode(s.split()) for s in SOURCES):
        hyps = BeamSearch(beam_size=3, max_len=8)(model, torch.tensor([sentence]),
                                                  torch.tensor([len(sentence)]))
        out.append(hyps[0][0].tokens)
    return out


def fresh_env(*paths: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), str(ROOT)])}


@pytest.fixture(scope="module")
def own_model(guide_dir, tmp_path_factory) -> tuple[Translator, Path]:
    """A model assembled with the guide's attention, trained a few updates and saved by
    `Translator.save_pretrained`: (the translator, its folder)."""
    from own_attention_guide import ScaledDotAttention  # type: ignore[import-not-found]
    src_vocab, tgt_vocab = vocabularies()
    torch.manual_seed(0)
    model = trained(assembled(ScaledDotAttention(10, 12, 5), src_vocab, tgt_vocab), src_vocab,
                    steps=30)                   # beams that differ from sentence to sentence
    translator = Translator(model, DefaultTokenizer(), src_vocab, tgt_vocab)
    return translator, translator.save_pretrained(tmp_path_factory.mktemp("own") / "mine")


def test_own_attention_model_reloads_in_a_fresh_process(own_model, guide_dir, tmp_path
                                                        ) -> None:
    """Saved after training, the folder decodes the same beams in a fresh process, and
    translate --trust-code and the released folder give the same text."""
    translator, folder = own_model
    config = json.loads((folder / "config.json").read_text())
    assert config["args"]["decoder"]["args"]["attention"] == {
        "part": f"{GUIDE_MODULE}:ScaledDotAttention",
        "args": {"query_size": 10, "key_size": 12, "align_size": 5}}
    assert main(["release", "--checkpoint", str(folder), "--out", str(tmp_path / "released"),
                 "--trust-code"]) == 0
    expected = {"beams": beam_tokens(translator), "text": translator.translate(SOURCES)}
    script = ("import json, sys, bahdanau\n"
              "from test_pretrained import beam_tokens, SOURCES\n"
              "assert 'own_attention_guide' not in sys.modules\n"
              "out = {}\n"
              "for name in sys.argv[1:]:\n"
              "    t = bahdanau.load(name, trust_code=True)\n"
              "    out[name] = {'beams': beam_tokens(t), 'text': t.translate(SOURCES)}\n"
              "print(json.dumps(out))\n")
    env = fresh_env(guide_dir, Path(__file__).parent, ROOT / "tests")
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(tmp_path / "released")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reloaded = json.loads(done.stdout)
    assert reloaded == {str(folder): expected, str(tmp_path / "released"): expected}
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    cli = subprocess.run([sys.executable, "-m", "bahdanau", "translate", "--checkpoint",
                          str(folder), "--input", str(src), "--trust-code", "--device", "cpu"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == expected["text"]


# Run with `python -I` (no PYTHONPATH: neither bahdanau nor the guide's module can be imported):
# decodes the batch on stdin with the exported folder's decode.py over its programs, read by
# torch alone and by onnxruntime.
_ISOLATED_BEAMS = """
import json, runpy, sys
folder, runtimes = sys.argv[1], sys.argv[2:]
batch = json.loads(sys.stdin.read())
decode = runpy.run_path(folder + "/decode.py")
import torch
out = {}
for runtime in runtimes:
    encoder, step, manifest = decode["load_programs"](folder, runtime)
    ids = {k: manifest[k] for k in ("bos_id", "eos_id", "pad_id")}
    out[runtime] = decode["beam_decode"](encoder, step, torch.tensor(batch["src"]),
                                         torch.tensor(batch["lengths"]), beam_size=3,
                                         max_len=8, **ids)
out["imported"] = sorted(m for m in sys.modules
                         if m.split(".")[0] in ("bahdanau", "own_attention_guide"))
print(json.dumps(out))
"""

# Run in a fresh process with the guide's module importable: load_exported refuses the folder
# without trust (importing nothing), then traces it again with trust_code and beam-decodes.
_FRESH_EXPORTED = """
import json, sys, torch
from bahdanau.errors import InputError
from bahdanau.serving import beam_decode, load_exported
folder, batch = sys.argv[1], json.loads(sys.stdin.read())
try:
    load_exported(folder)
    refused = None
except InputError as err:
    refused = str(err)
imported = "own_attention_guide" in sys.modules
m = load_exported(folder, trust_code=True)
ids = {k: m.manifest[k] for k in ("bos_id", "eos_id", "pad_id")}
beams = beam_decode(m.encoder, m.step, torch.tensor(batch["src"]),
                    torch.tensor(batch["lengths"]), beam_size=3, max_len=8, **ids)
print(json.dumps({"refused": refused, "imported_when_refused": imported, "beams": beams}))
"""


def test_own_attention_model_exports_and_decodes_without_bahdanau(own_model, guide_dir,
                                                                  tmp_path) -> None:
    """bahdanau export --trust-code --onnx of the saved folder: decode.py's beam search over
    the torch programs and over onnxruntime, in a process without bahdanau, gives the
    library's BeamSearch tokens on the model; load_exported in a fresh process refuses the
    folder in one line naming the class without trust, and with trust_code traces the same
    model again."""
    translator, folder = own_model
    onnx = ["--onnx"] if HAS_ONNX else []
    served = tmp_path / "served"
    assert main(["export", "--checkpoint", str(folder), "--out", str(served), "--trust-code",
                 *onnx]) == 0
    manifest = json.loads((served / "manifest.json").read_text())
    assert (manifest["model_config"]["args"]["decoder"]["args"]["attention"]["part"]
            == f"{GUIDE_MODULE}:ScaledDotAttention")
    want = beam_tokens(translator)
    assert len({tuple(tokens) for tokens in want}) > 1          # not one answer for all
    src, lengths = pad_sources([translator.src_vocab.encode(s.split()) for s in SOURCES],
                               translator.src_vocab.pad_id)
    batch = json.dumps({"src": src.tolist(), "lengths": lengths.tolist()})
    runtimes = ["torch", "onnx"] if HAS_ONNX else ["torch"]
    alone = subprocess.run([sys.executable, "-I", "-c", _ISOLATED_BEAMS, str(served), *runtimes],
                           input=batch, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert json.loads(alone.stdout) == {**{runtime: want for runtime in runtimes},
                                        "imported": []}
    env = fresh_env(guide_dir, ROOT)
    fresh = subprocess.run([sys.executable, "-c", _FRESH_EXPORTED, str(served)], input=batch,
                           env=env, capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    got = json.loads(fresh.stdout)
    assert got["beams"] == want and got["imported_when_refused"] is False
    refused = got["refused"]
    assert refused is not None and "\n" not in refused
    assert all(part in refused for part in (str(served), f"{GUIDE_MODULE}:ScaledDotAttention",
                                             "trust_code=True")), refused


def test_a_preset_model_round_trips_exactly(tmp_path) -> None:
    src_vocab, tgt_vocab = vocabularies()
    torch.manual_seed(1)
    model = build_model(presets.tiny(len(src_vocab), len(tgt_vocab))).eval()
    translator = Translator(model, DefaultTokenizer(), src_vocab, tgt_vocab)
    folder = translator.save_pretrained(tmp_path / "preset")
    assert json.loads((folder / "config.json").read_text()) == model.config.to_dict()
    back = Translator.from_pretrained(folder)
    assert back.model.config == model.config
    theirs = back.model.state_dict()
    assert all(torch.equal(w, theirs[k]) for k, w in model.state_dict().items())
    assert beam_tokens(back) == beam_tokens(translator)


def _resealed(folder: Path, name: str, text: str) -> None:
    """Write `name` into the model folder and its new digest into the manifest."""
    (folder / name).write_text(text, encoding="utf-8")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


@pytest.fixture
def own_folder(tmp_path) -> tuple[Path, type]:
    """A model folder whose attention comes from a module of its own, then forgotten."""
    (tmp_path / "untrusted_attention.py").write_text(
        "from bahdanau import LuongAttention\n\n"
        "class Untrusted(LuongAttention):\n"
        "    def score(self, query, keys):\n"
        "        return super().score(query, keys)\n", encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        from untrusted_attention import Untrusted  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("untrusted_attention")
    src_vocab, tgt_vocab = vocabularies()
    model = assembled(Untrusted(10, 12), src_vocab, tgt_vocab).eval()
    folder = Translator(model, DefaultTokenizer(), src_vocab, tgt_vocab).save_pretrained(
        tmp_path / "own")
    return folder, Untrusted


def test_a_class_outside_bahdanau_needs_trust(own_folder, capsys, monkeypatch) -> None:
    """Refused in one line naming the class and how to allow it, before anything is imported
    (by translate, export and score too, which take --trust-code);
    given as `parts`, it loads without an import (the subclass without an __init__ of its own
    is recorded with its parent's arguments)."""
    folder, cls = own_folder
    one_line_error(lambda: bahdanau.load(folder), "untrusted_attention:Untrusted",
                   "trust_code=True", "parts=")
    assert "untrusted_attention" not in sys.modules
    src, tgt = folder.parent / "score.src", folder.parent / "score.tgt"
    src.write_text("a b\n", encoding="utf-8")
    tgt.write_text("c d\n", encoding="utf-8")
    for command in (["translate"], ["export", "--out", str(folder.parent / "served")],
                    ["score", "--src", str(src), "--tgt", str(tgt)]):
        assert main([*command, "--checkpoint", str(folder)]) != 0
        error = capsys.readouterr().err
        assert "--trust-code" in error and len(error.splitlines()) == 1, error
        assert "untrusted_attention:Untrusted" in error
    assert not (folder.parent / "served").exists()
    loaded = bahdanau.load(folder, parts={"untrusted_attention:Untrusted": cls})
    assert type(loaded.model.decoder.attention) is cls
    assert loaded.model.decoder.attention.built_with == {"query_size": 10, "key_size": 12,
                                                         "form": "general"}
    assert "untrusted_attention" not in sys.modules
    monkeypatch.syspath_prepend(str(folder.parent))            # trusted: imported, and runs
    try:
        assert main(["score", "--checkpoint", str(folder), "--src", str(src), "--tgt", str(tgt),
                     "--trust-code"]) == 0
        assert "untrusted_attention" in sys.modules
    finally:
        sys.modules.pop("untrusted_attention", None)


@pytest.mark.parametrize(("path", "message"), [
    ("bahdanau.attention:NoSuchAttention", "has no NoSuchAttention"),
    ("no_such_module_here:Attention", "cannot be imported"),
    ("bahdanau.errors:InputError", "not a part of a model"),
])
def test_a_config_naming_a_class_that_is_not_a_part_is_refused(own_folder, path,
                                                                message) -> None:
    folder, _ = own_folder
    config = json.loads((folder / "config.json").read_text())
    config["args"]["decoder"]["args"]["attention"]["part"] = path
    _resealed(folder, "config.json", json.dumps(config))
    one_line_error(lambda: bahdanau.load(folder, trust_code=True), str(folder), path, message)


def test_a_weight_of_another_shape_is_refused(own_folder) -> None:
    folder, cls = own_folder
    config = json.loads((folder / "config.json").read_text())
    config["args"]["decoder"]["args"]["maxout_size"] = 5
    _resealed(folder, "config.json", json.dumps(config))
    one_line_error(lambda: bahdanau.load(folder, parts={"untrusted_attention:Untrusted": cls}),
                   str(folder), "has shape", "the model's has")


class Tempered(LuongAttention):
    """A Luong attention whose energies are divided by a temperature."""

    def __init__(self, query_size: int, key_size: int, temperature: object) -> None:
        super().__init__(query_size, key_size)
        self.temperature = temperature

    def score(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return super().score(query, keys) / self.temperature


def test_a_constructor_argument_that_is_not_json_is_refused_at_save(tmp_path) -> None:
    src_vocab, tgt_vocab = vocabularies()
    model = assembled(Tempered(10, 12, torch.tensor(2.0)), src_vocab, tgt_vocab)
    translator = Translator(model, DefaultTokenizer(), src_vocab, tgt_vocab)
    one_line_error(lambda: translator.save_pretrained(tmp_path / "t"),
                   "model.decoder.attention.temperature", "Tensor")
    assert not (tmp_path / "t").exists()
    record = build_record(assembled(Tempered(10, 12, 2.0), src_vocab, tgt_vocab))
    rebuilt = blueprint(json.loads(json.dumps(record)),
                        parts={f"{__name__}:Tempered": Tempered}).build()
    assert rebuilt.decoder.attention.temperature == 2.0


def test_a_part_records_its_own_class_and_arguments() -> None:
    """Recorded by the object's own __init__, defaults filled in; a subclass's __init__ that
    calls its parent's records only its own arguments."""
    attention = Tempered(10, 12, temperature=3.0)
    assert attention.built_with == {"query_size": 10, "key_size": 12, "temperature": 3.0}
    assert LuongAttention(4, 6).built_with == {"query_size": 4, "key_size": 6, "form": "general"}
    with pytest.raises(InputError):
        build_record(torch.nn.Linear(2, 2))


# A model alone: `save_pretrained` and `from_pretrained` on the model classes.

_FRESH_LOAD = """
import json, sys, torch
from bahdanau import RNNSearch
from test_pretrained import model_beams, vocabularies
assert 'own_attention_guide' not in sys.modules
model = RNNSearch.from_pretrained(sys.argv[1], trust_code=True)
torch.save(model.state_dict(), sys.argv[2])
print(json.dumps({"class": type(model).__name__, "training": model.training,
                  "attention": type(model.decoder.attention).__name__,
                  "beams": model_beams(model, vocabularies()[0])}))
"""


@pytest.mark.parametrize("kind", ["preset", "own attention"])
def test_a_model_saves_itself_and_loads_in_a_fresh_process(kind, guide_dir, tmp_path) -> None:
    """model.save_pretrained writes the model alone (config.json, model.safetensors, the
    manifest); RNNSearch.from_pretrained in a fresh process gives the same weights, bit for
    bit, and the same beams (the guide's attention imported there only by trust_code)."""
    from own_attention_guide import ScaledDotAttention  # type: ignore[import-not-found]
    src_vocab, tgt_vocab = vocabularies()
    torch.manual_seed(2)
    model = trained(build_model(presets.tiny(len(src_vocab), len(tgt_vocab))) if kind == "preset"
                    else assembled(ScaledDotAttention(10, 12, 5), src_vocab, tgt_vocab),
                    src_vocab)
    folder = model.save_pretrained(tmp_path / "model")
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "manifest.json", "model.safetensors"]
    env = fresh_env(guide_dir, Path(__file__).parent, ROOT / "tests")
    done = subprocess.run([sys.executable, "-c", _FRESH_LOAD, str(folder),
                           str(tmp_path / "weights.pt")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "class": "RNNSearch", "training": False,
        "attention": type(model.decoder.attention).__name__,
        "beams": model_beams(model, src_vocab)}
    theirs = torch.load(tmp_path / "weights.pt", weights_only=True)
    ours = model.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], w) for k, w in ours.items())


def test_a_model_loads_from_a_translators_folder_and_not_the_other_way(own_folder) -> None:
    """RNNSearch.from_pretrained reads the model half of a Translator's folder; bahdanau.load
    of a model saved alone says, in one line, that a Translator needs vocabularies."""
    folder, cls = own_folder
    translator = bahdanau.load(folder, parts={"untrusted_attention:Untrusted": cls})
    model = RNNSearch.from_pretrained(folder, parts={"untrusted_attention:Untrusted": cls})
    assert type(model.decoder.attention) is cls
    theirs = model.state_dict()
    assert all(torch.equal(theirs[k], w) for k, w in translator.model.state_dict().items())
    alone = model.save_pretrained(folder.parent / "alone")
    one_line_error(lambda: bahdanau.load(alone, parts={"untrusted_attention:Untrusted": cls}),
                   str(alone), "holds a model alone", "Translator.save_pretrained",
                   "RNNSearch.from_pretrained")


def test_a_folder_of_another_class_is_refused(own_folder, tmp_path) -> None:
    src_vocab, tgt_vocab = vocabularies()
    encdec = build_model(replace(presets.tiny(len(src_vocab), len(tgt_vocab)), arch="rnnencdec"))
    folder = encdec.save_pretrained(tmp_path / "encdec")
    assert type(RNNEncDec.from_pretrained(folder)) is RNNEncDec
    one_line_error(lambda: RNNSearch.from_pretrained(folder), str(folder),
                   "its model is RNNEncDec", "arch 'rnnencdec'", "not RNNSearch",
                   "RNNEncDec.from_pretrained")
    parts_folder, cls = own_folder
    one_line_error(lambda: RNNEncDec.from_pretrained(parts_folder, parts={
        "untrusted_attention:Untrusted": cls}), str(parts_folder), "its model is RNNSearch",
        "not RNNEncDec", "RNNSearch.from_pretrained")


def test_weights_of_another_shape_are_refused_before_loading(tmp_path) -> None:
    src_vocab, tgt_vocab = vocabularies()
    config = presets.tiny(len(src_vocab), len(tgt_vocab))
    wider = build_model(presets.tiny(len(src_vocab) + 1, len(tgt_vocab)))
    folder = write_model_folder(tmp_path / "m", wider.state_dict(), config.to_dict())
    one_line_error(lambda: RNNSearch.from_pretrained(folder), str(folder),
                   "its weights do not fit the model", "'encoder.embedding.weight' has shape "
                   f"({len(src_vocab) + 1}, {config.embed_size})")


def test_without_safetensors_saving_and_loading_say_what_to_install(tmp_path,
                                                                    monkeypatch) -> None:
    src_vocab, tgt_vocab = vocabularies()
    model = build_model(presets.tiny(len(src_vocab), len(tgt_vocab)))
    folder = model.save_pretrained(tmp_path / "m")
    monkeypatch.setitem(sys.modules, "safetensors", None)      # import safetensors fails
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    one_line_error(lambda: model.save_pretrained(tmp_path / "new"), "bahdanau[share]")
    assert not (tmp_path / "new").exists()
    one_line_error(lambda: RNNSearch.from_pretrained(folder), str(folder), "bahdanau[share]")


@pytest.mark.parametrize(("command", "why"), [
    (["average", "--checkpoint", "{folder}", "{copy}", "--output", "{out}.pt"],
     "an average is a checkpoint of one ModelConfig"),
    (["train", "--init-from", "{folder}", "--train-src", "{text}", "--train-tgt", "{text}",
      "--out", "{out}", "--max-steps", "1"],
     "train --init-from builds the new run's model from a preset"),
])
def test_what_needs_a_model_config_refuses_parts_saying_why(own_folder, tmp_path, capsys,
                                                           command, why) -> None:
    """average and train --init-from refuse a model assembled from parts in one line
    saying why, before its classes are looked up (so trust is never suggested: it would not
    help), and write nothing."""
    folder, _ = own_folder
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in folder.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    text = tmp_path / "text.txt"
    text.write_text("a b\n", encoding="utf-8")
    argv = [a.format(folder=folder, copy=copy, out=tmp_path / "out", text=text) for a in command]
    assert main(argv) != 0
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert f"{folder}: holds a model assembled from parts" in error and why in error, error
    assert "trust" not in error and "untrusted_attention" not in sys.modules
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.pt").exists()


def test_a_record_is_never_a_way_to_import_a_module_of_the_package() -> None:
    """Without trust, a record's class is one of bahdanau's parts, found among the classes
    already defined: a record naming another module of the package (`bahdanau.__main__` runs
    the command line when imported) is one line, and that module is not imported (the
    library's own parts: test_exported_folder.py)."""
    code = (
        "import sys\n"
        "from bahdanau.errors import InputError\n"
        "from bahdanau.parts import blueprint\n"
        "for path in ('bahdanau.__main__:main', 'bahdanau.cli.commands:translate'):\n"
        "    before = set(sys.modules)\n"
        "    try:\n"
        "        blueprint({'part': path, 'args': {}})\n"
        "    except InputError as error:\n"
        "        print(str(error).count(chr(10)), path in str(error),\n"
        "              sorted(set(sys.modules) - before))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout == "0 True []\n0 True []\n", out.stderr


def test_a_model_whose_parts_are_not_its_configs_is_not_saved_as_its_config(tmp_path) -> None:
    """A preset's model whose attention was swapped after it was built: saved as its config,
    it would load with the config's attention (and the same shapes, so silently); it is one
    line naming the part instead, and nothing is written."""
    from bahdanau.attention import AdditiveAttention

    class Swapped(AdditiveAttention):
        def score(self, query, keys):
            return -super().score(query, keys)

    model = build_model(presets.tiny(12, 14))
    model.save_pretrained(tmp_path / "plain")                     # its own parts: saved
    old = model.decoder.attention
    model.decoder.attention = Swapped(old.query_size, old.key_size, old.align_size)
    one_line_error(lambda: model.save_pretrained(tmp_path / "swapped"),
                   "model.decoder.attention is Swapped, but its config builds AdditiveAttention")
    assert not (tmp_path / "swapped").exists()
