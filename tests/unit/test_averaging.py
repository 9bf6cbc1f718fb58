"""Checkpoint averaging (bahdanau.checkpoint) and the checkpoints it picks (keep_best, best_n).

Expectations: the average of two checkpoints is the element-wise mean of their weights computed
by hand in float64 (and, for weights set to exact values, that value); averaging one checkpoint
gives its weights unchanged; `--last`/`--best` pick the files a hand-made ranking says.
"""

from __future__ import annotations

import math
import os

import torch
from training_fixtures import TINY_VOCAB, one_line_error, random_examples, tiny_model

from bahdanau.checkpoint import (
    CheckpointManager,
    average_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    select_checkpoints,
    tokenizer_of,
)
from bahdanau.config import TrainConfig
from bahdanau.data import DefaultTokenizer, Vocab
from bahdanau.training import WeightEMA, train
from bahdanau.training.state import checkpoint_payload
from bahdanau.translate import load

VOCAB = TINY_VOCAB


def _save(path, model, **kwargs):
    kwargs.setdefault("tokenizer", DefaultTokenizer(lowercase=True))
    save_checkpoint(path, checkpoint_payload(model, src_vocab=kwargs.pop("src_vocab", VOCAB),
                                             tgt_vocab=VOCAB, **kwargs))
    return path


def test_average_of_two_is_the_hand_mean(tmp_path) -> None:
    a, b = tiny_model(0), tiny_model(1)
    paths = [_save(tmp_path / "a.pt", a), _save(tmp_path / "b.pt", b)]
    payload = average_checkpoints(paths)
    for key, value in payload["model"].items():
        expected = (a.state_dict()[key].double() + b.state_dict()[key].double()) / 2
        assert value.dtype == torch.float32
        torch.testing.assert_close(value.double(), expected, rtol=2**-24, atol=0)
    # exact values: 1 and 2 average to 1.5; 0.25 and -0.75 to -0.25
    with torch.no_grad():
        for model, value in ((a, 1.0), (b, 2.0)):
            for p in model.parameters():
                p.fill_(value)
    halves = average_checkpoints([_save(tmp_path / "a1.pt", a), _save(tmp_path / "b2.pt", b)])
    assert all(bool((v == 1.5).all()) for v in halves["model"].values())


def test_average_of_one_is_identity_and_a_checkpoint_like_any_other(tmp_path) -> None:
    model = tiny_model(3)
    path = _save(tmp_path / "one.pt", model, train_config=TrainConfig())
    payload = average_checkpoints([path])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in payload["model"].items())
    assert payload["train_state"] is None and payload["optimizer"] is None
    assert payload["extra"]["averaged_from"] == [{"file": str(path), "weights": "model",
                                                  "step": None, "run_id": None}]
    out = tmp_path / "avg.pt"
    save_checkpoint(out, payload)
    loaded, src_vocab, _ = model_from_checkpoint(out)
    assert src_vocab == VOCAB
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    assert tokenizer_of(load_checkpoint(out)).lowercase is True
    assert load(out).tokenizer.lowercase is True


def test_members_contribute_their_ema_weights(tmp_path) -> None:
    a, b = tiny_model(0), tiny_model(1)
    ema = WeightEMA(a, 0.5)
    with torch.no_grad():
        for p in a.parameters():
            p.add_(4.0)
    ema.update(a)                                       # e = w_0 + 2
    paths = [_save(tmp_path / "a.pt", a, ema=ema), _save(tmp_path / "b.pt", b)]
    payload = average_checkpoints(paths)
    assert [m["weights"] for m in payload["extra"]["averaged_from"]] == ["ema", "model"]
    key = "decoder.weight_hh"
    expected = (ema.state_dict()[key].double() + b.state_dict()[key].double()) / 2
    torch.testing.assert_close(payload["model"][key].double(), expected, rtol=2**-24, atol=0)
    assert "ema" not in payload


def test_mismatched_members_are_refused_in_one_line(tmp_path) -> None:
    a = _save(tmp_path / "a.pt", tiny_model(0))
    other_size = _save(tmp_path / "wide.pt", tiny_model(0, hidden_size=10))
    one_line_error(lambda: average_checkpoints([a, other_size]),
                   f"{other_size}: its model config differs from {a}'s", "hidden_size=10 vs 8")
    vocab = Vocab([f"v{i}" for i in range(12)])
    other_vocab = _save(tmp_path / "vocab.pt", tiny_model(0), src_vocab=vocab)
    one_line_error(lambda: average_checkpoints([a, other_vocab]),
                   f"{other_vocab}: its source vocabulary", f"differs from {a}'s")
    other_tok = _save(tmp_path / "tok.pt", tiny_model(0), tokenizer=DefaultTokenizer())
    one_line_error(lambda: average_checkpoints([a, other_tok]),
                   f"{other_tok}: its tokenizer (default (lowercase=False, joiners='prefix')) "
                   f"differs from {a}'s (default (lowercase=True, joiners='prefix'))")
    one_line_error(lambda: average_checkpoints([a, tmp_path / "." / "a.pt"]), "is listed twice")
    # a hard link (what a run's best.pt is to its step file) is the same file under another
    # name; realpath tells them apart, the inode does not
    os.link(a, tmp_path / "best.pt")
    one_line_error(lambda: average_checkpoints([a, tmp_path / "best.pt"]),
                   f"{tmp_path / 'best.pt'} is listed twice (also as {a})")
    one_line_error(lambda: average_checkpoints([]), "non-empty list")
    one_line_error(lambda: average_checkpoints(str(a)), "non-empty list")


def test_manager_keeps_the_best_n(tmp_path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1, keep_best=3)
    metrics = {1: 1.0, 2: 5.0, 3: 2.0, 4: 4.0, 5: None, 6: 0.5}
    for step, metric in metrics.items():
        manager.save(step, {"step": step}, metric=metric)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.json", "best.pt", "step_00000002.pt", "step_00000003.pt", "step_00000004.pt",
        "step_00000006.pt"]
    ranking = [(2, 5.0), (4, 4.0), (3, 2.0)]
    assert manager.best_n() == ranking
    assert load_checkpoint(manager.latest())["best_n"] == [
        {"step": 2, "metric": 5.0}, {"step": 4, "metric": 4.0}, {"step": 3, "metric": 2.0}]
    again = CheckpointManager(tmp_path)                 # read back from the latest checkpoint
    assert again.best_n() == ranking
    assert again.best_checkpoints(2) == [tmp_path / "step_00000002.pt",
                                         tmp_path / "step_00000004.pt"]
    one_line_error(lambda: again.best_checkpoints(4), "ranks 3 evaluated checkpoints, not 4",
                   "--keep-best 4")
    assert manager.would_keep(2.5) and not manager.would_keep(2.0)
    (tmp_path / "step_00000004.pt").unlink()
    one_line_error(lambda: again.best_checkpoints(2), "step_00000004.pt: no such file",
                   "ranked 2 (step 4, metric 4)")


def test_keep_best_one_writes_no_section_and_falls_back_to_best_pt(tmp_path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    for step, metric in {1: 1.0, 2: 3.0, 3: 2.0}.items():
        manager.save(step, {"step": step}, metric=metric)
    assert "best_n" not in load_checkpoint(manager.latest())
    assert manager.best_n() == [(2, 3.0)]
    assert manager.best_checkpoints(1) == [tmp_path / "best.pt"]
    assert manager.would_keep(3.5) and not manager.would_keep(3.0)
    one_line_error(lambda: CheckpointManager(tmp_path, keep_best=0), "keep_best must be a positive")
    # NaN would be the best forever (nothing compares above it); "3" fails at the next save
    for metric in (math.nan, "3"):
        one_line_error(lambda m=metric: manager.save(4, {"step": 4}, metric=m),
                       "metric must be a finite number")
        one_line_error(lambda m=metric: manager.would_keep(m), "metric must be a finite number")
    assert manager.checkpoints()[-1].name == "step_00000003.pt"


def test_select_last_and_best(tmp_path) -> None:
    run = tmp_path / "run"
    folder = run / "checkpoints"
    manager = CheckpointManager(folder, keep_last=3, keep_best=2)
    for step, metric in {2: 1.0, 4: 3.0, 6: 2.0, 8: None, 10: None}.items():
        manager.save(step, {"step": step}, metric=metric)
    files = {s: folder / f"step_{s:08d}.pt" for s in (4, 6, 8, 10)}
    assert select_checkpoints([run], last=2) == [files[8], files[10]]
    assert select_checkpoints([folder], last=3) == [files[6], files[8], files[10]]
    assert select_checkpoints([run], best=2) == [files[4], files[6]]
    one_line_error(lambda: select_checkpoints([run], last=5), "holds 4 numbered checkpoints",
                   "--last 5")
    one_line_error(lambda: select_checkpoints([run], last=1, best=1), "not both")
    one_line_error(lambda: select_checkpoints([run]), f"--checkpoint {run} is a folder",
                   "--last N or --best N")
    one_line_error(lambda: select_checkpoints([files[4], files[6]], last=2), "one training output")
    one_line_error(lambda: select_checkpoints([tmp_path / "nope.pt"]), "nope.pt: no such file")
    assert select_checkpoints([files[4], files[6]]) == [files[4], files[6]]


def test_select_last_takes_the_run_s_last_saves_not_its_older_best(tmp_path) -> None:
    """Step 1, the best evaluation, outlives --keep-last 2 by --keep-best 2: it is not one of
    the last 3 saves (which the run no longer holds), it is another moment of the run."""
    manager = CheckpointManager(tmp_path, keep_last=2, keep_best=2)
    for step, metric in {1: 5.0, 2: None, 3: None, 4: None}.items():
        manager.save(step, {"format": 2, "step": step, "train_config": {"keep_last": 2}},
                     metric=metric)
    files = {s: tmp_path / f"step_{s:08d}.pt" for s in (1, 3, 4)}
    assert manager.checkpoints() == [files[1], files[3], files[4]]
    assert select_checkpoints([tmp_path], last=2) == [files[3], files[4]]
    one_line_error(lambda: select_checkpoints([tmp_path], last=3),
                   "holds 2 numbered checkpoints, not the 3 of --last 3 (its last 2 saves, "
                   "--keep-last 2; the older checkpoints (1) are kept as its best evaluations")


def test_select_last_leaves_out_the_saves_of_an_interruption(tmp_path) -> None:
    """A save marked `stopped` (Ctrl-C at step 3) is written with that section and is not one
    of the last N; the others have no such section."""
    manager = CheckpointManager(tmp_path, keep_last=10)
    for step, stopped in {2: None, 3: "sigint", 4: None, 5: "sigterm"}.items():
        manager.save(step, {"format": 2, "step": step}, stopped=stopped)
    files = {s: tmp_path / f"step_{s:08d}.pt" for s in (2, 3, 4, 5)}
    assert {s: load_checkpoint(f).get("stopped") for s, f in files.items()} == {
        2: None, 3: "sigint", 4: None, 5: "sigterm"}
    assert select_checkpoints([tmp_path], last=2) == [files[2], files[4]]
    assert select_checkpoints([tmp_path], last=1) == [files[4]]
    one_line_error(lambda: select_checkpoints([tmp_path], last=3),
                   "holds 2 numbered checkpoints saved on the run's schedule and 2 saved when "
                   "the run was interrupted", "--last 3")


def test_training_keeps_the_checkpoints_of_the_best_evaluations(tmp_path) -> None:
    metrics = iter([1.0, 3.0, 2.0, 0.5])            # evaluations at steps 2, 4, 6, 8
    cfg = TrainConfig(batch_size=8, max_steps=8, eval_every=2, save_every=100, keep_last=1,
                      keep_best=2, log_every=100)
    result = train(tiny_model(), random_examples(40), cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                   checkpoint_dir=tmp_path, validate=lambda m: next(metrics),
                   log=lambda s: None)
    assert result.step == 8
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == [
        "step_00000004.pt", "step_00000006.pt", "step_00000008.pt"]   # 6: no improvement, 2nd
    assert load_checkpoint(result.last_checkpoint)["best_n"] == [
        {"step": 4, "metric": 3.0}, {"step": 6, "metric": 2.0}]
    assert load_checkpoint(tmp_path / "best.pt")["train_state"]["step"] == 4
