"""Command lines refused before any work: a --config file that names an option twice, train
options that would silently do nothing, an evaluate reference file with an empty line.

Each case runs `bahdanau.cli.main` in-process and expects exit status 2 and one error line, with
no run folder made and no checkpoint read (the refusal comes before any work).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bahdanau.cli import main


def _refused(args: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> str:
    # training files that do not exist: a case that is not refused ends there, without training
    missing = ["--train-src", str(out) + ".src", "--train-tgt", str(out) + ".tgt"]
    assert main(["train", "--out", str(out), *missing, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bahdanau: error: "), err
    assert not out.exists()
    return err


@pytest.mark.parametrize("name, text", [
    ("dup.yaml", "max_steps: 3\nlr: 0.1\nmax_steps: 5\n"),           # the last used to win
    ("dup.json", '{"max_steps": 3, "max-steps": 3, "lr": 0.1}'),     # one option, two spellings
    ("dup-json.json", '{"lr": 0.1, "lr": 0.2}'),
])
def test_config_naming_an_option_twice_is_refused(name, text, tmp_path, capsys) -> None:
    if name.endswith(".yaml"):
        pytest.importorskip("yaml", reason="reading YAML needs PyYAML (the yaml extra)")
    config = tmp_path / name
    config.write_text(text, encoding="utf-8")
    err = _refused(["--config", str(config)], capsys, tmp_path / "run")
    assert f"--config {config}: the option " in err and "is given twice" in err


def test_yaml_merge_keys_may_still_be_overridden(tmp_path, capsys) -> None:
    # a key after a merge ("<<") overrides the merged one, as YAML means: not a duplicate
    pytest.importorskip("yaml", reason="reading YAML needs PyYAML (the yaml extra)")
    config = tmp_path / "merge.yaml"
    config.write_text("<<: {max_steps: 3, lr: 0.1}\nlr: 0.5\n", encoding="utf-8")
    err = _refused(["--config", str(config)], capsys, tmp_path / "run")
    assert "run.src: no such file" in err                  # the file was read; the run stops there


@pytest.mark.parametrize("args", [
    ["--keep-best", "3", "--max-steps", "5"],                         # the job: no evals
    ["--keep-best", "2", "--eval-every", "0", "--max-steps", "5"],
])
def test_keep_best_without_evaluations_is_refused(args, tmp_path, capsys) -> None:
    err = _refused(args, capsys, tmp_path / "run")
    assert "--keep-best" in err and "needs --eval-every" in err


@pytest.mark.parametrize("ref_text, line", [("a b\n\nc\n", 2), ("a b\nc\n   \n", 3)])
def test_evaluate_refuses_an_empty_reference_line(ref_text, line, tmp_path, capsys) -> None:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("x\ny\nz\n", encoding="utf-8")
    ref.write_text(ref_text, encoding="utf-8")
    not_a_model = tmp_path / "model.pt"                 # refused before it is read
    not_a_model.write_bytes(b"")
    assert main(["evaluate", "--checkpoint", str(not_a_model), "--src", str(src),
                 "--ref", str(ref)]) == 2
    err = capsys.readouterr().err
    assert err == (f"bahdanau: error: {ref}: line {line} is empty; every line needs the "
                   "reference translation of its source line\n")


@pytest.mark.parametrize("argv, hint", [
    (["train", "--learning_rate", "0.1"], "; did you mean --lr?"),          # its words' initials
    (["train", "--max_steps", "3"], "; did you mean --max-steps?"),         # underscores
    (["train", "--max-step", "3"], "; did you mean --max-steps?"),          # a letter short
    (["translate", "--beam_size=3"], "; did you mean --beam-size?"),        # with its value
    (["train", "--bogus"], ""),                                             # near nothing
])
def test_a_misspelt_option_names_the_nearest_one(argv, hint, capsys) -> None:
    """An unknown option is one line naming it, the command's --help, and the command's own
    option nearest to it (argparse's suggest_on_error is Python 3.14's); nothing runs."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err == (f"bahdanau: error: unrecognized arguments: {' '.join(argv[1:])}{hint} "
                   f"(see 'bahdanau {argv[0]} --help')\n")
