"""Characters in, phonemes out: a toy spelling rule learnt through `CharTokenizer`, a
`TokenizerPair` and bahdanau's trainer, then scored on held-out words; and the G2P recipe
(examples/g2p/cmudict.py) run end to end on a toy dictionary, resumed, and evaluated."""

from __future__ import annotations

import json
import random

import pytest
import torch
from example_scripts import load_example

from bahdanau import (
    BeamSearch,
    CharTokenizer,
    ModelConfig,
    TokenizerPair,
    TrainConfig,
    Vocab,
    WhitespaceTokenizer,
    build_model,
    encode_pairs,
    load,
    translate_corpus,
)
from bahdanau.checkpoint import read_checkpoint
from bahdanau.error_rates import error_rates, group_references
from bahdanau.training import train

LETTERS = "abcdef"


def _pronounce(word: str) -> str:
    """The toy rule: each letter is one phoneme, "c" sounds "K", the others their capital,
    read backwards ("abc" -> "K B A")."""
    return " ".join("K" if ch == "c" else ch.upper() for ch in reversed(word))


def _words(rng: random.Random, n: int) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 5))))
    return sorted(words)


def test_a_spelling_rule_is_learnt_from_characters(tmp_path) -> None:
    rng = random.Random(0)
    words = _words(rng, 460)
    rng.shuffle(words)
    train_words, held_out = words[:400], words[400:]
    tokenizer = TokenizerPair(CharTokenizer(), WhitespaceTokenizer())
    pairs = [(w, _pronounce(w)) for w in train_words]
    src_vocab = Vocab.build(tokenizer.source.tokenize(w) for w, _ in pairs)
    tgt_vocab = Vocab.build(tokenizer.target.tokenize(p) for _, p in pairs)
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tokenizer)
    config = ModelConfig(src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab),
                         embed_size=16, hidden_size=32, decoder_size=32, align_size=16,
                         maxout_size=16, init="glorot")
    torch.manual_seed(0)
    model = build_model(config)
    cfg = TrainConfig(optimizer="adam", lr=1e-2, batch_size=32, max_steps=300,
                      save_every=300, seed=0)
    train(model, examples, cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
          checkpoint_dir=tmp_path / "run", tokenizer=tokenizer, log=lambda line: None)

    translator = load(tmp_path / "run")           # the pair comes back from the checkpoint
    assert repr(translator.tokenizer) == repr(tokenizer)
    hyps = translate_corpus(translator.model, held_out, translator.src_vocab,
                            translator.tgt_vocab, translator.tokenizer,
                            search=BeamSearch(beam_size=3, max_len=10), progress=None)
    rates = error_rates([h.text for h in hyps], [[_pronounce(w)] for w in held_out])
    assert rates.items == 60 and rates.accuracy >= 90.0, rates


def _write_dictionary(folder, rng: random.Random) -> list[str]:
    """train.tsv and dev.tsv of toy words, stressed like CMUdict ("A1 B0"); every third dev
    word has a second pronunciation on a later line."""
    folder.mkdir()
    words = _words(rng, 80)
    stressed = {w: " ".join(f"{p}{i % 3}" for i, p in enumerate(_pronounce(w).split()))
                for w in words}
    (folder / "train.tsv").write_text("".join(f"{w}\t{stressed[w]}\n" for w in words[:60]))
    dev = [f"{w}\t{stressed[w]}\n" for w in words[60:]]
    dev += [f"{w}\tX1 {stressed[w]}\n" for w in words[60::3]]
    (folder / "dev.tsv").write_text("".join(dev))
    return words[60:]


def test_the_g2p_recipe_trains_resumes_and_evaluates(tmp_path, capsys) -> None:
    recipe = load_example("g2p/cmudict.py")
    dev_words = _write_dictionary(tmp_path / "data", random.Random(1))
    run = tmp_path / "run"
    common = ["train", "--data", str(tmp_path / "data"), "--out", str(run), "--eval-every",
              "2", "--batch-size", "16", "--threads", "1"]
    assert recipe.main([*common, "--max-steps", "2", "--dropout", "1.5"]) == 2
    assert "dropout" in capsys.readouterr().err and not run.exists()   # one line, no run
    options = ["--dropout-deep-output", "0.5", "--label-smoothing", "0.2", "--schedule",
               "linear", "--lr", "5e-3", "--ema-decay", "0.5", "--layer-norm",
               "--decoder", "cgru"]                                 # none of them the defaults
    assert recipe.parser().parse_args([*common, "--ema-decay", "none"]).ema_decay is None
    assert recipe.main([*common, "--max-steps", "2", *options]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["step"], first["train_pairs"], first["dev_words"]) == (2, 60, 20)
    config = load(run).model.config
    assert (config.dropout_deep_output, config.layer_norm, config.decoder) == (0.5, True, "cgru")
    stored = read_checkpoint(run).train_config
    assert (stored["label_smoothing"], stored["schedule"], stored["lr"], stored["ema_decay"]) == (
        0.2, "linear", 5e-3, 0.5)
    assert recipe.main([*common, "--max-steps", "4", *options[:-1], "paper"]) == 2
    error = capsys.readouterr().err                     # another decoder: refused, one line
    assert "decoder" in error and len(error.strip().splitlines()) == 1
    assert read_checkpoint(run).step == 2
    assert recipe.main([*common, "--max-steps", "4", *options]) == 0
    # the same command resumes
    resumed = json.loads(capsys.readouterr().out)
    assert (resumed["start_step"], resumed["step"]) == (2, 4)

    translator = load(run)
    assert not any(p[-1].isdigit() for p in translator.tgt_vocab.tokens)   # stress stripped
    scores = tmp_path / "dev.json"
    assert recipe.main(["evaluate", "--checkpoint", str(run), "--tsv",
                        str(tmp_path / "data" / "dev.tsv"), "--json", str(scores),
                        "--threads", "1"]) == 0
    report = json.loads(scores.read_text())
    assert report["words"] == len(dev_words) == 20 and report["beam_size"] == 5
    # the same scores, worked out from the model's own beam-5 outputs and the stripped
    # references grouped by word
    hyps = translate_corpus(translator.model, dev_words, translator.src_vocab,
                            translator.tgt_vocab, translator.tokenizer,
                            search=BeamSearch(beam_size=5, max_len=recipe.MAX_PHONEMES),
                            progress=None)
    lines = (tmp_path / "data" / "dev.tsv").read_text().splitlines()
    items, groups, _ = group_references([ln.split("\t")[0] for ln in lines],
                                        [recipe.strip_stress(ln.split("\t")[1]) for ln in lines])
    assert items == dev_words and sum(len(g) == 2 for g in groups) == 7
    expected = error_rates([h.text for h in hyps], groups)
    assert (report["wer"], report["per"]) == (round(expected.wer, 2), round(expected.per, 2))
    # an ensemble of the model with itself averages equal distributions: the same scores
    assert recipe.main(["evaluate", "--checkpoint", str(run), str(run), "--tsv",
                        str(tmp_path / "data" / "dev.tsv"), "--json", str(scores),
                        "--threads", "1"]) == 0
    pair = json.loads(scores.read_text())
    assert pair["models"] == 2 and (pair["wer"], pair["per"]) == (report["wer"], report["per"])


def test_the_recipe_refuses_a_data_folder_without_its_files(tmp_path, capsys) -> None:
    recipe = load_example("g2p/cmudict.py")
    assert recipe.main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.tsv" in err
    for flag, value, error in (("--limit", "0", "must be at least 1, got 0"),
                               ("--dev-limit", "-1", "must be at least 1, got -1"),
                               ("--threads", "two", "must be a whole number, got 'two'")):
        with pytest.raises(SystemExit):
            recipe.main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "r"), flag,
                         value])
        assert f"argument {flag}: {error}" in capsys.readouterr().err


