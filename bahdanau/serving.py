"""A trained model as two `torch.export` programs, for decoding without `BeamSearch`.

`export_programs(model)` traces the model's own `encode` and `step` (the decoding path
`translate` runs, with the model's engine) into two `torch.export.ExportedProgram`s whose inputs
and outputs are flat tensors, with the batch B and the source length S dynamic:

    encoder(src (B, S) int64, src_lengths (B,) int64)
        -> hidden (B, D), memory_1 .. memory_M           (every tensor has B rows)
    step(prev_tokens (N,) int64, hidden (N, D), memory_1 .. memory_M)
        -> log_probs (N, V), hidden (N, D)[, weights (N, S)]

in the model's dtype (float32, or float64 for a float64 model; the manifest's ``dtype``).

`log_probs` is the log-softmax of the step's logits, exactly what `BeamSearch` ranks;
`weights` (the alignment a_ij) is there for attention models only. The memory is the
per-sentence part of what `encode` prepares (annotations, mask, precomputed keys and values);
what every sentence shares (the fused step weight) is a constant of the step program. The step
takes as many memory rows as state rows: a beam of K repeats each sentence's rows K times
(``m.repeat_interleave(K, 0)``), and a sentence that is done is dropped from both.

The programs take S >= 2 (`MIN_SRC_LEN`; traced shapes do not hold at S = 1): `pad_source`
pads a batch of one-token sentences, which changes nothing.

`greedy_decode` is the whole decoding loop over the two programs in plain torch, written to be
copied into a serving process: with `pad_source` it reads nothing of `bahdanau` but the two
programs, the special ids and the check that refuses NaN scores
(`bahdanau.search.refuse_nan_scores`), and the folder's README holds both. It gives the tokens
`BeamSearch(beam_size=1)` gives with the default ``length_penalty="none"``
(`translate --beam-size 1`). `ExportedDecoder` makes the programs a model for `BeamSearch`, so
beam search over them (`translate_corpus` with any search) gives what the model gives.

`export_folder` writes the programs (``encoder.pt2``, ``step.pt2``, with nothing pickled:
`bahdanau._pt2_archive`), the vocabularies, the tokenizer, a README with the loop and a
``manifest.json`` of the interface and the model's config that seals every file
(`bahdanau._sealed`); `load_exported` reads them back as data: it checks the seal and traces
the programs again from the config and the weights, never deserializing a program (which
``torch.export.load`` does by running what the file says), and `bahdanau export` runs
`export_folder`. The step program is plain torch
ops; the encoder program calls the library's registered GRU op (``bahdanau::gru_layer``, the
traced encoder's path, which keeps S dynamic), so loading it needs `import bahdanau` first.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from bahdanau._about import versions
from bahdanau._checks import is_int
from bahdanau._files import (
    atomic_write,
    check_destination,
    held,
    new_folder,
    restore_replaced,
)
from bahdanau._folders import EXPORTED_FORMAT, Kind, check_folder_to_write
from bahdanau._pt2_archive import archive_weights, check_archive, program_bytes
from bahdanau._sealed import check_sealed, seal
from bahdanau.config import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS, UNK_ID, ModelConfig
from bahdanau.data.sentencepiece import SentencePieceTokenizer
from bahdanau.data.tokenizers import Tokenizer, tokenizer_from_payload, tokenizer_to_payload
from bahdanau.data.vocab import Vocab
from bahdanau.decoder import DecoderState, StepOutput
from bahdanau.errors import InputError
from bahdanau.models import RNNSearch, build_model, model_class
from bahdanau.search import refuse_nan_scores

__all__ = ["ExportedDecoder", "ExportedMemory", "ExportedModel", "ServingPrograms", "export_folder",
           "export_programs", "greedy_decode", "load_exported", "pad_source"]

# ``manifest.json``'s "format" (what the folder is: `EXPORTED_FORMAT`, declared with the other
# folders' in `bahdanau._folders`) and "version" (raised when the interface of the programs or
# the folder changes; version 1 had an integer "format" and no digests).
EXPORTED_VERSION = 2
# The shortest padded source the programs take: traced shapes hold for S >= 2 (a batch whose
# longest sentence has one token is padded to two, `pad_source`).
MIN_SRC_LEN = 2


class ServingPrograms(NamedTuple):
    """The two programs of `export_programs` and the interface they share."""

    encoder: ExportedProgram
    step: ExportedProgram
    manifest: dict[str, Any]      # sizes, special ids, the number of memory tensors


# ---------------------------------------------------------------------------- flat memory
def _flatten(tree: Any) -> list[Any]:
    """The leaves of a nest of (named) tuples, in order: tensors, None and other constants."""
    if isinstance(tree, tuple):
        return [leaf for child in tree for leaf in _flatten(child)]
    return [tree]


def _rebuild(template: Any, leaves: list[Any]) -> Any:
    """`template` with its leaves replaced, in order, by `leaves` (consumed from the front)."""
    if isinstance(template, tuple):
        children = [_rebuild(child, leaves) for child in template]
        return type(template)(*children) if hasattr(template, "_fields") else tuple(children)
    return leaves.pop(0)


def _per_sentence(memory: Any, batch: int) -> list[bool]:
    """Which leaves of `memory` (built for `batch` >= 2 sentences) hold one row per sentence:
    those that `memory.select` (what the search calls to drop sentences) cuts to one row."""
    device = next(leaf for leaf in _flatten(memory) if isinstance(leaf, Tensor)).device
    one = _flatten(memory.select(torch.zeros(1, dtype=torch.long, device=device)))
    return [isinstance(full, Tensor) and full.dim() > 0 and full.shape[0] == batch
            and part.shape[0] == 1 for full, part in zip(_flatten(memory), one, strict=True)]


class _EncoderProgram(nn.Module):
    """`model.encode` with flat outputs: s_0, then the per-sentence memory tensors."""

    def __init__(self, model: RNNSearch, per_sentence: list[bool]) -> None:
        super().__init__()
        self.model, self.per_sentence = model, per_sentence

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, ...]:
        state, memory = self.model.encode(src, src_lengths)
        kept = [leaf for leaf, own in zip(_flatten(memory), self.per_sentence, strict=True)
                if own]
        return (state.hidden, *kept)


class _StepProgram(nn.Module):
    """`model.step` from flat inputs; the shared memory (built from the weights) is kept."""

    def __init__(self, model: RNNSearch, memory: Any, per_sentence: list[bool]) -> None:
        super().__init__()
        # The step reads the decoder's weights alone: registering the decoder (not the model)
        # keeps the encoder's out of the program.
        self.decoder, self.model_step = model.decoder, model.step
        self.template, self.per_sentence = memory, per_sentence
        self.constants = [None if own else leaf
                          for leaf, own in zip(_flatten(memory), per_sentence, strict=True)]
        for i, leaf in enumerate(self.constants):      # constants of the program, not inputs
            if isinstance(leaf, Tensor):
                self.register_buffer(f"shared_{i}", leaf.detach().clone())

    def forward(self, prev_tokens: Tensor, hidden: Tensor, *memory: Tensor
                ) -> tuple[Tensor, ...]:
        given, leaves = iter(memory), list[Any]()
        for i, (leaf, own) in enumerate(zip(self.constants, self.per_sentence, strict=True)):
            if own:                                      # an input of the program
                leaves.append(next(given))
            elif isinstance(leaf, Tensor):               # a tensor shared by every sentence
                leaves.append(getattr(self, f"shared_{i}"))
            else:                                        # None, a flag
                leaves.append(leaf)
        out = self.model_step(prev_tokens, DecoderState(hidden), _rebuild(self.template, leaves))
        dtype = torch.float64 if out.logits.dtype == torch.float64 else torch.float32
        log_probs = torch.log_softmax(out.logits.to(dtype), dim=-1)         # as BeamSearch
        return (log_probs, out.state.hidden, *(() if out.weights is None else (out.weights,)))


def _ids(model: RNNSearch) -> dict[str, int]:
    """The special ids the programs' users need (the model's config, else the defaults)."""
    cfg = model.config
    return {"pad_id": cfg.pad_id if cfg else PAD_ID, "bos_id": cfg.bos_id if cfg else BOS_ID,
            "eos_id": cfg.eos_id if cfg else EOS_ID, "unk_id": cfg.unk_id if cfg else UNK_ID}


def _example(model: RNNSearch, lengths: list[int]) -> tuple[Tensor, Tensor]:
    """A padded source batch with these lengths (every real token the unknown word)."""
    ids, device = _ids(model), next(model.parameters()).device
    src = torch.full((len(lengths), max(lengths)), ids["pad_id"], dtype=torch.long,
                     device=device)
    for row, n in enumerate(lengths):
        src[row, :n] = ids["unk_id"]
    return src, torch.tensor(lengths, device=device)


def _source_dims(model: RNNSearch, per_sentence: list[bool]) -> list[set[int]]:
    """For each per-sentence memory tensor, its dims over source positions: those that follow
    S when the same batch is encoded at two source lengths."""
    def shapes(length: int) -> list[torch.Size]:
        _, memory = model.encode(*_example(model, [length, 2]))
        return [leaf.shape for leaf, own in zip(_flatten(memory), per_sentence, strict=True)
                if own]
    return [{d for d, (a, b) in enumerate(zip(x, y, strict=True)) if a != b}
            for x, y in zip(shapes(5), shapes(6), strict=True)]


def _one_model(model: nn.Module) -> RNNSearch:
    """`model`, checked to be one `RNNSearch` / `RNNEncDec` (an `Ensemble` is several)."""
    if not isinstance(model, RNNSearch):          # a Module's repr would run over many lines
        raise InputError(f"export needs an RNNSearch or RNNEncDec, got a "
                         f"{type(model).__name__}")
    return model


@torch.inference_mode(False)   # even inside a caller's inference mode: a search's memory would
@torch.no_grad()               # hold weights packed for oneDNN, which a program cannot store
def export_programs(model: nn.Module) -> ServingPrograms:
    """Trace `model.encode` and `model.step` into two programs (see the module docstring).

    Args:
        model: an `RNNSearch` / `RNNEncDec` (any engine, attention and GRU form), on the CPU
            or a GPU; it is traced in eval mode and left in the mode it was in.
    Returns:
        The two programs and their manifest (what `export_folder` writes as JSON).
    Raises:
        InputError: not a single model (an `Ensemble` is several), or an attention that keeps
            a per-row state (the programs carry s_i alone).
    """
    model = _one_model(model)
    was_training = model.training
    model.eval()
    try:
        src, src_lengths = _example(model, [5, 3])
        state, memory = model.encode(src, src_lengths)
        if state.attention is not None:
            raise InputError("this model's attention keeps a per-row state, which the exported "
                             "step does not carry")
        per_sentence = _per_sentence(memory, batch=2)
        kept = [leaf for leaf, own in zip(_flatten(memory), per_sentence, strict=True) if own]
        batch, length = Dim("batch", min=1), Dim("src_len", min=MIN_SRC_LEN)
        encoder = torch.export.export(_EncoderProgram(model, per_sentence), (src, src_lengths),
                                      dynamic_shapes=({0: batch, 1: length}, {0: batch}))
        memory_dims = [{0: batch, **{d: length for d in over}}
                       for over in _source_dims(model, per_sentence)]
        tokens = torch.full((2,), _ids(model)["bos_id"], dtype=torch.long, device=src.device)
        step = torch.export.export(
            _StepProgram(model, memory, per_sentence), (tokens, state.hidden, *kept),
            dynamic_shapes=({0: batch}, {0: batch}, tuple(memory_dims)))
    finally:
        model.train(was_training)
    manifest = {"format": EXPORTED_FORMAT, "version": EXPORTED_VERSION, "arch": model.arch,
                "src_vocab_size": model.encoder.vocab_size,
                "tgt_vocab_size": model.decoder.vocab_size, **_ids(model),
                "memory_tensors": len(kept), "min_src_len": MIN_SRC_LEN,
                "attention": model.decoder.attention is not None,
                "dtype": str(state.hidden.dtype).removeprefix("torch.")}
    return ServingPrograms(encoder, step, manifest)


def pad_source(src: Tensor, pad_id: int) -> Tensor:
    """`src` padded to the programs' shortest source, `MIN_SRC_LEN` (padding changes nothing)."""
    short = MIN_SRC_LEN - src.shape[1]
    return torch.nn.functional.pad(src, (0, short), value=pad_id) if short > 0 else src


def greedy_decode(encoder: Any, step: Any, src: Tensor, src_lengths: Tensor, *, bos_id: int,
                  eos_id: int, pad_id: int, max_len: int = 100, min_len: int = 1
                  ) -> list[list[int]]:
    """Greedy search over the exported programs, in plain torch; see the module docstring.

    Args:
        encoder, step: the programs as callables (``torch.export.load(path).module()``).
        src: (B, S) source ids, padded with `pad_id` (to S >= 2: `pad_source`); src_lengths:
            (B,) real lengths.
        bos_id, eos_id, pad_id: the special ids (``manifest.json``).
        max_len: most tokens before eos; min_len: eos is forbidden before this many.
    Returns:
        For each sentence its target ids, without bos and eos: the tokens of
        `BeamSearch(beam_size=1, max_len=max_len, min_len=min_len)`.
    Raises:
        InputError: the step's log-probabilities hold NaN (a diverged model), as
            `BeamSearch` refuses them (`bahdanau.search.refuse_nan_scores`).
    """
    hidden, *memory = encoder(pad_source(src, pad_id), src_lengths)
    rows = torch.arange(src.shape[0], device=src.device)      # the sentences still decoding
    tokens = torch.full_like(rows, bos_id)
    out: list[list[int]] = [[] for _ in range(src.shape[0])]
    for t in range(max_len + 1):
        log_probs, hidden, *_ = step(tokens, hidden, *memory)   # (N, V), (N, D)[, (N, S)]
        refuse_nan_scores(log_probs.isnan().any())   # NaN would win the argmax: a diverged model
        log_probs[:, [pad_id, bos_id]] = float("-inf")          # never generated
        if t < min_len:
            log_probs[:, eos_id] = float("-inf")
        tokens = log_probs.argmax(dim=1) if t < max_len else torch.full_like(tokens, eos_id)
        going = tokens != eos_id
        for row, token in zip(rows[going].tolist(), tokens[going].tolist(), strict=True):
            out[row].append(token)
        if not bool(going.any()):
            break
        rows, tokens, hidden = rows[going], tokens[going], hidden[going]
        memory = [m[going] for m in memory]
    return out


class ExportedMemory(NamedTuple):
    """The encoder program's memory tensors, as `BeamSearch` handles a memory."""

    tensors: tuple[Tensor, ...]   # each with one row per sentence

    def select(self, keep: Tensor) -> ExportedMemory:
        """The memory of sentences `keep` (the search drops finished sentences)."""
        return ExportedMemory(tuple(t.index_select(0, keep) for t in self.tensors))


class ExportedDecoder(nn.Module):
    """The two programs as a model `BeamSearch` decodes with: beam search (and every option of
    `bahdanau translate`) over the exported programs, without the model's Python code.

    The search keeps one memory row per sentence and K state rows per sentence; `step` repeats
    the memory rows K times for the program (a serving loop would repeat them once, up front).

    Args:
        encoder, step: the programs' modules (`load_exported`, or ``.module()`` of
            `export_programs`' programs).
        manifest: their manifest (special ids and vocabulary sizes).
    """

    def __init__(self, encoder: nn.Module, step: nn.Module, manifest: dict[str, Any]) -> None:
        super().__init__()
        self.encoder_program, self.step_program = encoder, step
        self.config = ModelConfig(src_vocab_size=manifest["src_vocab_size"],
                                  tgt_vocab_size=manifest["tgt_vocab_size"],
                                  **{k: manifest[k] for k in SPECIAL_IDS})

    def train(self, mode: bool = True) -> ExportedDecoder:
        """The programs were traced in eval mode and have no other (`BeamSearch` sets eval)."""
        self.training = mode
        return self

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[DecoderState, ExportedMemory]:
        """s_0 and the memory of a padded batch."""
        hidden, *memory = self.encoder_program(pad_source(src, self.config.pad_id),
                                               src_lengths)
        return DecoderState(hidden), ExportedMemory(tuple(memory))

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: ExportedMemory
             ) -> StepOutput:
        """One step for N = K x B rows; the logits are the program's log-probabilities."""
        beams = prev_tokens.shape[0] // memory.tensors[0].shape[0]
        tensors = [m.repeat_interleave(beams, 0) if beams > 1 else m for m in memory.tensors]
        log_probs, hidden, *weights = self.step_program(prev_tokens, state.hidden, *tensors)
        return StepOutput(log_probs, DecoderState(hidden), weights[0] if weights else None)

# ---------------------------------------------------------------------------- the folder
# The files of an exported folder (`export_folder`), by what they hold; the encoder's name is
# the checkpoints' floor's, which names an exported folder given for a checkpoint by it.
FILES = {"encoder": "encoder.pt2", "step": "step.pt2", "manifest": "manifest.json",
         "src_vocab": "src_vocab.json", "tgt_vocab": "tgt_vocab.json",
         "tokenizer": "tokenizer.json", "readme": "README.md"}
SENTENCEPIECE_FILE = "tokenizer.model"   # a SentencePiece tokenizer's model, beside its JSON
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
                  folder: str | os.PathLike[str]) -> Path:
    """Write what serving needs into a new folder: the two programs, the vocabularies
    (`Vocab.save`), the tokenizer (``tokenizer.json``, and ``tokenizer.model`` for
    SentencePiece), ``manifest.json`` (`ServingPrograms.manifest`) and a README with the loop.

    The folder is written beside its final name and renamed into place
    (`bahdanau._files.new_folder`, `held` against a second writer): it is whole or absent.

    The manifest records the model's config too: `load_exported` rebuilds the programs from it
    and the weights, so the model must be one that `build_model` builds from its config.

    Raises:
        InputError: `folder` exists or cannot be written (`check_new_folder`), the model has
            no config or is not what `build_model` builds from it, the vocabularies do not fit
            the model, or what `export_programs` and `tokenizer_to_payload` refuse; before any
            tracing.
    """
    folder, model = check_new_folder(folder), _one_model(model)
    if model.config is None or type(model) is not model_class(model.config):
        raise InputError(f"export writes a model that build_model rebuilds from its config; "
                         f"this {type(model).__name__} "
                         f"{'has no config' if model.config is None else 'is not one'}")
    model.config.check_vocabs(src_vocab, tgt_vocab)
    tokenizer_data = tokenizer_to_payload(tokenizer)        # refuses tokenizers it cannot store
    programs = export_programs(model)
    archives = {name: program_bytes(getattr(programs, name)) for name in PROGRAMS}
    manifest = {**programs.manifest, "model_config": model.config.to_dict(),
                "versions": versions()}
    with held(folder, f"{folder} is being exported by another process: wait for it to "
                      "finish or choose another folder"):
        check_new_folder(folder)                  # as it is now that the folder is held
        with new_folder(folder) as partial:
            _write_folder(partial, archives, src_vocab, tgt_vocab, tokenizer, tokenizer_data,
                          manifest)
    return folder


def _write_folder(partial: Path, archives: dict[str, bytes], src_vocab: Vocab,
                  tgt_vocab: Vocab, tokenizer: Tokenizer, tokenizer_data: Any,
                  manifest: dict[str, Any]) -> None:
    """Every file of an exported folder, written into `partial`, the manifest last: it seals
    the others (`bahdanau._sealed.seal`). The programs are archived in memory
    (`bahdanau._pt2_archive.program_bytes`) and written as every file is: torch's archive
    writer, meeting a failed write (a full disk), aborts the process from a C++ destructor,
    where `atomic_write` makes it one `OSError` naming the file."""
    for name, data in archives.items():
        _write_bytes(partial / FILES[name], data)
    src_vocab.save(partial / FILES["src_vocab"])
    tgt_vocab.save(partial / FILES["tgt_vocab"])
    if isinstance(tokenizer, SentencePieceTokenizer):
        tokenizer.save(partial / SENTENCEPIECE_FILE)
        tokenizer_data = {"name": "sentencepiece", "model": SENTENCEPIECE_FILE}
    readme = _readme(manifest, isinstance(tokenizer, SentencePieceTokenizer))
    _write_bytes(partial / FILES["tokenizer"],
                 (json.dumps(tokenizer_data, indent=2) + "\n").encode("utf-8"))
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


def load_exported(folder: str | os.PathLike[str]) -> ExportedModel:
    """The programs, vocabularies and tokenizer of a folder that `export_folder` wrote, read as
    data: loading never runs code from the folder.

    Before anything is used, the manifest's own digest and every file's SHA-256 are checked
    against the seal `export_folder` wrote (`bahdanau._sealed.check_sealed`), each file from
    the bytes then used, and every name stays in the folder (no path, no symbolic link, the
    SentencePiece model only as ``tokenizer.model``). The programs are not deserialized:
    ``torch.export.load`` trusts its file (it unpickles some members, and its JSON graph is
    code to it: `bahdanau._pt2_archive`). They are traced again (`export_programs`) from the
    model of the manifest's config, with the weights read as raw tensors from the encoder
    program's archive (`bahdanau._pt2_archive.archive_weights`), which must hold nothing
    pickled. The vocabularies must have the manifest's sizes and special ids, and the
    programs traced the manifest's interface.

    Raises:
        InputError: one line naming the file: not an exported folder, one of an earlier
            version, a file changed or damaged, an archive with a pickled or unknown member,
            or parts that do not fit together.
    """
    folder = Path(folder)
    restore_replaced(folder)             # left aside by a writer that died replacing it
    manifest = _read_manifest(folder)
    files = check_sealed(folder, manifest, [FILES[key] for key in FILES if key != "manifest"],
                         _AGAIN, hashed=False)
    data = {name: _sealed_bytes(folder / name, sha) for name, sha in files.items()}
    try:
        src_vocab, tgt_vocab = (Vocab.from_dict(_json(data, folder, FILES[side]))
                                for side in ("src_vocab", "tgt_vocab"))
        ModelConfig(src_vocab_size=manifest["src_vocab_size"],
                    tgt_vocab_size=manifest["tgt_vocab_size"],
                    **{k: manifest[k] for k in SPECIAL_IDS}).check_vocabs(src_vocab, tgt_vocab)
    except InputError as err:
        raise InputError(f"{folder}: the vocabularies do not fit {FILES['manifest']}: {err}; "
                         f"{_AGAIN}") from None
    tokenizer = _tokenizer(_json(data, folder, FILES["tokenizer"]), data, folder)
    check_archive(data[FILES["step"]], str(folder / FILES["step"]))   # no pickle for anyone
    programs = export_programs(_rebuilt_model(manifest, data[FILES["encoder"]],
                                              folder / FILES["encoder"]))
    for key, value in programs.manifest.items():
        if manifest.get(key) != value:
            raise InputError(f"{folder}: its model gives programs with {key} {value!r}, "
                             f"{FILES['manifest']} says {manifest.get(key)!r}: {_AGAIN}")
    return ExportedModel(programs.encoder.module(), programs.step.module(), manifest,
                         src_vocab, tgt_vocab, tokenizer)


def _rebuilt_model(manifest: dict[str, Any], archive: bytes, path: Path) -> RNNSearch:
    """The model of the manifest's config with the weights of the encoder program's archive
    (which holds them all, as ``model.NAME``), in their dtype."""
    try:
        config = ModelConfig.from_dict(manifest["model_config"])
    except (InputError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{path.parent / FILES['manifest']}: its model_config is no model "
                         f"config ({err}): {_AGAIN}") from None
    weights = {name.removeprefix("model."): tensor
               for name, tensor in archive_weights(archive, path).items()
               if name.startswith("model.")}
    dtypes = {tensor.dtype for tensor in weights.values()}
    if len(dtypes) != 1:
        raise InputError(f"{path}: its weights are of {len(dtypes)} dtypes, a model's of one: "
                         f"{_AGAIN}")
    model = build_model(config).to(dtypes.pop()).eval()
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        raise InputError(f"{path}: its weights are not those of the manifest's model "
                         f"({str(err).splitlines()[0][:200]}): {_AGAIN}") from None
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
    except (ValueError, RecursionError) as err:   # JSONDecodeError, UnicodeDecodeError, nesting
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
    except (ValueError, RecursionError) as err:
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
    """The folder's README: the interface (in the model's dtype), how the tokenizer is rebuilt,
    and the loop to copy (`greedy_decode`'s source)."""
    weights = f", weights (N, S) {manifest['dtype']}" if manifest["attention"] else ""
    tokenizer = (f"names the SentencePiece model `{SENTENCEPIECE_FILE}` beside it, which "
                 "`SentencePieceTokenizer.load` of `bahdanau.data` reads" if sentencepiece else
                 "`tokenizer_from_payload` of `bahdanau.data.tokenizers` rebuilds it")
    return README.format(memory=manifest["memory_tensors"], weights=weights,
                         tokenizer=tokenizer, loop=_loop_source(), **manifest)


def _loop_source() -> str:
    """The loop as a user copies it: the shortest source, `pad_source` and `greedy_decode`."""
    return "\n\n".join(["from bahdanau.search import refuse_nan_scores\n\n"
                         f"MIN_SRC_LEN = {MIN_SRC_LEN}", inspect.getsource(pad_source),
                         inspect.getsource(greedy_decode)])


README = """# An exported {arch} model

Exported by `bahdanau export` for decoding without bahdanau's beam search: the encoder and one
decoder step as `torch.export` programs, with the batch B and the source length S (>= 2)
dynamic. The files:

- `encoder.pt2`: (src (B, S) int64, src_lengths (B,) int64)
  -> (hidden (B, D), memory x {memory});
- `step.pt2`: (prev_tokens (N,) int64, hidden (N, D), memory x {memory})
  -> (log_probs (N, V) {dtype}, hidden (N, D){weights});
- `manifest.json`: sizes and special ids (pad {pad_id}, bos {bos_id}, eos {eos_id},
  unk {unk_id});
- `src_vocab.json`, `tgt_vocab.json`: the vocabularies (an id is an index into
  specials + tokens);
- `tokenizer.json`: the tokenizer ({tokenizer}; `load_exported` does it).

Sources are padded with pad after each sentence (every sentence has a token). `log_probs` is
the log-softmax of the next token; the memory tensors (annotations, mask, precomputed keys and
values) have one row per sentence. The step takes as many memory rows as state rows: for a beam
of K, repeat each sentence's rows K times (`m.repeat_interleave(K, 0)`), and drop a finished
sentence's rows from both. The encoder uses bahdanau's registered GRU op: `import bahdanau`
first. `manifest.json` also lists the SHA-256 of every file and its own, and the model's
config. `torch.export.load` trusts its file (it unpickles some members of an archive and
evaluates strings of its graph): give it only folders you trust. `load_exported` checks the
digests and traces the programs again from the config and the raw weights, so a folder it
loads runs none of its own code.

## Greedy decoding, in plain torch

```python
import torch, bahdanau
from bahdanau.serving import greedy_decode, load_exported

m = load_exported("THIS_FOLDER")
ids = [m.src_vocab.encode(m.tokenizer.tokenize("A man is riding a bicycle."))]
src = torch.tensor(ids)
out = greedy_decode(m.encoder, m.step, src, torch.tensor([src.shape[1]]),
                    bos_id=m.manifest["bos_id"], eos_id=m.manifest["eos_id"],
                    pad_id=m.manifest["pad_id"], max_len=100)
print(m.tokenizer.detokenize(m.tgt_vocab.decode(out[0])))
```

It gives the tokens of `bahdanau translate --beam-size 1` (length penalty none). The loop:

```python
{loop}```
"""
