"""Beam and greedy search against independent computations: enumeration, scoring, greedy loop."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from search_asserts import assert_same_hypotheses

from bahdanau import BeamSearch, RNNEncDec, RNNSearch, greedy_search, presets, replace_unk
from bahdanau.search import Hypothesis, length_normalise

PAD, BOS, EOS = 0, 1, 2


def random_model(cls=RNNSearch, vocab: int = 16, seed: int = 0, scale: float = 1.0):
    torch.manual_seed(seed)
    model = cls.from_config(presets.tiny(16, vocab)).double()
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.data = scale * torch.randn(p.shape, generator=gen, dtype=torch.float64)
    return model.eval()


SRC = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 0, 0, 0], [4, 12, 13, 0, 0]])
LENGTHS = torch.tensor([5, 2, 3])


def sequence_log_prob(model, src, length, tokens: list[int]) -> float:
    """Teacher-forced log p(tokens + eos | src) from the model's forward."""
    tgt_in = torch.tensor([[BOS] + tokens])
    tgt_out = torch.tensor([tokens + [EOS]])
    logp = torch.log_softmax(model(src[None, :length], torch.tensor([length]), tgt_in), -1)
    return logp.gather(2, tgt_out[..., None]).sum().item()


def reference_greedy(model, src, length, max_len: int) -> tuple[list[int], float]:
    """Greedy decoding written independently: argmax over allowed tokens, eos forced at the cap."""
    state, memory = model.encode(src[None, :length], torch.tensor([length]))
    token, tokens, total = torch.tensor([BOS]), [], 0.0
    for step in range(max_len + 1):
        out = model.step(token, state, memory)
        logp = torch.log_softmax(out.logits[0], -1)
        logp[[PAD, BOS]] = float("-inf")
        if step == 0:
            logp[EOS] = float("-inf")                            # min_len = 1
        if step == max_len:
            choice = EOS
        else:
            choice = int(logp.argmax())
        total += logp[choice].item()
        if choice == EOS:
            return tokens, total
        tokens.append(choice)
        token, state = torch.tensor([choice]), out.state
    raise AssertionError("unreachable")


@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_beam_one_is_greedy(cls) -> None:
    model = random_model(cls)
    results = BeamSearch(beam_size=1, max_len=7)(model, SRC, LENGTHS)
    greedy = greedy_search(model, SRC, LENGTHS, max_len=7)
    for b in range(3):
        tokens, total = reference_greedy(model, SRC[b], int(LENGTHS[b]), 7)
        assert results[b][0].tokens == greedy[b].tokens == tokens
        assert results[b][0].log_prob == pytest.approx(total, abs=1e-10)
        assert greedy[b].score == results[b][0].score


@pytest.mark.parametrize("penalty", ["none", "average", "gnmt"])
def test_wide_beam_equals_exhaustive_enumeration(penalty: str) -> None:
    """V = 6 (4 specials, 2 words), cap 3: 39 candidate sequences, all enumerated."""
    model = random_model(vocab=6, seed=1, scale=1.5)
    words = [3, 4, 5]                                           # unk and the two words
    max_len = 3
    search = BeamSearch(beam_size=40, n_best=3, max_len=max_len, length_penalty=penalty,
                        alpha=0.8)
    for b in range(3):
        length = int(LENGTHS[b])
        scored = []
        for n in range(1, max_len + 1):
            for seq in itertools.product(words, repeat=n):
                logp = sequence_log_prob(model, SRC[b], length, list(seq))
                score = length_normalise(torch.tensor(logp, dtype=torch.float64), n + 1, penalty,
                                         0.8).item()
                scored.append((score, logp, list(seq)))
        scored.sort(key=lambda x: -x[0])
        found = search(model, SRC[b:b + 1, :length], LENGTHS[b:b + 1])[0]
        for hyp, (score, logp, seq) in zip(found, scored[:3], strict=True):
            assert hyp.tokens == seq
            assert hyp.score == pytest.approx(score, abs=1e-9)
            assert hyp.log_prob == pytest.approx(logp, abs=1e-9)


def test_log_prob_matches_teacher_forcing_and_attention_rows() -> None:
    model = random_model()
    results = model.translate(SRC, LENGTHS, beam_size=4, n_best=3, max_len=6)
    for b, hyps in enumerate(results):
        length = int(LENGTHS[b])
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
        for hyp in hyps:
            assert hyp.log_prob == pytest.approx(
                sequence_log_prob(model, SRC[b], length, hyp.tokens), abs=1e-9)
            assert hyp.attention.shape == (len(hyp.tokens) + 1, length)
            torch.testing.assert_close(hyp.attention.sum(1),
                                       torch.ones(len(hyp.tokens) + 1, dtype=torch.float64))
            tgt_in = torch.tensor([[BOS] + hyp.tokens])
            _, attention = model(SRC[b:b + 1, :length], LENGTHS[b:b + 1], tgt_in,
                                 return_attention=True)
            torch.testing.assert_close(hyp.attention, attention[0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_alone_equals_in_batch(cls) -> None:
    model = random_model(cls, seed=2)
    search = BeamSearch(beam_size=3, n_best=2, max_len=8, length_penalty="average")
    batched = search(model, SRC, LENGTHS)
    for b in range(3):
        length = int(LENGTHS[b])
        alone = search(model, SRC[b:b + 1, :length], LENGTHS[b:b + 1])
        assert_same_hypotheses(alone, batched[b:b + 1], tol=1e-9)
        if cls is RNNEncDec:
            assert all(h.attention is None for h in alone[0])


def test_min_and_max_length_and_ratio() -> None:
    model = random_model(seed=3)
    fixed = BeamSearch(beam_size=3, min_len=4, max_len=4)(model, SRC, LENGTHS)
    assert all(len(h[0].tokens) == 4 for h in fixed)
    capped = BeamSearch(beam_size=2, max_len=50, max_len_ratio=1.5)(model, SRC, LENGTHS)
    for b in range(3):
        assert len(capped[b][0].tokens) <= -(-3 * int(LENGTHS[b]) // 2)


@pytest.mark.parametrize("ratio", [1e30, 1e300, 2.0**63])
def test_a_huge_length_ratio_caps_nothing(ratio: float) -> None:
    """ratio x length beyond int64 leaves max_len the cap (it once overflowed to min_len)."""
    lengths = torch.tensor([1, 7, 30])
    caps = BeamSearch(max_len=40, min_len=2, max_len_ratio=ratio).caps(lengths)
    assert caps.tolist() == [40, 40, 40]
    assert BeamSearch(max_len=40, max_len_ratio=2.0).caps(lengths).tolist() == [2, 14, 40]


def test_early_stopping_does_not_change_the_result() -> None:
    model = random_model(seed=4)
    for penalty in ("none", "average", "gnmt"):
        kwargs = dict(beam_size=3, n_best=2, max_len=6, length_penalty=penalty)
        fast = BeamSearch(**kwargs)(model, SRC, LENGTHS)
        full = BeamSearch(**kwargs, early_stopping=False)(model, SRC, LENGTHS)
        assert [[h.tokens for h in hs] for hs in fast] == [[h.tokens for h in hs] for hs in full]


def test_special_ids_come_from_the_config_or_vocab() -> None:
    model = random_model(seed=2)
    by_hand = RNNSearch(model.encoder, model.decoder)  # no config: Vocab's ids
    assert by_hand.config is None
    with_config = [[h.tokens for h in hs] for hs in model.translate(SRC, LENGTHS, beam_size=3)]
    assert [[h.tokens for h in hs] for hs in by_hand.translate(SRC, LENGTHS, beam_size=3)] == \
        with_config
    # The config's ids are the ones used: with eos_id=4, token 4 ends sentences and 2 is a word.
    other = RNNSearch(model.encoder, model.decoder, config=replace(model.config, eos_id=4))
    for hyps in other.translate(SRC, LENGTHS, beam_size=3, n_best=3, max_len=6):
        assert all(4 not in h.tokens for h in hyps)
    with pytest.raises(TypeError):
        BeamSearch(bos_id=1)  # no second source of special ids


def test_training_mode_restored() -> None:
    model = random_model().train()
    model.translate(SRC, LENGTHS, beam_size=2, max_len=3)
    assert model.training


def test_replace_unk() -> None:
    hyp = Hypothesis([7, 3, 8], -1.0, -1.0,
                     torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5], [0.5, 0.5]]))
    assert replace_unk(hyp, ["le", "chat"], ["the", "<unk>", "sat"]) == ["the", "chat", "sat"]
    assert replace_unk(hyp, ["le", "chat"], ["the", "<unk>", "sat"],
                       dictionary={"chat": "cat"}) == ["the", "cat", "sat"]
    with pytest.raises(ValueError, match="attention"):
        replace_unk(replace(hyp, attention=None), ["a"], ["b", "c", "d"])
    with pytest.raises(ValueError, match="source"):
        replace_unk(hyp, ["le"], ["the", "<unk>", "sat"])


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(beam_size=0), "beam_size"),
    (dict(beam_size=2, n_best=3), "n_best"),
    (dict(min_len=5, max_len=4), "max_len"),
    (dict(length_penalty="wu"), "length_penalty"),
    (dict(max_len_ratio=0.0), "max_len_ratio"),
    (dict(max_len_ratio=float("inf")), "max_len_ratio must be a finite number"),
    (dict(max_len_ratio=float("nan")), "max_len_ratio must be a finite number"),
    (dict(alpha=float("nan")), "alpha must be a finite number"),
    (dict(alpha=-1.0), "alpha must be >= 0"),
    (dict(max_len=2.5), "max_len must be an int"),
    (dict(beam_size=True), "beam_size must be an int"),
])
def test_config_errors(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        BeamSearch(**kwargs)


def test_input_errors() -> None:
    model = random_model()
    with pytest.raises(ValueError, match="nothing to translate"):
        model.translate(SRC[:0], LENGTHS[:0])
    with pytest.raises(ValueError, match="at least one token"):
        model.translate(SRC, torch.tensor([5, 0, 3]))
