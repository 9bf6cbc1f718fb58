"""Bad inputs, table-driven: every one is refused before any work with one error line.

Each command-line case runs `bahdanau.cli.main` in-process and asserts exit status 2, exactly one
``bahdanau: error:`` line on stderr naming the problem, no traceback (an exception other than the
user errors would escape `main` and fail the test), and that no file of the trained run, of the
input files or of a new output folder was created or changed. The numeric cases come from every
numeric option of every command with values outside its range or of the wrong kind; the others
are listed by hand, by class: files, devices, checkpoints, run folders, resumes and options that
contradict each other. The API cases assert an `InputError` naming the argument.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bahdanau._checks as checks
from bahdanau._checks import usable_cores
from bahdanau.cli import main
from bahdanau.data import multi30k_files, read_lines
from bahdanau.jobs import EvaluateOptions, PlotOptions, TrainOptions, TranslateOptions
from bahdanau.jobs.options import ScoreOptions, flag, flat_settings
from bahdanau.settings import base_type

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Small parallel files, and bad ones of every kind."""
    root = tmp_path_factory.mktemp("bad-inputs")
    en = read_lines(multi30k_files("train", "en"))[:60]
    fr = read_lines(multi30k_files("train", "fr"))[:60]
    text = {"tr.en": en[:50], "tr.fr": fr[:50], "te.en": en[50:], "te.fr": fr[50:]}
    for name, lines in text.items():
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "empty.txt").write_bytes(b"")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (root / "short.fr").write_text("\n".join(fr[50:55]) + "\n", encoding="utf-8")
    (root / "blank-line.en").write_text("\n".join(en[50:55] + ["  "] + en[56:60]) + "\n",
                                        encoding="utf-8")
    whole = gzip.compress(("\n".join(en[50:]) + "\n").encode())
    (root / "truncated.gz").write_bytes(whole[: len(whole) // 2])
    (root / "bad-crc.gz").write_bytes(whole[:-8] + bytes(8))
    (root / "bad-header.gz").write_bytes(whole[:2] + b"\x99" + whole[3:])
    (root / "a-folder").mkdir()
    (root / "notes.txt").write_text("not a checkpoint\n")
    (root / "unknown-key.yaml").write_text("max_steps: 1\nlearning_rate: 0.1\n")
    (root / "wrong-type.json").write_text('{"max_steps": 1, "threads": "two"}')
    (root / "not-a-mapping.yaml").write_text("- max_steps\n- 1\n")
    (root / "broken.yaml").write_text("max_steps: [1\n")
    # a model folder whose manifest is a JSON bomb (nested too deeply to parse: RecursionError)
    (root / "bomb").mkdir()
    (root / "bomb" / "manifest.json").write_text("[" * 200000 + "]" * 200000)
    for name in ("model.safetensors", "config.json"):
        (root / "bomb" / name).write_bytes(b"")
    (root / "bomb.json").write_text("[" * 200000 + "]" * 200000)
    (root / "nan.yaml").write_text("max_steps: 1\nlr: .nan\n")
    phrases = {                      # JSON Lines of phrases for te.en's 10 lines (--constraints)
        "c-ok.jsonl": ['["un"]'] * 10,
        "c-short.jsonl": ["[]"] * 3,
        "c-bad-json.jsonl": ["[]", '["un"'] + ["[]"] * 8,
        "c-not-list.jsonl": ['{"un": 1}'] + ["[]"] * 9,
        "c-number.jsonl": ["[]", "[1]"] + ["[]"] * 8,
        "c-blank.jsonl": ["[]", "[]", ""] + ["[]"] * 7,
        "c-empty-phrase.jsonl": ["[]"] * 3 + ['["un", " "]'] + ["[]"] * 6,
        "c-unknown.jsonl": ["[]"] * 4 + ['["xyzzyq"]'] + ["[]"] * 5,
        "c-long.jsonl": ['["un homme un homme un"]'] + ["[]"] * 9,
    }
    for name, lines in phrases.items():
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


TRAIN = ["--preset", "tiny", "--max-steps", "4", "--time-budget", "0", "--eval-every", "2",
         "--save-every", "2", "--beam-size", "2", "--max-len", "6", "--threads", "1",
         "--log-every", "2"]


def _train_argv(files: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-src", str(files / "tr.en"), "--train-tgt", str(files / "tr.fr"),
            "--dev-src", str(files / "te.en"), "--dev-tgt", str(files / "te.fr"),
            "--test-src", str(files / "te.en"), "--test-tgt", str(files / "te.fr"),
            *TRAIN, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def run(files) -> Path:
    """A finished tiny run (its checkpoints, config.yaml and results)."""
    out = files / "run"
    assert main(_train_argv(files, out)) == 0
    return out


@pytest.fixture(scope="module")
def bad_checkpoints(run, files) -> Path:
    """Checkpoint files damaged in every way a user can meet."""
    root = files / "checkpoints"
    root.mkdir()
    good = run / "checkpoints" / "best.pt"
    payload = torch.load(good, weights_only=True)
    torch.save(payload["model"], root / "state_dict.pt")
    torch.save({"weights": payload["model"]}, root / "foreign.pt")
    torch.save([1, 2, 3], root / "list.pt")
    data = good.read_bytes()
    (root / "truncated.pt").write_bytes(data[: len(data) // 2])
    largest = max(payload["model"].values(), key=lambda t: t.numel())
    inside = data.index(largest.numpy().tobytes()) + largest.numel() * 2  # within its bytes
    flipped = bytearray(data)
    flipped[inside] ^= 0x10
    (root / "flipped.pt").write_bytes(bytes(flipped))
    (root / "empty.pt").write_bytes(b"")

    def variant(name: str, change) -> None:
        copy = {k: v for k, v in payload.items() if k != "digest"}
        change(copy)
        torch.save(copy, root / name)

    weights = [name for name in ("model", "ema") if payload.get(name) is not None]
    assert "ema" in weights                      # the default job's average translates

    def nan_weight(p):
        for name in weights:
            p[name] = {k: v.clone() for k, v in p[name].items()}
            next(v for v in p[name].values() if v.is_floating_point()).view(-1)[0] = float("nan")

    def missing_weight(p):
        for name in weights:
            p[name] = {k: v for i, (k, v) in enumerate(p[name].items()) if i > 0}

    variant("nan.pt", nan_weight)
    variant("config-mismatch.pt",
            lambda p: p.update(model_config={**p["model_config"], "hidden_size": 9}))
    variant("missing-weights.pt", missing_weight)
    variant("no-vocab.pt", lambda p: p.pop("src_vocab"))
    variant("future.pt", lambda p: p.update(format=99))
    variant("bad-config.pt", lambda p: p.update(model_config={**p["model_config"],
                                                              "embed_size": -3}))
    damaged = files / "damaged-best-json"
    damaged.mkdir()
    (damaged / "checkpoints").mkdir()
    for f in (run / "checkpoints").iterdir():
        (damaged / "checkpoints" / f.name).write_bytes(f.read_bytes())
    (damaged / "checkpoints" / "best.json").write_text("{not json")
    return root


def _snapshot(*roots: Path) -> dict[str, str]:
    found = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            found[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return found


def _main(argv: list[str]) -> int:
    """`main`'s exit status; argparse's usage errors exit through SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code)


def _assert_one_error(capsys, code: int, match: str) -> str:
    captured = capsys.readouterr()
    assert code == 2, f"exit {code}, expected 2 (stdout: {captured.out[-300:]!r})"
    err = captured.err
    assert err.startswith("bahdanau: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert match.lower() in err.lower(), f"{match!r} not in {err!r}"
    return err


# ----------------------------------------------------------------------------- numeric options

_COMMAND_OPTIONS = {"train": TrainOptions, "translate": TranslateOptions,
                    "evaluate": EvaluateOptions, "plot": PlotOptions, "score": ScoreOptions}


def _numeric_cases() -> list:
    """(command, flag, bad value) for every numeric option: below its range, not finite, not a
    number, and a fraction for integers."""
    cases = []
    for command, cls in _COMMAND_OPTIONS.items():
        for setting in flat_settings(cls):
            base, _ = base_type(setting.annotation)
            if base not in (int, float):
                continue
            spec = setting.spec
            bad = ["x", "nan"]
            bad += ["1.5"] if base is int else ["inf", "-inf"]
            if spec.low is not None:
                below = spec.low if spec.above else spec.low - 1
                bad.append(str(int(below)) if base is int else str(float(below)))
            if spec.high is not None:
                bad.append(str(int(spec.high) + 1))
            for value in bad:
                cases.append(pytest.param(command, flag(setting.key), value,
                                          id=f"{command}{flag(setting.key)}={value}"))
    return cases


_BASE = {
    "train": ["--out", "{new}", "--max-steps", "1"],
    "translate": ["--checkpoint", "{run}", "--input", "{files}/te.en"],
    "evaluate": ["--checkpoint", "{run}", "--src", "{files}/te.en", "--ref", "{files}/te.fr"],
    "plot": ["--checkpoint", "{run}", "--sentence", "a dog", "--output", "{new}.png"],
    "score": ["--checkpoint", "{run}", "--src", "{files}/te.en", "--tgt", "{files}/te.fr"],
}


def _fill(argv: list[str], run: Path, files: Path, new: Path) -> list[str]:
    return [a.replace("{run}", str(run)).replace("{files}", str(files))
            .replace("{new}", str(new)) for a in argv]


@pytest.mark.parametrize(("command", "option", "value"), _numeric_cases())
def test_numeric_option_refused(command, option, value, run, files, tmp_path, capsys) -> None:
    new = tmp_path / "new"
    before = _snapshot(run, files)
    argv = _fill([command, *_BASE[command], f"{option}={value}"], run, files, new)
    code = _main(argv)
    _assert_one_error(capsys, code, option)
    assert _snapshot(run, files) == before
    assert not new.exists() and not Path(f"{new}.png").exists()


def test_numeric_cases_cover_every_numeric_option() -> None:
    """The generated table has at least three bad values for each numeric option."""
    per_option: dict[tuple[str, str], int] = {}
    for case in _numeric_cases():
        command, option, _ = case.values
        per_option[command, option] = per_option.get((command, option), 0) + 1
    assert ("train", "--threads") in per_option and ("translate", "--n-best") in per_option
    assert min(per_option.values()) >= 3 and len(per_option) >= 40


# ----------------------------------------------------------------------------- listed cases

CASES = [
    # choices and flags (argparse usage errors)
    ("train --arch transformer", "invalid choice"),
    ("train --optimizer sgd", "invalid choice"),
    ("train --preset huge", "invalid choice"),
    ("train --amp fp8", "invalid choice"),
    ("translate --checkpoint {run} --amp fp8", "invalid choice"),
    ("score --checkpoint {run} --src {files}/te.en --tgt {files}/te.fr --amp fp32",
     "invalid choice"),
    ("train --length-penalty wu", "invalid choice"),
    ("translate --checkpoint {run} --length-penalty x", "invalid choice"),
    ("train --bogus", "unrecognized arguments"),
    ("train --out {new} --max-steps 1 --overw", "unrecognized arguments: --overw"),
    ("translate", "--checkpoint is required"),
    ("evaluate --checkpoint {run}", "--src is required"),
    ("evaluate --checkpoint {run} --src {files}/te.en", "--ref is required"),
    ("train --max-steps", "expected one argument"),
    # values that contradict each other
    ("train --out {new} --max-steps 1 --min-len 9 --max-len 5", "--min-len"),
    ("translate --checkpoint {run} --n-best 3 --beam-size 2", "--n-best"),
    ("train --out {new} --time-budget 0 --train-src {files}/tr.en --train-tgt {files}/tr.fr",
     "--max-steps"),                       # the user's own corpus has no default length
    ("train --out {new} --data {files}/a-folder", "--max-steps"),
    ("train --out {new} --max-steps 1 --dropout 1", "--dropout"),
    ("train --out {new} --max-steps 1 --dropout 1.5", "--dropout"),
    ("train --out {new} --max-steps 1 --patience 2", "--patience"),
    ("train --out {new} --max-steps 1 --schedule plateau", "--eval-every"),
    ("train --out {new} --max-steps 1 --schedule plateau --eval-every 5 --patience 2",
     "--patience 2 stops the run at or before the evaluation that first decays the rate "
     "(--decay-patience 2), so --schedule plateau would never act"),
    ("train --out {new} --max-steps 1 --min-lr 0.001", "--min-lr"),
    # options that act only together with another, given alone (silently ignored)
    ("translate --checkpoint {run} --input {files}/te.en --alignments-format json",
     "--alignments-format json sets what --alignments FILE holds: it needs --alignments FILE"),
    ("translate --checkpoint {run} --input {files}/te.en --alignments-format pharaoh",
     "--alignments-format pharaoh sets what --alignments FILE holds"),
    ("train --out {new} --max-steps 1 --optimizer adam --min-lr 0.0001",
     "--min-lr 0.0001 floors a decaying learning rate: it needs --schedule inverse_sqrt, "
     "plateau or linear"),
    ("train --out {new} --max-steps 1 --optimizer adam --schedule constant --min-lr 0.0001",
     "--min-lr 0.0001 floors a decaying learning rate"),
    # a manifest or --config nested too deeply to parse (RecursionError tracebacks)
    ("release --checkpoint {run} --out {files}/bomb", "is a model folder already"),
    ("translate --checkpoint {run} --input {files}/te.en --alignments {files}/bomb/al.txt",
     "is a file of the model folder"),
    ("translate --checkpoint {files}/bomb --input {files}/te.en", "not a readable manifest"),
    ("train --data {files}/bomb --out {new} --max-steps 1", "manifest.json is damaged"),
    ("train --config {files}/bomb.json --out {new}", "nested too deeply"),
    ("train --out {new} --max-steps 1 --optimizer adadelta --min-lr 2", "--min-lr"),
    ("train --out {new} --max-steps 1 --label-smoothing 1", "--label-smoothing"),
    ("train --out {new} --max-steps 1 --decay-factor 1", "--decay-factor"),
    # an option that acts only with another one, given without it (silently ignored before)
    ("train --out {new} --max-steps 1 --early-stopping-metric ppl",
     "--early-stopping-metric ppl ranks dev evaluations"),
    ("train --out {new} --max-steps 1 --eval-every 0 --early-stopping-metric chrf",
     "it needs --eval-every"),
    ("train --out {new} --max-steps 1 --dev-size 20", "--dev-size 20"),
    ("train --out {new} --max-steps 1 --decay-patience 4", "it needs --schedule plateau"),
    ("train --out {new} --max-steps 1 --eval-every 1 --schedule inverse_sqrt --decay-factor 0.3",
     "--decay-factor 0.3"),
    ("train --out {new} --max-steps 1 --rho 0.9", "it needs --optimizer adadelta"),
    ("translate --checkpoint {run} --alpha 1.0", "it needs --length-penalty gnmt"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --length-penalty "
     "average --alpha 0.9", "--alpha 0.9"),
    ("score --checkpoint {run} --src {files}/te.en --tgt {files}/te.fr --alpha 0.9",
     "it needs --length-penalty gnmt"),
    ("prepare --out {new} --subword-vocab 500", "it needs --tokenizer bpe or unigram"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --metric bleu",
     "--metric bleu: choose from wer, per, accuracy"),
    ("train --schedule cosine", "invalid choice"),
    ("train --attention dot", "invalid choice"),
    ("train --attention-impl cuda", "invalid choice"),
    ("train --out {new} --max-steps 1 --preset tiny --attention luong_dot",
     "--attention luong_dot needs --decoder-size = 2 x --hidden-size"),
    ("train --out {new} --max-steps 1 --arch rnnencdec --unk-replace", "--unk-replace"),
    ("plot --output {new}.png --checkpoint {run}", "--sentence"),
    ("plot --output {new}.png --checkpoint {run} --sentence a --input {files}/te.en", "--sentence"),
    ("plot --output {new}.png --checkpoint {run} --input {files}/te.en --line 99", "--line 99"),
    ("plot --output {new}.png --checkpoint {run} --sentence '' ", "--sentence"),
    ("train --out {new} --max-steps 1 --src-lang de", "--src-lang"),
    ("train --out {new} --max-steps 1 --train-src {files}/tr.en --train-tgt {files}/tr.fr "
     "--src-lang en", "--src-lang"),
    ("train --out {new} --max-steps 1 --train-src {files}/tr.en", "--train-tgt"),
    ("train --out {new} --max-steps 1 --dev-tgt {files}/te.fr", "--dev-src"),
    ("train --out {new} --max-steps 1 --test-src {files}/te.en", "--test-tgt"),
    # the user's own data: dev and test sets only from their files
    ("train --out {new} --max-steps 1 --train-src {files}/tr.en --train-tgt {files}/tr.fr "
     "--eval-every 1", "needs a dev set"),
    # files
    ("train --out {new} --max-steps 1 --train-src {files}/nope.en --train-tgt {files}/tr.fr",
     "no such file"),
    ("train --out {new} --max-steps 1 --train-src {files}/a-folder --train-tgt {files}/tr.fr",
     "is a folder"),
    ("train --out {new} --max-steps 1 --train-src {files}/empty.txt --train-tgt "
     "{files}/empty.txt", "empty"),
    ("train --out {new} --max-steps 1 --test-src {files}/empty.txt --test-tgt "
     "{files}/empty.txt", "empty"),
    ("train --out {new} --max-steps 1 --eval-every 5 --dev-src {files}/empty.txt --dev-tgt "
     "{files}/empty.txt", "empty"),
    ("train --out {new} --max-steps 1 --train-src {files}/latin1.txt --train-tgt "
     "{files}/latin1.txt", "utf-8"),
    ("train --out {new} --max-steps 1 --train-src {files}/te.en --train-tgt {files}/short.fr",
     "line-aligned"),
    ("train --out {new} --max-steps 1 --train-src {files}/blank-line.en --train-tgt "
     "{files}/te.fr", "line 6 is empty"),
    ("train --out {new} --max-steps 1 --train-src {files}/truncated.gz --train-tgt "
     "{files}/te.fr", "truncated.gz"),
    ("train --out {new} --max-steps 1 --train-src {files}/bad-crc.gz --train-tgt "
     "{files}/te.fr", "bad-crc.gz"),
    ("train --out {new} --max-steps 1 --train-src {files}/bad-header.gz --train-tgt "
     "{files}/te.fr", "bad-header.gz"),
    ("train --out {new} --max-steps 1 --max-train-len 1", "--max-train-len"),
    ("train --out {files}/notes.txt --max-steps 1", "is a file"),
    ("translate --checkpoint {run} --input {files}/nope.en", "no such file"),
    ("translate --checkpoint {run} --input {files}/latin1.txt", "utf-8"),
    ("translate --checkpoint {run} --input {files}/truncated.gz", "truncated.gz"),
    ("translate --checkpoint {run} --input {files}/te.en --alignments {files}/no/dir/a.json",
     "does not exist"),
    ("translate --checkpoint {run} --input {files}/te.en --alignments {files}/a-folder",
     "is a folder"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/short.fr", "lines"),
    ("evaluate --checkpoint {run} --src {files}/empty.txt --ref {files}/empty.txt", "empty"),
    ("evaluate --checkpoint {run} --src {files}/nope --ref {files}/te.fr", "no such file"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --json "
     "{files}/no/x.json", "does not exist"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --output "
     "{files}/a-folder", "is a folder"),
    ("plot --checkpoint {run} --sentence 'a dog' --output {new}.xyz", "xyz"),
    ("plot --checkpoint {run} --sentence 'a dog' --output {files}/no/dir/a.png",
     "does not exist"),
    ("plot --output {new}.png --checkpoint {run} --input {files}/empty.txt", "--line 1"),
    # phrases each line's translation must hold (--constraints) or not (--avoid), JSON Lines
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/nope.jsonl",
     "--constraints {files}/nope.jsonl: no such file"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-short.jsonl",
     "--constraints {files}/c-short.jsonl has 3 lines but the input has 10"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --avoid "
     "{files}/c-short.jsonl", "--avoid {files}/c-short.jsonl has 3 lines but the input has 10"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-bad-json.jsonl",
     "c-bad-json.jsonl: line 2 is not JSON"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --constraints "
     "{files}/c-bad-json.jsonl", "c-bad-json.jsonl: line 2 is not JSON"),
    ("translate --checkpoint {run} --input {files}/te.en --avoid {files}/c-not-list.jsonl",
     "c-not-list.jsonl: line 1 must be a JSON list of phrases (strings), got dict"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-number.jsonl",
     "c-number.jsonl: line 2 must be a JSON list of phrases (strings), got list [1]"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-blank.jsonl",
     "c-blank.jsonl: line 3 is empty; write [] for a line without phrases"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/latin1.txt",
     "utf-8"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints "
     "{files}/c-empty-phrase.jsonl", "c-empty-phrase.jsonl, line 4: the phrase ' ' is empty"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --avoid "
     "{files}/c-empty-phrase.jsonl", "--avoid {files}/c-empty-phrase.jsonl, line 4: the phrase "
     "' ' is empty"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-unknown.jsonl",
     "c-unknown.jsonl, line 5: the phrase 'xyzzyq' has words outside the target vocabulary "
     "(xyzzyq): the model cannot write it"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --avoid "
     "{files}/c-unknown.jsonl", "--avoid {files}/c-unknown.jsonl, line 5: the phrase 'xyzzyq'"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-long.jsonl "
     "--max-len 3", "line 1: its phrases need at least 5 tokens, more than the 3"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --constraints "
     "{files}/c-long.jsonl --max-len-ratio 0.25", "line 1: its phrases need at least 5 tokens, "
     "more than the 4"),                     # line 1 has 15 tokens: ceil(0.25 x 15) = 4
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-ok.jsonl "
     "--avoid {files}/c-ok.jsonl", "line 1: its phrases cannot all appear in a translation that "
     "holds none of its avoided phrases"),
    ("translate --checkpoint {run} --input {files}/blank-line.en --constraints "
     "{files}/c-ok.jsonl", "line 6 has phrases, but input line 6 is empty"),
    ("translate --checkpoint {run} --input {files}/te.en --constraints {files}/c-ok.jsonl "
     "--alignments {files}/c-ok.jsonl", "would destroy it"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --avoid "
     "{files}/c-ok.jsonl --output {files}/c-ok.jsonl", "would destroy it"),
    # config files
    ("train --out {new} --config {files}/unknown-key.yaml", "'learning_rate'"),
    ("train --out {new} --config {files}/wrong-type.json", "--threads"),
    ("train --out {new} --config {files}/not-a-mapping.yaml", "must map option names"),
    ("train --out {new} --config {files}/broken.yaml", "not valid YAML"),
    ("train --out {new} --config {files}/nan.yaml", "--lr"),
    ("train --out {new} --config {files}/nope.yaml", "no such file"),
    ("train --out {new} --config {files}/nan.yaml --lr 0", "--lr must be > 0"),
    # devices and threads
    ("train --out {new} --max-steps 1 --device foo", "foo"),
    ("train --out {new} --max-steps 1 --device cuda:99", "cuda"),
    ("train --out {new} --max-steps 1 --device ''", "--device"),
    ("translate --checkpoint {run} --device tpu", "tpu"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --device gpu0",
     "gpu0"),
    ("plot --output {new}.png --checkpoint {run} --sentence a --device cuda", "cuda"),
    ("train --out {new} --max-steps 1 --device meta", "meta"),
    ("train --out {new} --max-steps 1 --device cpu --cuda-graphs", "--cuda-graphs"),
    ("translate --checkpoint {run} --device cpu --cuda-graphs", "--cuda-graphs"),
    ("translate --checkpoint {run} --device vulkan", "vulkan"),
    ("translate --checkpoint {run} --device cpu:1", "cpu:1"),
    ("translate --checkpoint {run} --max-len 99999999999999999999", "--max-len"),
    ("translate --checkpoint {run} --threads 99999999999", "--threads"),
    # searches beyond this machine's memory (an allocator's traceback), refused before any
    # work (threads beyond its cores: test_threads_up_to_the_usable_cores_and_no_more)
    ("translate --checkpoint {run} --input {files}/te.en --beam-size 1000000000",
     "with a beam of 1,000,000,000 and up to 100 target tokens needs about"),
    ("translate --checkpoint {run} --input {files}/te.en --beam-size 1000000000 "
     "--n-best 1000000000", "with a beam of 1,000,000,000"),
    ("translate --checkpoint {run} --input {files}/te.en --max-len 2000000000",
     "with a beam of 5 and up to 2,000,000,000 target tokens needs about"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr "
     "--beam-size 1000000000", "with a beam of 1,000,000,000"),
    ("train --out {new} --max-steps 1 --beam-size 1000000000",
     "decoding the test set (64 sentences together"),
    # checkpoints
    ("translate --checkpoint {files}/nope.pt", "no such file"),
    ("translate --checkpoint {files}/a-folder", "no checkpoint"),
    ("translate --checkpoint {files}/notes.txt", "notes.txt"),
    ("translate --checkpoint {ckpt}/state_dict.pt", "state_dict.pt"),
    ("translate --checkpoint {ckpt}/foreign.pt", "foreign.pt"),
    ("translate --checkpoint {ckpt}/list.pt", "list.pt"),
    ("translate --checkpoint {ckpt}/truncated.pt", "truncated.pt"),
    ("translate --checkpoint {ckpt}/flipped.pt", "flipped.pt"),
    ("translate --checkpoint {ckpt}/empty.pt", "empty.pt"),
    ("translate --checkpoint {ckpt}/nan.pt", "nan.pt"),
    ("translate --checkpoint {ckpt}/config-mismatch.pt", "config-mismatch.pt"),
    ("translate --checkpoint {ckpt}/missing-weights.pt", "missing-weights.pt"),
    ("translate --checkpoint {ckpt}/no-vocab.pt", "no-vocab.pt"),
    ("translate --checkpoint {ckpt}/future.pt", "future.pt"),
    ("translate --checkpoint {ckpt}/bad-config.pt", "bad-config.pt"),
    ("evaluate --checkpoint {ckpt}/nan.pt --src {files}/te.en --ref {files}/te.fr", "nan.pt"),
    ("plot --output {new}.png --checkpoint {ckpt}/flipped.pt --sentence a", "flipped.pt"),
    # run folders and resumes: the trained run is never touched
    ("resume --no-resume", "holds a run"),
    ("resume --optimizer adadelta", "--optimizer"),
    ("resume --preset small", "--preset"),
    ("resume --arch rnnencdec", "--arch"),
    ("resume --seed 7", "--seed"),
    ("resume --train-batch-size 8", "--train-batch-size"),
    ("resume --vocab-size 50", "--vocab-size"),
    ("resume --lowercase", "--lowercase"),
    ("resume --max-train-len 20", "--max-train-len"),
    ("resume --dropout 0.2", "--dropout"),
    ("resume --dropout-rnn-inputs 0.2", "--dropout-rnn-inputs"),
    ("resume --max-tokens 300", "--max-tokens"),
    ("resume --gru-form paper", "--gru-form"),
    ("train --out {run} " + " ".join(TRAIN), "training examples differ"),  # shipped data now
    # outputs that would destroy an input or each other
    ("translate --checkpoint {run}/checkpoints/best.pt --input {files}/te.en --alignments "
     "{run}/checkpoints/best.pt", "would destroy it"),
    ("translate --checkpoint {run} --input {files}/te.en --alignments {files}/te.en",
     "would destroy it"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --output "
     "{files}/te.fr", "would destroy it"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --output "
     "{files}/te.en", "would destroy it"),
    ("evaluate --checkpoint {run} --src {files}/te.en --ref {files}/te.fr --output {new}.txt "
     "--json {new}.txt", "would destroy it"),
    ("plot --checkpoint {run} --input {files}/te.en --output {files}/te.en", "would destroy it"),
    # options that would do nothing
    ("plot --output {new}.png --checkpoint {run} --sentence a --line 3", "--line"),
    # a sentence too long to plot: by its words before the model loads, by its tokens after
    ("plot --output {new}.png --checkpoint {run} --sentence '" + "w " * 101 + "'",
     "has 101 words; plot draws sentences of at most 100 tokens"),
    ("plot --output {new}.png --checkpoint {run} --sentence '" + "a, " * 51 + "'",
     "has 102 tokens"),
    ("train --out {new} --max-steps 1 --dev-src {files}/te.en --dev-tgt {files}/te.fr",
     "--eval-every"),
]


@pytest.mark.parametrize(("command", "match"), CASES, ids=[c for c, _ in CASES])
def test_listed_case_refused(command, match, run, files, bad_checkpoints, tmp_path,
                             capsys) -> None:
    new = tmp_path / "new"
    before = _snapshot(run, files)
    if command.startswith("resume"):                # the trained run's command, changed
        command = " ".join(_train_argv(files, run)) + command[len("resume"):]
    argv = _fill(_split(command), run, files, new)
    argv = [a.replace("{ckpt}", str(bad_checkpoints)) for a in argv]
    code = _main(argv)
    extra = _missing_extra(argv)
    match = _fill([match], run, files, new)[0]
    err = _assert_one_error(capsys, code, "" if extra else match)
    assert _snapshot(run, files) == before
    assert not new.exists() and not Path(f"{new}.png").exists()
    if extra and match.lower() not in err.lower():
        assert f"pip install 'bahdanau[{extra}]'" in err, err
        pytest.skip(f"refused for want of the {extra} extra before {match!r} could be checked")


def _missing_extra(argv: list[str]) -> str | None:
    """The extra this command needs that is not installed (a plot needs matplotlib, a YAML
    --config PyYAML): that line may refuse the command before the case's own check does."""
    if argv[0] == "plot" and importlib.util.find_spec("matplotlib") is None:
        return "plot"
    if any(a.endswith(".yaml") for a in argv) and importlib.util.find_spec("yaml") is None:
        return "yaml"
    return None


def _split(command: str) -> list[str]:
    return shlex.split(command)


# ----------------------------------------------------------------------------- machine limits


def test_threads_up_to_the_usable_cores_and_no_more(run, files, tmp_path, capsys) -> None:
    """--threads 100000 crashed every command (rc 139, no message; run apart here, as a crash
    would take the tests with it); just above the usable cores is refused the same way, by
    every command that takes --threads, before any work; the usable cores are taken."""
    cores = usable_cores()
    child = subprocess.run([sys.executable, "-m", "bahdanau", "translate", "--checkpoint",
                            str(run), "--input", str(files / "te.en"), "--threads", "100000"],
                           capture_output=True, text=True, timeout=300)
    assert (child.returncode, child.stdout) == (2, "")
    assert child.stderr == (f"bahdanau: error: --threads 100000 is more than the {cores} CPU "
                            f"core{'s' if cores != 1 else ''} this process may run on: give at "
                            f"most {cores}, or leave --threads out (the cores shared by the "
                            "processes of this machine)\n")
    before = _snapshot(run, files)
    new = tmp_path / "new"
    for command in ("train", "translate", "evaluate", "score"):
        argv = _fill([command, *_BASE[command], "--threads", str(cores + 1)], run, files, new)
        _assert_one_error(capsys, _main(argv), f"--threads {cores + 1} is more than the "
                                               f"{cores} CPU core")
    assert _snapshot(run, files) == before and not new.exists()
    threads = torch.get_num_threads()
    try:
        argv = _fill(["translate", *_BASE["translate"], "--threads", str(cores)], run, files,
                     new)
        assert _main(argv) == 0 and torch.get_num_threads() == cores
    finally:
        torch.set_num_threads(threads)
    assert len(capsys.readouterr().out.splitlines()) == 10          # te.en's 10 lines


@pytest.mark.parametrize("command", ["score", "translate"])
def test_a_line_beyond_the_memory_is_refused_naming_it(command, run, files, tmp_path, capsys,
                                                       monkeypatch) -> None:
    """A 40,000-word line: scoring half as long a one took 8.7 GB and ended in a traceback.
    With 10 MB of memory available, the line is named (line 3, after an empty line 2 that
    translate skips) and refused before any work; the short lines alone would fit."""
    monkeypatch.setattr(checks, "available_memory", lambda device: 10**7)
    src, tgt = tmp_path / "long.en", tmp_path / "long.fr"
    src.write_text("a dog runs\n\n" + "dog " * 40_000 + "\n", encoding="utf-8")
    tgt.write_text("un chien\n\n" + "chien " * 40_000 + "\n", encoding="utf-8")
    if command == "score":
        lines = src.read_text().splitlines()
        src.write_text("\n".join(line or "a cat" for line in lines) + "\n")
        tgt.write_text("\n".join(line or "un chat" for line in
                                 tgt.read_text().splitlines()) + "\n")
        argv = ["score", "--checkpoint", str(run), "--src", str(src), "--tgt", str(tgt)]
        what = "scoring sentence 3 (40,000 source and 40,001 target tokens) needs about"
        lower = "split or shorten that sentence"
    else:
        argv = ["translate", "--checkpoint", str(run), "--input", str(src)]
        what = "translating sentence 3 (40,000 tokens) with a beam of 5 and up to 100 target"
        lower = ("lower the beam size, the maximum length or the sentences searched "
                 "together, or shorten the sentence")
    err = _assert_one_error(capsys, _main(argv), what)
    assert err.endswith(f"more than the 10.0 MB of memory available on cpu: {lower}\n"), err
    short = tmp_path / "short.en"
    short.write_text("a dog runs\n\na cat\n", encoding="utf-8")
    assert _main(["translate", "--checkpoint", str(run), "--input", str(short)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
