"""A trained model ready to translate: `load` a checkpoint, call `translate`.

    translator = bahdanau.load("runs/default")         # a run folder or a checkpoint file
    translator.translate(["A man is riding a bicycle."])  # e.g. ['Un homme fait du vélo.']
    translator.save_pretrained("my-model")             # a model folder, any model's
    Translator.from_pretrained("my-model", trust_code=True)   # parts of one's own imported

The checkpoint, read through the door `bahdanau.checkpoint.read_checkpoint`, gives the model,
its vocabularies and the tokenizer it was trained with (a SentencePiece model is restored from
the checkpoint itself). `translate` is `bahdanau.evaluate.translate_corpus` returning text;
call that for the hypotheses, n-best lists and attention weights.

Several checkpoints make an ensemble (`bahdanau.ensemble.Ensemble`), which decodes with the
mean of its members' probabilities:

    translator = bahdanau.load(["runs/a", "runs/b", "runs/c"])

`load(..., int8=True)` decodes with the big step matmuls in int8 on a CPU
(`bahdanau.RNNSearch.int8_copy`): faster, and nearly the same translations.

Under `torch.autocast` the model runs in its precision (bfloat16, float16), on a CPU or a GPU:

    with torch.autocast("cuda", dtype=torch.bfloat16):
        translator.translate(["A man is riding a bicycle."])
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from bahdanau._checks import check_type, describe
from bahdanau.checkpoint.averaging import read_members
from bahdanau.checkpoint.reader import find_checkpoint
from bahdanau.checkpoint.release import model_payload, parts_card, write_release
from bahdanau.data.tokenizers import Tokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.ensemble import Ensemble
from bahdanau.errors import InputError
from bahdanau.evaluate import translate_corpus
from bahdanau.models import RNNSearch
from bahdanau.search import BeamSearch

__all__ = ["Translator", "load"]


@dataclass(frozen=True)
class Translator:
    """A model with what it needs to translate raw text (`load` builds one)."""

    model: torch.nn.Module    # in eval mode, on the device it translates on
    tokenizer: Tokenizer      # tokenises the source, detokenises the target
    src_vocab: Vocab
    tgt_vocab: Vocab
    # the training update each checkpoint was saved at, in the order given (None where the
    # file records none): what a title or a log line names the model by
    steps: tuple[int | None, ...] = ()

    def save_pretrained(self, folder: str | os.PathLike[str], *, card: str | None = None,
                        overwrite: bool = False) -> Path:
        """Write the model, its vocabularies and tokenizer as a model folder (Hugging Face's
        layout: config.json, model.safetensors, README.md; docs/release-format.md).

        A model built from a preset is stored by its `ModelConfig`; one assembled from parts
        (an attention of one's own, say) by every part's class and constructor arguments
        (`bahdanau.parts.build_record`). `from_pretrained`, `load`, ``bahdanau translate``,
        ``evaluate`` and ``release`` read the folder.

        Args:
            folder: absent, empty, or a model folder to replace with `overwrite`.
            card: the README.md; default a short one (`bahdanau.checkpoint.release.parts_card`).
            overwrite: replace the model folder `folder` holds.
        Returns:
            The folder.
        Raises:
            InputError: a part that records no arguments, a constructor argument that is not
                JSON (named), an ensemble, or what `write_release` refuses.
        """
        if isinstance(self.model, Ensemble):
            raise InputError("an ensemble is several models: save each member apart")
        payload = model_payload(self.model, self.src_vocab, self.tgt_vocab, self.tokenizer)
        return write_release(payload, folder, overwrite=overwrite,
                             card=parts_card(payload) if card is None else card)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str], *,
                        device: str | torch.device = "cpu", trust_code: bool = False,
                        parts: Mapping[str, type] | None = None) -> Translator:
        """The `Translator` of a model folder (`save_pretrained`, ``bahdanau release``): `load`."""
        return load(folder, device=device, trust_code=trust_code, parts=parts)

    def translate(self, sentences: Sequence[str], *, search: BeamSearch | None = None,
                  batch_size: int = 64, constraints: Sequence[Sequence[str]] | None = None,
                  avoid: Sequence[Sequence[str]] | None = None) -> list[str]:
        """Translate raw sentences, in order.

        Args:
            sentences: source sentences (not one str).
            search: a `BeamSearch` (default: beam 5, at most 100 tokens).
            batch_size: sentences per batch.
            constraints: optional, one list of phrases per sentence that its translation
                holds, each contiguously; avoid: phrases it must not hold (as
                `translate_corpus`).
        Returns:
            One detokenised translation per sentence (under `torch.autocast`, decoded in its
            precision, as `translate_corpus`).
        Raises:
            InputError: as `translate_corpus` (an empty sentence, a bad argument).
        """
        device = next(self.model.parameters()).device
        return [t.text for t in translate_corpus(self.model, sentences, self.src_vocab,
                                                 self.tgt_vocab, self.tokenizer, search=search,
                                                 batch_size=batch_size, device=device,
                                                 constraints=constraints, avoid=avoid)]


def load(checkpoint: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
         device: str | torch.device = "cpu", trust_code: bool = False,
         parts: Mapping[str, type] | None = None, int8: bool = False) -> Translator:
    """The `Translator` of a checkpoint, or of an ensemble of several.

    Args:
        checkpoint: a checkpoint file, or a training output folder (``bahdanau train --out``,
            or a folder of checkpoints): its ``best.pt``, else its latest checkpoint
            (`bahdanau.checkpoint.find_checkpoint`). A list of them (two or more) gives an
            `Ensemble` of their models; a list of one is that one checkpoint.
        device: where the model goes.
        trust_code: import the classes outside bahdanau that a model assembled from parts
            names (`Translator.save_pretrained`); without it, or `parts` giving them, such a
            folder is refused before anything is imported.
        parts: those classes by import path, ``{"my_module:MyAttention": MyAttention}``.
        int8: decode each model's big step matmuls in int8 on the CPU's int8 units
            (`bahdanau.RNNSearch.int8_copy`); a CPU only.
    Returns:
        The model (eval mode), its tokenizer and vocabularies, and each checkpoint's training
        step (`Translator.steps`). A checkpoint with EMA weights
        translates with them (`bahdanau.checkpoint.Checkpoint.model`).
    Raises:
        InputError: no checkpoint there, or one that `bahdanau.checkpoint.read_checkpoint`
            refuses or whose weights do not fit (the file is named first), or ensemble
            members whose vocabularies or tokenizers differ
            (`bahdanau.checkpoint.read_members`); a SentencePiece tokenizer needs the
            sentencepiece package; `int8` that `bahdanau.RNNSearch.int8_copy` refuses.
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = [checkpoint]
    elif isinstance(checkpoint, bytes) or not isinstance(checkpoint, Sequence) or not checkpoint:
        raise InputError(f"checkpoint must be a path or a non-empty list of paths, got "
                         f"{describe(checkpoint)}")
    check_type("int8", int8, bool, "True or False")
    paths = [find_checkpoint(given) for given in checkpoint]
    models: list[torch.nn.Module] = []
    steps: list[int | None] = []
    for member in read_members(paths, same_config=False, trust_code=trust_code, parts=parts):
        if not models:
            tokenizer, src_vocab, tgt_vocab = member.tokenizer, member.src_vocab, member.tgt_vocab
        model = member.model(device=device)
        models.append(cast(RNNSearch, model).int8_copy() if int8 else model)
        steps.append(member.step)
    model = models[0] if len(models) == 1 else Ensemble(models).eval()
    return Translator(model=model, tokenizer=tokenizer, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                      steps=tuple(steps))
