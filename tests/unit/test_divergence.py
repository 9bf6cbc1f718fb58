"""Divergence: a non-finite loss or gradient is never applied, a run of them stops training in
one line keeping the last good checkpoint, no checkpoint of NaN weights is written, and search
refuses scores that are not finite instead of returning no hypothesis.

Expectations: weights and optimizer state compared with their values before the step (an
update that is skipped changes nothing), step counts worked out from which losses were made
non-finite, and the folder's files before and after.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from torch import Tensor, nn
from training_fixtures import (
    TINY_VOCAB,
    logged,
    one_line_error,
    random_examples,
    tiny_model,
    unlogged,
    write_multi30k_slice,
)

from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import DefaultTokenizer, collate
from bahdanau.evaluate import score_corpus, score_ids, translate_corpus
from bahdanau.search import BeamSearch, greedy_search
from bahdanau.serving import greedy_decode
from bahdanau.training import run_step, save_run, setup_run, train, train_run, train_step

VOCAB = TINY_VOCAB
EXAMPLES = random_examples(24)
BATCH = collate(EXAMPLES[:4])


class Flaky(nn.Module):
    """A model whose loss is +inf on the calls listed (the gradient stays finite): what a
    diverging batch, or an fp16 overflow, gives; every loss is multiplied by `factor`."""

    def __init__(self, model: nn.Module, bad_calls: set[int], factor: float = 1.0) -> None:
        super().__init__()
        self.inner, self.bad_calls, self.calls, self.factor = model, bad_calls, 0, factor

    def loss(self, *args: Tensor, **kwargs: float) -> tuple[Tensor, Tensor]:
        self.calls += 1
        loss_sum, n = self.inner.loss(*args, **kwargs)
        loss_sum = loss_sum * self.factor
        return (loss_sum + math.inf if self.calls in self.bad_calls else loss_sum), n


def _weights(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _blow_up(model: nn.Module) -> None:
    """Finite weights whose logits overflow: the loss is NaN, no weight is."""
    with torch.no_grad():
        model.decoder.output.weight.fill_(1e38)


# ----------------------------------------------------------------------------------------------
# train_step: the update is skipped before the optimizer sees it


def test_infinite_loss_with_finite_gradient_is_not_applied() -> None:
    model = Flaky(tiny_model(), bad_calls={1})
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = _weights(model)
    stats = train_step(model, BATCH, opt)
    assert stats.non_finite and math.isfinite(stats.grad_norm) and stats.loss_sum == math.inf
    assert _same(_weights(model), before) and not opt.state     # Adam never stepped
    stats = train_step(model, BATCH, opt)                        # the next one applies
    assert not stats.non_finite and not _same(_weights(model), before)


def test_nan_gradient_is_not_applied_and_counted() -> None:
    model = tiny_model()
    with torch.no_grad():
        model.encoder.embedding.weight[5:].fill_(float("nan"))
    opt = torch.optim.Adadelta(model.parameters())
    before = _weights(model)
    stats = train_step(model, BATCH, opt)
    assert stats.non_finite and not math.isfinite(stats.grad_norm)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], equal_nan=True, rtol=0, atol=0)


def test_grad_scaler_overflow_is_the_scalers_but_a_nan_loss_is_divergence() -> None:
    """An overflowing scaled gradient is routine for fp16's GradScaler (it skips the step and
    halves its scale): not counted. A loss that is not finite is, and is not applied."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1e10)
    before = _weights(model)
    big = Flaky(model, bad_calls=set(), factor=1e30)   # finite gradient, overflowing scaled
    stats = train_step(big, BATCH, opt, scaler=scaler)
    assert not stats.non_finite and math.isfinite(stats.loss_sum)
    assert not math.isfinite(stats.grad_norm) and scaler.get_scale() == pytest.approx(5e9)
    assert _same(_weights(model), before)
    flaky = Flaky(model, bad_calls={1})
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    stats = train_step(flaky, BATCH, opt, scaler=scaler)
    assert stats.non_finite and _same(_weights(model), before)
    assert scaler.get_scale() == 1.0                              # the gradient was finite


# ----------------------------------------------------------------------------------------------
# The loop: N skipped in a row stop it, fewer do not


def test_skipped_updates_are_logged_and_fewer_than_the_limit_in_a_row_train_on() -> None:
    model, lines = Flaky(tiny_model(), bad_calls={2, 3, 5, 6, 8, 9}), []
    cfg = TrainConfig(batch_size=4, bucket=1, max_steps=10, log_every=100,
                      max_nonfinite_steps=3)
    result = train(model, EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, log=lines.append)
    assert result.step == 10 and result.stopped == "max_steps"
    skipped = [line for line in lines if "update skipped" in line]
    assert [line.split(" |")[0] for line in skipped] == [f"step {s}" for s in (2, 3, 5, 6, 8, 9)]
    assert "loss inf, gradient norm" in skipped[0] and "(2 in a row; the run stops at 3)" in \
        skipped[1]
    assert math.isfinite(result.train_loss)                        # skipped ones left out


def test_the_limit_in_a_row_stops_the_run_in_one_line() -> None:
    model, lines = Flaky(tiny_model(), bad_calls={2, 3, 4, 5}), []
    cfg = TrainConfig(batch_size=4, bucket=1, max_steps=10, max_nonfinite_steps=3)
    one_line_error(lambda: train(model, EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 log=lines.append),
                   "training diverged at step 4: the loss or gradient norm was not finite for 3 "
                   "updates in a row, which were skipped (last: loss inf, gradient norm",
                   "max_nonfinite_steps 3", "no checkpoint was written")
    assert sum("update skipped" in line for line in lines) == 2


def test_divergence_keeps_the_last_good_checkpoint_and_saves_none_after(tmp_path) -> None:
    """Steps 1 and 2 are good and saved; then the weights overflow (finite, but every loss is
    NaN): steps 3 and 4 are skipped, neither evaluated nor saved, and step 5 stops the run."""
    cfg = TrainConfig(batch_size=4, bucket=1, max_steps=20, save_every=1, eval_every=1,
                      max_nonfinite_steps=3, log_every=100)
    run = setup_run(tiny_model(), EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=tmp_path)
    for _ in range(2):
        run_step(run)
        save_run(run)
    _blow_up(run.model)
    evaluated: list[int] = []
    message = one_line_error(lambda: train_run(run, validate=lambda m: evaluated.append(1) or 1.0,
                                               log=lambda _: None),
                             "training diverged at step 5:", "3 updates in a row")
    assert message.endswith(f"the last checkpoint, {tmp_path / 'step_00000002.pt'}, is kept (a "
                            "lower learning rate may help)")
    assert sorted(os.listdir(tmp_path)) == ["step_00000001.pt", "step_00000002.pt"]
    assert not evaluated


def test_learning_rate_1e308_never_saves_nan_weights(tmp_path) -> None:
    """Adam's first update, of a finite gradient, makes the float32 weights inf: the save of
    that step is refused, and nothing is written."""
    cfg = TrainConfig(optimizer="adam", lr=1e308, batch_size=4, bucket=1, max_steps=5,
                      save_every=1)
    one_line_error(lambda: train(tiny_model(), EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                                 checkpoint_dir=tmp_path, log=lambda _: None),
                   "training diverged at step 1: the weights hold NaN or inf; no checkpoint "
                   "was written")
    assert os.listdir(tmp_path) == []


def test_a_stop_after_fewer_skipped_updates_than_the_limit_saves_the_last_good_weights(
        tmp_path) -> None:
    """One transient inf loss at the last step (an fp16 overflow): the run stops at max_steps
    as usual, logs the skipped update, and saves step 4 holding step 3's weights (the skipped
    update changed nothing), which a final evaluation scores; no divergence error."""
    cfg = TrainConfig(batch_size=4, bucket=1, max_steps=4, save_every=100, eval_every=100,
                      log_every=100)
    model, lines, scored = tiny_model(), [], []
    loss, calls = model.loss, []

    def inf_at_call_4(*args: Tensor, **kwargs: float) -> tuple[Tensor, Tensor]:
        calls.append(1)
        loss_sum, n = loss(*args, **kwargs)
        return (loss_sum + math.inf if len(calls) == 4 else loss_sum), n

    model.loss = inf_at_call_4                  # an instance attribute: this model only
    run = setup_run(model, EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=tmp_path)
    for _ in range(3):
        run_step(run)
    after_3 = _weights(run.model)
    result = train_run(run, validate=lambda m: scored.append(1) or 1.0, log=lines.append)
    assert result.stopped == "max_steps" and result.step == 4 and scored == [1]
    assert sorted(os.listdir(tmp_path)) == ["best.json", "best.pt", "step_00000004.pt"]
    saved = torch.load(tmp_path / "step_00000004.pt", weights_only=True)["model"]
    assert _same(saved, after_3) and not _same(saved, _weights(tiny_model()))
    assert ("step 4 | the run stopped (max_steps) after 1 skipped update (max_nonfinite_steps "
            "5): its weights are those of the last applied update") in lines


def test_adadelta_refuses_a_learning_rate_float32_cannot_hold(tmp_path) -> None:
    """torch's Adadelta converts the learning rate to the weights' dtype at its first update
    (a RuntimeError then): refused before any work instead."""
    cfg = TrainConfig(lr=1e308, max_steps=5)
    one_line_error(lambda: setup_run(tiny_model(), EXAMPLES, cfg, src_vocab=VOCAB,
                                     tgt_vocab=VOCAB, checkpoint_dir=tmp_path),
                   "adadelta cannot apply the learning rate 1e+308 to torch.float32 weights: "
                   "it must be at most 3.403e+38")
    assert os.listdir(tmp_path) == []


def test_save_refuses_a_nan_optimizer_moment_or_moving_average(tmp_path) -> None:
    cfg = TrainConfig(optimizer="adam", batch_size=4, bucket=1, max_steps=5, ema_decay=0.9)
    run = setup_run(tiny_model(), EXAMPLES, cfg, src_vocab=VOCAB, tgt_vocab=VOCAB,
                    checkpoint_dir=tmp_path)
    run_step(run)
    save_run(run)
    for state in run.optimizer.state.values():
        state["exp_avg_sq"].fill_(float("inf"))
    one_line_error(lambda: save_run(run), "training diverged at step 1: the optimizer moments "
                   "hold NaN or inf", f"the last checkpoint, {tmp_path / 'step_00000001.pt'}")
    run2 = setup_run(tiny_model(), EXAMPLES, replace(cfg, max_steps=6), src_vocab=VOCAB,
                     tgt_vocab=VOCAB, checkpoint_dir=tmp_path)
    assert run2.ema is not None
    next(iter(run2.ema.state_dict().values())).fill_(float("nan"))
    one_line_error(lambda: save_run(run2), "the averaged weights (ema) hold NaN or inf")
    assert os.listdir(tmp_path) == ["step_00000001.pt"]


def test_cli_learning_rate_1e308_ends_in_one_line(tmp_path, capsys) -> None:
    """The issue's `train --lr 1e308`: no IndexError from the dev evaluation, no checkpoint."""
    data = write_multi30k_slice(tmp_path, 60, 5)
    base = ["train", "--preset", "tiny", "--lr", "1e308", "--train-src", str(data / "tr.en"),
            "--train-tgt", str(data / "tr.fr"), "--test-src", str(data / "te.en"),
            "--test-tgt", str(data / "te.fr"), "--dev-src", str(data / "te.en"),
            "--dev-tgt", str(data / "te.fr"), "--threads", "1", "--max-steps", "20",
            "--train-batch-size", "8"]
    for out, extra, expected in (
            ("a", ["--eval-every", "3", "--save-every", "3", "--log-every", "1"],
             "the loss or gradient norm was not finite for 5 updates in a row"),
            ("b", ["--eval-every", "1", "--save-every", "1"], "the weights hold NaN or inf")):
        capsys.readouterr()
        assert main([*base, "--out", str(tmp_path / out), *extra]) == 2
        console = capsys.readouterr().err
        err = unlogged(console)                         # the run's log lines are on stderr too
        assert err.count("\n") == 1 and err.startswith("bahdanau: error: training diverged"), err
        assert expected in err and "no checkpoint was written" in err
        # the error is train.log's last line, with its time, and on the console only once
        error = err.removeprefix("bahdanau: error: ").rstrip("\n")
        assert logged((tmp_path / out / "train.log").read_text())[-1] == f"ERROR: {error}"
        assert not any("diverged" in line for line in logged(console))
        assert not list((tmp_path / out).glob("checkpoints/*.pt"))


# ----------------------------------------------------------------------------------------------
# Search: scores that are not finite are an error, never an empty or NaN-ranked result


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan weight", "inf weight"])
def test_search_refuses_nan_scores(value: float) -> None:
    model = tiny_model()
    with torch.no_grad():
        model.decoder.output.weight[3, 2] = value
    src, lengths = BATCH.src, BATCH.src_lengths
    for call in (lambda: model.translate(src, lengths),                   # [[], []] before
                 lambda: model.translate(src, lengths, beam_size=3, n_best=2),
                 lambda: greedy_search(model, src, lengths)):
        one_line_error(call, "the model's scores are NaN")
    one_line_error(lambda: translate_corpus(model, ["w4 w5", "w6"], VOCAB, VOCAB,
                                            DefaultTokenizer()), "the model's scores are NaN")


def _change_logits(model: nn.Module, change: Callable[[Tensor], None]) -> None:
    """Make `model.step` (of this model only: an instance attribute) return its logits changed
    in place by `change`, on a copy."""
    step = model.step

    def changed(tokens, state, memory):
        out = step(tokens, state, memory)
        logits = out.logits.clone()
        change(logits)
        return out._replace(logits=logits)

    model.step = changed


def test_nan_in_one_beam_only_is_refused() -> None:
    """One beam's NaN would rank first and crowd out the finite ones: refused too."""
    model = tiny_model()

    def nan_in_row_one(logits: Tensor) -> None:
        if logits.shape[0] > 1:
            logits[1, 5] = float("nan")

    _change_logits(model, nan_in_row_one)
    one_line_error(lambda: BeamSearch(beam_size=3)(model, BATCH.src[:1], BATCH.src_lengths[:1]),
                   "the model's scores are NaN")


def test_search_refuses_a_model_that_never_lets_a_sentence_end() -> None:
    model = tiny_model()

    def no_eos(logits: Tensor) -> None:
        logits[:, model.config.eos_id] = -math.inf

    _change_logits(model, no_eos)
    one_line_error(lambda: BeamSearch(beam_size=2, max_len=4)(model, BATCH.src, BATCH.src_lengths),
                   "sentence 0 of the batch got no hypothesis: the model gives every ending a "
                   "log-probability of -inf")


def test_search_of_a_good_model_is_unchanged() -> None:
    """The checks add no result of their own: every sentence gets its n-best."""
    hyps = BeamSearch(beam_size=3, n_best=2)(tiny_model(), BATCH.src, BATCH.src_lengths)
    assert [len(h) for h in hyps] == [2] * 4
    assert all(math.isfinite(h.score) for sent in hyps for h in sent)


def test_default_limit_is_a_setting() -> None:
    assert TrainConfig().max_nonfinite_steps == 5
    one_line_error(lambda: TrainConfig(max_nonfinite_steps=0), "max_nonfinite_steps")


def test_the_serving_greedy_loop_refuses_nan_scores() -> None:
    """`greedy_decode` over programs whose step gives NaN in one row at the second step: an
    error, where argmax picked the NaN's column as the next token."""
    vocab_size, eos = 6, 2

    def encoder(src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return torch.zeros(src.shape[0], 3), torch.zeros(src.shape[0], src.shape[1])

    calls = []

    def step(tokens: Tensor, hidden: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        calls.append(tokens)
        log_probs = torch.full((tokens.shape[0], vocab_size), -5.0)
        log_probs[:, 4] = -0.1                                 # token 4, never eos: runs on
        if len(calls) == 2:
            log_probs[1, 5] = math.nan
        return log_probs, hidden

    src = torch.tensor([[4, 5], [5, 4]])
    one_line_error(lambda: greedy_decode(encoder, step, src, torch.tensor([2, 2]), bos_id=1,
                                         eos_id=eos, pad_id=0, max_len=5),
                   "the model's scores are NaN")
    assert len(calls) == 2                                     # stopped at the NaN's step


def test_scoring_refuses_a_model_whose_scores_are_nan() -> None:
    """Forced decoding of a diverged model: the error of the search, not a score of nan."""
    model = tiny_model()
    with torch.no_grad():
        model.decoder.output.weight[3, 2] = math.inf
    pairs = [(ex.src, ex.tgt) for ex in EXAMPLES[:3]]
    one_line_error(lambda: score_ids(model, pairs), "the model's scores are NaN")
    one_line_error(lambda: score_corpus(model, ["w4 w5"], ["w6"], VOCAB, VOCAB,
                                        DefaultTokenizer()), "the model's scores are NaN")
