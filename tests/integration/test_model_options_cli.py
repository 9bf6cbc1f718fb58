"""The command line with the conditional GRU decoder, layer-normalised GRUs and a two-layer
encoder: a few training steps, a checkpoint that rebuilds the same model, translate and evaluate
with beam search."""

from __future__ import annotations

import json

import pytest
import torch
from training_fixtures import write_multi30k_slice

from bahdanau.checkpoint import find_checkpoint, load_checkpoint, model_from_checkpoint
from bahdanau.cli import main
from bahdanau.conditional_decoder import ConditionalGRUDecoder
from bahdanau.models import build_model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cgru")
    write_multi30k_slice(root, 40, 8)
    out = root / "run"
    assert main(["train", "--train-src", str(root / "tr.en"), "--train-tgt", str(root / "tr.fr"),
                 "--test-src", str(root / "te.en"), "--test-tgt", str(root / "te.fr"),
                 "--preset", "tiny", "--decoder", "cgru", "--layer-norm", "--encoder-layers", "2",
                 "--max-steps", "3",
                 "--time-budget", "0", "--out", str(out), "--beam-size", "2", "--max-len", "6",
                 "--threads", "1", "--no-progress"]) == 0
    return root


def test_the_checkpoint_rebuilds_the_trained_model(run) -> None:
    path = find_checkpoint(run / "run")
    payload = load_checkpoint(path)
    model, _, _ = model_from_checkpoint(payload, ema=False)     # the trained weights
    assert model.config.decoder == "cgru" and model.config.layer_norm
    assert model.config.encoder_layers == 2 and model.encoder.rnn.num_layers == 2
    assert isinstance(model.decoder, ConditionalGRUDecoder) and model.encoder.norms is not None
    rebuilt = build_model(model.config)                 # the config alone: the same layers
    assert rebuilt.state_dict().keys() == model.state_dict().keys()
    weights = payload["model"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    trained = weights["decoder.weight_hh2"]
    assert not torch.equal(trained, build_model(model.config).state_dict()["decoder.weight_hh2"])
    metrics = json.loads((run / "run" / "metrics.json").read_text())
    assert metrics["updates"] == 3 and metrics["sentences"] == 8


def test_translate_and_evaluate_with_beam_search(run, capsys, tmp_path) -> None:
    assert main(["translate", "--checkpoint", str(run / "run"), "--input", str(run / "te.en"),
                 "--beam-size", "3", "--n-best", "2", "--max-len", "5", "--no-progress"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 16
    scores = tmp_path / "s.json"
    assert main(["evaluate", "--checkpoint", str(run / "run"), "--src", str(run / "te.en"),
                 "--ref", str(run / "te.fr"), "--beam-size", "2", "--max-len", "5",
                 "--json", str(scores), "--no-progress"]) == 0
    assert json.loads(scores.read_text())["sentences"] == 8


def test_an_unknown_decoder_is_one_line(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["train", "--out", str(tmp_path / "new"), "--decoder", "lstm"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "bahdanau: error: argument --decoder: invalid choice: 'lstm' (choose from 'paper', "
        "'cgru') (see 'bahdanau train --help')\n")


@pytest.mark.parametrize(("flags", "error"), [
    (["--layer-norm", "--gru-form", "paper"],
     "--layer-norm normalises U h, the torch form's recurrent projection: it needs --gru-form "
     "torch, or --no-layer-norm (the paper form computes U (r * h))"),
    (["--gru-form", "paper"],                      # layer norm is the job's default
     "--layer-norm normalises U h, the torch form's recurrent projection: it needs --gru-form "
     "torch, or --no-layer-norm (the paper form computes U (r * h))"),
    (["--decoder", "cgru", "--arch", "rnnencdec"],
     "--decoder cgru attends from its first GRU's state: it needs --arch rnnsearch (rnnencdec "
     "has no attention)"),
    (["--decoder", "cgru", "--gru-form", "paper"],
     "--decoder cgru is built of the torch form's GRUs: it needs --gru-form torch"),
])
def test_choices_that_do_not_go_together_are_one_line(flags, error, tmp_path, capsys) -> None:
    assert main(["train", "--out", str(tmp_path / "new"), "--max-steps", "1", *flags]) == 2
    assert capsys.readouterr().err == f"bahdanau: error: {error}\n"
    assert not (tmp_path / "new").exists()              # refused before any work
