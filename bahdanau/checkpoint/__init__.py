"""Checkpoints: the file format, a run's checkpoint folder, reading a model back, averaging.

* `files`: the format (docs/checkpoint-format.md), its digest, atomic `save_checkpoint`,
  checked `load_checkpoint`, and every upgrade of an old format (`upgrade_payload`);
* `manager`: `CheckpointManager` (the last N and the best kept) and `find_checkpoint`;
* `payload`: what translates from a checkpoint, `model_from_checkpoint`, `translation_weights`
  and `tokenizer_of`;
* `averaging`: `average_checkpoints` and the checks of members averaged or ensembled together;
* `release`: a model folder to share (`write_release`, `read_release`; docs/release-format.md),
  which `load_checkpoint` reads like a checkpoint file.

A checkpoint of a training run is built and restored by `bahdanau.training.checkpoint_payload`
and `bahdanau.training.restore`, beside the `TrainState` it holds.
"""

from bahdanau.checkpoint.averaging import (
    average_checkpoints,
    check_members,
    read_members,
    select_checkpoints,
)
from bahdanau.checkpoint.files import (
    FORMAT_VERSION,
    complete_old_state,
    load_checkpoint,
    save_checkpoint,
    upgrade_payload,
)
from bahdanau.checkpoint.manager import CheckpointManager, checkpoints_folder, find_checkpoint
from bahdanau.checkpoint.payload import model_from_checkpoint, tokenizer_of, translation_weights

__all__ = [
    "FORMAT_VERSION",
    "CheckpointManager",
    "average_checkpoints",
    "check_members",
    "checkpoints_folder",
    "complete_old_state",
    "find_checkpoint",
    "load_checkpoint",
    "model_from_checkpoint",
    "read_members",
    "save_checkpoint",
    "select_checkpoints",
    "tokenizer_of",
    "translation_weights",
    "upgrade_payload",
]
