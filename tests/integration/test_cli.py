"""The command line on a tiny model: train, translate, evaluate, plot (bad inputs: in
test_bad_inputs.py; run folders, resumes and signals: in test_runs.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import struct
import subprocess
import sys
import threading

import pytest
from training_fixtures import logged, write_multi30k_slice

import bahdanau
from bahdanau.checkpoint import find_checkpoint, load_checkpoint
from bahdanau.cli import main
from bahdanau.data import DefaultTokenizer


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    write_multi30k_slice(root, 100, 20)
    return root


@pytest.fixture(scope="module")
def trained(files):
    out = files / "run"
    argv = ["train", "--train-src", str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"),
            "--dev-src", str(files / "te.en"), "--dev-tgt", str(files / "te.fr"),
            "--test-src", str(files / "te.en"), "--test-tgt", str(files / "te.fr"),
            "--preset", "tiny", "--max-steps", "6", "--time-budget", "0", "--out", str(out),
            "--eval-every", "3", "--save-every", "3", "--beam-size", "2", "--max-len", "8",
            "--threads", "1"]
    assert main(argv) == 0
    return out


def test_train_writes_outputs(trained) -> None:
    metrics = json.loads((trained / "metrics.json").read_text())
    assert metrics["sentences"] == 20 and metrics["updates"] == 6
    assert "tok:13a" in metrics["bleu_signature"]
    assert len((trained / "test.hyp.txt").read_text().splitlines()) == 20
    if importlib.util.find_spec("matplotlib") is None:    # no plot extra: no plot, and why
        assert not (trained / "alignment.png").exists()
        assert "no alignment plot: plots need matplotlib" in (trained / "train.log").read_text()
    else:
        assert (trained / "alignment.png").read_bytes()[:4] == b"\x89PNG"
    assert (trained / "checkpoints" / "best.pt").is_file()
    for step in (3, 6):             # the dev translations of each evaluation, one per line
        hyps = (trained / "dev" / f"step_{step:08d}.hyp").read_text(encoding="utf-8")
        assert len(hyps.splitlines()) == 20


def test_resume_continues_from_checkpoint(trained, files, capsys) -> None:
    argv = ["train", "--train-src", str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"),
            "--test-src", str(files / "te.en"), "--test-tgt", str(files / "te.fr"),
            "--dev-src", str(files / "te.en"), "--dev-tgt", str(files / "te.fr"),
            "--eval-every", "3",
            "--preset", "tiny", "--max-steps", "8", "--time-budget", "0", "--out", str(trained),
            "--beam-size", "1", "--max-len", "5", "--threads", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "resumed from" in err and "trained 8 updates" in err


def test_train_with_luong_attention_and_translate_with_it(files, tmp_path, capsys) -> None:
    """--attention chooses the model's attention: the run trains it, its checkpoint records it,
    and `bahdanau.load` and `translate` rebuild the same model (the same translations)."""
    out = tmp_path / "luong"
    assert main(["train", "--train-src", str(files / "tr.en"), "--train-tgt",
                 str(files / "tr.fr"), "--preset", "tiny", "--attention", "luong_general",
                 "--attention-impl", "reference", "--max-steps", "3", "--time-budget", "0",
                 "--out", str(out), "--beam-size", "2", "--max-len", "6",
                 "--threads", "1"]) == 0
    assert "model rnnsearch (tiny, attention=luong_general)" in capsys.readouterr().err
    translator = bahdanau.load(out)
    attention = translator.model.decoder.attention
    assert type(attention) is bahdanau.LuongAttention and attention.form == "general"
    assert translator.model.config.attention == "luong_general"
    sentences = (files / "te.en").read_text(encoding="utf-8").splitlines()
    expected = translator.translate(sentences, search=bahdanau.BeamSearch(beam_size=2,
                                                                          max_len=6))
    assert main(["translate", "--checkpoint", str(out), "--input", str(files / "te.en"),
                 "--beam-size", "2", "--max-len", "6", "--threads", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == expected


def test_translate_evaluate(trained, files, capsys, tmp_path) -> None:
    align = tmp_path / "al.jsonl"
    assert main(["translate", "--checkpoint", str(trained), "--input", str(files / "te.en"),
                 "--beam-size", "2", "--max-len", "6", "--alignments", str(align)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 20
    record = json.loads(align.read_text().splitlines()[0])
    assert len(record["weights"]) == len(record["target"])
    assert len(record["weights"][0]) == len(record["source"])
    assert main(["translate", "--checkpoint", str(trained), "--input", str(files / "te.en"),
                 "--beam-size", "3", "--n-best", "2", "--max-len", "4"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 40
    scores = tmp_path / "s.json"
    assert main(["evaluate", "--checkpoint", str(trained), "--src", str(files / "te.en"),
                 "--ref", str(files / "te.fr"), "--beam-size", "1", "--max-len", "6",
                 "--json", str(scores)]) == 0
    assert json.loads(scores.read_text())["sentences"] == 20


@pytest.mark.parametrize("penalty, said, written", [
    ([], "beam 2,", {"length_penalty": "none"}),
    (["--length-penalty", "average"], "beam 2, average length penalty,",
     {"length_penalty": "average"}),
    (["--length-penalty", "gnmt", "--alpha", "1.0"], "beam 2, gnmt length penalty (alpha 1.0),",
     {"length_penalty": "gnmt", "alpha": 1.0})])
def test_evaluate_says_how_it_searched(trained, files, capsys, tmp_path, penalty, said,
                                       written) -> None:
    """A score is read with the search that made it: the first line and the JSON name the
    length penalty (and gnmt's alpha) beside the beam."""
    scores = tmp_path / "s.json"
    assert main(["evaluate", "--checkpoint", str(trained), "--src", str(files / "te.en"),
                 "--ref", str(files / "te.fr"), "--beam-size", "2", "--max-len", "6",
                 "--threads", "1", "--json", str(scores), *penalty]) == 0
    assert f"(20 sentences, {said}" in capsys.readouterr().out
    report = json.loads(scores.read_text())
    assert {k: report[k] for k in written} == written and report["beam_size"] == 2
    assert ("alpha" in report) == ("alpha" in written)


def test_evaluate_without_threads_follows_the_machine_and_translates_as_one_thread(
        trained, files, capsys, tmp_path, monkeypatch) -> None:
    """Without --threads a decoding command times its search steps at neighbouring thread
    counts and keeps the faster (`AdaptiveThreads.for_decoding`), and --verbose says so first;
    the thread count changes no translation."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(2)), raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    outputs = []
    for threads in (["--threads", "1"], [], ["--threads", "2"]):
        out = tmp_path / f"out{len(outputs)}.txt"
        assert main(["evaluate", "--checkpoint", str(trained), "--src", str(files / "te.en"),
                     "--ref", str(files / "te.fr"), "--beam-size", "3", "--max-len", "8",
                     "--output", str(out), "--verbose", *threads]) == 0
        outputs.append(out.read_text(encoding="utf-8"))
        lines = [line.removeprefix("DEBUG: ") for line in logged(capsys.readouterr().err)
                 if line.startswith("DEBUG: machine: ")]
        assert lines == [{0: "machine: cpu, 1 thread; float32 (--amp none)",
                          1: "machine: cpu, 1 thread at first, then as many as measure fastest "
                             "(up to 2) beside the machine's other work (--threads N fixes the "
                             "count); float32 (--amp none)",
                          2: "machine: cpu, 2 threads; float32 (--amp none)"}[len(outputs) - 1]]
    assert len(outputs[0].splitlines()) == 20 and outputs[1] == outputs[0] == outputs[2]


def test_evaluate_metric_groups_the_references_of_a_source(trained, files, capsys,
                                                           tmp_path) -> None:
    """--metric wer per accuracy: the lines of one source are one item, right when its
    translation equals any of its references; worked out here from the translations."""
    sources = (files / "te.en").read_text(encoding="utf-8").splitlines()
    decode = ["--beam-size", "1", "--max-len", "6"]
    assert main(["translate", "--checkpoint", str(trained), "--input", str(files / "te.en"),
                 *decode]) == 0
    hyps = capsys.readouterr().out.splitlines()
    a = next(i for i, h in enumerate(hyps) if h.split())
    b = next(i for i, h in enumerate(hyps) if i != a and hyps[i] != hyps[a])
    # items: a (references "nope" and its own translation: right), b (reference "zzz": wrong)
    (tmp_path / "src").write_text(f"{sources[a]}\n{sources[b]}\n{sources[a]}\n")
    (tmp_path / "ref").write_text(f"nope\nzzz\n{hyps[a]}\n")
    scores = tmp_path / "s.json"
    assert main(["evaluate", "--checkpoint", str(trained), "--src", str(tmp_path / "src"),
                 "--ref", str(tmp_path / "ref"), *decode, "--metric", "wer", "per",
                 "accuracy", "--json", str(scores)]) == 0
    report = json.loads(scores.read_text())
    tokens = DefaultTokenizer().tokenize          # the model's target tokens
    b_tokens = tokens(hyps[b])
    # PER: 0 edits against a's own translation (of its length), and b against "zzz": each of
    # its tokens but one substituted or deleted (all of them if none is "zzz"), of 1 token
    b_edits = max(len(b_tokens), 1) - ("zzz" in b_tokens)
    expected_per = round(100 * b_edits / (len(tokens(hyps[a])) + 1), 2)
    assert report["items"] == 2 and report["sentences"] == 3
    assert (report["wer"], report["accuracy"], report["per"]) == (50.0, 50.0, expected_per)
    assert "WER 50.00  PER" in capsys.readouterr().out


def test_decoding_commands_take_amp(trained, files, capsys, tmp_path) -> None:
    """--amp bf16 or fp16: translate, evaluate and score run the model under autocast on the
    CPU, and give their outputs; translate's alignment weights and score's log-probabilities
    then differ from float32's (the model ran in half precision), and stay finite."""
    weights = {}
    for amp in ("none", "bf16", "fp16"):
        align = tmp_path / f"{amp}.jsonl"
        assert len(_translate(trained, files / "te.en", capsys, "--amp", amp,
                              "--alignments", str(align))) == 20
        weights[amp] = [json.loads(row)["weights"] for row in align.read_text().splitlines()]
    assert weights["bf16"] != weights["none"] and weights["fp16"] != weights["none"]
    scores = tmp_path / "s.json"
    assert main(["evaluate", "--checkpoint", str(trained), "--src", str(files / "te.en"),
                 "--ref", str(files / "te.fr"), "--beam-size", "1", "--max-len", "6",
                 "--json", str(scores), "--amp", "bf16"]) == 0
    assert json.loads(scores.read_text())["sentences"] == 20
    capsys.readouterr()

    def score(*flags: str) -> list[float]:
        assert main(["score", "--checkpoint", str(trained), "--src", str(files / "te.en"),
                     "--tgt", str(files / "te.fr"), *flags]) == 0
        return [float(line.split("\t")[0]) for line in capsys.readouterr().out.splitlines()]

    full, half = score(), score("--amp", "bf16")
    assert len(half) == len(full) == 20 and all(math.isfinite(x) for x in half)
    assert half != full


def test_plot_writes_a_png(trained, files, tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="plots need the plot extra (matplotlib)")
    image = tmp_path / "p.png"
    assert main(["plot", "--checkpoint", str(trained), "--input", str(files / "te.en"),
                 "--line", "3", "--output", str(image), "--max-len", "6"]) == 0
    assert image.read_bytes()[:4] == b"\x89PNG"


def test_plot_title_names_the_checkpoint_its_step_and_the_sentence(trained, tmp_path,
                                                                  monkeypatch) -> None:
    """A hypothesis forced to 80 tokens: the title says which checkpoint (its step as
    `load_checkpoint` reads it), the sentence, and that 60 of the 81 rows are drawn; the image
    is within the cap."""
    plots = pytest.importorskip("bahdanau.plot")
    pytest.importorskip("matplotlib")
    figures = []
    draw = plots.plot_alignment
    monkeypatch.setattr(plots, "plot_alignment",
                        lambda *args, **kwargs: figures.append(draw(*args, **kwargs)))
    image, sentence = tmp_path / "p.png", "Two dogs  play in the snow."
    assert main(["plot", "--checkpoint", str(trained), "--sentence", sentence, "--output",
                 str(image), "--beam-size", "1", "--min-len", "80", "--max-len", "80"]) == 0
    path = find_checkpoint(trained)
    step = load_checkpoint(path)["train_state"]["step"]
    [figure] = figures
    model, source, note = figure.get_suptitle().splitlines()
    # a long path loses its middle, never its start, file name or step
    assert model.startswith(str(path)[:20]) and model.endswith(f"{path.name} (step {step})")
    assert source == "\u201cTwo dogs play in the snow.\u201d"
    assert note == f"showing the first {plots.MAX_CELLS} of 81 target words"
    width, height = struct.unpack(">II", image.read_bytes()[16:24])
    assert max(width, height) <= plots.MAX_IMAGE_PIXELS


@pytest.mark.skipif(sys.platform != "linux", reason="peak RSS from os.wait4 in KiB: Linux")
def test_plot_of_a_1000_word_sentence_is_refused_in_bounded_memory(trained, tmp_path) -> None:
    """Such a plot once took 21.5 GB for a 67,725 x 6,997 pixel image. Now it is one line
    before the model loads, in the memory of starting the package (the child's peak RSS)."""
    pytest.importorskip("matplotlib", reason="plots need the plot extra (matplotlib); without "
                        "it, that is the line")
    image, log = tmp_path / "p.png", tmp_path / "log"
    with log.open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "bahdanau", "plot", "--checkpoint", str(trained),
             "--sentence", " ".join(["dog"] * 1000), "--output", str(image)],
            stdout=out, stderr=out)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)           # reaped by wait4
    assert child.returncode == 2
    text = log.read_text()
    assert text.count("\n") == 1 and "the sentence has 1000 words" in text
    assert usage.ru_maxrss < 1024 * 1024                            # KiB: under 1 GiB
    assert not image.exists()


def _translate(trained, path, capsys, *flags: str) -> list[str]:
    assert main(["translate", "--checkpoint", str(trained), "--input", str(path),
                 "--beam-size", "2", "--max-len", "6", *flags]) == 0
    return capsys.readouterr().out.splitlines()


def test_translate_windows_and_empty_lines_keep_the_line_alignment(trained, files, capsys,
                                                                   tmp_path) -> None:
    """Windows of 20 x --batch-size lines give what one window gives; an empty (or blank) input
    line gives an empty output line, and the other lines are translated as without it."""
    whole = _translate(trained, files / "te.en", capsys, "--batch-size", "64")
    assert len(whole) == 20
    assert _translate(trained, files / "te.en", capsys, "--batch-size", "1") == whole
    sources = (files / "te.en").read_text(encoding="utf-8").splitlines()
    gappy = tmp_path / "gappy.en"
    gappy.write_text("\n".join(["", *sources[:7], "   ", *sources[7:]]) + "\n", encoding="utf-8")
    align = tmp_path / "al.jsonl"
    out = _translate(trained, gappy, capsys, "--batch-size", "1", "--alignments", str(align))
    assert out == ["", *whole[:7], "", *whole[7:]]
    rows = [json.loads(row) for row in align.read_text().splitlines()]
    assert len(rows) == 22 and rows[0]["target"] == rows[8]["target"] == []


def holds(words: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(words[i:i + n] == phrase for i in range(len(words) - n + 1))


def test_translate_and_evaluate_hold_the_phrases_of_each_line(trained, files, capsys,
                                                              tmp_path, monkeypatch) -> None:
    """--constraints/--avoid (JSON Lines, one list per input line): every output line holds its
    line's phrases and none of its avoided ones, across windows and empty lines; evaluate's
    translations too."""
    from bahdanau import load

    t = load(trained)
    sources = (files / "te.en").read_text(encoding="utf-8").splitlines()
    refs = (files / "te.fr").read_text(encoding="utf-8").splitlines()
    known = [[w for w in t.tokenizer.tokenize(r) if w in t.tgt_vocab and w.isalpha()]
             for r in refs]
    need = [[] if not ws else [ws[0]] if i % 3 else [" ".join(ws[:2]), ws[-1]]
            for i, ws in enumerate(known)]
    shun = [[w] if i % 2 and w not in ws else [] for i, (ws, w) in enumerate(
        zip(known, ["un", "une", "le", "la"] * 5, strict=True))]
    gappy = tmp_path / "gappy.en"
    gappy.write_text("\n".join(["", *sources[:7], "   ", *sources[7:]]) + "\n", encoding="utf-8")
    cons, avoid = tmp_path / "c.jsonl", tmp_path / "a.jsonl"
    for path, lists in ((cons, need), (avoid, shun)):
        path.write_text("".join(json.dumps(p) + "\n" for p in [[], *lists[:7], [], *lists[7:]]),
                        encoding="utf-8")
    out = _translate(trained, gappy, capsys, "--batch-size", "1", "--constraints", str(cons),
                     "--avoid", str(avoid))
    assert len(out) == 22 and out[0] == out[8] == ""
    out = out[1:8] + out[9:]
    for line, phrases, avoided in zip(out, need, shun, strict=True):
        words = t.tokenizer.tokenize(line)
        assert all(holds(words, t.tokenizer.tokenize(p)) for p in phrases), (line, phrases)
        assert not any(holds(words, [a]) for a in avoided), (line, avoided)
    assert any(phrases for phrases in need) and any(shun)
    for path, lists in ((cons, need), (avoid, shun)):
        path.write_text("".join(json.dumps(p) + "\n" for p in lists), encoding="utf-8")
    # from stdin (read whole before the first line is translated): the same lines
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        "\n".join(sources).encode() + b"\n")))
    assert main(["translate", "--checkpoint", str(trained), "--beam-size", "2", "--max-len", "6",
                 "--batch-size", "1", "--constraints", str(cons), "--avoid", str(avoid)]) == 0
    assert capsys.readouterr().out.splitlines() == out
    hyps = tmp_path / "hyps.txt"
    assert main(["evaluate", "--checkpoint", str(trained), "--src", str(files / "te.en"),
                 "--ref", str(files / "te.fr"), "--beam-size", "2", "--max-len", "8",
                 "--constraints", str(cons), "--avoid", str(avoid), "--output", str(hyps)]) == 0
    for line, phrases in zip(hyps.read_text(encoding="utf-8").splitlines(), need, strict=True):
        assert all(holds(t.tokenizer.tokenize(line), t.tokenizer.tokenize(p)) for p in phrases)


def test_translate_streams(trained, files) -> None:
    """From a pipe, each window's translations come out before the input ends."""
    sources = (files / "te.en").read_text(encoding="utf-8").splitlines()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bahdanau", "translate", "--checkpoint", str(trained),
         "--beam-size", "1", "--max-len", "4", "--batch-size", "1", "--threads", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, proc.kill)   # a translate that waits for the end hangs
    watchdog.start()
    try:
        proc.stdin.write("\n".join(sources[:20]) + "\n")     # one window: 20 x batch size 1
        proc.stdin.flush()
        first = [proc.stdout.readline() for _ in range(20)]   # while stdin is still open
        assert all(line.endswith("\n") for line in first)
        proc.stdin.write(sources[0] + "\n")
        proc.stdin.close()
        assert proc.stdout.read().splitlines() == [first[0].rstrip("\n")]
        assert proc.wait(timeout=60) == 0
    finally:
        watchdog.cancel()
        proc.kill()


def test_translate_answers_a_pipe_before_its_input_ends(trained, files, tmp_path,
                                                        capsys) -> None:
    """With the default --batch-size (windows of 1,280 lines), three lines sent down a pipe
    are translated, in order, while it is still open (the command waited for 1,280 lines or
    the end of the input), as from a file."""
    sources = (files / "te.en").read_text(encoding="utf-8").splitlines()[:3]
    (tmp_path / "three.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    flags = ["--beam-size", "1", "--max-len", "4", "--threads", "1"]
    expected = _translate(trained, tmp_path / "three.en", capsys, *flags)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bahdanau", "translate", "--checkpoint", str(trained), *flags],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, proc.kill)   # a translate that waits for the end hangs
    watchdog.start()
    try:
        proc.stdin.write("\n".join(sources) + "\n")
        proc.stdin.flush()
        first = proc.stdout.readline()                  # while stdin is still open
        assert first == expected[0] + "\n"
        proc.stdin.close()
        assert proc.stdout.read().splitlines() == expected[1:]
        assert proc.wait(timeout=60) == 0
    finally:
        watchdog.cancel()
        proc.kill()


def test_translate_ends_quietly_when_stdout_is_closed(trained, files, tmp_path) -> None:
    """`translate ... | head -1`: the reader of stdout leaves after one line; the next write
    ends the command quietly with status 141 (128 + SIGPIPE), as a Unix tool's; the
    --alignments file, whose write did not fail, is not blamed (the error line named it) and
    is left as it was (here: not written)."""
    sources = (files / "te.en").read_text(encoding="utf-8").splitlines()
    align = tmp_path / "al.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bahdanau", "translate", "--checkpoint", str(trained),
         "--beam-size", "1", "--max-len", "4", "--threads", "1", "--alignments", str(align)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        proc.stdin.write(sources[0] + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().endswith("\n")
        proc.stdout.close()                              # head -1 has what it wanted
        proc.stdin.write("\n".join(sources[1:]) + "\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 141
        assert proc.stderr.read() == ""
    finally:
        watchdog.cancel()
        proc.kill()
    assert not align.exists()


def test_help_and_bad_option() -> None:
    for sub in ([], ["train"], ["translate"], ["evaluate"], ["plot"]):
        out = subprocess.run([sys.executable, "-m", "bahdanau", *sub, "--help"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "usage: bahdanau" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "bahdanau", "train", "--bogus"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "unrecognized arguments: --bogus" in bad.stderr and "Traceback" not in bad.stderr
