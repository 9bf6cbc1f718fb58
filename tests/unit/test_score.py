"""Forced decoding: `bahdanau.evaluate.score_ids`, `score_corpus` and `bahdanau score`.

Expectations: the search's own output scores exactly what the search says it scored (log_prob
and the normalised score, greedy and beam, every length penalty, float64); and log p(Y | X)
equals the sum of log-softmax at the target ids computed independently, one step at a time,
with the reference decoder (`AttentiveDecoder.init_state` / `step`), not the teacher-forced path
the scorer takes.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from serving_fixtures import shared_checkpoint
from training_fixtures import TINY_VOCAB, one_line_error, tiny_model

import bahdanau._checks as checks
from bahdanau.cli import main
from bahdanau.data import CharTokenizer, DefaultTokenizer, pad_sources
from bahdanau.ensemble import Ensemble
from bahdanau.evaluate import score_corpus, score_ids, translate_corpus
from bahdanau.search import BeamSearch
from bahdanau.translate import load

SOURCES = [[5, 9, 4], [7, 8, 9, 10, 11, 12], [13], [4, 6, 15, 14], [11, 5, 6, 7, 8]]


def float64_model(**changes):
    model = tiny_model(seed=3, **changes).double().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():                     # weights large enough to make real differences
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("penalty", ["none", "average", "gnmt"])
@pytest.mark.parametrize("beam_size", [1, 4])
def test_search_output_scores_as_the_search_scored_it(engine, penalty, beam_size) -> None:
    model = float64_model(engine=engine)
    src, lengths = pad_sources(SOURCES)
    search = BeamSearch(beam_size=beam_size, n_best=beam_size, max_len=7,
                        length_penalty=penalty, alpha=0.8)
    hyps = search(model, src, lengths)
    pairs = [(s, h.tokens) for s, sent in zip(SOURCES, hyps, strict=True) for h in sent]
    found = [h for sent in hyps for h in sent]
    scored = score_ids(model, pairs, batch_size=3, length_penalty=penalty, alpha=0.8)
    assert len(scored) == len(found) == len(SOURCES) * beam_size
    for hyp, got in zip(found, scored, strict=True):
        assert got.n_tokens == len(hyp.tokens) + 1
        assert got.log_prob == pytest.approx(hyp.log_prob, rel=1e-12, abs=1e-12)
        assert got.score == pytest.approx(hyp.score, rel=1e-12, abs=1e-12)


def reference_log_prob(model, src: list[int], tgt: list[int]) -> float:
    """log p(tgt eos | src), one reference decoder step at a time (no engine, no batching)."""
    annotations, mask = model.encoder(torch.tensor([src]), torch.tensor([len(src)]))
    state, memory = model.decoder.init_state(annotations, mask)
    total, prev = 0.0, model.config.bos_id
    for token in [*tgt, model.config.eos_id]:
        out = model.decoder.step(torch.tensor([prev]), state, memory)
        total += float(torch.log_softmax(out.logits[0], -1)[token])
        state, prev = out.state, token
    return total


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnencdec"])
def test_log_prob_is_the_sum_of_reference_step_log_softmax(arch) -> None:
    model = float64_model(arch=arch)
    targets = [[6, 7], [], [15, 4, 4, 9, 12], [8], [10, 11, 13]]
    scored = score_ids(model, list(zip(SOURCES, targets, strict=True)), batch_size=2,
                       length_penalty="average")
    with torch.no_grad():
        for src, tgt, got in zip(SOURCES, targets, scored, strict=True):
            want = reference_log_prob(model, src, tgt)
            assert got.log_prob == pytest.approx(want, rel=1e-12, abs=1e-12)
            assert got.score == pytest.approx(want / (len(tgt) + 1), rel=1e-12)


def test_the_result_keeps_the_input_order_and_the_model_its_mode() -> None:
    model = float64_model().train()
    pairs = [(s, [4] * (len(s) % 3)) for s in SOURCES]
    alone = [score_ids(model, [pair])[0] for pair in pairs]
    batched = score_ids(model, pairs, batch_size=2)            # sorted by length inside
    for got, want in zip(batched, alone, strict=True):
        assert got.n_tokens == want.n_tokens
        assert got.log_prob == pytest.approx(want.log_prob, rel=1e-12)
    assert model.training                                      # scored in eval mode, restored


def test_bad_arguments_are_one_line_errors() -> None:
    model = float64_model()
    one_line_error(lambda: score_ids(Ensemble([model]), [([4], [5])]), "Ensemble only decodes")
    one_line_error(lambda: score_ids(model, [([4], [5])], batch_size=0), "batch_size")
    one_line_error(lambda: score_ids(model, [([4], [5])], length_penalty="long"),
                   "length_penalty")
    one_line_error(lambda: score_ids(model, [([], [5])]), "empty source")
    one_line_error(lambda: score_ids(model, [([4], [5]), ([4], [99])]), "tgt", "vocabulary")
    vocab = TINY_VOCAB
    tok = DefaultTokenizer()
    score = lambda src, tgt: score_corpus(model, src, tgt, vocab, vocab, tok)  # noqa: E731
    one_line_error(lambda: score(["w1", "w2"], ["w3"]), "2 sources but 1 targets")
    one_line_error(lambda: score(["w1", "w2"], ["w3", " "]), "target sentence 2 is empty")
    one_line_error(lambda: score_corpus(model, ["w1", "\t"], ["w3", "w4"], vocab, vocab,
                                        CharTokenizer()), "source sentence 2 is empty")
    assert score(["w1 w2", "w5"], ["w3 zebra", "w4"])[0].n_tokens == 3   # zebra is <unk>


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_teacher_forcing_keeps_a_step_s_weights_only_while_it_runs(engine, monkeypatch) -> None:
    """A 20,000-word line took 8.7 GB to score: every step's (B, S) weights were kept, (T, S)
    in all, for a return_attention scoring never asks for. Counted: the weights the attention
    returned that are still alive when it is called again."""
    model = float64_model(engine=engine)
    attention, alive, most = model.decoder.attention, [], [0]
    attend = attention.attend

    def counted(*args, **kwargs):
        most[0] = max(most[0], sum(ref() is not None for ref in alive))
        context, weights = attend(*args, **kwargs)
        alive.append(weakref.ref(weights))
        return context, weights

    monkeypatch.setattr(attention, "attend", counted)
    score_ids(model, [([5, 9, 4] * 10, [6, 7] * 20)])
    assert len(alive) == 41 and most[0] <= 2          # 41 steps; before: 40 alive at the last
    _, weights = model(*pad_sources([[5, 9, 4]]), torch.tensor([[1, 6, 7]]),
                       return_attention=True)
    assert weights.shape == (1, 3, 3)                   # asked for: (B, T, S), kept


def test_a_sentence_or_batch_beyond_the_memory_is_refused(monkeypatch) -> None:
    """Scoring needs memory in proportion to each sentence's lengths: a sentence that alone
    needs more than there is, is named (by its 1-based place, its line for `bahdanau score`);
    sentences that fit alone but not together ask for a smaller batch; all before any work."""
    model = float64_model()
    monkeypatch.setattr(checks, "available_memory", lambda device: 10**6)
    short, long = ([5, 9], [6]), ([5] * 2000, [6] * 2000)
    message = one_line_error(lambda: score_ids(model, [short, long, short]),
                             "scoring sentence 2 (2,000 source and 2,001 target tokens) needs "
                             "about ")
    assert message.endswith(" more than the 1.0 MB of memory available on cpu: split or "
                            "shorten that sentence")
    middle = ([5] * 400, [6] * 400)
    message = one_line_error(lambda: score_ids(model, [middle] * 3),
                             "scoring 3 sentences together (up to 400 source and 401 target "
                             "tokens) needs about ")
    assert message.endswith("memory available on cpu: lower the batch size")
    assert len(score_ids(model, [middle] * 3, batch_size=1)) == 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return shared_checkpoint(tmp_path_factory)


def test_score_command(checkpoint, tmp_path, capsys) -> None:
    """Lines of ``log_prob<TAB>score<TAB>n_tokens``: for the search's own n-best translations,
    the search's log_prob and score; bad inputs are one line each, before any work."""
    t = load(checkpoint)
    sentences = ["A man is riding a bicycle.", "Two dogs play in the snow.",
                 "A woman is sitting on a bench.", "A group of people are standing."]
    search = BeamSearch(beam_size=3, n_best=3, max_len=8, length_penalty="average")
    pairs = [(source, hyp) for source, tr in zip(sentences, translate_corpus(
        t.model, sentences, t.src_vocab, t.tgt_vocab, t.tokenizer, search=search),
        strict=True) for hyp in tr.nbest]
    texts = [t.tokenizer.detokenize(t.tgt_vocab.decode(hyp.tokens)) for _, hyp in pairs]
    src, tgt, out = tmp_path / "n.en", tmp_path / "n.fr", tmp_path / "scores.tsv"
    src.write_text("".join(source + "\n" for source, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    assert main(["score", "--checkpoint", str(checkpoint), "--src", str(src), "--tgt", str(tgt),
                 "--length-penalty", "average", "--batch-size", "2", "--output",
                 str(out)]) == 0
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert len(rows) == len(pairs) == 12
    compared = 0
    for (_, hyp), text, (log_prob, score, n_tokens) in zip(pairs, texts, rows, strict=True):
        assert float(score) == pytest.approx(float(log_prob) / int(n_tokens), abs=1e-5)
        if t.tgt_vocab.encode(t.tokenizer.tokenize(text)) == hyp.tokens:  # text round trips
            compared += 1
            assert int(n_tokens) == len(hyp.tokens) + 1
            assert float(log_prob) == pytest.approx(hyp.log_prob, abs=1e-5)
            assert float(score) == pytest.approx(hyp.score, abs=1e-5)
    assert compared >= 2, compared

    def error(*argv: str) -> str:
        assert main(["score", "--checkpoint", str(checkpoint), *argv]) == 2
        return capsys.readouterr().err.strip()

    capsys.readouterr()
    (tmp_path / "gap.fr").write_text("un\n\n", encoding="utf-8")
    (tmp_path / "one.fr").write_text("un\n", encoding="utf-8")
    (tmp_path / "two.en").write_text("a\nb\n", encoding="utf-8")
    assert error("--src", str(src), "--tgt", str(tmp_path / "one.fr")) == (
        "bahdanau: error: --src has 12 lines but --tgt has 1")
    assert "line 2 is empty" in error("--src", str(tmp_path / "two.en"), "--tgt",
                                      str(tmp_path / "gap.fr"))
    assert "would destroy it" in error("--src", str(src), "--tgt", str(tgt), "--output",
                                       str(src))
    assert "no such file" in error("--src", str(tmp_path / "missing"), "--tgt", str(src))
