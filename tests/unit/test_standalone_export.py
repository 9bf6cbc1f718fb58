"""An exported folder that stands alone: its programs and ``decode.py`` run with torch (or
onnxruntime) and no `bahdanau`, and decode as the library does.

Expectations: the tokens of `bahdanau.search.BeamSearch` on the model itself (beam 5 and the
default length penalty, and beam 1 for the greedy loop), sentence for sentence; on a tiny
trained model through the folder `bahdanau export` wrote, read in a fresh process that never
imports `bahdanau` (checked in its `sys.modules`), and on random float64 models whose outputs
vary widely, where every rule of the search (ties, early stopping, the cap, min_len, the
length penalties) decides something (the tiny trained model's beam, unlike its greedy search,
ends most sentences the same short way).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from serving_fixtures import shared_checkpoint
from training_fixtures import one_line_error

from bahdanau import presets
from bahdanau.cli import main
from bahdanau.data import multi30k_files, pad_sources, read_lines
from bahdanau.errors import InputError
from bahdanau.models import build_model
from bahdanau.search import LENGTH_PENALTIES, BeamSearch, refuse_nan_scores
from bahdanau.serving import beam_decode, decode, export_programs, greedy_decode, onnx_programs
from bahdanau.translate import load

HAS_ONNX = all(importlib.util.find_spec(name) for name in onnx_programs.ONNX_PACKAGES)
N_SENTENCES = 32          # of the first 300 test sentences, those of the most varied outputs

# Run with `python -I` (no PYTHONPATH, no current folder, no user site): loads the folder's
# programs with torch alone and decodes the batch on stdin with the folder's decode.py.
ISOLATED = """
import json, runpy, sys
folder, runtime = sys.argv[1], sys.argv[2]
batch = json.loads(sys.stdin.read())
decode = runpy.run_path(folder + "/decode.py")
import torch
encoder, step, manifest = decode["load_programs"](folder, runtime)
ids = {k: manifest[k] for k in ("bos_id", "eos_id", "pad_id")}
src, lengths = torch.tensor(batch["src"]), torch.tensor(batch["lengths"])
out = {"greedy": decode["greedy_decode"](encoder, step, src, lengths, max_len=50, **ids),
       "beam": decode["beam_decode"](encoder, step, src, lengths, **ids)}
out["bahdanau_imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "bahdanau")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The shared tiny model exported by `bahdanau export` (with --onnx where the extra is),
    a batch of test sentences, and the library's greedy and beam tokens for it."""
    checkpoint = shared_checkpoint(tmp_path_factory)
    folder = tmp_path_factory.mktemp("standalone") / "served"
    onnx = ["--onnx"] if HAS_ONNX else []
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(folder), *onnx]) == 0
    t = load(checkpoint)
    sentences = read_lines(multi30k_files("test_2016_flickr", "en"))[:300]
    ids = [t.src_vocab.encode(t.tokenizer.tokenize(s)) for s in sentences]
    greedy = BeamSearch(beam_size=1, max_len=50)
    outputs = [h[0].tokens for h in greedy(t.model, *pad_sources(ids, t.src_vocab.pad_id))]
    first = {tuple(tokens): i for i, tokens in reversed(list(enumerate(outputs)))}
    chosen = sorted(first.values())[:N_SENTENCES]          # one sentence of each output
    chosen += [i for i in range(len(ids)) if i not in chosen][:N_SENTENCES - len(chosen)]
    src, lengths = pad_sources([ids[i] for i in chosen], t.src_vocab.pad_id)
    want = {"greedy": [outputs[i] for i in chosen],
            "beam": [h[0].tokens for h in BeamSearch()(t.model, src, lengths)]}
    assert len({tuple(tokens) for tokens in want["greedy"]}) > 1   # not one answer for all
    return folder, src, lengths, want


def isolated_decode(folder: Path, runtime: str, src: torch.Tensor, lengths: torch.Tensor
                    ) -> dict:
    batch = json.dumps({"src": src.tolist(), "lengths": lengths.tolist()})
    done = subprocess.run([sys.executable, "-I", "-c", ISOLATED, str(folder), runtime],
                          input=batch, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_programs_run_without_bahdanau(exported) -> None:
    """torch.export.load of the folder's programs and its decode.py, in a process that never
    imports bahdanau: the library's greedy and beam tokens."""
    folder, src, lengths, want = exported
    got = isolated_decode(folder, "torch", src, lengths)
    assert got["bahdanau_imported"] == []
    assert got["greedy"] == want["greedy"]
    assert got["beam"] == want["beam"]


def test_the_onnx_programs_give_the_same_tokens(exported) -> None:
    """onnxruntime over encoder.onnx and step.onnx (bahdanau export --onnx), without bahdanau:
    the library's greedy and beam tokens."""
    pytest.importorskip("onnxruntime")
    if not HAS_ONNX:
        pytest.skip("the onnx extra is not installed (pip install 'bahdanau[onnx]')")
    folder, src, lengths, want = exported
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["onnx"] is True and {"encoder.onnx", "step.onnx"} <= set(manifest["files"])
    got = isolated_decode(folder, "onnx", src, lengths)
    assert got["bahdanau_imported"] == []
    assert got["greedy"] == want["greedy"]
    assert got["beam"] == want["beam"]


def test_the_decode_file_is_the_module_and_imports_torch_alone(exported) -> None:
    folder = exported[0]
    source = inspect.getsource(decode)
    assert (folder / "decode.py").read_text() == source
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported == {"__future__", "json", "pathlib", "typing", "torch", "onnxruntime"}


def test_the_decode_file_knows_the_library_s_length_penalties() -> None:
    """decode.py imports torch alone, so it names the penalties itself: the same as the
    library's, or `check_request` would refuse one the library decodes, or pass a new one."""
    assert decode.PENALTIES == LENGTH_PENALTIES


def random_model(changes: dict, seed: int) -> torch.nn.Module:
    """A float64 tiny model with large random weights: varied outputs, eos often early."""
    torch.manual_seed(seed)
    model = build_model(replace(presets.tiny(), **changes)).double().eval()
    for p in model.parameters():
        p.data.normal_(0, 0.5)
    model.decoder.output.bias.data[2] += 2.0           # eos likely early: min_len, caps matter
    return model


def random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 10, (24,), generator=gen)
    lengths[0] = 9
    src = torch.randint(4, 16, (24, 9), generator=gen)
    src[torch.arange(9) >= lengths[:, None]] = 0
    return src, lengths


@pytest.mark.parametrize(("changes", "search"), [
    ({}, {}),
    ({}, {"beam_size": 3, "length_penalty": "average", "min_len": 2, "max_len": 7}),
    ({"arch": "rnnencdec"}, {"length_penalty": "gnmt", "alpha": 1.0, "max_len": 9}),
])
def test_beam_decode_equals_beam_search(changes, search) -> None:
    """`beam_decode` over the programs gives `BeamSearch`'s best hypothesis on the model."""
    model = random_model(changes, seed=0)
    programs = export_programs(model)
    src, lengths = random_batch(seed=1)
    want = [h[0].tokens for h in BeamSearch(**search)(model, src, lengths)]
    got = beam_decode(programs.encoder.module(), programs.step.module(), src, lengths,
                      bos_id=1, eos_id=2, pad_id=0, **search)
    assert got == want
    assert len({tuple(tokens) for tokens in want}) > 8       # varied, not one answer
    lengths_found = {len(tokens) for tokens in want}
    assert len(lengths_found) > 1
    if "max_len" in search:                                  # the cap and min_len bind
        assert max(lengths_found) == search["max_len"]
    assert min(lengths_found) >= search.get("min_len", 1)


def test_the_loops_refuse_nan_scores_as_the_library_does() -> None:
    """decode.py's own error carries the library's message; through `bahdanau.serving` both
    loops raise the library's one-line InputError."""
    with pytest.raises(InputError) as library:
        refuse_nan_scores(True)
    assert str(decode.NaNScores()) == str(library.value)

    def encoder(src: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(src.shape[0], 3), torch.zeros(src.shape[0], src.shape[1])

    def step(tokens: torch.Tensor, hidden: torch.Tensor, memory: torch.Tensor):
        log_probs = torch.full((tokens.shape[0], 6), -5.0)
        log_probs[:, 4] = -0.1
        log_probs[-1, 5] = float("nan")                        # one row of the last sentence
        return log_probs, hidden

    src, ids = torch.tensor([[4, 5], [5, 4]]), {"bos_id": 1, "eos_id": 2, "pad_id": 0}
    for loop in (greedy_decode, beam_decode):
        one_line_error(lambda loop=loop: loop(encoder, step, src, torch.tensor([2, 2]), **ids),
                       "the model's scores are NaN")
    with pytest.raises(decode.NaNScores):
        decode.beam_decode(encoder, step, src, torch.tensor([2, 2]), **ids)


def test_onnx_without_the_extra_is_one_line(monkeypatch, tmp_path, capsys, tmp_path_factory
                                            ) -> None:
    monkeypatch.setattr(onnx_programs, "ONNX_PACKAGES", ("onnx", "no_such_onnx_package"))
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(shared_checkpoint(tmp_path_factory)),
                 "--out", str(tmp_path / "served"), "--onnx"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_onnx_package" in err
    assert "pip install 'bahdanau[onnx]'" in err
    assert not (tmp_path / "served").exists()
