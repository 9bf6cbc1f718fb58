"""A small trained model of the shipped Multi30k, saved as a checkpoint, shared by the tests of
scoring, export and alignments. Importable from any test module (`pythonpath = ["tests"]`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bahdanau import presets
from bahdanau.checkpoint import save_checkpoint
from bahdanau.config import TrainConfig
from bahdanau.data import DefaultTokenizer, Vocab, encode_pairs, multi30k_files, read_parallel
from bahdanau.models import build_model
from bahdanau.training import train
from bahdanau.training.state import checkpoint_payload


def shared_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `trained_checkpoint` of this test session, trained once for every test module."""
    path = tmp_path_factory.getbasetemp() / "serving-model.pt"
    return path if path.is_file() else trained_checkpoint(path)


def trained_checkpoint(path: Path, *, pairs: int = 2000, steps: int = 120,
                       arch: str = "rnnsearch") -> Path:
    """A `presets.tiny` model trained `steps` Adam steps on the first `pairs` Multi30k en-fr
    pairs (lowercased default tokenizer), saved at `path` with its vocabularies and tokenizer:
    about 15 s on a CPU, and far enough from random that its translations vary ("un homme.",
    "deux <unk>.") and end before their length cap."""
    torch.manual_seed(0)
    data = read_parallel(multi30k_files("train", "en"), multi30k_files("train", "fr"))[:pairs]
    tok = DefaultTokenizer(lowercase=True)
    src_vocab = Vocab.build((tok.tokenize(s) for s, _ in data), max_size=1000)
    tgt_vocab = Vocab.build((tok.tokenize(t) for _, t in data), max_size=1000)
    examples = encode_pairs(data, src_vocab, tgt_vocab, tok, max_len=30)
    cfg = presets.tiny(len(src_vocab), len(tgt_vocab))
    model = build_model(replace(cfg, arch=arch))
    train(model, examples, TrainConfig(optimizer="adam", lr=0.01, batch_size=32,
                                       max_steps=steps),
          src_vocab=src_vocab, tgt_vocab=tgt_vocab, log=lambda line: None)
    save_checkpoint(path, checkpoint_payload(model.eval(), src_vocab=src_vocab,
                                             tgt_vocab=tgt_vocab, tokenizer=tok))
    return path
