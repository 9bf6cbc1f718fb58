"""What a checkpoint holds besides its training state: the model, its weights and its tokenizer.

The parsers and checks of a payload's parts, which the door (`bahdanau.checkpoint.reader`) runs
on what it reads: `stored_parts` (the model config and vocabularies, checked against each
other), `translation_weights` (the weights a checkpoint translates with: the moving average
when it has one), `check_built_vocabs` (a model assembled from parts against its vocabularies) and
`parse_tokenizer` (the tokenizer it was trained with). They take a payload of the current
format; `tokenizer_of` takes one of any format.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from bahdanau.checkpoint.files import parse_section, upgrade_payload
from bahdanau.checkpoint.sections import (
    BUILD,
    EMA,
    EXTRA,
    MODEL,
    MODEL_CONFIG,
    SRC_VOCAB,
    TGT_VOCAB,
    TOKENIZER,
)
from bahdanau.config import ModelConfig, model_vocabs
from bahdanau.data.sentencepiece import SentencePieceTokenizer, check_vocabs
from bahdanau.data.tokenizers import (
    DefaultTokenizer,
    Tokenizer,
    tokenizer_from_payload,
)
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError


def stored_parts(payload: dict[str, Any]) -> tuple[ModelConfig | None, Vocab, Vocab]:
    """The payload's model config and vocabularies, checked against each other; the config is
    None for a model assembled from parts (its `BUILD` record, checked against the
    vocabularies once its classes are found: `check_built_vocabs`)."""
    config = None
    if payload[MODEL_CONFIG] is not None or payload.get(BUILD) is None:
        config = parse_section(payload, MODEL_CONFIG, ModelConfig.from_dict)
    src_vocab = parse_section(payload, SRC_VOCAB, Vocab.from_dict)
    tgt_vocab = parse_section(payload, TGT_VOCAB, Vocab.from_dict)
    try:
        if config is not None:
            config.check_vocabs(src_vocab, tgt_vocab)
    except ValueError as err:
        raise InputError(f"checkpoint is inconsistent: {err}") from None
    return config, src_vocab, tgt_vocab


def check_built_vocabs(model: nn.Module, src_vocab: Vocab, tgt_vocab: Vocab) -> None:
    """Refuse vocabularies whose sizes or padding id differ from those of a model assembled
    from parts (its skeleton will do: only sizes are read, by `bahdanau.config.model_vocabs`)."""
    sizes = model_vocabs(model).sizes
    if sizes is not None and sizes != (len(src_vocab), len(tgt_vocab)):
        raise InputError(f"checkpoint is inconsistent: its model's vocabulary sizes are "
                         f"{sizes}, its vocabularies have {len(src_vocab)} and "
                         f"{len(tgt_vocab)} entries")
    for part in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
        pad_id = getattr(part, "pad_id", src_vocab.pad_id)
        if pad_id != src_vocab.pad_id:
            raise InputError(f"checkpoint is inconsistent: its model pads with id {pad_id}, "
                             f"its vocabularies with {src_vocab.pad_id}")


def translation_weights(payload: dict[str, Any], *, ema: bool = True
                        ) -> tuple[str, dict[str, Tensor]]:
    """The weights a checkpoint translates with: its `ema` section (the moving average of
    training, `bahdanau.training.ema`) when it has one and `ema` is True, else its `model` section.

    Args:
        payload: a checkpoint dict of the current format (`upgrade_payload`).
        ema: False always takes `model`.
    Returns:
        (the section's name, its state_dict), unchecked.
    """
    if ema and payload.get(EMA) is not None:
        return EMA, payload[EMA]
    return MODEL, payload[MODEL]


def tokenizer_of(payload: dict[str, Any]) -> Tokenizer:
    """The tokenizer that a checkpoint's model was trained with.

    The payload's `tokenizer` section; for a checkpoint without one (written by an earlier
    version, or without a tokenizer given), a `DefaultTokenizer` with the settings that the
    command line kept in extra["tokenizer"] ("lowercase", "joiners"; missing ones take their
    defaults), else `DefaultTokenizer()`. A SentencePiece tokenizer is checked against both
    stored vocabularies.

    Args:
        payload: a checkpoint dict (format 1 or 2), e.g. from `load_checkpoint`.
    Returns:
        The tokenizer.
    Raises:
        InputError: the section (or extra["tokenizer"]) is malformed or names a tokenizer that
            bahdanau does not store, its SentencePiece model does not load (or sentencepiece is
            not installed), or a stored vocabulary holds a word that is not a piece of that
            model; one line each.
    """
    return parse_tokenizer(upgrade_payload(payload))


def parse_tokenizer(payload: dict[str, Any]) -> Tokenizer:
    """`tokenizer_of` for a payload of the current format (`upgrade_payload`)."""
    section, data = tokenizer_data(payload)
    if data is None:
        return DefaultTokenizer()
    try:
        tokenizer = tokenizer_from_payload(data)
    except InputError as err:
        raise InputError(f"checkpoint {section}: {err}") from None
    if isinstance(tokenizer, SentencePieceTokenizer):
        src_vocab = parse_section(payload, SRC_VOCAB, Vocab.from_dict)
        tgt_vocab = parse_section(payload, TGT_VOCAB, Vocab.from_dict)
        try:
            check_vocabs(tokenizer, src_vocab, tgt_vocab)
        except InputError as err:
            raise InputError(f"checkpoint {section} does not fit its vocabularies: {err}"
                             ) from None
    return tokenizer


def tokenizer_data(payload: dict[str, Any]) -> tuple[str, Any]:
    """(where, what) a payload stores of its tokenizer, as `tokenizer_of` reads it: the
    `tokenizer` section, else extra["tokenizer"] with the missing default settings filled in;
    None for neither (`DefaultTokenizer()`)."""
    data = payload.get(TOKENIZER)
    if data is not None:
        return TOKENIZER, data
    extra = payload[EXTRA] if isinstance(payload[EXTRA], dict) else {}
    data = extra.get("tokenizer")
    if isinstance(data, dict) and data.get("name", "default") == "default":
        data = {"lowercase": False, "joiners": "prefix", **data, "name": "default"}
    return "extra['tokenizer']", data
