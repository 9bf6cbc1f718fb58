"""Training: one step, a run of named pieces over one state, the loop, and what they use.

* `step`: `make_optimizer`, `LossModule`, `train_step` (one update of any model on any batch),
  `evaluate_loss`;
* `precision`: what each `--amp` name runs in, and what `--amp auto` picks on this machine
  (`precision.resolve_amp`, from the decisions recorded in `precision.AUTO_BF16`);
* `plan`: `BatchPlan` (each update's batches, shared among processes), `BatchLoader` and
  `LoaderWorkerError`;
* `state`: `TrainState`, and the checkpoint of a run (`checkpoint_payload`, `restore`);
* `stored_states`: the checks `restore` runs on a checkpoint's optimizer and GradScaler states;
* `run`: `TrainRun` and its pieces, `setup_run`, `next_batches`, `run_step`, `validate_run`,
  `save_run`, `stop_reason`;
* `loop`: `train` and `train_run`, the pieces put together with logging, early stopping and
  signals;
* `progress`: the run's progress bar on a terminal (`TrainBar`: updates, loss, tok/s, time
  left);
* `distributed`: the process group's life (`leave_process_group`);
* `schedules`, `ema`, `runlog`: learning-rate schedules, the weights' moving average, and the
  run's log file and TensorBoard events.
"""

from bahdanau.training.distributed import leave_process_group
from bahdanau.training.ema import WeightEMA
from bahdanau.training.loop import TrainResult, train, train_run
from bahdanau.training.plan import BatchLoader, BatchPlan, LoaderWorkerError, PlannedUpdate
from bahdanau.training.run import (
    TrainRun,
    examples_digest,
    next_batches,
    run_step,
    save_run,
    setup_run,
    stop_reason,
    validate_run,
)
from bahdanau.training.schedules import LRSchedule
from bahdanau.training.state import TrainState, checkpoint_payload, restore
from bahdanau.training.step import (
    LossModule,
    StepStats,
    evaluate_loss,
    make_optimizer,
    train_step,
)

__all__ = [
    "BatchLoader",
    "BatchPlan",
    "LRSchedule",
    "LoaderWorkerError",
    "LossModule",
    "PlannedUpdate",
    "StepStats",
    "TrainResult",
    "TrainRun",
    "TrainState",
    "WeightEMA",
    "checkpoint_payload",
    "evaluate_loss",
    "examples_digest",
    "leave_process_group",
    "make_optimizer",
    "next_batches",
    "restore",
    "run_step",
    "save_run",
    "setup_run",
    "stop_reason",
    "train",
    "train_run",
    "train_step",
    "validate_run",
]
