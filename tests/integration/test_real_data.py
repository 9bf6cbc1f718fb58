"""A tiny RNNsearch learns from the shipped Multi30k en->fr data, and can overfit 100 pairs."""

from __future__ import annotations

import math

import torch

from bahdanau import RNNSearch, presets
from bahdanau.data import (
    BucketBatchSampler,
    DefaultTokenizer,
    Vocab,
    collate,
    encode_pairs,
    multi30k_files,
    read_lines,
)


def _data(n_pairs: int, max_len: int, vocab: int):
    tok = DefaultTokenizer(lowercase=True)
    src = read_lines(multi30k_files("train", "en"))
    tgt = read_lines(multi30k_files("train", "fr"))
    pairs = [(s, t) for s, t in zip(src, tgt, strict=True)
             if len(s.split()) <= max_len and len(t.split()) <= max_len][:n_pairs]
    src_vocab = Vocab.build([tok.tokenize(s) for s, _ in pairs], max_size=vocab)
    tgt_vocab = Vocab.build([tok.tokenize(t) for _, t in pairs], max_size=vocab)
    return encode_pairs(pairs, src_vocab, tgt_vocab, tok), len(src_vocab), len(tgt_vocab)


def _model(src_v: int, tgt_v: int) -> RNNSearch:
    torch.manual_seed(0)
    cfg = presets.tiny(src_v, tgt_v)
    cfg = type(cfg)(**{**cfg.to_dict(), "embed_size": 32, "hidden_size": 32, "decoder_size": 48,
                       "align_size": 32, "maxout_size": 32})
    return RNNSearch.from_config(cfg)


def _token_loss(model, batches) -> float:
    with torch.no_grad():
        total = sum(model.loss(b.src, b.src_lengths, b.tgt_in, b.tgt_out)[0].item()
                    for b in batches)
    return total / sum(b.n_tokens for b in batches)


def test_loss_drops_well_below_start() -> None:
    examples, src_v, tgt_v = _data(2000, 10, 400)
    model = _model(src_v, tgt_v)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    held_out = [collate(examples[i:i + 100]) for i in range(1800, 2000, 100)]
    train = examples[:1800]
    start = _token_loss(model, held_out)
    assert abs(start - math.log(tgt_v)) < 0.05                   # untrained: uniform output
    steps = 0
    for epoch in range(10):
        sampler = BucketBatchSampler(train, batch_size=32, seed=epoch)
        for indices in sampler:
            batch = collate([train[i] for i in indices])
            loss, _ = model.loss(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
            opt.zero_grad()
            (loss / len(indices)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            steps += 1
            if steps >= 300:
                break
        if steps >= 300:
            break
    end = _token_loss(model, held_out)
    print(f"held-out token loss {start:.3f} -> {end:.3f}")
    assert end < 0.6 * start, (start, end)


def test_overfits_100_pairs() -> None:
    examples, src_v, tgt_v = _data(100, 12, 10_000)
    model = _model(src_v, tgt_v)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = [collate(examples[i:i + 50]) for i in (0, 50)]
    for _ in range(150):
        for batch in batches:
            loss, _ = model.loss(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
            opt.zero_grad()
            (loss / 50).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    final = _token_loss(model, batches)
    print(f"100-pair token loss after 300 steps: {final:.4f}")
    assert final < 0.1
