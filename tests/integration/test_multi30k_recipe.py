"""The Multi30k recipe (examples/recipes/multi30k.sh and its multi30k.yaml): the options it
trains with are LIUM-CVC's monomodal system's, its budget is in updates, and the script run
end to end with tiny sizes writes OUT/final (the better candidate on val), scores it on
test_2016_flickr both ways, resumes, and leaves what is done alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bahdanau import BeamSearch, load
from bahdanau.checkpoint.reader import read_checkpoint
from bahdanau.data import multi30k_files, read_lines
from bahdanau.jobs.options import TrainOptions

RECIPE = Path(__file__).parents[2] / "examples" / "recipes"
SCRIPT, CONFIG = RECIPE / "multi30k.sh", RECIPE / "multi30k.yaml"
# LIUM-CVC's monomodal en-fr configuration (config/monomodal-en-fr.conf of lium-lst/wmt17-mmt),
# copied by hand: embedding_dim, rnn_dim, layer_norm, batch_size, optimizer, lrate, clip_c,
# valid_freq, save_best_n.
LIUM = {"embed_size": 128, "hidden_size": 256, "decoder_size": 256, "layer_norm": True,
        "batch_size": 32, "optimizer": "adam", "lr": 4e-4, "clip_norm": 5.0,
        "eval_every": 1000, "keep_best": 3}
VAL_SENTENCES = 1014


def _options() -> TrainOptions:
    yaml = pytest.importorskip("yaml")
    return TrainOptions.from_mapping(yaml.safe_load(CONFIG.read_text(encoding="utf-8")))


def test_the_recipe_trains_lium_cvcs_model_and_selects_on_the_whole_val_split() -> None:
    options = _options()
    model = options.model.config(5937, 6640)
    training = options.train_config()
    assert (model.embed_size, model.hidden_size, model.decoder_size, model.layer_norm) == (
        LIUM["embed_size"], LIUM["hidden_size"], LIUM["decoder_size"], LIUM["layer_norm"])
    assert model.decoder == "cgru" and model.arch == "rnnsearch" and model.init == "glorot"
    assert model.align_size == 2 * model.hidden_size       # attention over the 2H annotations
    # their dropout, 0.3 on the embeddings and 0.5 before the output layer, at our nearest
    # places; no second draw on the GRU inputs (it lost on val)
    assert (model.dropout, model.dropout_deep_output) == (0.3, 0.5)
    assert model.dropout_rnn_inputs == 0
    assert (training.batch_size, training.optimizer, training.learning_rate,
            training.clip_norm) == (LIUM["batch_size"], LIUM["optimizer"], LIUM["lr"],
                                    LIUM["clip_norm"])
    # the budget is a number of updates alone: no minutes, no epochs, no early stop
    assert training.max_steps is not None and training.max_steps > 0
    assert (training.max_time_s, training.max_epochs, training.patience) == (None, None, None)
    assert options.time_budget is None
    # chosen on val, all of it, by the task's own metric; the candidates' average needs 3 kept
    assert options.data is None and options.train_src is None and options.dev_src is None
    assert len(read_lines(multi30k_files("val", "en"))) == VAL_SENTENCES
    assert options.dev_size >= VAL_SENTENCES
    assert (training.eval_every, training.keep_best) == (LIUM["eval_every"], LIUM["keep_best"])
    assert training.early_stopping_metric == "bleu"


def test_the_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


# The recipe at tiny sizes: a model of a few thousand weights, a few updates, each decode short.
TINY = ["--embed-size", "8", "--hidden-size", "8", "--decoder-size", "8", "--align-size", "8",
        "--maxout-size", "6", "--train-batch-size", "8", "--eval-every", "1", "--save-every",
        "1", "--dev-size", "4", "--beam-size", "1", "--max-len", "4", "--threads", "1"]


def _recipe(out: Path, *train: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable,
           "EVALUATE_OPTIONS": "--beam-size 1 --max-len 4 --threads 1"}
    proc = subprocess.run(["bash", str(SCRIPT), str(out), *TINY, *train], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_the_recipe_runs_resumes_and_writes_a_final_model_scored_both_ways(tmp_path) -> None:
    for extra in ("yaml", "sentencepiece", "sacremoses"):
        pytest.importorskip(extra)
    out = tmp_path / "recipe"
    _recipe(out, "--max-steps", "3")
    first = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}

    # the candidates are the run's best checkpoint and its 3 best averaged; OUT/final is the
    # one of the higher val BLEU (the first on a tie), byte for byte
    val = {k: json.loads((out / "select" / f"best{k}.val.json").read_text())["bleu"]
           for k in (1, 3)}
    chosen = 3 if val[3] > val[1] else 1
    assert (out / "final").read_bytes() == (out / "select" / f"best{chosen}.pt").read_bytes()
    config = read_checkpoint(out / "final").config      # the file's choices, the flags' sizes
    assert (config.decoder, config.layer_norm, config.embed_size) == ("cgru", True, 8)
    [translation] = load(out / "final").translate(["A dog runs."],
                                                  search=BeamSearch(beam_size=1, max_len=4))
    assert isinstance(translation, str)
    sacre = json.loads((out / "test_2016_flickr.sacrebleu.json").read_text())
    moses = json.loads((out / "test_2016_flickr.moses-lc.json").read_text())
    assert sacre["bleu_text"]["lowercase"] is False and sacre["bleu_text"]["tokenize"] == "13a"
    assert moses["bleu_text"] == {"lowercase": True, "tokenize": "moses", "moses_lang": "fr"}
    assert sacre["sentences"] == moses["sentences"] == 1000
    # every beam search of steps 3 and 4 normalises scores by length (the recipe's choice on
    # val); EVALUATE_OPTIONS, given after it, set the beam and lengths of this quick run
    chosen_on_val = [json.loads((out / "select" / f"best{k}.val.json").read_text())
                     for k in (1, 3)]
    assert {(r["length_penalty"], r["beam_size"]) for r in (sacre, moses, *chosen_on_val)} == {
        ("average", 1)}
    hyps = (out / "test_2016_flickr.hyp.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 1000

    # the same command again, the other candidate's val report made the better one: the
    # finished run is left alone and nothing is averaged or scored on val again, but OUT/final
    # becomes the other candidate, and the test reports, older than it now, are scored again
    other = 1 if chosen == 3 else 3
    edited = out / "select" / f"best{other}.val.json"
    report = json.loads(edited.read_text())
    report["bleu"] = val[chosen] + 1.0
    edited.write_text(json.dumps(report))
    select = {p: p.stat().st_mtime_ns for p in (out / "select").iterdir()}
    again = _recipe(out, "--max-steps", "3")
    assert "finished at step 3" in again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "select").iterdir()} == select
    assert (out / "final").read_bytes() == (out / "select" / f"best{other}.pt").read_bytes()
    assert all(p.stat().st_mtime_ns > first[p] for p in first)
    first = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}

    # more updates: the run resumes from its step 3, and every later step is done again
    more = _recipe(out, "--max-steps", "4")
    log = more.stdout + more.stderr
    assert "step_00000003.pt at step 3" in log and "trained 4 updates" in log
    assert all(p.stat().st_mtime_ns > first[p] for p in first)
