"""Ensembles: several models decoding together, as one model for `BeamSearch`.

An `Ensemble` offers exactly what the search calls on a model, `encode` and `step` (see
`BeamSearch.__call__`), so `BeamSearch`, `greedy_search`, `translate_corpus` and the command line
decode with it unchanged. It calls each member's `encode` and `step` and never looks inside a
member, so the members may differ in size, attention or architecture; they must read and write
the same ids (`bahdanau.load` also checks that their checkpoints share vocabularies and tokenizer).

At each step the members' next-token distributions are averaged (Hinton & Dietterich's linear
pool, as in fairseq and Nematus):

    log p(y | ...) = log( 1/M sum_m p_m(y | ...) ) = logsumexp_m log p_m(y | ...) - log M

for M members; the step returns these log-probabilities as its logits (`BeamSearch` takes their
log_softmax, which leaves normalised log-probabilities as they are). An ensemble of one member
returns that member's logits unchanged, so it decodes exactly as the member does.

Alignments: a step's weights are the mean of the weights of the members that have attention
(each row still sums to 1 over the real source positions), None if no member has any.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, cast

import torch
from torch import Tensor, nn

from bahdanau.config import ModelConfig, model_vocabs
from bahdanau.decoder import StepOutput
from bahdanau.errors import InputError

__all__ = ["Ensemble", "EnsembleMemory", "EnsembleState"]


class _Member(Protocol):
    """What an ensemble calls on a member (`RNNSearch`, `RNNEncDec`)."""

    def encode(self, src: Tensor, src_lengths: Tensor, *, check: bool = True
               ) -> tuple[Any, Any]: ...

    def step(self, prev_tokens: Tensor, state: Any, memory: Any, *, check: bool = True
             ) -> StepOutput: ...


class EnsembleState(NamedTuple):
    """The decoder states of the members, one per member, each of the same N rows."""

    members: tuple[Any, ...]

    @property
    def hidden(self) -> Tensor:
        """(N, D) the first member's s_i (`BeamSearch` reads its dtype)."""
        return self.members[0].hidden

    def rows(self, index: Tensor) -> EnsembleState:
        """Rows `index` of every member's state (beam search repeats and reorders rows)."""
        return EnsembleState(tuple(state.rows(index) for state in self.members))


class EnsembleMemory(NamedTuple):
    """The members' memories of the same B sentences."""

    members: tuple[Any, ...]

    def select(self, keep: Tensor) -> EnsembleMemory:
        """The memories of sentences `keep` (search drops finished sentences)."""
        return EnsembleMemory(tuple(memory.select(keep) for memory in self.members))


class Ensemble(nn.Module):
    """Models that decode together by averaging their next-token probabilities.

    Args:
        models: one or more models with `encode(src, src_lengths, check=...)` and
            `step(prev_tokens, state, memory, check=...)` (`RNNSearch`, `RNNEncDec`), on one
            device, and with the same source and target vocabulary sizes and special ids (their
            `.config`s').
    Raises:
        InputError: no model, something that is not a `torch.nn.Module` with `encode` and
            `step`, or members whose vocabulary sizes or special ids, or devices, differ
            (named).

    `config` is the first member's `ModelConfig` (its vocabulary sizes and special ids are
    every member's); `arch` is "rnnsearch" if a member has attention, else "rnnencdec". An
    ensemble decodes only: it has no `forward` or `loss` to train.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        if isinstance(models, nn.Module) or not isinstance(models, Sequence) or not models:
            raise InputError(f"models must be a non-empty list of models, got "
                             f"{type(models).__name__}")
        for i, model in enumerate(models):
            if not (isinstance(model, nn.Module) and callable(getattr(model, "encode", None))
                    and callable(getattr(model, "step", None))):
                raise InputError(f"models[{i}] must be a torch.nn.Module with encode() and "
                                 f"step() (e.g. RNNSearch), got {type(model).__name__}")
        _check_same_ids(models)
        _check_one_device(models)
        self.members = nn.ModuleList(models)

    def _models(self) -> list[_Member]:
        """The members, as `__init__` checked they are: Modules with encode() and step()."""
        return cast(list[_Member], list(self.members))

    @property
    def config(self) -> ModelConfig | None:
        """The first member's config (vocabulary sizes and special ids are every member's)."""
        return getattr(self.members[0], "config", None)

    @property
    def vocab_sizes(self) -> tuple[int, int] | None:
        """The first member's (source, target) vocabulary sizes, every member's; None when it
        says none."""
        return getattr(self.members[0], "vocab_sizes", None)

    @property
    def arch(self) -> str:
        """"rnnsearch" if a member has attention (`arch` other than "rnnencdec"), else
        "rnnencdec"."""
        archs = {getattr(model, "arch", "rnnsearch") for model in self.members}
        return "rnnencdec" if archs == {"rnnencdec"} else "rnnsearch"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not available: an ensemble only decodes.

        Raises:
            InputError: always.
        """
        raise InputError("an Ensemble only decodes (encode/step, e.g. through BeamSearch); "
                         "train its members one by one")

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[EnsembleState, EnsembleMemory]:
        """Every member's `encode` of the batch. The values of the source are checked once, by
        the first member (every member reads the same ids); the others get `check=False`.

        Args:
            src: (B, S) source ids, padded.
            src_lengths: (B,) real lengths.
        Returns:
            The members' initial states (B rows each) and memories.
        Raises:
            InputError: what the members' `encode` refuses.
        """
        states, memories = [], []
        for i, model in enumerate(self._models()):
            state, memory = model.encode(src, src_lengths, check=i == 0)
            states.append(state)
            memories.append(memory)
        return EnsembleState(tuple(states)), EnsembleMemory(tuple(memories))

    def step(self, prev_tokens: Tensor, state: EnsembleState, memory: EnsembleMemory, *,
             check: bool = True) -> StepOutput:
        """One step of every member, combined (see the module docstring).

        Args:
            prev_tokens: (N,) the previous target ids.
            state: N rows of every member's state.
            memory: the members' memories.
            check: the members' check of the token ids' values (`RNNSearch.step`), made by the
                first member alone; False (what `BeamSearch` passes) reads nothing back.
        Returns:
            (N, V) log of the mean of the members' probabilities as `logits` (the one member's
            logits for an ensemble of one), the new `EnsembleState`, and the (N, S) mean of
            the members' alignment weights (None if no member has attention).
        """
        outputs = [model.step(prev_tokens, member_state, member_memory, check=check and i == 0)
                   for i, (model, member_state, member_memory)
                   in enumerate(zip(self._models(), state.members, memory.members,
                                    strict=True))]
        new_state = EnsembleState(tuple(out.state for out in outputs))
        if len(outputs) == 1:
            # StepOutput.state is typed DecoderState; an ensemble's is an EnsembleState with the
            # same rows() and hidden, all the search uses (a NamedTuple cannot be generic on 3.10)
            return StepOutput(outputs[0].logits, new_state,  # type: ignore[arg-type]
                              outputs[0].weights)
        dtype = torch.float64 if outputs[0].logits.dtype == torch.float64 else torch.float32
        log_probs = torch.stack([torch.log_softmax(out.logits.to(dtype), dim=-1)
                                 for out in outputs])                          # (M, N, V)
        combined = torch.logsumexp(log_probs, dim=0) - math.log(len(outputs))  # (N, V)
        weights = [out.weights for out in outputs if out.weights is not None]
        mean_weights = torch.stack(weights).mean(0) if weights else None       # (N, S)
        return StepOutput(combined, new_state, mean_weights)  # type: ignore[arg-type]  # as above


def _check_same_ids(models: Sequence[nn.Module]) -> None:
    """Members agree on vocabulary sizes and special ids: those of their configs, and for a
    member built without one, its `vocab_sizes` and the default ids (what `BeamSearch` uses:
    `bahdanau.config.model_vocabs`). A member that says no sizes is not compared."""
    said = [(i, model_vocabs(model)) for i, model in enumerate(models)]
    known = [(i, dataclasses.asdict(vocabs)) for i, vocabs in said if vocabs.sizes is not None]
    if not known:
        return
    first_index, first = known[0]
    for i, ids in known[1:]:
        for name, value in ids.items():
            if value != first[name]:
                raise InputError(f"models[{i}] has {name}={value} but models[{first_index}] "
                                 f"has {first[name]}: ensemble members share their "
                                 "vocabularies")



def _check_one_device(models: Sequence[nn.Module]) -> None:
    """Members' weights lie on one device: their distributions are averaged there."""
    placed = [(i, param.device) for i, model in enumerate(models)
              if (param := next(iter(model.parameters()), None)) is not None]
    for i, device in placed[1:]:
        if device != placed[0][1]:
            raise InputError(f"models[{i}] is on {device} but models[{placed[0][0]}] on "
                             f"{placed[0][1]}: ensemble members decode on one device (move "
                             "them there with .to(device))")
