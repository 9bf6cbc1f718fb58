"""Beam and greedy search against independent computations: enumeration, scoring, greedy loop."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest
import torch
from search_asserts import assert_same_hypotheses, random_model, reorder_tol
from training_fixtures import one_line_error

import bahdanau._checks as checks
from bahdanau import BeamSearch, RNNEncDec, RNNSearch, greedy_search, replace_unk
from bahdanau.captured_step import pad_to_bucket
from bahdanau.errors import InputError
from bahdanau.search import (
    Hypothesis,
    _Beams,
    length_normalise,
    select_candidates,
    step_call,
)

# The host looks at the batch every k steps (`check_every`): every k finds the same hypotheses.
# 1 is today's default, 3 leaves finished sentences in the batch for up to two steps, and
# 1000 runs every step of a batch before the first look.
CHECKS = [1, 3, 1000]
TOL64 = reorder_tol(torch.float64)

PAD, BOS, EOS = 0, 1, 2


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


@pytest.mark.parametrize("check_every", CHECKS)
@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_beam_one_is_greedy(cls, check_every) -> None:
    model = random_model(cls)
    results = BeamSearch(beam_size=1, max_len=7, check_every=check_every)(model, SRC, LENGTHS)
    greedy = greedy_search(model, SRC, LENGTHS, max_len=7)
    for b in range(3):
        tokens, total = reference_greedy(model, SRC[b], int(LENGTHS[b]), 7)
        assert results[b][0].tokens == greedy[b].tokens == tokens
        assert results[b][0].log_prob == pytest.approx(total, abs=1e-10)
        assert greedy[b].score == pytest.approx(results[b][0].score, abs=TOL64)


@pytest.mark.parametrize("check_every", CHECKS)
@pytest.mark.parametrize("penalty", ["none", "average", "gnmt"])
def test_wide_beam_equals_exhaustive_enumeration(penalty: str, check_every: int) -> None:
    """V = 6 (4 specials, 2 words), cap 3: 39 candidate sequences, all enumerated."""
    model = random_model(vocab=6, seed=1, scale=1.5)
    words = [3, 4, 5]                                           # unk and the two words
    max_len = 3
    search = BeamSearch(beam_size=40, n_best=3, max_len=max_len, length_penalty=penalty,
                        alpha=0.8, check_every=check_every)
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


@pytest.mark.parametrize("check_every", CHECKS)
@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_alone_equals_in_batch(cls, check_every) -> None:
    model = random_model(cls, seed=2)
    search = BeamSearch(beam_size=3, n_best=2, max_len=8, length_penalty="average",
                        check_every=check_every)
    batched = search(model, SRC, LENGTHS)
    for b in range(3):
        length = int(LENGTHS[b])
        alone = search(model, SRC[b:b + 1, :length], LENGTHS[b:b + 1])
        assert_same_hypotheses(alone, batched[b:b + 1], tol=1e-9)
        if cls is RNNEncDec:
            assert all(h.attention is None for h in alone[0])


@pytest.mark.parametrize("check_every", [1, 1000])
def test_observe_hears_each_run_of_steps_and_changes_no_hypothesis(check_every) -> None:
    """`observe` is told of each run of `check_every` steps: its target tokens (the beam rows
    of the sentences still searching, times the steps) and seconds. Torch's thread count
    changed at every call (as `AdaptiveThreads` changes it) leaves every hypothesis as it is."""
    model = random_model(seed=3)
    search = BeamSearch(beam_size=3, n_best=2, max_len=8, check_every=check_every)
    plain = search(model, SRC, LENGTHS)
    heard: list[tuple[int, float]] = []

    def observe(tokens: int, seconds: float) -> None:
        heard.append((tokens, seconds))
        torch.set_num_threads(2 if torch.get_num_threads() == 1 else 1)

    assert_same_hypotheses(replace(search, observe=observe)(model, SRC, LENGTHS), plain,
                           tol=TOL64)
    tokens = [t for t, _ in heard]
    if check_every == 1000:         # one run: steps 0 to 8 (eos at the cap), 3 x 3 rows each
        assert tokens == [3 * 3 * 9]
    else:       # a step at a time: the rows of the sentences still searching, which are
        steps = []  # those that search as many steps alone
        for b in range(3):
            alone: list[int] = []
            replace(search, observe=lambda t, s, alone=alone: alone.append(t))(
                model, SRC[b:b + 1, :LENGTHS[b]], LENGTHS[b:b + 1])
            steps.append(len(alone))
        assert tokens == [3 * sum(n > i for n in steps) for i in range(max(steps))]
        assert tokens[-1] < tokens[0]                # seed 3: sentences leave the batch
    assert all(seconds >= 0 for _, seconds in heard)


@pytest.mark.parametrize("check_every", CHECKS)
def test_min_and_max_length_and_ratio(check_every) -> None:
    model = random_model(seed=3)
    fixed = BeamSearch(beam_size=3, min_len=4, max_len=4, check_every=check_every)(
        model, SRC, LENGTHS)
    assert all(len(h[0].tokens) == 4 for h in fixed)
    capped = BeamSearch(beam_size=2, max_len=50, max_len_ratio=1.5, check_every=check_every)(
        model, SRC, LENGTHS)
    for b in range(3):
        assert len(capped[b][0].tokens) <= -(-3 * int(LENGTHS[b]) // 2)


@pytest.mark.parametrize("ratio", [1e30, 1e300, 2.0**63])
def test_a_huge_length_ratio_caps_nothing(ratio: float) -> None:
    """ratio x length beyond int64 leaves max_len the cap (it once overflowed to min_len)."""
    lengths = torch.tensor([1, 7, 30])
    caps = BeamSearch(max_len=40, min_len=2, max_len_ratio=ratio).caps(lengths)
    assert caps.tolist() == [40, 40, 40]
    assert BeamSearch(max_len=40, max_len_ratio=2.0).caps(lengths).tolist() == [2, 14, 40]


@pytest.mark.parametrize("check_every", CHECKS)
def test_early_stopping_does_not_change_the_result(check_every) -> None:
    model = random_model(seed=4)
    for penalty in ("none", "average", "gnmt"):
        kwargs = dict(beam_size=3, n_best=2, max_len=6, length_penalty=penalty,
                      check_every=check_every)
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
    (dict(check_every=0), "check_every must be an int >= 1"),
    (dict(check_every=2.0), "check_every must be an int"),
    (dict(cuda_graphs=1), "cuda_graphs must be True or False"),
    (dict(observe=3), "observe must be a function of"),
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


# ---------------------------------------------------------------------------- the check interval
LONGER_SRC = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [9, 10, 0, 0, 0, 0, 0],
                           [4, 12, 13, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0, 0],
                           [8, 8, 9, 9, 10, 0, 0], [13, 5, 0, 0, 0, 0, 0]])
LONGER_LENGTHS = torch.tensor([7, 2, 3, 1, 5, 2])
SETTINGS = [
    dict(beam_size=1, max_len=9),
    dict(beam_size=3, n_best=2, min_len=2, max_len=9, max_len_ratio=1.5,
         length_penalty="average"),
    dict(beam_size=4, n_best=3, max_len=7, length_penalty="gnmt", alpha=0.8),
    dict(beam_size=2, n_best=2, max_len=5, early_stopping=False),
]


def ending_model(cls=RNNSearch):
    """A random model whose eos is likely enough that sentences end at different steps, some
    before their caps (greedy and beam: 1 to 9 tokens over LONGER_SRC)."""
    model = random_model(cls, seed=5, scale=0.5)
    with torch.no_grad():
        model.decoder.output.bias[EOS] += 3.0 if cls is RNNSearch else 6.0
    return model


@pytest.mark.parametrize("check_every", CHECKS[1:])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_every_check_interval_finds_the_hypotheses_of_one(cls, settings, check_every) -> None:
    """Sentences that are done but still in the batch change nothing: the same tokens, and the
    same scores and alignments up to the order of the sums their rows now share."""
    model = ending_model(cls)
    want = BeamSearch(**settings)(model, LONGER_SRC, LONGER_LENGTHS)
    got = BeamSearch(**settings, check_every=check_every)(model, LONGER_SRC, LONGER_LENGTHS)
    assert_same_hypotheses(got, want, tol=TOL64)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_a_done_sentence_changes_nothing_while_it_stays_in_the_batch(settings) -> None:
    """Every step of the batch without a check: once a sentence is done, none of its
    candidates is finite (so none finishes), its beams score -inf and its n-best stay."""
    model = ending_model()
    search = BeamSearch(**settings)
    with torch.inference_mode():
        beams = _Beams.start(search, model, LONGER_SRC, LONGER_LENGTHS, step_call(model))
        done_at, kept_at = {}, {}
        for index in range(int(beams.caps.max()) + 1):
            beams.advance(range(index, index + 1))
            for sent in range(LONGER_SRC.shape[0]):
                if bool(beams.done[sent]) and sent not in done_at:
                    done_at[sent], kept_at[sent] = index, beams.kept[sent].clone()
    assert len(done_at) == LONGER_SRC.shape[0]
    if search.early_stopping:                       # else every sentence runs to its cap
        assert len(set(done_at.values())) > 1
    for step, _, finished, top_scores, _ in beams.finished:
        for sent, index in done_at.items():
            if step > index:
                assert not torch.isfinite(top_scores[sent]).any() and not finished[sent].any()
    for sent in done_at:
        assert torch.equal(beams.kept[sent], kept_at[sent])
        assert not torch.isfinite(beams.scores[sent]).any()


class NaNAfter(torch.nn.Module):
    """A model whose logits turn NaN for one sentence's rows from a given step on: the memory
    carries each sentence's id, so its rows are known however the batch is cut."""

    def __init__(self, model: RNNSearch, sentence: int, from_step: int) -> None:
        super().__init__()
        self.model, self.sentence, self.from_step = model, sentence, from_step
        self.config, self.steps = model.config, 0

    def encode(self, src, src_lengths):
        state, memory = self.model.encode(src, src_lengths)
        self.steps = 0
        return state, Tagged(memory, torch.arange(src.shape[0]))

    def step(self, prev_tokens, state, memory):
        out = self.model.step(prev_tokens, state, memory.inner)
        beams = prev_tokens.shape[0] // memory.ids.shape[0]
        bad = (memory.ids.repeat_interleave(beams) == self.sentence) & (
            self.steps >= self.from_step)
        self.steps += 1
        return out._replace(logits=torch.where(bad[:, None], float("nan"), out.logits))


class Tagged(tuple):
    """A memory and the sentences' ids, selected together."""

    def __new__(cls, inner, ids):
        return super().__new__(cls, (inner, ids))

    inner = property(lambda self: self[0])
    ids = property(lambda self: self[1])

    def select(self, keep):
        return Tagged(self.inner.select(keep), self.ids.index_select(0, keep))


@pytest.mark.parametrize("check_every", CHECKS)
def test_nan_scores_are_refused_only_in_sentences_still_searching(check_every) -> None:
    model = ending_model()
    search = BeamSearch(beam_size=1, max_len=9, check_every=check_every)
    want = search(model, LONGER_SRC, LONGER_LENGTHS)
    # sentence 3 ends with eos at step 3 (its last beam gone: done, not at its cap); its rows
    # turn NaN from step 4 on, inside the second run of 3 steps
    assert len(want[3][0].tokens) == 3 and all(len(h[0].tokens) > 4 for h in want[:3])
    found = search(NaNAfter(model, 3, 4), LONGER_SRC, LONGER_LENGTHS)
    assert_same_hypotheses(found, want, tol=TOL64)
    with pytest.raises(InputError, match="scores are NaN"):
        search(NaNAfter(model, 0, 4), LONGER_SRC, LONGER_LENGTHS)   # still searching at 4


def test_only_eos_is_the_log_probs_masked_but_eos() -> None:
    """`select_candidates(..., only_eos=...)` equals selecting from log-probabilities that are
    -inf everywhere but eos for those sentences (how a cap was applied before)."""
    gen = torch.Generator().manual_seed(7)
    n_sent, beams, vocab, eos = 5, 3, 9, 2
    log_probs = torch.log_softmax(torch.randn(n_sent, beams, vocab, generator=gen,
                                              dtype=torch.float64), -1)
    log_probs[4, :, eos] = float("nan")
    scores = torch.randn(n_sent, beams, generator=gen, dtype=torch.float64)
    scores[1, 1:] = float("-inf")
    capped = torch.tensor([True, True, False, True, True])
    masked = log_probs.clone()
    masked[capped] = float("-inf")
    masked[capped, :, eos] = log_probs[capped, :, eos]
    want = select_candidates(scores, masked, eos)
    got = select_candidates(scores, log_probs, eos, only_eos=capped)
    assert torch.equal(got.finished, want.finished)
    torch.testing.assert_close(got.top_scores, want.top_scores, rtol=0, atol=0, equal_nan=True)
    live = torch.isfinite(want.top_scores)          # -inf candidates tie: their order is free
    assert torch.equal(got.top_parent[live], want.top_parent[live])
    torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=0, equal_nan=True)
    going = torch.isfinite(want.scores)
    assert torch.equal(got.parent[going], want.parent[going])
    assert torch.equal(got.token[going], want.token[going])
    assert got.finished[capped].any() and not torch.isfinite(got.scores[capped]).any()
    assert not (got.token[capped] == eos).any()          # K continuing beams, none with eos


@pytest.mark.parametrize("cls", [RNNSearch, RNNEncDec])
def test_a_source_padded_to_a_bucket_finds_the_same_hypotheses(cls) -> None:
    """Padding is exact in this model (the encoder stops at each sentence's length, attention
    gives padding the weight 0), up to the order of the sums over the longer rows."""
    model = random_model(cls, seed=8)
    full = torch.tensor([[5, 6, 7], [9, 10, 11]])            # no padding: packed after it
    for src, lengths in ((SRC, LENGTHS), (full, torch.tensor([3, 3]))):
        padded = pad_to_bucket(src, 0)
        assert padded.shape == (src.shape[0], 8) and torch.equal(padded[:, :src.shape[1]], src)
        search = BeamSearch(beam_size=3, n_best=2, max_len=8)
        assert_same_hypotheses(search(model, padded, lengths), search(model, src, lengths),
                               tol=TOL64)


def test_cuda_graphs_are_refused_on_a_cpu() -> None:
    with pytest.raises(InputError, match=re.escape("cuda_graphs=True replays the decoder step "
                                                   "as CUDA graphs")) as err:
        BeamSearch(cuda_graphs=True)(random_model(), SRC, LENGTHS)
    assert "\n" not in str(err.value) and "src is on cpu" in str(err.value)


@pytest.mark.parametrize(("search", "what"), [
    (BeamSearch(beam_size=10**9, n_best=10**9), "a beam of 1,000,000,000 and up to 100 target"),
    (BeamSearch(max_len=2**31 - 1), "a beam of 5 and up to 2,147,483,647 target tokens"),
])
def test_a_search_beyond_the_memory_is_refused_before_it_allocates(search, what,
                                                                    monkeypatch) -> None:
    """--beam-size 1000000000 ended in an allocator's traceback (48 GB for the decoder state
    alone), and a length cap the memory cannot hold would too: one line, before the model
    encodes anything; a search that fits runs."""
    monkeypatch.setattr(checks, "available_memory", lambda device: 10**9)
    model = random_model()

    def encode(*args):
        raise AssertionError("the search allocated before its memory was checked")

    monkeypatch.setattr(model, "encode", encode)
    message = one_line_error(lambda: search(model, SRC, LENGTHS),
                             f"searching 3 sentence(s) of 5 source tokens with {what}")
    assert message.endswith(" more than the 1.0 GB of memory available on cpu: lower the beam "
                            "size, the maximum length or the sentences searched together, or "
                            "shorten the sentence")
    assert len(BeamSearch(beam_size=5, max_len=7)(random_model(), SRC, LENGTHS)) == 3
