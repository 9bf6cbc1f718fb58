"""A trained model as two `torch.export` programs, and the loop that decodes with them.

See `bahdanau.serving` for the interface; `bahdanau.serving.folder` writes and reads the
programs as a folder.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from bahdanau._checks import check_lengths, check_padding, check_tensor, check_token_ids
from bahdanau._folders import EXPORTED_FORMAT
from bahdanau.config import ModelConfig, model_vocabs
from bahdanau.decoder import DecoderState, StepOutput
from bahdanau.errors import InputError
from bahdanau.models import RNNSearch
from bahdanau.parts import PART
from bahdanau.serving import decode
from bahdanau.serving.decode import MIN_SRC_LEN, BadRequest, NaNScores, pad_source

__all__ = ["EXPORTED_VERSION", "MIN_SRC_LEN", "ExportedDecoder", "ExportedMemory",
           "ServingPrograms", "beam_decode", "export_programs", "greedy_decode", "interface",
           "one_model", "pad_source"]


# ``manifest.json``'s "format" (what the folder is: `EXPORTED_FORMAT`, declared with the other
# folders' in `bahdanau._folders`) and "version" (raised when the interface of the programs or
# the folder changes; version 1 had an integer "format" and no digests).
EXPORTED_VERSION = 2


class ServingPrograms(NamedTuple):
    """The two programs of `export_programs` and the interface they share."""

    encoder: ExportedProgram
    step: ExportedProgram
    manifest: dict[str, Any]      # sizes, special ids, the number of memory tensors; the
                                  # model's `ModelConfig` as "model_config" when it has one


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


def interface(model: RNNSearch) -> dict[str, Any]:
    """The sizes and special ids the programs of `model` take and give, as the model says them
    (`bahdanau.config.model_vocabs`: its config's, or for a model assembled from parts, its
    `vocab_sizes` and the default ids): what a manifest records of them before tracing.

    Raises:
        InputError: a model that says no vocabulary sizes.
    """
    vocabs = model_vocabs(model)
    if vocabs.sizes is None:
        raise InputError(f"a {type(model).__name__} with neither a ModelConfig nor vocab_sizes "
                         "says no vocabulary sizes, which an exported folder records")
    return dataclasses.asdict(vocabs)


def _example(model: RNNSearch, lengths: list[int]) -> tuple[Tensor, Tensor]:
    """A padded source batch with these lengths (every real token the unknown word)."""
    vocabs, device = model_vocabs(model), next(model.parameters()).device
    src = torch.full((len(lengths), max(lengths)), vocabs.pad_id, dtype=torch.long,
                     device=device)
    for row, n in enumerate(lengths):
        src[row, :n] = vocabs.unk_id
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


def one_model(model: nn.Module) -> RNNSearch:
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
        The two programs and their manifest (what `export_folder` writes as JSON), which holds
        the model's `ModelConfig` as ``model_config`` when it was built from one.
    Raises:
        InputError: not a single model (an `Ensemble` is several), or an attention that keeps
            a per-row state (the programs carry s_i alone).
    """
    model = one_model(model)
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
        tokens = torch.full((2,), model_vocabs(model).bos_id, dtype=torch.long, device=src.device)
        step = torch.export.export(
            _StepProgram(model, memory, per_sentence), (tokens, state.hidden, *kept),
            dynamic_shapes=({0: batch}, {0: batch}, tuple(memory_dims)))
    finally:
        model.train(was_training)
    manifest = {"format": EXPORTED_FORMAT, "version": EXPORTED_VERSION, "arch": model.arch,
                **interface(model), "memory_tensors": len(kept), "min_src_len": MIN_SRC_LEN,
                "attention": model.decoder.attention is not None,
                "dtype": str(state.hidden.dtype).removeprefix("torch.")}
    if isinstance(model.config, ModelConfig):     # every size (`ExportedDecoder` reads them)
        manifest["model_config"] = model.config.to_dict()
    return ServingPrograms(encoder, step, manifest)


def _input_errors(loop: Callable[..., list[list[int]]]) -> Callable[..., list[list[int]]]:
    """A loop of `bahdanau.serving.decode` (which imports nothing of `bahdanau`) raising the
    library's one-line `InputError` where that file raises its `BadRequest` (a batch or a
    setting it cannot decode right) or its `NaNScores` (a `ValueError` with the message of
    `bahdanau.search.refuse_nan_scores`)."""
    @functools.wraps(loop)
    def decode(*args: Any, **kwargs: Any) -> list[list[int]]:
        try:
            return loop(*args, **kwargs)
        except (BadRequest, NaNScores) as err:
            raise InputError(str(err)) from None
    return decode


greedy_decode = _input_errors(decode.greedy_decode)
beam_decode = _input_errors(decode.beam_decode)


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

    It says of itself what the exported model said (`bahdanau.config.model_vocabs`): as
    `config`, the `ModelConfig` its manifest records as ``model_config`` (a preset's model:
    every size, so `BeamSearch.memory_needed` estimates the model's own memory), or, for a
    model assembled from parts (a build record there), none: its `vocab_sizes` and the default
    ids, and no memory estimate, as for that model.

    Args:
        encoder, step: the programs' modules (`load_exported`, or ``.module()`` of
            `export_programs`' programs).
        manifest: their manifest (special ids, vocabulary sizes and the model's config).
    Raises:
        InputError: a ``model_config`` that is no `ModelConfig`'s record nor a build record,
            or sizes and special ids that disagree with it (one line).
    """

    def __init__(self, encoder: nn.Module, step: nn.Module, manifest: dict[str, Any]) -> None:
        super().__init__()
        self.encoder_program, self.step_program = encoder, step
        self.config = _recorded_config(manifest)
        self.vocab_sizes = (manifest["src_vocab_size"], manifest["tgt_vocab_size"])
        for key, value in dataclasses.asdict(model_vocabs(self)).items():   # as `interface`
            if manifest[key] != value:
                holds = ("a model without a ModelConfig has" if self.config is None
                         else "model_config says")
                raise InputError(f"the manifest says {key} {manifest[key]!r} but {holds} "
                                 f"{value!r}")

    def train(self, mode: bool = True) -> ExportedDecoder:
        """The programs were traced in eval mode and have no other (`BeamSearch` sets eval)."""
        self.training = mode
        return self

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[DecoderState, ExportedMemory]:
        """s_0 and the memory of a padded batch, checked first as the model's `encode` checks
        it (`RNNSearch.check_batch`: the programs cannot).

        Raises:
            InputError: `src` not a (B, S) integer tensor, lengths outside [1, S] or that
                disagree with the padding, or ids outside the source vocabulary.
        """
        vocabs = model_vocabs(self)
        check_tensor("src", src, 2, integer=True)
        check_lengths("src_lengths", src_lengths, src.shape[0], src.shape[1])
        check_padding("src", src, src_lengths, vocabs.pad_id)
        check_token_ids("src", src, self.vocab_sizes[0])
        hidden, *memory = self.encoder_program(pad_source(src, vocabs.pad_id), src_lengths)
        return DecoderState(hidden), ExportedMemory(tuple(memory))

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: ExportedMemory
             ) -> StepOutput:
        """One step for N = K x B rows; the logits are the program's log-probabilities."""
        beams = prev_tokens.shape[0] // memory.tensors[0].shape[0]
        tensors = [m.repeat_interleave(beams, 0) if beams > 1 else m for m in memory.tensors]
        log_probs, hidden, *weights = self.step_program(prev_tokens, state.hidden, *tensors)
        return StepOutput(log_probs, DecoderState(hidden), weights[0] if weights else None)


def _recorded_config(manifest: dict[str, Any]) -> ModelConfig | None:
    """The `ModelConfig` that `manifest` records as ``model_config`` (`export_programs` and
    `export_folder` record a preset's model's; every exported folder has one), or None for a
    model assembled from parts (a build record there, or none)."""
    recorded = manifest.get("model_config")
    if recorded is None or (isinstance(recorded, dict) and PART in recorded):
        return None
    try:
        return ModelConfig.from_dict(recorded)
    except (InputError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"the manifest's model_config is no model config ({err})") from None
