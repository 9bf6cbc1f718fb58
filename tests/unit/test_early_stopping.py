"""The early-stopping metric (`TrainConfig.early_stopping_metric`): perplexity ranks checkpoints
lowest first, BLEU and chrF highest first, in best.pt, best.json, the kept best checkpoints,
patience and the dev log line; validate may return every score by name.
"""

from __future__ import annotations

import json

from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

from bahdanau.checkpoint import CheckpointManager, load_checkpoint
from bahdanau.config import TrainConfig, improves
from bahdanau.training import train

VOCAB = TINY_VOCAB
# Evaluations at steps 2, 4, 6, 8: the lowest perplexity is step 4's, the highest BLEU step 6's.
SCORES = {2: {"bleu": 1.0, "ppl": 50.0}, 4: {"bleu": 0.5, "ppl": 30.0},
          6: {"bleu": 3.0, "ppl": 40.0}, 8: {"bleu": 2.0, "ppl": 35.0}}


def _train(tmp_path, metric: str, **settings):
    steps = iter(SCORES)
    lines: list[str] = []
    cfg = TrainConfig(batch_size=8, max_steps=8, eval_every=2, save_every=100, log_every=100,
                      keep_last=1, early_stopping_metric=metric, **settings)
    result = train(tiny_model(), random_examples(40), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                   checkpoint_dir=tmp_path, validate=lambda model: SCORES[next(steps)],
                   log=lines.append)
    return result, lines


def test_improves_by_direction() -> None:
    assert improves("ppl", 30.0, 40.0) and not improves("ppl", 40.0, 30.0)
    assert improves("bleu", 40.0, 30.0) and not improves("chrf", 30.0, 40.0)
    assert improves("ppl", 1e9, None) and not improves("bleu", 3.0, 3.0)


def test_perplexity_picks_the_lowest_checkpoint_as_best(tmp_path) -> None:
    result, lines = _train(tmp_path, "ppl", keep_best=2, patience=2)
    # ppl 50, 30 (best), 40, 35: two evaluations without a lower one -> patience stops at 8
    assert (result.step, result.stopped) == (8, "patience")
    assert result.evals == [(2, 50.0), (4, 30.0), (6, 40.0), (8, 35.0)]
    assert (result.best_metric, result.best_step) == (30.0, 4)
    assert json.loads((tmp_path / "best.json").read_text()) == {"metric": 30.0, "step": 4,
                                                                "name": "ppl"}
    assert load_checkpoint(tmp_path / "best.pt")["train_state"]["step"] == 4
    # the two lowest are kept (steps 4 and 8; step 6's 40 is dropped) beside the last
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == [
        "step_00000004.pt", "step_00000008.pt"]
    manager = CheckpointManager(tmp_path, keep_best=2)           # reads the name back
    assert manager.metric_name == "ppl" and manager.best_n() == [(4, 30.0), (8, 35.0)]
    assert [p.name for p in manager.best_checkpoints(2)] == ["step_00000004.pt",
                                                             "step_00000008.pt"]
    assert manager.would_keep(34.0) and not manager.would_keep(36.0)
    assert "step 4 | dev bleu 0.50 ppl 30.00 | best ppl 30.00 at step 4" in lines


def test_bleu_picks_the_highest_from_the_same_scores(tmp_path) -> None:
    result, lines = _train(tmp_path, "bleu")
    assert (result.best_metric, result.best_step, result.stopped) == (3.0, 6, "max_steps")
    assert json.loads((tmp_path / "best.json").read_text())["name"] == "bleu"
    assert "step 8 | dev bleu 2.00 ppl 35.00 | best bleu 3.00 at step 6" in lines


def test_a_run_keeps_its_metric(tmp_path) -> None:
    _train(tmp_path, "ppl")
    one_line_error(lambda: CheckpointManager(tmp_path, metric_name="bleu"),
                   "best.json: the run ranks its checkpoints by ppl, not bleu")
    one_line_error(lambda: _train(tmp_path, "bleu"),            # resuming with another
                   "the run ranks its checkpoints by ppl, not bleu")


def test_validate_must_return_the_metric(tmp_path) -> None:
    cfg = TrainConfig(batch_size=8, max_steps=2, eval_every=2, early_stopping_metric="chrf")
    one_line_error(lambda: train(tiny_model(), random_examples(8), cfg, src_vocab=VOCAB,
                                 tgt_vocab=VOCAB, validate=lambda m: {"bleu": 1.0},
                                 log=lambda line: None),
                   "validate returned the scores ['bleu'], without 'chrf'")


def test_best_json_without_a_name_is_bleu_s(tmp_path) -> None:
    """A best.json from before metrics had names ranked by BLEU, the only metric then: it
    reads as BLEU's, and a run resumed to rank by perplexity is refused (it would compare a
    perplexity with a recorded BLEU)."""
    (tmp_path / "best.json").write_text(json.dumps({"metric": 2.0, "step": 3}))
    (tmp_path / "best.pt").write_bytes(b"")                 # only best.json is read here
    for given in ("bleu", None):
        manager = CheckpointManager(tmp_path, metric_name=given)
        assert (manager.best_metric, manager.best_step, manager.metric_name) == (2.0, 3, "bleu")
    for given in ("ppl", "chrf"):
        one_line_error(lambda given=given: CheckpointManager(tmp_path, metric_name=given),
                       f"best.json: the run ranks its checkpoints by bleu, not {given}")
