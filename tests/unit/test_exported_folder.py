"""An exported folder is data, not code: `load_exported` checks it whole and never runs it.

Expectations: an archive member that `torch.export.load` would unpickle, and a string of a
program's graph that it would evaluate, run their code there (shown first, with a harmless
payload that creates a file); `load_exported` refuses a pickled member in one line, and
traces the programs again instead of reading their graphs, so neither runs, even when the
folder's seal was written again to match (as whoever swapped the member would). A file
changed without a new seal, a path that leaves the folder, a symbolic link, and vocabularies
or special ids that do not fit the programs are refused in one line too; an untouched folder
loads and decodes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from training_fixtures import one_line_error

from bahdanau import BeamSearch, presets
from bahdanau._pt2_archive import check_archive
from bahdanau._sealed import manifest_digest, seal
from bahdanau.data.tokenizers import DefaultTokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.models import build_model
from bahdanau.serving import (
    ExportedDecoder,
    export_folder,
    export_programs,
    greedy_decode,
    load_exported,
)


class _Payload:
    """A pickle that, when loaded, creates the file `marker` (what a shell command could do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    vocab = Vocab([f"w{i}" for i in range(12)])
    folder = tmp_path_factory.mktemp("exported") / "model"
    export_folder(build_model(presets.tiny()), vocab, vocab, DefaultTokenizer(), folder)
    return folder


@pytest.fixture
def exported(clean, tmp_path) -> Path:
    """A copy of the exported folder to tamper with."""
    folder = tmp_path / "model"
    folder.mkdir()
    for path in clean.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def _rewrite(archive: Path, replace: dict[str, bytes]) -> None:
    """Rewrite members of a .pt2 archive (names without the archive's top folder); a name that
    is not there is added."""
    with zipfile.ZipFile(archive) as z:
        members = {name: z.read(name) for name in z.namelist()}
    top = next(iter(members)).split("/", 1)[0]
    members.update({f"{top}/{name}": data for name, data in replace.items()})
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _reseal(folder: Path, **fields) -> None:
    """Seal the folder again as it is now, as a forger would."""
    manifest = {k: v for k, v in _manifest(folder).items() if k not in ("files", "digest")}
    seal(folder, {**manifest, **fields})


def _pickle(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_an_untouched_folder_loads_and_decodes(clean) -> None:
    served = load_exported(clean)
    out = greedy_decode(served.encoder, served.step, torch.tensor([[5, 6, 7]]),
                        torch.tensor([3]), bos_id=1, eos_id=2, pad_id=0, max_len=5)
    assert len(out) == 1 and 1 <= len(out[0]) <= 5
    for name in ("encoder.pt2", "step.pt2"):                  # nothing pickled was written
        check_archive((clean / name).read_bytes(), name)
        with zipfile.ZipFile(clean / name) as z:
            inputs = [n for n in z.namelist() if n.endswith("data/sample_inputs/model.pt")]
            assert [z.read(n) for n in inputs] == [b""]


def test_pickled_sample_inputs_never_run(exported, tmp_path) -> None:
    marker = tmp_path / "ran"
    _rewrite(exported / "encoder.pt2", {"data/sample_inputs/model.pt": _pickle(_Payload(marker))})
    with contextlib.suppress(Exception):                      # what loading used to do
        torch.export.load(exported / "encoder.pt2")
    assert marker.exists()                                    # ... runs the payload
    marker.unlink()
    _reseal(exported)
    one_line_error(lambda: load_exported(exported), "encoder.pt2", "pickled sample inputs")
    assert not marker.exists()


@pytest.mark.parametrize("member", ["weight", "constant"])
def test_pickled_tensors_never_run(exported, tmp_path, member) -> None:
    """A weight or constant table entry marked as pickled, pointing at a pickle."""
    marker = tmp_path / "ran"
    table = f"data/{member}s/model_{member}s_config.json"
    with zipfile.ZipFile(exported / "step.pt2") as z:
        name = next(n for n in z.namelist() if n.endswith(table))
        config = json.loads(z.read(name))
    key = "weight_0" if member == "weight" else "tensor_0"
    entry = {"path_name": key, "is_param": False, "use_pickle": True, "tensor_meta": None}
    config["config"]["injected"] = entry
    _rewrite(exported / "step.pt2", {table: json.dumps(config).encode(),
                                     f"data/{member}s/{key}": _pickle(_Payload(marker))})
    _reseal(exported)
    one_line_error(lambda: load_exported(exported), "step.pt2", "'injected'", "unpickle")
    assert not marker.exists()


def test_a_member_no_program_holds_is_refused(exported, tmp_path) -> None:
    marker = tmp_path / "ran"
    _rewrite(exported / "step.pt2",
             {"data/constants/opaque_obj_0": pickle.dumps(_Payload(marker))})
    _reseal(exported)
    one_line_error(lambda: load_exported(exported), "step.pt2",
                   "data/constants/opaque_obj_0", "could run code")
    assert not marker.exists()


def test_a_changed_file_without_a_new_seal(exported) -> None:
    _rewrite(exported / "encoder.pt2", {"extra/note.txt": b"changed"})
    one_line_error(lambda: load_exported(exported), "encoder.pt2", "does not match its digest")
    vocab = json.loads((exported / "tgt_vocab.json").read_text())
    vocab["tokens"][0], vocab["tokens"][1] = vocab["tokens"][1], vocab["tokens"][0]
    (exported / "tgt_vocab.json").write_text(json.dumps(vocab))
    one_line_error(lambda: load_exported(exported), "does not match its digest")


def test_a_changed_manifest_field_without_a_new_seal(exported) -> None:
    manifest = _manifest(exported)
    manifest["eos_id"] = 3
    (exported / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(lambda: load_exported(exported), "manifest.json",
                   "does not match its digest")


def test_special_ids_and_vocabularies_that_do_not_fit(exported) -> None:
    _reseal(exported, eos_id=3)                       # sealed again, but not the vocabularies'
    one_line_error(lambda: load_exported(exported), "do not fit", "eos_id")
    _reseal(exported, eos_id=2)
    vocab = json.loads((exported / "tgt_vocab.json").read_text())
    vocab["tokens"].append("extra")                   # a vocabulary of another model
    (exported / "tgt_vocab.json").write_text(json.dumps(vocab))
    _reseal(exported)
    one_line_error(lambda: load_exported(exported), "do not fit", "tgt_vocab_size")
    _reseal(exported, tgt_vocab_size=17)              # and a manifest made to agree with it
    one_line_error(lambda: load_exported(exported), "tgt_vocab_size 16", "says 17")


def test_a_manifest_s_dtype_that_is_not_the_model_s(exported) -> None:
    _reseal(exported, dtype="float64")
    one_line_error(lambda: load_exported(exported), "dtype 'float32'", "says 'float64'")


def _inject(folder: Path, archive: str, old: str, new: str) -> None:
    """Replace the first `old` in the JSON graph of a program's archive by `new`, sealed."""
    with zipfile.ZipFile(folder / archive) as z:
        name = next(n for n in z.namelist() if n.endswith("models/model.json"))
        graph = z.read(name).decode()
    assert old in graph
    _rewrite(folder / archive, {"models/model.json": graph.replace(old, new, 1).encode()})
    _reseal(folder)


@pytest.mark.parametrize("archive", ["encoder.pt2", "step.pt2"])
def test_code_in_a_program_s_graph_never_runs(exported, tmp_path, archive) -> None:
    """torch.export's JSON graph is code to torch.export.load: its shape expressions go to
    sympy's eval. load_exported traces the programs again from the config and the raw
    weights: the graph is never read."""
    marker = tmp_path / "ran"
    touch = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    with zipfile.ZipFile(exported / archive) as z:
        graph = json.loads(z.read(next(n for n in z.namelist() if n.endswith("model.json"))))
    symbol = "Symbol('" + next(iter(graph["range_constraints"])) + "'"
    _inject(exported, archive, symbol, f"{touch} or {symbol}")
    with contextlib.suppress(Exception):                      # what loading used to do
        torch.export.load(exported / archive).module()
    assert marker.exists()                                    # ... runs it
    marker.unlink()
    served = load_exported(exported)
    assert not marker.exists()
    out = greedy_decode(served.encoder, served.step, torch.tensor([[5, 6, 7]]),
                        torch.tensor([3]), bos_id=1, eos_id=2, pad_id=0, max_len=5)
    assert not marker.exists() and len(out) == 1


@pytest.mark.parametrize("model", ["/etc/hostname", "../outside.model", "sub/tokenizer.model"])
def test_a_tokenizer_model_outside_the_folder(exported, tmp_path, model) -> None:
    (tmp_path / "outside.model").write_bytes(b"not read")
    (exported / "tokenizer.json").write_text(json.dumps({"name": "sentencepiece",
                                                         "model": model}))
    _reseal(exported)
    one_line_error(lambda: load_exported(exported), "tokenizer.json", "'tokenizer.model'")


def test_listed_names_stay_in_the_folder(exported, tmp_path) -> None:
    (tmp_path / "outside.json").write_bytes((exported / "README.md").read_bytes())
    manifest = {k: v for k, v in _manifest(exported).items() if k != "digest"}
    manifest["files"]["../outside.json"] = manifest["files"]["README.md"]
    (exported / "manifest.json").write_text(json.dumps({**manifest,
                                                        "digest": manifest_digest(manifest)}))
    one_line_error(lambda: load_exported(exported), "'../outside.json'", "not a file name")


def test_a_symbolic_link_is_refused(exported, tmp_path) -> None:
    """A link to a file elsewhere, even one with the sealed bytes."""
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes((exported / "src_vocab.json").read_bytes())
    (exported / "src_vocab.json").unlink()
    os.symlink(outside, exported / "src_vocab.json")
    one_line_error(lambda: load_exported(exported), "src_vocab.json", "symbolic link")


def test_an_earlier_unsealed_folder_is_refused(exported) -> None:
    manifest = {k: v for k, v in _manifest(exported).items()
                if k not in ("files", "digest", "version")}
    (exported / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    one_line_error(lambda: load_exported(exported), "earlier bahdanau", "export the model again")


def test_not_an_exported_folder(tmp_path) -> None:
    one_line_error(lambda: load_exported(tmp_path / "missing"), "no such folder")
    (tmp_path / "empty").mkdir()
    one_line_error(lambda: load_exported(tmp_path / "empty"), "not an exported model",
                   "manifest.json")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text('{"format": "bahdanau-model"}')
    one_line_error(lambda: load_exported(tmp_path / "other"), "not the manifest of an exported")


@pytest.mark.parametrize("name", ["manifest.json", "tokenizer.json", "src_vocab.json"])
def test_deeply_nested_json_is_one_line(exported, name) -> None:
    (exported / name).write_text("[" * 200_000 + "]" * 200_000)
    if name != "manifest.json":
        _reseal(exported)
    one_line_error(lambda: load_exported(exported), name)


def test_a_damaged_sentencepiece_model_is_named(exported) -> None:
    (exported / "tokenizer.model").write_bytes(b"not a model")
    (exported / "tokenizer.json").write_text(json.dumps({"name": "sentencepiece",
                                                         "model": "tokenizer.model"}))
    _reseal(exported)
    one_line_error(lambda: load_exported(exported), "tokenizer.model", "SentencePiece")


def test_a_model_assembled_from_parts_is_rebuilt_from_its_record(tmp_path) -> None:
    """A model of bahdanau's parts (no ModelConfig): the manifest holds its build record, and
    load_exported (no trust needed for the library's classes) traces it again to the model's
    greedy tokens; a record of other sizes is refused from the weights' shapes (on the meta
    device, before anything is allocated), and one whose outermost part is no model, in one
    line each."""
    from bahdanau import AdditiveAttention, AttentiveDecoder, BiRNNEncoder, RNNSearch
    from bahdanau.parts import build_record

    torch.manual_seed(3)
    encoder = BiRNNEncoder(vocab_size=16, embed_size=4, hidden_size=4)
    decoder = AttentiveDecoder(vocab_size=16, embed_size=4, hidden_size=4, context_size=8,
                               attention=AdditiveAttention(query_size=4, key_size=8,
                                                           align_size=4),
                               maxout_size=4)
    model = RNNSearch(encoder, decoder).eval()
    vocab = Vocab([f"w{i}" for i in range(12)])
    folder = export_folder(model, vocab, vocab, DefaultTokenizer(), tmp_path / "out")
    record = _manifest(folder)["model_config"]
    assert record == build_record(model)
    served = load_exported(folder)
    src, lengths = torch.tensor([[5, 6, 7, 8], [9, 4, 0, 0], [15, 14, 13, 0]]), torch.tensor(
        [4, 2, 3])
    got = greedy_decode(served.encoder, served.step, src, lengths, bos_id=1, eos_id=2,
                        pad_id=0, max_len=6)
    assert got == [h[0].tokens for h in BeamSearch(beam_size=1, max_len=6)(model, src, lengths)]
    decoder = ExportedDecoder(served.encoder, served.step, served.manifest)   # no config, as
    search = BeamSearch(beam_size=2, max_len=6)                               # the model
    assert decoder.config is None and search.memory_needed(decoder, 3, 4) is None
    assert ([h[0].tokens for h in search(decoder, src, lengths)]
            == [h[0].tokens for h in search(model, src, lengths)])
    record["args"]["decoder"]["args"]["maxout_size"] = 5             # the weights have 4
    _reseal(folder, model_config=record)
    one_line_error(lambda: load_exported(folder), "encoder.pt2",
                   "not those of the manifest's model", "in the manifest")
    _reseal(folder, model_config=record["args"]["decoder"]["args"]["attention"])
    one_line_error(lambda: load_exported(folder), "manifest.json", "AdditiveAttention",
                   "not a model")


def test_the_exported_decoder_estimates_the_model_s_memory(exported) -> None:
    """`ExportedDecoder` is the exported model's `ModelConfig` (the manifest's model_config),
    not one of the default sizes (1000 units each): a search over the programs estimates the
    memory the model's own search does, from a folder (one whose record predates a field too)
    or straight from `export_programs`; a manifest that disagrees with its record is refused in
    one line."""
    model, search = build_model(presets.tiny()), BeamSearch(beam_size=4, max_len=9)
    want = search.memory_needed(model, 3, 7)
    served = load_exported(exported)
    decoder = ExportedDecoder(served.encoder, served.step, served.manifest)
    assert search.memory_needed(decoder, 3, 7) == want
    assert decoder.config == model.config
    programs = export_programs(model)
    decoder = ExportedDecoder(programs.encoder.module(), programs.step.module(),
                              programs.manifest)
    assert search.memory_needed(decoder, 3, 7) == want
    record = {k: v for k, v in served.manifest["model_config"].items() if k != "layer_norm"}
    _reseal(exported, model_config=record)                       # written before layer_norm
    served = load_exported(exported)
    decoder = ExportedDecoder(served.encoder, served.step, served.manifest)
    assert search.memory_needed(decoder, 3, 7) == want
    one_line_error(lambda: ExportedDecoder(served.encoder, served.step,
                                           {**served.manifest, "eos_id": 5}),
                   "the manifest says eos_id 5 but model_config says 2")


@pytest.mark.parametrize("sizes", [{"hidden_size": 1_000_000}, {"maxout_size": 5}])
def test_a_config_of_other_sizes_is_refused_before_it_allocates(exported, sizes) -> None:
    """A million hidden units would take terabytes: refused from the weights' shapes."""
    manifest = _manifest(exported)
    _reseal(exported, model_config={**manifest["model_config"], **sizes})
    one_line_error(lambda: load_exported(exported), "encoder.pt2",
                   "not those of the manifest's model", "in the manifest")


def test_a_weight_of_more_elements_than_its_bytes_is_refused(exported) -> None:
    """Stride 0 over a few bytes would clone into gigabytes: a weight holds at most the
    elements its bytes hold."""
    table = "data/weights/model_weights_config.json"
    with zipfile.ZipFile(exported / "encoder.pt2") as z:
        config = json.loads(z.read(next(n for n in z.namelist() if n.endswith(table))))
    name, entry = next(iter(config["config"].items()))
    entry["tensor_meta"]["sizes"] = [{"as_int": 50_000}, {"as_int": 10_000}]
    entry["tensor_meta"]["strides"] = [{"as_int": 0}, {"as_int": 0}]
    _rewrite(exported / "encoder.pt2", {table: json.dumps(config).encode()})
    _reseal(exported)
    one_line_error(lambda: load_exported(exported), "encoder.pt2", repr(name),
                   "no float tensor within its bytes")
