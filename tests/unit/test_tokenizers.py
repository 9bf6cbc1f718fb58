"""Unit tests for bahdanau.data: SentencePiece training and use, characters as tokens, one
tokenizer per side, and storing tokenizers.

Expectations come from the text itself (pieces spell the sentence, detokenising gives it back
with its whitespace normalised), from hand-written payloads and files, and from what a model
trained on chosen sentences can hold (the characters of those sentences only).
"""

from __future__ import annotations

import io
import json
import pickle
import sys

import pytest
import torch
from training_fixtures import one_line_error

from bahdanau.data import (
    CharTokenizer,
    DefaultTokenizer,
    SentencePieceTokenizer,
    TokenizerPair,
    Vocab,
    WhitespaceTokenizer,
    encode_pairs,
    load_tokenizer,
    multi30k_files,
    read_lines,
    save_tokenizer,
    sides,
    tokenizer_from_payload,
    tokenizer_to_payload,
)
from bahdanau.data.tokenizers import SENTENCEPIECE_FILE, TOKENIZER_FILE, tokenizer_files

MISSING = ("SentencePiece needs the sentencepiece package: pip install "
           "'bahdanau[sentencepiece]'")


def _sample() -> list[str]:
    """400 English and 400 French training sentences of the shipped Multi30k."""
    return (read_lines(multi30k_files("train", "en"))[:400]
            + read_lines(multi30k_files("train", "fr"))[:400])


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def sp(request) -> SentencePieceTokenizer:
    pytest.importorskip("sentencepiece")
    return SentencePieceTokenizer.train(_sample(), vocab_size=300, model_type=request.param)


def _normalized(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------------------------
# SentencePiece


def test_trained_model_has_the_size_and_none_of_our_special_pieces(sp) -> None:
    assert len(sp.pieces) == 300
    assert sp.pieces[0] == "<unk>"
    assert not {"<pad>", "<s>", "</s>"} & set(sp.pieces)


def test_pieces_spell_each_sentence(sp) -> None:
    for sentence in _sample()[::40]:
        tokens = sp.tokenize(sentence)
        assert tokens and set(tokens) <= set(sp.pieces)
        assert "".join(tokens).replace("\u2581", " ").strip() == _normalized(sentence)


def test_round_trip_on_held_out_sentences(sp) -> None:
    known = set("".join(_sample()))
    held_out = [s for s in read_lines(multi30k_files("val", "en"))[:100]
                + read_lines(multi30k_files("val", "fr"))[:100] if set(s) <= known]
    assert len(held_out) > 150
    for sentence in held_out:
        assert sp.detokenize(sp.tokenize(sentence)) == _normalized(sentence)
    messy = "  " + held_out[0].replace(" ", " \t  ") + "\n"
    assert sp.detokenize(sp.tokenize(messy)) == _normalized(held_out[0])


def test_unknown_characters_are_one_unk_token(sp) -> None:
    tokens = sp.tokenize("un chat \u732b\u732b noir")
    assert tokens.count("<unk>") == 1
    unknown = [i for i, t in enumerate(tokens) if t == "<unk>"]
    ids = Vocab.build([tokens]).encode(tokens)
    assert [i for i, x in enumerate(ids) if x == Vocab.unk_id] == unknown
    assert sp.detokenize(tokens) == "un chat \u2047 noir"   # SentencePiece's mark for unknown


def test_blank_text_has_no_tokens(sp) -> None:
    assert sp.tokenize(" \t ") == []
    assert sp.detokenize([]) == ""


def test_sample_is_at_most_max_sentences_and_follows_the_seed() -> None:
    pytest.importorskip("sentencepiece")
    letters = "abcdefgh"
    sentences = [c * 3 for c in letters]                     # one letter per sentence

    def trained_letters(seed: int) -> set[str]:
        tok = SentencePieceTokenizer.train(sentences, vocab_size=5, model_type="bpe",
                                           max_sentences=3, seed=seed)
        return set(tok.pieces) & set(letters)

    assert all(len(trained_letters(seed)) == 3 for seed in range(4))
    assert trained_letters(0) == trained_letters(0)
    assert len({frozenset(trained_letters(seed)) for seed in range(6)}) > 1
    everything = SentencePieceTokenizer.train(sentences, vocab_size=10, model_type="bpe",
                                              max_sentences=8)
    assert set(letters) <= set(everything.pieces)


def test_training_is_deterministic() -> None:
    pytest.importorskip("sentencepiece")
    sample = _sample()
    for model_type in ("bpe", "unigram"):
        first = SentencePieceTokenizer.train(sample, vocab_size=250, model_type=model_type,
                                             max_sentences=300, seed=7)
        again = SentencePieceTokenizer.train(sample, vocab_size=250, model_type=model_type,
                                             max_sentences=300, seed=7)
        assert first == again and first.model_proto == again.model_proto
        assert hash(first) == hash(again)


def test_check_vocab_accepts_its_own_and_names_a_foreign_word(sp) -> None:
    sample = _sample()
    sp.check_vocab(Vocab.build(sp.tokenize(s) for s in sample), "src")
    words = Vocab.build(DefaultTokenizer().tokenize(s) for s in sample)
    first = next(i for i, w in enumerate(words.tokens, start=4) if w not in set(sp.pieces))
    one_line_error(lambda: sp.check_vocab(words, "tgt"),
                   f"tgt vocabulary entry {words.id_to_token(first)!r} (id {first}) is not a "
                   "piece of the SentencePiece model: the vocabulary was built with another "
                   "tokenizer")


def test_save_load_and_pickle_keep_the_model(sp, tmp_path) -> None:
    path = tmp_path / "m" / "sp.model"
    sp.save(path)
    assert path.read_bytes() == sp.model_proto
    assert SentencePieceTokenizer.load(path) == sp
    assert pickle.loads(pickle.dumps(sp)) == sp
    assert repr(sp).startswith("SentencePieceTokenizer(pieces=300, sha256=")


def test_a_model_that_makes_our_special_strings_from_text_is_refused() -> None:
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_sample()[:200]), model_writer=model,
                                   vocab_size=200, bos_id=-1, eos_id=-1,
                                   user_defined_symbols=["<s>"], minloglevel=2)
    one_line_error(lambda: SentencePieceTokenizer(model.getvalue()), "'<s>'", "special")


def test_missing_package_is_one_line(monkeypatch, sp) -> None:
    monkeypatch.setitem(sys.modules, "sentencepiece", None)          # import fails
    one_line_error(lambda: SentencePieceTokenizer.train(["a b"], vocab_size=10), MISSING)
    one_line_error(lambda: SentencePieceTokenizer(sp.model_proto), MISSING)
    one_line_error(lambda: tokenizer_from_payload(tokenizer_to_payload(sp)), MISSING)


@pytest.mark.parametrize("contents", [b"not a model", b""], ids=["garbage", "empty"])
def test_a_file_that_is_no_model_is_one_line_naming_it(tmp_path, contents: bytes) -> None:
    pytest.importorskip("sentencepiece")
    path = tmp_path / "x.model"
    path.write_bytes(contents)
    one_line_error(lambda: SentencePieceTokenizer.load(path),
                   f"{path}: not a SentencePiece model")
    one_line_error(lambda: SentencePieceTokenizer.load(tmp_path / "none.model"),
                   f"{tmp_path / 'none.model'}: no such file")


@pytest.mark.parametrize(("arguments", "fragment"), [
    ({"sentences": "one str", "vocab_size": 10}, "not one str"),
    ({"sentences": ["a", 3], "vocab_size": 10}, "sentences must hold str"),
    ({"sentences": [" ", ""], "vocab_size": 10}, "no text"),
    ({"sentences": ["a"], "vocab_size": 1}, "vocab_size must be an int >= 2"),
    ({"sentences": ["a"], "vocab_size": 10, "model_type": "word"}, "model_type"),
    ({"sentences": ["a"], "vocab_size": 10, "max_sentences": 0}, "max_sentences"),
    ({"sentences": ["a"], "vocab_size": 10, "seed": -1}, "seed"),
    ({"sentences": ["a"], "vocab_size": 10, "character_coverage": 0}, "character_coverage"),
    ({"sentences": ["a dog"], "vocab_size": 5000}, "Please set it to a value <="),
])
def test_bad_training_arguments_are_one_line(arguments: dict, fragment: str) -> None:
    pytest.importorskip("sentencepiece")
    one_line_error(lambda: SentencePieceTokenizer.train(**arguments), fragment)


# ----------------------------------------------------------------------------------------------
# Storing


def _through_torch(payload: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("tokenizer", [DefaultTokenizer(), WhitespaceTokenizer(),
                                       DefaultTokenizer(lowercase=True, joiners="punctuation")],
                         ids=["default", "whitespace", "lowercase-punctuation"])
def test_simple_tokenizers_round_trip_through_a_checkpoint_payload(tokenizer) -> None:
    payload = _through_torch(tokenizer_to_payload(tokenizer))
    expected = ({"name": "whitespace"} if isinstance(tokenizer, WhitespaceTokenizer) else
                {"name": "default", "lowercase": tokenizer.lowercase,
                 "joiners": tokenizer.joiners})
    assert payload == expected
    back = tokenizer_from_payload(payload)
    assert type(back) is type(tokenizer) and vars(back) == vars(tokenizer)


def test_sentencepiece_round_trips_through_a_checkpoint_payload(sp) -> None:
    payload = _through_torch(tokenizer_to_payload(sp))
    assert payload["name"] == "sentencepiece" and payload["model"].dtype == torch.uint8
    assert payload["model"].numpy().tobytes() == sp.model_proto
    assert tokenizer_from_payload(payload) == sp


@pytest.mark.parametrize(("payload", "fragment"), [
    ("default", "a tokenizer is stored as a dict with a 'name'"),
    ({"name": "moses"}, "unknown tokenizer 'moses'"),
    ({"lowercase": True}, "unknown tokenizer None"),
    ({"name": "default", "lowercase": False}, "stored with the keys"),
    ({"name": "whitespace", "extra": 1}, "stored with the keys"),
    ({"name": "default", "lowercase": "yes", "joiners": "prefix"}, "'lowercase' must be a bool"),
    ({"name": "default", "lowercase": False, "joiners": "both"}, "'joiners' must be one of"),
    ({"name": "sentencepiece", "model": "sp.model"}, "1-D uint8 tensor"),
    ({"name": "sentencepiece", "model": torch.zeros(3)}, "1-D uint8 tensor"),
])
def test_malformed_payloads_are_one_line(payload, fragment: str) -> None:
    one_line_error(lambda: tokenizer_from_payload(payload), fragment)


def test_a_payload_with_a_damaged_model_is_one_line() -> None:
    pytest.importorskip("sentencepiece")
    payload = {"name": "sentencepiece", "model": torch.tensor(list(b"junk"), dtype=torch.uint8)}
    one_line_error(lambda: tokenizer_from_payload(payload), "not a SentencePiece model")


class _Lowercase(DefaultTokenizer):
    pass


@pytest.mark.parametrize("tokenizer", [_Lowercase(), object()], ids=["subclass", "other"])
def test_only_our_tokenizers_can_be_stored(tokenizer, tmp_path) -> None:
    fragment = "only bahdanau's tokenizers"
    one_line_error(lambda: tokenizer_to_payload(tokenizer), fragment)
    one_line_error(lambda: save_tokenizer(tokenizer, tmp_path), fragment)
    assert not (tmp_path / TOKENIZER_FILE).exists()


def test_folder_round_trip_of_each_tokenizer(sp, tmp_path) -> None:
    default = DefaultTokenizer(lowercase=True, joiners="punctuation")
    assert save_tokenizer(default, tmp_path / "d") == tmp_path / "d" / TOKENIZER_FILE
    assert json.loads((tmp_path / "d" / TOKENIZER_FILE).read_text()) == {
        "name": "default", "lowercase": True, "joiners": "punctuation"}
    assert repr(load_tokenizer(tmp_path / "d")) == repr(default)

    save_tokenizer(WhitespaceTokenizer(), tmp_path / "w")
    assert isinstance(load_tokenizer(tmp_path / "w"), WhitespaceTokenizer)

    save_tokenizer(sp, tmp_path / "s")
    assert json.loads((tmp_path / "s" / TOKENIZER_FILE).read_text()) == {
        "name": "sentencepiece", "model": SENTENCEPIECE_FILE}
    assert (tmp_path / "s" / SENTENCEPIECE_FILE).read_bytes() == sp.model_proto
    assert load_tokenizer(tmp_path / "s") == sp


def test_tokenizer_files_are_the_model_first_then_the_json_naming_it(sp) -> None:
    """What every folder that stores a tokenizer writes (a prepared corpus, a model folder, an
    exported folder): the SentencePiece model's own bytes under the name it is given, then
    tokenizer.json naming it, as indented JSON; a tokenizer without a model, its JSON alone."""
    files = tokenizer_files(sp, "tokenizer.model")
    assert list(files) == ["tokenizer.model", "tokenizer.json"]
    assert files["tokenizer.model"] == sp.model_proto
    assert files["tokenizer.json"] == (b'{\n  "name": "sentencepiece",\n'
                                       b'  "model": "tokenizer.model"\n}\n')
    assert list(tokenizer_files(sp, SENTENCEPIECE_FILE)) == ["sentencepiece.model",
                                                             "tokenizer.json"]
    default = DefaultTokenizer(lowercase=True, joiners="prefix")
    assert tokenizer_files(default, SENTENCEPIECE_FILE) == {
        "tokenizer.json": b'{\n  "name": "default",\n  "lowercase": true,\n'
                          b'  "joiners": "prefix"\n}\n'}


@pytest.mark.parametrize(("contents", "fragment"), [
    (None, "no such file"),
    ('{"name": "default", ', "is damaged"),
    (b"\xff\xfe", "is damaged"),
    ('{"name": "moses"}', "unknown tokenizer 'moses'"),
    ('["default"]', "a tokenizer is stored as a dict"),
    ('{"name": "sentencepiece", "model": "../sp.model"}', "'model' must name a file beside it"),
])
def test_bad_tokenizer_json_is_one_line_naming_it(tmp_path, contents, fragment: str) -> None:
    path = tmp_path / TOKENIZER_FILE
    if isinstance(contents, str):
        path.write_text(contents, encoding="utf-8")
    elif contents is not None:
        path.write_bytes(contents)
    message = one_line_error(lambda: load_tokenizer(tmp_path), fragment)
    assert message.startswith(str(path))


@pytest.mark.parametrize("model", [None, b"not a model"], ids=["missing", "garbage"])
def test_bad_model_beside_tokenizer_json_is_one_line_naming_it(tmp_path, model) -> None:
    pytest.importorskip("sentencepiece")
    (tmp_path / TOKENIZER_FILE).write_text(
        json.dumps({"name": "sentencepiece", "model": SENTENCEPIECE_FILE}), encoding="utf-8")
    if model is not None:
        (tmp_path / SENTENCEPIECE_FILE).write_bytes(model)
    message = one_line_error(lambda: load_tokenizer(tmp_path),
                             "no such file" if model is None else "not a SentencePiece model")
    assert message.startswith(str(tmp_path / SENTENCEPIECE_FILE))


# ----------------------------------------------------------------------------------------------
# Characters, and one tokenizer per side

SPACE = CharTokenizer.SPACE


@pytest.mark.parametrize(("text", "tokens"), [
    ("cat", ["c", "a", "t"]),
    ("New York", ["N", "e", "w", SPACE, "Y", "o", "r", "k"]),
    (" a\tb ", [SPACE, "a", "\t", "b", SPACE]),               # every space kept, a tab as it is
    (f"a{SPACE}b", ["a", "\\" + SPACE, "b"]),                 # a literal "▁" is escaped
    ("", []),
])
def test_char_tokenizer_examples(text: str, tokens: list[str]) -> None:
    tok = CharTokenizer()
    assert tok.tokenize(text) == tokens
    assert tok.detokenize(tokens) == text


def test_a_pair_tokenizes_sources_and_detokenizes_targets_with_its_sides() -> None:
    pair = TokenizerPair(CharTokenizer(), WhitespaceTokenizer())
    assert pair.tokenize("aunt") == ["a", "u", "n", "t"]
    assert pair.detokenize(["AE", "N", "T"]) == "AE N T"
    assert sides(pair) == (pair.source, pair.target)
    plain = CharTokenizer()
    assert sides(plain) == (plain, plain)
    examples = encode_pairs([("ab", "X Y"), ("b", "Y")], Vocab(["a", "b"]), Vocab(["X", "Y"]),
                            pair)
    assert [(e.src, e.tgt) for e in examples] == [([4, 5], [4, 5]), ([5], [5])]


@pytest.mark.parametrize("side", [object(), TokenizerPair(CharTokenizer(), CharTokenizer())],
                         ids=["other", "nested"])
def test_a_pair_of_unstorable_sides_is_one_line(side) -> None:
    one_line_error(lambda: TokenizerPair(CharTokenizer(), side), "a TokenizerPair's target")


@pytest.mark.parametrize("tokenizer", [
    CharTokenizer(), TokenizerPair(CharTokenizer(), WhitespaceTokenizer()),
    TokenizerPair(DefaultTokenizer(lowercase=True), CharTokenizer())],
    ids=["char", "char-whitespace", "default-char"])
def test_char_and_pair_round_trip_through_a_payload_and_a_folder(tokenizer, tmp_path) -> None:
    payload = _through_torch(tokenizer_to_payload(tokenizer))
    if isinstance(tokenizer, CharTokenizer):
        assert payload == {"name": "char"}
    else:
        assert payload == {"name": "pair", "source": tokenizer_to_payload(tokenizer.source),
                           "target": tokenizer_to_payload(tokenizer.target)}
    for back in (tokenizer_from_payload(payload),
                 load_tokenizer(save_tokenizer(tokenizer, tmp_path).parent)):
        assert repr(back) == repr(tokenizer)


@pytest.mark.parametrize(("payload", "fragment"), [
    ({"name": "char", "lowercase": True}, "stored with the keys"),
    ({"name": "pair", "source": {"name": "char"}}, "stored with the keys"),
    ({"name": "pair", "source": {"name": "char"}, "target": {"name": "moses"}},
     "the pair's target: unknown tokenizer 'moses'"),
    ({"name": "pair", "source": {"name": "pair", "source": {}, "target": {}},
      "target": {"name": "char"}}, "the pair's source: a tokenizer pair's side is"),
    ({"name": "pair", "source": {"name": "sentencepiece", "model": torch.zeros(1)},
      "target": {"name": "char"}}, "a tokenizer pair's side is"),
])
def test_malformed_char_and_pair_payloads_are_one_line(payload, fragment: str) -> None:
    one_line_error(lambda: tokenizer_from_payload(payload), fragment)
