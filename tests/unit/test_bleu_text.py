"""BLEU as the WMT shared tasks scored it: Moses' tokenisation on hand-made sentences, and BLEU
scores that lowercasing and tokenisation change in a way worked out by hand."""

from __future__ import annotations

import json
import sys

import pytest
import sacrebleu
from training_fixtures import write_multi30k_slice

from bahdanau.bleu_text import BleuText, check_moses, moses_tokenize
from bahdanau.cli import main
from bahdanau.data import DefaultTokenizer, Vocab
from bahdanau.errors import InputError
from bahdanau.evaluate import corpus_bleu, corpus_scores, score_test_set

sacremoses = pytest.importorskip("sacremoses", reason="needs the moses extra")

# What Moses' normalize-punctuation.perl | tokenizer.perl (no -a) make of them, by the rules of
# the scripts: French keeps an elided article's apostrophe on its left ("l' homme",
# "aujourd' hui"), English puts it on the right ("doesn 't", "man 's"); hyphenated words stay
# whole without -a; guillemets and curly quotes are normalised to straight ones; "..." is one
# token; the French space before "!" is kept once; in English, normalize-punctuation.perl moves
# a full stop after a closing quote inside it ("laughing". -> "laughing.").
FRENCH = [
    ("L'homme, qui porte un t-shirt bleu, regarde «les enfants» jouer... C'est l'été !",
     "L' homme , qui porte un t-shirt bleu , regarde \" les enfants \" jouer ... C' est l' "
     "été !"),
    ("Aujourd’hui, deux chiens-loups courent (vite).",
     "Aujourd' hui , deux chiens-loups courent ( vite ) ."),
]
ENGLISH = [
    ("A man's dog doesn't jump -- it's a well-known fact, isn't it?",
     "A man 's dog doesn 't jump -- it 's a well-known fact , isn 't it ?"),
    ("Two girls: one in a red-and-white dress; the other's \"laughing\".",
     "Two girls : one in a red-and-white dress ; the other 's \" laughing . \""),
]


@pytest.mark.parametrize(("lang", "raw", "tokens"),
                         [("fr", r, t) for r, t in FRENCH] + [("en", r, t) for r, t in ENGLISH])
def test_moses_tokenisation_by_hand(lang, raw, tokens) -> None:
    assert moses_tokenize([raw], lang) == [tokens]


def test_lowercase_turns_a_case_mismatch_into_a_match() -> None:
    """One sentence of 5 tokens (13a splits the final "."), the first differing in case only:
    cased, the n-gram precisions are 4/5, 3/4, 2/3, 1/2 (brevity 1), so BLEU is
    100 * (1/5)^(1/4); lowercased, every n-gram matches: 100."""
    hyp, ref = ["A man's dog runs."], ["a man's dog runs."]
    assert corpus_bleu(hyp, ref) == pytest.approx(100 * (1 / 5) ** 0.25)
    assert corpus_bleu(hyp, ref, lowercase=True) == pytest.approx(100.0)


def test_moses_tokenisation_splits_what_13a_keeps_whole() -> None:
    """The hypothesis equals the reference but for its last word. For n tokens, the precisions
    are (n-1)/n, (n-2)/(n-1), (n-3)/(n-2), (n-4)/(n-3) and BLEU is 100 * ((n-4)/n)^(1/4).
    13a keeps "l'enfant" whole (n = 8); Moses' French rules make it "l' enfant" (n = 9); with
    --tokenize none the text is taken as it is (n = 8 here too)."""
    hyp, ref = (["un homme et l'enfant jouent dans le parc"],
                ["un homme et l'enfant jouent dans le jardin"])
    assert corpus_bleu(hyp, ref) == pytest.approx(100 * (4 / 8) ** 0.25)
    assert corpus_bleu(hyp, ref, tokenize="none") == pytest.approx(100 * (4 / 8) ** 0.25)
    moses = corpus_bleu(hyp, ref, tokenize="moses", moses_lang="fr")
    assert moses == pytest.approx(100 * (5 / 9) ** 0.25)


def test_signature_says_case_and_moses_pretokenisation() -> None:
    hyps = ["Un homme regarde l'écran.", "Deux chiens jouent."]
    refs = ["un homme regarde l'écran.", "Deux chiens courent."]
    scores = corpus_scores(hyps, refs, lowercase=True, tokenize="moses", moses_lang="fr")
    assert scores.bleu_signature.startswith("nrefs:1|case:lc|eff:no|tok:none|smooth:exp|")
    assert scores.bleu_signature.endswith(
        f"|pretok:moses-fr+sacremoses-{sacremoses.__version__}")
    expected = sacrebleu.corpus_bleu(
        [" ".join(["un", "homme", "regarde", "l'", "écran", "."]), "deux chiens jouent ."],
        [[" ".join(["un", "homme", "regarde", "l'", "écran", "."]), "deux chiens courent ."]],
        tokenize="none")
    assert scores.bleu == pytest.approx(expected.score)
    assert "tok:13a" in corpus_scores(hyps, refs).bleu_signature


def test_score_test_set_records_how_bleu_read_the_text() -> None:
    tok = DefaultTokenizer()
    hyps = ["Un chien court.", "L'homme dort."]
    refs = ["un chien court.", "l'enfant dort."]
    vocab = Vocab(["Un", "chien", "court", "L'homme", "dort"])
    got = score_test_set(hyps, hyps, refs, vocab, vocab, tok,
                         bleu=BleuText(lowercase=True, tokenize="moses", moses_lang="fr"))
    assert got["bleu_text"] == {"lowercase": True, "tokenize": "moses", "moses_lang": "fr"}
    assert got["bleu"] == round(sacrebleu.corpus_bleu(
        ["un chien court .", "l' homme dort ."], [["un chien court .", "l' enfant dort ."]],
        tokenize="none").score, 2)
    assert "|pretok:moses-fr+" in got["bleu_signature"]
    plain = score_test_set(hyps, hyps, refs, vocab, vocab, tok)
    assert plain["bleu_text"] == {"lowercase": False, "tokenize": "13a", "moses_lang": None}


@pytest.mark.parametrize(("settings", "match"), [
    ({"tokenize": "moses"}, "^tokenize moses needs moses_lang LANG"),
    ({"moses_lang": "fr"}, "^moses_lang fr sets Moses tokenisation's language: it needs "
                           "tokenize moses$"),
    ({"tokenize": "moses", "moses_lang": "French"}, "^moses_lang must be a language code"),
    ({"tokenize": "spacy"}, "^tokenize must be one of 13a, intl, none, moses, got 'spacy'$"),
])
def test_bad_settings_are_one_line(settings, match) -> None:
    with pytest.raises(InputError, match=match):
        BleuText(**settings)


def test_missing_sacremoses_is_one_line_naming_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "sacremoses", None)          # import fails
    with pytest.raises(InputError, match=r"^--tokenize moses needs sacremoses: pip install "
                                         r"'bahdanau\[moses\]'"):
        check_moses("--tokenize moses")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wmt")
    write_multi30k_slice(root, 40, 12)
    out = root / "run"
    assert main(["train", "--train-src", str(root / "tr.en"), "--train-tgt", str(root / "tr.fr"),
                 "--test-src", str(root / "te.en"), "--test-tgt", str(root / "te.fr"),
                 "--preset", "tiny", "--max-steps", "2", "--time-budget", "0", "--out", str(out),
                 "--beam-size", "1", "--max-len", "6", "--threads", "1", "--test-lowercase",
                 "--test-tokenize", "moses", "--test-moses-lang", "fr", "--no-progress"]) == 0
    return root


def test_train_reports_the_test_set_as_asked(run) -> None:
    metrics = json.loads((run / "run" / "metrics.json").read_text())
    assert metrics["bleu_text"] == {"lowercase": True, "tokenize": "moses", "moses_lang": "fr"}
    assert "|case:lc|" in metrics["bleu_signature"]
    assert "|pretok:moses-fr+sacremoses-" in metrics["bleu_signature"]


def test_evaluate_scores_as_the_shared_task(run, tmp_path, capsys) -> None:
    """evaluate --lowercase --tokenize moses: the BLEU of sacremoses' own tokenisation of the
    translations and references, lowercased, scored by sacrebleu with no tokenizer of its own."""
    hyps, scores = tmp_path / "hyp.txt", tmp_path / "scores.json"
    assert main(["evaluate", "--checkpoint", str(run / "run"), "--src", str(run / "te.en"),
                 "--ref", str(run / "te.fr"), "--beam-size", "1", "--max-len", "6",
                 "--lowercase", "--tokenize", "moses", "--moses-lang", "fr",
                 "--output", str(hyps), "--json", str(scores), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    got = json.loads(scores.read_text())
    assert got["bleu_text"] == {"lowercase": True, "tokenize": "moses", "moses_lang": "fr"}
    assert got["bleu_signature"] in printed and "tok:none" in got["bleu_signature"]
    normaliser = sacremoses.MosesPunctNormalizer(lang="fr")
    tokenizer = sacremoses.MosesTokenizer(lang="fr")

    def moses(lines: list[str]) -> list[str]:
        return [tokenizer.tokenize(normaliser.normalize(line), escape=False, return_str=True)
                .lower() for line in lines]

    refs = (run / "te.fr").read_text(encoding="utf-8").splitlines()
    expected = sacrebleu.corpus_bleu(moses(hyps.read_text(encoding="utf-8").splitlines()),
                                     [moses(refs)], tokenize="none").score
    assert got["bleu"] == round(expected, 2)


def test_evaluate_refuses_bad_scoring_flags_in_one_line(run, capsys) -> None:
    argv = ["evaluate", "--checkpoint", str(run / "run"), "--src", str(run / "te.en"),
            "--ref", str(run / "te.fr")]
    assert main([*argv, "--tokenize", "moses"]) == 2
    assert capsys.readouterr().err == ("bahdanau: error: --tokenize moses needs --moses-lang "
                                       "LANG, the references' language (e.g. fr)\n")
    assert main(["train", "--test-moses-lang", "fr", "--out", str(run / "other")]) == 2
    assert capsys.readouterr().err.startswith("bahdanau: error: --test-moses-lang fr sets "
                                              "Moses tokenisation's language: it needs "
                                              "--test-tokenize moses")


def test_moses_tokens_raise_no_warning_about_tokenised_input(caplog) -> None:
    """sacrebleu warns when many lines end in a tokenised full stop: with --tokenize moses they
    all do, on purpose, and its warning would only mislead."""
    lines = [f"un chien numéro {i} court." for i in range(120)]
    with caplog.at_level("WARNING"):
        corpus_bleu(lines, lines, tokenize="moses", moses_lang="fr")
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]
    with caplog.at_level("WARNING"):             # what the check would have seen
        corpus_bleu(moses_tokenize(lines, "fr"), lines, tokenize="none")
    assert [r for r in caplog.records if "detokenize" in r.getMessage()]
