"""Checkpoints: the file format, a run's checkpoint folder, the door that reads them, averaging.

* `reader`: the one door for reading: `read_checkpoint` reads a checkpoint file, a run folder
  or a model folder, upgrades an old format once and gives a `Checkpoint` of typed parts
  (config, vocabularies, tokenizer, weights, training sections, the `RunRecord` of its run);
  `find_checkpoint`, `load_checkpoint` (the raw payload) and `model_from_checkpoint` too;
* `sections`: the name of every section of a checkpoint, declared once;
* `files`: the format (docs/checkpoint-format.md), its digest, atomic `save_checkpoint`,
  checked `bahdanau.checkpoint.files.load_checkpoint_file`, and every upgrade of an old format
  (`upgrade_payload`);
* `manager`: `CheckpointManager` (the last N and the best kept);
* `payload`: the parsers and checks of what translates from a checkpoint,
  `translation_weights` and `tokenizer_of`;
* `averaging`: `average_checkpoints` and the checks of members averaged or ensembled together;
* `release`: a model folder to share (`write_release`, `read_release`; docs/release-format.md),
  one of the folder kinds the door reads.

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
    save_checkpoint,
    upgrade_payload,
)
from bahdanau.checkpoint.manager import CheckpointManager, checkpoints_folder
from bahdanau.checkpoint.payload import tokenizer_of, translation_weights
from bahdanau.checkpoint.reader import (
    Checkpoint,
    RunRecord,
    checkpoint_of,
    find_checkpoint,
    load_checkpoint,
    model_from_checkpoint,
    read_checkpoint,
)

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointManager",
    "RunRecord",
    "average_checkpoints",
    "check_members",
    "checkpoint_of",
    "checkpoints_folder",
    "complete_old_state",
    "find_checkpoint",
    "load_checkpoint",
    "model_from_checkpoint",
    "read_checkpoint",
    "read_members",
    "save_checkpoint",
    "select_checkpoints",
    "tokenizer_of",
    "translation_weights",
    "upgrade_payload",
]
