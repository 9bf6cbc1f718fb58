"""An exported folder: the programs, vocabularies, tokenizer, README and a sealed manifest.

See `bahdanau.serving`: `export_folder` writes it, `load_exported` reads it back as data.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from bahdanau._about import versions
from bahdanau._checks import JSON_ERRORS, is_int
from bahdanau._files import (
    atomic_write,
    check_destination,
    held,
    new_folder,
    restore_replaced,
)
from bahdanau._folders import (
    CARD,
    DECODE_FILE,
    ENCODER_ONNX,
    ENCODER_PROGRAM,
    EXPORTED_FORMAT,
    FOLDER_SENTENCEPIECE,
    MANIFEST,
    SRC_VOCAB_FILE,
    STEP_ONNX,
    STEP_PROGRAM,
    TGT_VOCAB_FILE,
    TOKENIZER_FILE,
    Kind,
    check_folder_to_write,
)
from bahdanau._pt2_archive import archive_weights, check_archive, program_bytes
from bahdanau._sealed import check_sealed, seal
from bahdanau.config import SPECIAL_IDS, ModelConfig
from bahdanau.data.sentencepiece import SentencePieceTokenizer
from bahdanau.data.tokenizers import Tokenizer, tokenizer_files, tokenizer_from_payload
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.model_folder import model_config_json, model_skeleton
from bahdanau.models import RNNSearch, build_model, model_class
from bahdanau.parts import PART, blueprint
from bahdanau.serving import decode
from bahdanau.serving.onnx_programs import check_onnx, onnx_bytes
from bahdanau.serving.programs import (
    EXPORTED_VERSION,
    MIN_SRC_LEN,
    export_programs,
    interface,
    one_model,
)

__all__ = ["DECODE_FILE", "FILES", "ONNX_FILES", "SENTENCEPIECE_FILE", "ExportedModel",
           "check_new_folder", "export_folder", "load_exported"]


# The files of an exported folder (`export_folder`), by what they hold; the names are declared
# in `bahdanau._folders`, with those of every folder the commands write.
FILES = {"encoder": ENCODER_PROGRAM, "step": STEP_PROGRAM, "manifest": MANIFEST,
         "src_vocab": SRC_VOCAB_FILE, "tgt_vocab": TGT_VOCAB_FILE,
         "tokenizer": TOKENIZER_FILE, "readme": CARD}
# A SentencePiece tokenizer's model beside its JSON, as in a model folder (a prepared corpus
# names it `bahdanau.data.tokenizers.SENTENCEPIECE_FILE`).
SENTENCEPIECE_FILE = FOLDER_SENTENCEPIECE
# The decoding loops in plain torch (`bahdanau.serving.decode`, copied as `DECODE_FILE`), for
# the user: sealed, never read by `load_exported`, as the ONNX programs
# (``export_folder(onnx=True)``).
ONNX_FILES = {"encoder": ENCODER_ONNX, "step": STEP_ONNX}
PROGRAMS = ("encoder", "step")


def check_new_folder(folder: str | os.PathLike[str]) -> Path:
    """`folder` as `export_folder` writes it: absent or empty (by the rule of every folder
    writer, `bahdanau._folders.check_folder_to_write`: never a folder of another kind or of
    other files, nor one inside a model folder, a prepared corpus or an exported folder), in a
    place that can be replaced by renaming (`bahdanau._files.check_destination`: not the
    current folder, a mount point or a dangling link, a parent that is not a file; a parent
    that is missing is created).

    Raises:
        InputError: it is an exported folder already, or `check_folder_to_write` or
            `check_destination` refuses it.
    """
    folder = Path(folder)
    if check_folder_to_write(folder, Kind.EXPORTED):
        raise InputError(f"{folder} exists: export writes a new folder")
    check_destination(folder, "an exported model")
    return folder


def export_folder(model: nn.Module, src_vocab: Vocab, tgt_vocab: Vocab, tokenizer: Tokenizer,
                  folder: str | os.PathLike[str], *, onnx: bool = False) -> Path:
    """Write what serving needs into a new folder: the two programs, the vocabularies
    (`Vocab.save`), the tokenizer (``tokenizer.json``, and ``tokenizer.model`` for
    SentencePiece), ``manifest.json`` (`ServingPrograms.manifest`), ``decode.py`` (the greedy
    and beam loops, `bahdanau.serving.decode`) and a README; with `onnx`, the programs as ONNX
    too (``encoder.onnx``, ``step.onnx``: `bahdanau.serving.onnx`).

    The folder is written beside its final name and renamed into place
    (`bahdanau._files.new_folder`, `held` against a second writer): it is whole or absent.

    The manifest also records how to build the model again, as a model folder's config.json
    does (`bahdanau.model_folder.model_config_json`): its `ModelConfig` (a preset's model) or
    its build record (a model assembled from parts, `bahdanau.parts.build_record`), from which
    and the weights `load_exported` traces the programs again.

    Raises:
        InputError: `folder` exists or cannot be written (`check_new_folder`), a model built
            from a config that `build_model` does not build from it, a part that records no
            arguments or an argument that is not JSON, vocabularies that do not fit the
            model, `onnx` without the onnx extra installed, or what `export_programs` and
            `tokenizer_to_payload` refuse; before any tracing.
    """
    folder, model = check_new_folder(folder), one_model(model)
    if onnx:
        check_onnx()
    if model.config is not None and type(model) is not model_class(model.config):
        raise InputError(f"export writes a model that build_model rebuilds from its config; "
                         f"this {type(model).__name__} is not one")
    built = model_config_json(model)          # refuses a part that cannot be recorded
    _check_vocabs(interface(model), src_vocab, tgt_vocab)
    stored = tokenizer_files(tokenizer, SENTENCEPIECE_FILE)   # refuses what it cannot store
    programs = export_programs(model)
    archives = {FILES[name]: program_bytes(getattr(programs, name)) for name in PROGRAMS}
    if onnx:
        archives |= {ONNX_FILES[name]: onnx_bytes(getattr(programs, name)) for name in PROGRAMS}
    manifest = {**programs.manifest, "model_config": built, "onnx": onnx,
                "versions": versions()}
    with held(folder, f"{folder} is being exported by another process: wait for it to "
                      "finish or choose another folder"):
        check_new_folder(folder)                  # as it is now that the folder is held
        with new_folder(folder) as partial:
            _write_folder(partial, archives | stored, src_vocab, tgt_vocab, manifest)
    return folder


def _check_vocabs(fields: dict[str, Any], src_vocab: Vocab, tgt_vocab: Vocab) -> None:
    """Refuse vocabularies whose sizes or special ids are not the interface's `fields` (those
    of `interface`, or of a manifest): `ModelConfig.check_vocabs` over them alone, for a model
    of either kind."""
    ModelConfig(src_vocab_size=fields["src_vocab_size"], tgt_vocab_size=fields["tgt_vocab_size"],
                **{k: fields[k] for k in SPECIAL_IDS}).check_vocabs(src_vocab, tgt_vocab)


def _write_folder(partial: Path, files: dict[str, bytes], src_vocab: Vocab, tgt_vocab: Vocab,
                  manifest: dict[str, Any]) -> None:
    """Every file of an exported folder, written into `partial`, the manifest last: it seals
    the others (`bahdanau._sealed.seal`). `files`: the programs and the tokenizer's files
    (`bahdanau.data.tokenizers.tokenizer_files`), by name. The programs are archived in memory
    (`bahdanau._pt2_archive.program_bytes`) and written as every file is: torch's archive
    writer, meeting a failed write (a full disk), aborts the process from a C++ destructor,
    where `atomic_write` makes it one `OSError` naming the file."""
    for name, data in files.items():
        _write_bytes(partial / name, data)
    _write_bytes(partial / DECODE_FILE, inspect.getsource(decode).encode("utf-8"))
    src_vocab.save(partial / FILES["src_vocab"])
    tgt_vocab.save(partial / FILES["tgt_vocab"])
    readme = _readme(manifest, SENTENCEPIECE_FILE in files)
    _write_bytes(partial / FILES["readme"], (readme + "\n").encode("utf-8"))
    seal(partial, manifest)


def _write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


class ExportedModel(NamedTuple):
    """An exported folder, read back (`load_exported`)."""

    encoder: Any                  # callable: the encoder program's module
    step: Any                     # callable: the step program's module
    manifest: dict[str, Any]
    src_vocab: Vocab
    tgt_vocab: Vocab
    tokenizer: Tokenizer


def load_exported(folder: str | os.PathLike[str], *, trust_code: bool = False,
                  parts: Mapping[str, type] | None = None) -> ExportedModel:
    """The programs, vocabularies and tokenizer of a folder that `export_folder` wrote, read as
    data: loading never runs code from the folder.

    Before anything is used, the manifest's own digest and every file's SHA-256 are checked
    against the seal `export_folder` wrote (`bahdanau._sealed.check_sealed`), each file from
    the bytes then used, and every name stays in the folder (no path, no symbolic link, the
    SentencePiece model only as ``tokenizer.model``). The programs are not deserialized:
    ``torch.export.load`` trusts its file (it unpickles some members, and its JSON graph is
    code to it: `bahdanau._pt2_archive`). They are traced again (`export_programs`) from the
    model the manifest records (its `ModelConfig`, or the build record of a model assembled
    from parts, read through `bahdanau.parts.blueprint`), with the weights read as raw tensors
    from the encoder program's archive (`bahdanau._pt2_archive.archive_weights`), which must
    hold nothing pickled. The vocabularies must have the manifest's sizes and special ids, and
    the programs traced the manifest's interface.

    Args:
        folder: a folder of `export_folder` (``bahdanau export``).
        trust_code, parts: for a model assembled from parts that names classes outside
            bahdanau (an attention of one's own): import them, or take them as given, as
            `bahdanau.Translator.from_pretrained` does; without either such a folder is
            refused in one line naming the class, before anything is imported.
    Raises:
        InputError: one line naming the file: not an exported folder, one of an earlier
            version, a file changed or damaged, an archive with a pickled or unknown member,
            a class outside bahdanau without trust, or parts that do not fit together.
    """
    folder = Path(folder)
    restore_replaced(folder)             # left aside by a writer that died replacing it
    manifest = _read_manifest(folder)
    files = check_sealed(folder, manifest, [FILES[key] for key in FILES if key != "manifest"],
                         _AGAIN)
    data = {name: _sealed_bytes(folder / name, sha) for name, sha in files.items()}
    try:
        src_vocab, tgt_vocab = (Vocab.from_dict(_json(data, folder, FILES[side]))
                                for side in ("src_vocab", "tgt_vocab"))
        _check_vocabs(manifest, src_vocab, tgt_vocab)
    except InputError as err:
        raise InputError(f"{folder}: the vocabularies do not fit {FILES['manifest']}: {err}; "
                         f"{_AGAIN}") from None
    tokenizer = _tokenizer(_json(data, folder, FILES["tokenizer"]), data, folder)
    check_archive(data[FILES["step"]], str(folder / FILES["step"]))   # no pickle for anyone
    build = _builder(manifest["model_config"], folder, (trust_code, parts))
    programs = export_programs(_rebuilt_model(build, data[FILES["encoder"]],
                                              folder / FILES["encoder"]))
    # the interface the programs give; not model_config, the record they were traced from (a
    # record written before a field was added lacks it, which `ModelConfig.from_dict` fills)
    for key, value in programs.manifest.items():
        if key != "model_config" and manifest.get(key) != value:
            raise InputError(f"{folder}: its model gives programs with {key} {value!r}, "
                             f"{FILES['manifest']} says {manifest.get(key)!r}: {_AGAIN}")
    return ExportedModel(programs.encoder.module(), programs.step.module(), manifest,
                         src_vocab, tgt_vocab, tokenizer)


def _builder(recorded: dict[str, Any], folder: Path,
             trust: tuple[bool, Mapping[str, type] | None]) -> Callable[[], nn.Module]:
    """How to build the model the manifest's ``model_config`` records: a `ModelConfig`
    (`build_model`), or a build record whose classes `bahdanau.parts.blueprint` finds as
    `trust` (trust_code, parts) allows and whose outermost part is a model class."""
    where = f"{folder / FILES['manifest']}"
    if PART in recorded:
        try:
            plan = blueprint(recorded, trust_code=trust[0], parts=trust[1],
                             name=f"{FILES['manifest']} model_config")
        except InputError as err:
            raise InputError(f"{folder}: {err}") from None
        if not issubclass(plan.root, RNNSearch):
            raise InputError(f"{where}: its model_config builds a {plan.root.__qualname__}, "
                             f"not a model (an RNNSearch): {_AGAIN}")
        return plan.build
    try:
        config = ModelConfig.from_dict(recorded)
    except (InputError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{where}: its model_config is no model config ({err}): "
                         f"{_AGAIN}") from None
    return lambda: build_model(config)


def _rebuilt_model(build: Callable[[], nn.Module], archive: bytes, path: Path) -> nn.Module:
    """The model `build` makes with the weights of the encoder program's archive (which holds
    them all, as ``model.NAME``), in their dtype; the model's shapes are checked against the
    weights' on the meta device first (`bahdanau.model_folder.model_skeleton`), so a manifest
    claiming other sizes is refused before it allocates anything."""
    weights = {name.removeprefix("model."): tensor
               for name, tensor in archive_weights(archive, path).items()
               if name.startswith("model.")}
    dtypes = {tensor.dtype for tensor in weights.values()}
    if len(dtypes) != 1:
        raise InputError(f"{path}: its weights are of {len(dtypes)} dtypes, a model's of one: "
                         f"{_AGAIN}")
    try:
        shapes = {name: tuple(t.shape) for name, t in model_skeleton(build).state_dict().items()}
    except InputError as err:                  # a constructor refusing its recorded arguments
        raise InputError(f"{path.parent}: {err}: {_AGAIN}") from None
    differ = next((name for name in sorted(shapes.keys() | weights.keys())
                   if name not in shapes or name not in weights
                   or shapes[name] != tuple(weights[name].shape)), None)
    if differ is not None:
        raise InputError(f"{path}: its weights are not those of the manifest's model "
                         f"(model.{differ}: {shapes.get(differ)} in the manifest, "
                         f"{None if differ not in weights else tuple(weights[differ].shape)} "
                         f"in the archive): {_AGAIN}")
    model = build().to(dtypes.pop()).eval()
    model.load_state_dict(weights, strict=True)
    return model


_AGAIN = "export the model again (bahdanau export)"
_MANIFEST_BYTES = 1 << 20          # a manifest.json larger than this is no exported folder's
_MANIFEST_FIELDS = {               # field -> (check, what it must be)
    "arch": (lambda v: isinstance(v, str), "a string"),
    "src_vocab_size": (lambda v: is_int(v) and v > 0, "a positive int"),
    "tgt_vocab_size": (lambda v: is_int(v) and v > 0, "a positive int"),
    **{key: (lambda v: is_int(v) and v >= 0, "an int >= 0") for key in SPECIAL_IDS},
    "memory_tensors": (lambda v: is_int(v) and v > 0, "a positive int"),
    "min_src_len": (lambda v: v == MIN_SRC_LEN, str(MIN_SRC_LEN)),
    "attention": (lambda v: isinstance(v, bool), "true or false"),
    "dtype": (lambda v: v in ("float32", "float64"), '"float32" or "float64"'),
    "model_config": (lambda v: isinstance(v, dict), "an object"),
}


def _read_manifest(folder: Path) -> dict[str, Any]:
    """An exported folder's manifest, its format, version and fields checked."""
    path = folder / FILES["manifest"]
    if not folder.is_dir():
        raise InputError(f"{folder}: " + ("not a folder" if folder.exists() else "no such folder")
                         + "; bahdanau export writes an exported model")
    if not path.is_file() or path.is_symlink():
        raise InputError(f"{folder} is not an exported model: {FILES['manifest']} missing")
    if path.stat().st_size > _MANIFEST_BYTES:
        raise InputError(f"{path} is larger than an exported model's manifest: {_AGAIN}")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except JSON_ERRORS as err:
        raise InputError(f"{path} is damaged ({type(err).__name__}): {_AGAIN}") from None
    if isinstance(manifest, dict) and manifest.get("format") == 1 and "version" not in manifest:
        raise InputError(f"{folder} was exported by an earlier bahdanau, without digests and "
                         f"with pickled members in its programs: {_AGAIN}")
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORTED_FORMAT:
        raise InputError(f"{path} is not the manifest of an exported model")
    if manifest.get("version") != EXPORTED_VERSION:
        raise InputError(f"{folder} is an exported model of version {manifest.get('version')!r}; "
                         f"this bahdanau reads version {EXPORTED_VERSION}: {_AGAIN}")
    for key, (check, expected) in _MANIFEST_FIELDS.items():
        if key not in manifest or not check(manifest[key]):
            raise InputError(f"{path} is damaged: {key!r} must be {expected}: {_AGAIN}")
    return manifest


def _sealed_bytes(path: Path, sha256: str) -> bytes:
    """The bytes of a file of the folder, once their SHA-256 is the sealed one."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"{path} does not match its digest in {FILES['manifest']}: the file "
                         f"was changed or damaged; {_AGAIN}")
    return data


def _json(data: dict[str, bytes], folder: Path, name: str) -> Any:
    try:
        return json.loads(data[name].decode("utf-8"))
    except JSON_ERRORS as err:
        raise InputError(f"{folder / name}: not readable JSON ({type(err).__name__})") from None


def _tokenizer(stored: Any, data: dict[str, bytes], folder: Path) -> Tokenizer:
    """The tokenizer of ``tokenizer.json``: a SentencePiece one names ``tokenizer.model``, the
    folder's own sealed file, and nothing else."""
    if isinstance(stored, dict) and stored.get("name") == "sentencepiece":
        if stored != {"name": "sentencepiece", "model": SENTENCEPIECE_FILE}:
            raise InputError(f"{folder / FILES['tokenizer']}: a SentencePiece tokenizer names "
                             f"its model {SENTENCEPIECE_FILE!r} beside it, and nothing else")
        if SENTENCEPIECE_FILE not in data:
            raise InputError(f"{folder / FILES['manifest']} seals no digest of "
                             f"{SENTENCEPIECE_FILE}: {_AGAIN}")
        try:
            return SentencePieceTokenizer(data[SENTENCEPIECE_FILE])
        except InputError as err:
            raise InputError(f"{folder / SENTENCEPIECE_FILE}: {err}; {_AGAIN}") from None
    try:
        return tokenizer_from_payload(stored)
    except InputError as err:
        raise InputError(f"{folder / FILES['tokenizer']}: {err}; {_AGAIN}") from None


def _readme(manifest: dict[str, Any], sentencepiece: bool) -> str:
    """The folder's README: the interface (in the model's dtype), how the tokenizer is rebuilt
    and how ``decode.py`` decodes."""
    weights = f", weights (N, S) {manifest['dtype']}" if manifest["attention"] else ""
    tokenizer = (f"names the SentencePiece model `{SENTENCEPIECE_FILE}` beside it, which "
                 "`SentencePieceTokenizer.load` of `bahdanau.data` reads" if sentencepiece else
                 "`tokenizer_from_payload` of `bahdanau.data.tokenizers` rebuilds it")
    onnx = (f"- `{ONNX_FILES['encoder']}`, `{ONNX_FILES['step']}`: the same programs as ONNX, "
            "for onnxruntime;\n" if manifest.get("onnx") else "")
    return README.format(memory=manifest["memory_tensors"], weights=weights,
                         tokenizer=tokenizer, onnx_files=onnx, **manifest)


README = """# An exported {arch} model

Exported by `bahdanau export` for decoding without bahdanau: the encoder and one decoder step as
`torch.export` programs of plain torch ops (no `import bahdanau` needed), with the batch B and
the source length S (>= 2) dynamic, and the greedy and beam search loops in plain PyTorch. The
files:

- `encoder.pt2`: (src (B, S) int64, src_lengths (B,) int64)
  -> (hidden (B, D), memory x {memory});
- `step.pt2`: (prev_tokens (N,) int64, hidden (N, D), memory x {memory})
  -> (log_probs (N, V) {dtype}, hidden (N, D){weights});
{onnx_files}- `decode.py`: `greedy_decode`, `beam_decode` and `load_programs`, importing torch
  alone;
- `manifest.json`: sizes and special ids (pad {pad_id}, bos {bos_id}, eos {eos_id},
  unk {unk_id});
- `src_vocab.json`, `tgt_vocab.json`: the vocabularies (an id is an index into
  specials + tokens);
- `tokenizer.json`: the tokenizer ({tokenizer}; `load_exported` does it).

Sources are padded with pad after each sentence (every sentence has a token). `log_probs` is
the log-softmax of the next token; the memory tensors (annotations, mask, precomputed keys and
values) have one row per sentence. The step takes as many memory rows as state rows: for a beam
of K, repeat each sentence's rows K times (`m.repeat_interleave(K, 0)`), and drop a finished
sentence's rows from both. `manifest.json` also lists the SHA-256 of every file and its own,
and how the model is built (its config, or the record of the parts it was assembled from).
`torch.export.load` trusts its file (it unpickles some members of an archive and evaluates
strings of its graph), as onnxruntime trusts an ONNX graph: give them only folders you trust.
`bahdanau.serving.load_exported` checks the digests and traces the programs again from that
and the raw weights, so a folder it loads runs none of its own code (a model of parts of your
own: `load_exported("THIS_FOLDER", trust_code=True)` imports their classes, as `bahdanau.load`
does).

## Decoding with torch alone

```python
import sys, torch
sys.path.insert(0, "THIS_FOLDER")
import decode

encoder, step, manifest = decode.load_programs("THIS_FOLDER")   # runtime="onnx": onnxruntime
ids = {{k: manifest[k] for k in ("bos_id", "eos_id", "pad_id")}}
src = torch.tensor([[5, 6, 7]])                  # source ids, padded with pad
print(decode.beam_decode(encoder, step, src, torch.tensor([3]), beam_size=5, **ids))
```

`beam_decode` gives the tokens of `bahdanau translate` (beam 5, length penalty none) and
`greedy_decode` those of `bahdanau translate --beam-size 1`.

## With bahdanau's tokenizer and vocabularies

```python
import torch
from bahdanau.serving import beam_decode, load_exported

m = load_exported("THIS_FOLDER")
ids = [m.src_vocab.encode(m.tokenizer.tokenize("A man is riding a bicycle."))]
src = torch.tensor(ids)
out = beam_decode(m.encoder, m.step, src, torch.tensor([src.shape[1]]),
                  bos_id=m.manifest["bos_id"], eos_id=m.manifest["eos_id"],
                  pad_id=m.manifest["pad_id"])
print(m.tokenizer.detokenize(m.tgt_vocab.decode(out[0])))
```
"""
