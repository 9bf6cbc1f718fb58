"""The reproduction's statistics (examples/reproduce/reproduce_paper.py): BLEU of resampled
sentences from per-sentence statistics, the paired bootstrap, and how the attention's argmax is
read on reordered word pairs, against sacrebleu itself and hand-worked examples."""

from __future__ import annotations

import numpy as np
import pytest
import sacrebleu
import torch
from example_scripts import load_example

from bahdanau.data import DefaultTokenizer
from bahdanau.evaluate import Translation
from bahdanau.search import Hypothesis

reproduce = load_example("reproduce/reproduce_paper.py")

HYPS = ["the cat sat on the mat .", "a dog is here", "hello world there", "x y z",
        "the government of Canada said no .", "we vote"]
REFS = ["the cat is on the mat .", "the dog is here", "hello there world", "x y z w",
        "the Canadian government said no .", "we will vote today"]


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5], [1, 4], [2, 2, 5, 0, 0]])
def test_bleu_of_summed_statistics_is_sacrebleus_corpus_bleu(rows: list[int]) -> None:
    stats = reproduce.SentenceStats(HYPS, REFS)
    expected = sacrebleu.corpus_bleu([HYPS[i] for i in rows], [[REFS[i] for i in rows]]).score
    assert stats.bleu(np.array(rows)) == pytest.approx(expected, abs=1e-9)


def test_paired_bootstrap_gives_intervals_around_the_score_and_pairs_the_resamples() -> None:
    systems = {"a": reproduce.SentenceStats(HYPS, REFS),
               "same": reproduce.SentenceStats(HYPS, REFS),
               "refs": reproduce.SentenceStats(REFS, REFS)}
    boot = reproduce.bootstrap(systems, [0, 1, 2, 3, 4, 5], resamples=200, seed=7)
    for name in systems:
        assert boot[name]["low"] <= boot[name]["bleu"] <= boot[name]["high"]
    # the same translations score the same on every resample; perfect ones score 100 on each
    assert np.array_equal(boot["a"]["samples"], boot["same"]["samples"])
    assert np.allclose(boot["refs"]["samples"], 100.0)
    again = reproduce.bootstrap(systems, [0, 1, 2, 3, 4, 5], resamples=200, seed=7)
    assert np.array_equal(again["a"]["samples"], boot["a"]["samples"])
    assert reproduce.bootstrap(systems, [], resamples=200, seed=7) == {}


def translation(text: str, peaks: list[int], n_src: int) -> Translation:
    """A translation whose attention puts all weight on source position peaks[i] for target
    token i (the last row is eos)."""
    tokens = DefaultTokenizer().tokenize(text)
    assert len(peaks) == len(tokens) + 1
    attention = torch.zeros(len(peaks), n_src)
    attention[torch.arange(len(peaks)), torch.tensor(peaks)] = 1.0
    return Translation(text, tokens, Hypothesis([0] * len(tokens), 0.0, 0.0, attention), [])


def test_reordered_pairs_count_crossing_and_exactly_swapped_argmaxes() -> None:
    source = "the federal government and the human rights"   # 0 1 2 3 4 5 6
    # "le gouvernement fédéral et les droits de la personne": gouvernement -> government (2),
    # fédéral -> federal (1): crossing and exact; droits -> rights (6), personne -> human (5):
    # crossing and exact
    swapped = translation("le gouvernement fédéral et les droits de la personne",
                          [0, 2, 1, 3, 4, 6, 6, 5, 5, 6], n_src=7)
    # the same words attended in the English order: no crossing
    monotonic = translation("le gouvernement fédéral et les droits de la personne",
                            [0, 1, 2, 3, 4, 5, 5, 6, 6, 6], n_src=7)
    # crossing, but onto other words than the pair's: crossing, not exact
    elsewhere = translation("le gouvernement fédéral", [0, 3, 0, 3], n_src=7)
    tokenizer = DefaultTokenizer()
    counts = reproduce.swapped_pair_attention([swapped, monotonic, elsewhere], [source] * 3,
                                              tokenizer)
    assert counts == {"pairs": 5, "crossing": 3, "exact": 2, "crossing_rate": 0.6,
                      "exact_rate": 0.4}


def test_a_pair_counts_only_where_the_model_wrote_the_french_order() -> None:
    tokenizer = DefaultTokenizer()
    source = "the federal government"
    english_order = translation("le fédéral gouvernement", [0, 1, 2, 2], n_src=3)
    assert reproduce.swapped_pair_positions(tokenizer.tokenize(source), english_order.tokens,
                                            tokenizer) == []
    assert reproduce.swapped_pair_attention([english_order], [source], tokenizer)["pairs"] == 0


def test_the_control_counts_backward_steps_of_the_argmax_between_adjacent_words() -> None:
    # argmax rows 0, 2, 1, 3 (then eos): steps 0->2 forward, 2->1 back, 1->3 forward
    t = translation("a b c d", [0, 2, 1, 3, 3], n_src=4)
    assert reproduce.backward_steps([t, translation("e", [1, 0], n_src=2)]) == {
        "steps": 3, "backward": 1, "rate": 0.333}


def test_the_runs_differ_only_by_the_attention_or_the_recipe() -> None:
    """RNNsearch-50 and RNNencdec-50 train with the same options but for the architecture, and
    the -paper pair differs from them only by the recipe and by training the whole budget."""
    args = reproduce.parse_args([])

    def differences(a: str, b: str) -> dict[str, tuple[object, object]]:
        # every option a run records in its config.yaml (all but where it starts: --out)
        first, second = (reproduce.job_options(args, n).to_record() for n in (a, b))
        return {k: (first[k], second[k]) for k in first if first[k] != second[k]}

    assert differences("RNNsearch-50", "RNNencdec-50") == {"arch": ("rnnsearch", "rnnencdec")}
    assert differences("RNNsearch-50", "RNNsearch-50-paper") == {
        "init": ("glorot", "paper"), "optimizer": ("adam", "adadelta"), "lr": (1e-3, 1.0),
        "patience": (3, None)}
    assert differences("RNNencdec-50-paper", "RNNsearch-50-paper") == {
        "arch": ("rnnencdec", "rnnsearch")}
