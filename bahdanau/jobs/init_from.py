"""Fine-tuning: a new run whose weights come from a trained model (``train --init-from``).

`read_init_model` reads the model a run starts from (a checkpoint, a run folder's best, or a
model folder from ``bahdanau release``): the weights it translates with, its config, its
vocabularies and its tokenizer. By default (``--init-vocab``) the new run encodes its data with
that model's vocabularies and tokenizer, which is what fine-tuning on new data needs; with
``--no-init-vocab`` (or a prepared corpus, ``--data``) the run's own vocabularies must equal the
model's. `check_fit` refuses, in one line, a run whose model or vocabularies do not fit the
weights, before any work; `init_weights` copies them into the new run's model. Only the weights
come along: the optimizer, the schedule and the place in the data start afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from torch import Tensor, nn

from bahdanau.checkpoint.reader import read_checkpoint
from bahdanau.config import ModelConfig
from bahdanau.data.tokenizers import Tokenizer, comparable_payload, tokenizer_to_payload
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.jobs.flags import flag_words
from bahdanau.model_folder import check_weights

# ModelConfig fields a fine-tuning run may choose anew: regularisation and how the same weights
# are computed or were first drawn. Every other field (sizes, architecture, special ids) must be
# the starting model's.
FREE_FIELDS = ("dropout", "dropout_rnn_inputs", "dropout_deep_output", "attention_impl",
               "engine", "init")


@dataclass(frozen=True)
class InitModel:
    """The trained model a run starts from."""

    path: Path                     # the checkpoint file or model folder it was read from
    config: ModelConfig
    src_vocab: Vocab
    tgt_vocab: Vocab
    tokenizer: Tokenizer
    weights: dict[str, Tensor]     # those it translates with (its moving average, if kept)


def read_init_model(given: str) -> InitModel:
    """The model of ``--init-from`` (a file, a run folder's best or latest, a model folder).

    Raises:
        InputError: nothing there, or a damaged checkpoint or model folder, a model assembled
            from parts (it has no ModelConfig to build the new run from), or weights that do
            not fit their own config (the file is named).
    """
    checkpoint = read_checkpoint(given, name="--init-from", needs_config=(
        "train --init-from builds the new run's model from a preset and its options"))
    _, weights = checkpoint.translation_weights()
    assert checkpoint.path is not None                    # read from a path
    return InitModel(checkpoint.path, checkpoint.config, checkpoint.src_vocab,
                     checkpoint.tgt_vocab, checkpoint.tokenizer, weights)


def check_fit(init: InitModel, config: ModelConfig, src_vocab: Vocab, tgt_vocab: Vocab,
              tokenizer: Tokenizer) -> None:
    """Refuse a run whose model config, vocabularies or tokenizer do not fit `init`'s weights.

    Raises:
        InputError: one line naming the model, what differs and both values.
    """
    where = f"--init-from {init.path}"
    for side, ours, theirs in (("source", src_vocab, init.src_vocab),
                               ("target", tgt_vocab, init.tgt_vocab)):
        if ours != theirs:
            raise InputError(f"{where}: its {side} vocabulary ({len(theirs)} entries) is not "
                             f"this run's ({len(ours)} entries): fine-tuning keeps the model's "
                             "vocabularies (--init-vocab takes them; a prepared --data must be "
                             "encoded with them)")
    if (comparable_payload(tokenizer_to_payload(tokenizer))
            != comparable_payload(tokenizer_to_payload(init.tokenizer))):
        raise InputError(f"{where}: its tokenizer is not this run's: fine-tuning keeps the "
                         "model's tokenizer (--init-vocab takes it)")
    for field in fields(ModelConfig):
        ours, theirs = getattr(config, field.name), getattr(init.config, field.name)
        if field.name not in FREE_FIELDS and ours != theirs:
            give = (flag_words(field.name, theirs) if isinstance(theirs, bool) else
                    "the model's preset and sizes (--preset, --arch, --hidden-size, ...)")
            raise InputError(f"{where}: its model has {field.name} {theirs!r}, this run's "
                             f"{ours!r}: give {give}")


def init_weights(model: nn.Module, init: InitModel) -> None:
    """Copy `init`'s weights into `model` (built from a config `check_fit` accepted)."""
    check_weights(init.weights, model)
    model.load_state_dict(init.weights)
