"""Jobs: what the commands do, as library calls that take their options.

* `options`: every option of every command, declared once (`TrainOptions` ...);
* `flags`: how an options class becomes command-line flags (`--help` groups) and back;
* `train_job`: the default job, `run_train_job` (data, vocabularies, model, run, test report);
* `run_folder`: a run folder's options file, lock, overwrite and results;
* `resume`: what a resumed run keeps of its recorded options, and which changes it refuses;
* `report`: a model's test-set report (`TestReport`);
* `release`: ``bahdanau release``, a model folder to share with its model card (`release_model`);
* `init_from`: ``train --init-from``, a new run from a trained model's weights (fine-tuning);
* `files`, `resolve`: inputs and outputs checked, and options resolved into a device, a search
  and loaded checkpoints, before any work.

`bahdanau.cli` parses a command line into options and calls these.
"""

from bahdanau.jobs.options import (
    AverageOptions,
    EvaluateOptions,
    PlotOptions,
    PrepareOptions,
    SearchOptions,
    TrainOptions,
    TranslateOptions,
)
from bahdanau.jobs.report import TestReport, score_translations
from bahdanau.jobs.train_job import TrainJobResult, run_train_job

__all__ = [
    "AverageOptions",
    "EvaluateOptions",
    "PlotOptions",
    "PrepareOptions",
    "SearchOptions",
    "TestReport",
    "TrainJobResult",
    "TrainOptions",
    "TranslateOptions",
    "run_train_job",
    "score_translations",
]
