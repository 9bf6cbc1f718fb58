"""Prepared corpora: the same examples, vocabularies and batches as the in-memory path, the
filters, reuse, and every damaged input as a one-line error."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from training_fixtures import tiny_model

import bahdanau._files as files_module
from bahdanau.cli import main
from bahdanau.config import TrainConfig
from bahdanau.data import (
    BucketBatchSampler,
    CharTokenizer,
    DefaultTokenizer,
    PreparedCorpus,
    Vocab,
    encode_pairs,
    multi30k_files,
    prepare_corpus,
    read_lines,
    read_parallel,
)
from bahdanau.data import corpus as corpus_module
from bahdanau.data.workers import Stopped
from bahdanau.errors import InputError
from bahdanau.training import examples_digest, next_batches, run_step, setup_run


def _write(path, lines, *, gz=False):
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The first 3,000 Multi30k training pairs, as gzip files."""
    root = tmp_path_factory.mktemp("corpus")
    en = read_lines(multi30k_files("train", "en"))[:3000]
    fr = read_lines(multi30k_files("train", "fr"))[:3000]
    return _write(root / "tr.en.gz", en, gz=True), _write(root / "tr.fr.gz", fr, gz=True)


def test_prepared_corpus_holds_the_in_memory_examples(sample, tmp_path) -> None:
    src, tgt = sample
    tok = DefaultTokenizer(joiners="punctuation")
    pairs = read_parallel(src, tgt)
    src_vocab = Vocab.build((tok.tokenize(s) for s, _ in pairs), max_size=2000)
    tgt_vocab = Vocab.build((tok.tokenize(t) for _, t in pairs), max_size=2000)
    examples = encode_pairs(pairs, src_vocab, tgt_vocab, tok, max_len=12)

    prepare_corpus(src, tgt, tmp_path / "one", tokenizer=tok, vocab_size=2000, workers=1)
    prepare_corpus(src, tgt, tmp_path / "two", tokenizer=tok, vocab_size=2000, workers=2)
    one = PreparedCorpus(tmp_path / "one", max_len=12)
    two = PreparedCorpus(tmp_path / "two", max_len=12)
    assert (one.src_vocab, one.tgt_vocab) == (src_vocab, tgt_vocab)
    assert list(one) == examples and list(two) == examples
    assert one[-1] == examples[-1] and one[1:3] == examples[1:3]
    assert one.digest() == two.digest() == examples_digest(examples)
    for name in ("src.ids.npy", "tgt.offsets.npy", "lines.npy"):
        assert np.array_equal(np.load(tmp_path / "one" / name), np.load(tmp_path / "two" / name))
    assert np.load(tmp_path / "one" / "src.ids.npy").dtype == np.uint16
    assert repr(one.tokenizer) == repr(tok)
    sampler_args = {"batch_size": 16, "seed": 7}
    for epoch in (0, 1):
        batches = [BucketBatchSampler(data, **sampler_args).epoch_batches(epoch)
                   for data in (one.lengths, examples)]
        assert [b.tolist() for b in batches[0]] == [b.tolist() for b in batches[1]]


def test_filters_are_counted_and_strict_names_the_line(tmp_path) -> None:
    src = _write(tmp_path / "s.txt", ["a b", "", "a b c d e f", "a", "c d", "   "])
    tgt = _write(tmp_path / "t.txt", ["x y", "x", "x y z", "x y z w v", "z", "y"])
    corpus = prepare_corpus(src, tgt, tmp_path / "out", max_len=5, max_ratio=3, workers=1)
    counts = corpus.manifest["counts"]
    # line 2 and 6: an empty side; line 3: 6 tokens; line 4: 1 vs 5 tokens (ratio 5 > 3)
    assert counts == {"lines": 6, "pairs": 2, "empty": 2, "too_long": 1, "ratio": 1}
    assert [ex.index for ex in corpus] == [0, 4]
    assert [corpus.src_vocab.decode(ex.src) for ex in corpus] == [["a", "b"], ["c", "d"]]
    assert corpus.src_vocab.tokens == ["a", "b", "c", "d"]      # counted on kept pairs only
    with pytest.raises(InputError, match=r"s\.txt: line 2 is empty \(strict"):
        prepare_corpus(src, tgt, tmp_path / "strict", strict=True, workers=1)
    assert not (tmp_path / "strict").exists()


def test_a_blank_line_is_empty_for_characters_too(tmp_path) -> None:
    # As characters, "   " would be three spaces and "\u00a0" one symbol: both are blank
    src = _write(tmp_path / "s.txt", ["ab", "   ", "b", "a"])
    tgt = _write(tmp_path / "t.txt", ["x", "y", "\u00a0", "z"])
    corpus = prepare_corpus(src, tgt, tmp_path / "out", tokenizer=CharTokenizer(), workers=1)
    assert corpus.manifest["counts"]["empty"] == 2 and [ex.index for ex in corpus] == [0, 3]
    with pytest.raises(InputError, match=r"s\.txt: line 2 is empty \(strict"):
        prepare_corpus(src, tgt, tmp_path / "strict", tokenizer=CharTokenizer(), strict=True,
                       workers=1)


def test_large_vocabularies_use_uint32_ids(tmp_path) -> None:
    words = [f"w{i}" for i in range(70_000)]
    lines = [" ".join(words[i:i + 7]) for i in range(0, len(words), 7)]
    corpus = prepare_corpus(_write(tmp_path / "s", lines), _write(tmp_path / "t", lines[::-1]),
                            tmp_path / "out", vocab_size=None, workers=2)
    assert np.load(tmp_path / "out" / "src.ids.npy").dtype == np.uint32
    assert len(corpus.src_vocab) == 70_004
    assert corpus.src_vocab.decode(corpus[5000].src) == lines[5000].split()
    assert corpus.tgt_vocab.decode(corpus[0].tgt) == lines[-1].split()


def test_reuse_overwrite_and_other_files_are_never_replaced(sample, tmp_path) -> None:
    src, tgt = sample
    out = tmp_path / "prep"
    lines: list[str] = []
    prepare_corpus(src, tgt, out, workers=1)
    stamp = (out / "src.ids.npy").stat().st_mtime_ns
    prepare_corpus(src, tgt, out, workers=1, log=lines.append)
    assert "up to date" in lines[-1] and (out / "src.ids.npy").stat().st_mtime_ns == stamp
    with pytest.raises(InputError, match="other inputs or options.*overwrite"):
        prepare_corpus(src, tgt, out, max_len=10, workers=1)
    assert (out / "src.ids.npy").stat().st_mtime_ns == stamp
    assert len(prepare_corpus(src, tgt, out, max_len=10, workers=1, overwrite=True)) < 3000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prep"]     # no leftovers
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match=r"mine is a folder of other files \(1 entry\): "
                       "prepare writes a prepared corpus whole and never replaces other files"):
        prepare_corpus(src, tgt, mine, workers=1, overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_failed_prepare_leaves_nothing(sample, tmp_path, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(corpus_module._Side, "write", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_corpus(*sample, tmp_path / "out", workers=1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case, message", [
    ("misaligned", r"s has 2 lines but .*t has more: the files are not line-aligned"),
    ("utf8", r"t: line 2 is not valid UTF-8"),
    ("truncated_gz", r"s: truncated gzip data"),
    ("no_pairs", r"no pair of .* is left after filtering"),
    ("missing", r"src_path .*nothing: no such file"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, case, message) -> None:
    src, tgt = tmp_path / "s", tmp_path / "t"
    _write(src, ["a b", "c d"])
    _write(tgt, ["x", "y"])
    if case == "misaligned":
        _write(tgt, ["x", "y", "z"])
    elif case == "utf8":
        tgt.write_bytes(b"x\n\xff\xfe\n")
    elif case == "truncated_gz":
        src.write_bytes(gzip.compress(b"a b\nc d\n")[:-6])
    elif case == "no_pairs":
        _write(src, ["", " "])
    elif case == "missing":
        src = tmp_path / "nothing"
    with pytest.raises(InputError, match=message) as err:
        prepare_corpus(src, tgt, tmp_path / "out", workers=1)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage, message", [
    ("no_folder", r"no such folder"),
    ("no_manifest", r"is not a prepared corpus \(no manifest\.json\)"),
    ("version", r"prepared corpus of version 99; this bahdanau reads version 2"),
    ("manifest_json", r"manifest\.json is damaged"),
    ("truncated_ids", r"src\.ids\.npy is damaged"),
    ("missing_ids", r"tgt\.ids\.npy is missing"),
    ("id_outside", r"tgt\.ids\.npy does not match its digest"),   # ids checked before sealing
    ("offsets", r"src\.offsets\.npy is damaged"),
])
def test_damaged_prepared_folders_are_refused(tmp_path, damage, message) -> None:
    folder = tmp_path / "prep"
    prepare_corpus(_write(tmp_path / "s", ["a b", "c d e"]), _write(tmp_path / "t", ["x", "y z"]),
                   folder, workers=1)
    manifest = folder / "manifest.json"
    if damage == "no_folder":
        folder = tmp_path / "elsewhere"
    elif damage == "no_manifest":
        manifest.unlink()
    elif damage == "version":
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "version": 99}))
    elif damage == "manifest_json":
        manifest.write_text('{"format": ')
    elif damage == "truncated_ids":
        path = folder / "src.ids.npy"
        path.write_bytes(path.read_bytes()[:-2])
    elif damage == "missing_ids":
        (folder / "tgt.ids.npy").unlink()
    elif damage == "id_outside":
        ids = np.load(folder / "tgt.ids.npy")
        ids[1] = 9999
        np.save(folder / "tgt.ids.npy", ids)
    elif damage == "offsets":
        np.save(folder / "src.offsets.npy", np.array([0, 3, 2], dtype=np.int64))
    with pytest.raises(InputError, match=message) as err:
        PreparedCorpus(folder)
    assert "\n" not in str(err.value)


def test_training_on_a_prepared_corpus_equals_training_on_the_list(sample, tmp_path) -> None:
    src, tgt = sample
    prepare_corpus(src, tgt, tmp_path / "prep", vocab_size=60, workers=1)
    corpus = PreparedCorpus(tmp_path / "prep", max_len=10)
    examples = list(corpus)
    cfg = TrainConfig(optimizer="adam", batch_size=8, max_steps=4, seed=3)
    losses = []
    for data in (examples, corpus):
        model = tiny_model(src_vocab_size=len(corpus.src_vocab),
                           tgt_vocab_size=len(corpus.tgt_vocab)).double()
        run = setup_run(model, data, cfg, src_vocab=corpus.src_vocab, tgt_vocab=corpus.tgt_vocab)
        losses.append([run_step(run).loss_sum for _ in range(4)])
    assert losses[0] == losses[1]


def test_loader_workers_give_the_inline_batches_and_resume_exactly(sample, tmp_path) -> None:
    corpus = prepare_corpus(*sample, tmp_path / "prep", vocab_size=60, workers=1)
    runs = {}
    for workers in (0, 2):
        cfg = TrainConfig(optimizer="adam", batch_size=32, max_steps=200, seed=5,
                          loader_workers=workers)
        model = tiny_model(src_vocab_size=len(corpus.src_vocab),
                           tgt_vocab_size=len(corpus.tgt_vocab))
        runs[workers] = setup_run(model, corpus, cfg, src_vocab=corpus.src_vocab,
                                  tgt_vocab=corpus.tgt_vocab)
    inline, ahead = runs[0], runs[2]
    per_epoch = len(inline.plan.sampler.epoch_batches(0))
    # across an epoch's end, then a jump back (as a resumed run asks for its saved place)
    places = [(0, p) for p in range(per_epoch - 3, per_epoch)] + [(1, 0), (1, 1), (0, 7), (0, 8)]
    for epoch, position in places:
        for run in (inline, ahead):
            run.state.epoch, run.state.position = epoch, position
        [a], [b] = next_batches(inline), next_batches(ahead)
        for name in ("src", "src_lengths", "tgt_in", "tgt_out", "indices"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (epoch, position, name)


def test_a_pickled_corpus_maps_its_folder_again(sample, tmp_path) -> None:
    prepare_corpus(*sample, tmp_path / "prep", workers=1)
    corpus = PreparedCorpus(tmp_path / "prep", max_len=8)
    data = pickle.dumps(corpus)
    assert len(data) < 1000                    # the folder, not the arrays
    again = pickle.loads(data)
    assert len(again) == len(corpus) < 3000 and again[10] == corpus[10]


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_signal_during_the_swap_waits_until_out_is_whole(sample, tmp_path, monkeypatch) -> None:
    """SIGTERM between the two renames of the swap (planted there) is held back until the new
    corpus is in place, whichever thread it reaches: then it stops the run, and neither corpus
    is lost."""
    out = tmp_path / "prep"
    prepare_corpus(*sample, out, workers=1)

    aside = files_module.partial_folder

    def old_folder(folder, kind="partial", pid=None):   # "old": within the swap's renames
        if kind == "old":
            os.kill(os.getpid(), signal.SIGTERM)
        return aside(folder, kind, pid)

    monkeypatch.setattr(files_module, "partial_folder", old_folder)
    done = threading.Event()              # another thread the signal may reach (a bar's, a pool's)
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        with pytest.raises(Stopped):
            prepare_corpus(*sample, out, max_len=10, workers=1, overwrite=True)
    finally:
        done.set()
        other.join()
    assert PreparedCorpus(out).manifest["options"]["max_len"] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prep"]


def test_an_old_corpus_left_aside_by_a_dead_run_is_put_back(sample, tmp_path) -> None:
    """A run that died between the renames left `out` missing and the old corpus aside: the
    next run puts it back (and so reuses it) instead of removing it as a leftover."""
    out = tmp_path / "prep"
    before = [ex.src for ex in prepare_corpus(*sample, out, workers=1)]
    os.replace(out, tmp_path / f".prep.old-{_dead_pid()}")
    lines: list[str] = []
    again = prepare_corpus(*sample, out, workers=1, log=lines.append)
    assert lines == [f"{out} is up to date (same inputs and options, digest checked): reusing it"]
    assert [ex.src for ex in again] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prep"]


def test_an_old_corpus_left_aside_by_a_dead_run_is_read(sample, tmp_path) -> None:
    """A reader (train --data: `PreparedCorpus`) of a corpus that a run killed between the
    renames left aside puts it back and reads it, instead of "no such folder"."""
    out = tmp_path / "prep"
    before = [ex.src for ex in prepare_corpus(*sample, out, workers=1)]
    os.replace(out, tmp_path / f".prep.old-{_dead_pid()}")
    assert [ex.src for ex in PreparedCorpus(out)] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prep"]


def test_a_prepared_corpus_given_for_a_checkpoint_says_what_it_is(sample, tmp_path,
                                                                  capsys) -> None:
    """A prepared corpus given to --checkpoint (or bahdanau.load) was "not a bahdanau model
    folder's manifest": it is named, with what reads it."""
    out = tmp_path / "prep"
    prepare_corpus(*sample, out, workers=1)
    assert main(["translate", "--checkpoint", str(out), "--input", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{out}: this is a prepared corpus (bahdanau prepare), not a model" in err, err
    assert "bahdanau train --data reads it" in err
