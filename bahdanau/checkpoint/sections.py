"""The sections of a checkpoint, each named once: the keys of the dict a checkpoint file holds.

docs/checkpoint-format.md says what each holds. Code reads and writes a section through these
names (``payload[TRAIN_STATE]``), never through a bare string, so a section's name is spelled in
one place, and a new optional section is one declaration here (added to `OPTIONAL`) plus the
code that writes and reads it.
"""

from __future__ import annotations

__all__ = [
    "BEST_N", "BUILD", "DIGEST", "EMA", "EXTRA", "FORMAT", "MODEL", "MODEL_CONFIG", "OPTIMIZER",
    "OPTIMIZER_CLASS", "OPTIONAL", "REQUIRED", "RNG", "RNG_BY_RANK", "RUN", "SCALER",
    "SRC_VOCAB", "STOPPED", "TGT_VOCAB", "TOKENIZER", "TRAINING", "TRAIN_CONFIG",
    "TRAIN_STATE", "VERSIONS",
]

FORMAT = "format"                  # the format's number (`bahdanau.checkpoint.FORMAT_VERSION`)

# Every checkpoint of format 2 has these (None where the checkpoint has no such part).
MODEL = "model"                    # the trained weights, a state_dict
MODEL_CONFIG = "model_config"      # ModelConfig.to_dict()
SRC_VOCAB = "src_vocab"            # Vocab.to_dict() of each side
TGT_VOCAB = "tgt_vocab"
TRAIN_CONFIG = "train_config"      # TrainConfig.to_dict(), or None
TRAIN_STATE = "train_state"        # TrainState.to_dict(), or None
OPTIMIZER = "optimizer"            # the optimizer's state_dict(), or None
SCALER = "scaler"                  # the fp16 GradScaler's state_dict(), or None
RNG = "rng"                        # the random generators' states
EXTRA = "extra"                    # the caller's own entries (the command's options: "options")

# Optional: absent from checkpoints that do not have them, and from those of earlier versions.
OPTIMIZER_CLASS = "optimizer_class"  # the optimizer's class name
DIGEST = "digest"                  # SHA-256 of every other section (`save_checkpoint` adds it)
TOKENIZER = "tokenizer"            # the tokenizer, as `tokenizer_to_payload` stores it
EMA = "ema"                        # the moving average of the weights, a state_dict
BEST_N = "best_n"                  # the best evaluations so far (`CheckpointManager`)
VERSIONS = "versions"              # what wrote the file (`bahdanau._about.versions`)
RNG_BY_RANK = "rng_by_rank"        # every process's random states, under torch.distributed
RUN = "run"                        # the run an average's members come from (`RunRecord`)
STOPPED = "stopped"                # why an interrupted run saved off its schedule ("sigint", ...)
BUILD = "build"                    # how a model assembled from parts was built
                                   # (`bahdanau.parts.build_record`); its MODEL_CONFIG is None

REQUIRED = (MODEL, MODEL_CONFIG, SRC_VOCAB, TGT_VOCAB, TRAIN_CONFIG, TRAIN_STATE, OPTIMIZER,
            SCALER, RNG, EXTRA)
OPTIONAL = (OPTIMIZER_CLASS, DIGEST, TOKENIZER, EMA, BEST_N, VERSIONS, RNG_BY_RANK, RUN,
            STOPPED, BUILD)
# What resumes training: None in a checkpoint that only translates (an average, a model folder).
TRAINING = (TRAIN_CONFIG, TRAIN_STATE, OPTIMIZER, OPTIMIZER_CLASS, SCALER, RNG)
