"""Each setting is declared once: the training settings' flags, records, checks and resume rule
all come from `TrainConfig`'s declarations (and the model choices' from `ModelConfig`'s)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bahdanau.cli import build_parser
from bahdanau.config import ModelConfig, TrainConfig
from bahdanau.errors import InputError
from bahdanau.jobs.flags import flag_words
from bahdanau.jobs.options import (
    GROUPS,
    JOB_TRAINING,
    TrainOptions,
    flag,
    flat_settings,
)
from bahdanau.jobs.resume import resume_changes
from bahdanau.presets import ModelChoices, tiny
from bahdanau.settings import declared

# with what every training setting acts with: dev evaluations, the plateau schedule, Adadelta
BASE = dataclasses.replace(JOB_TRAINING, eval_every=100, schedule="plateau",
                           optimizer="adadelta")
TRAIN_SETTINGS = [(field, spec) for field, _, spec in declared(TrainConfig)]


def _train_actions() -> list:
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]  # noqa: SLF001 (argparse)
    return train._actions


def _train_flags() -> set[str]:
    return {option for action in _train_actions() for option in action.option_strings}


def test_every_training_setting_is_a_train_flag_and_a_record_key() -> None:
    flags, record = _train_flags(), TrainOptions().to_record()
    for field, spec in TRAIN_SETTINGS:
        if spec.flag == "":                      # kept off the command line (max_time_s)
            assert flag(field.name) not in flags
            continue
        key = spec.flag or field.name
        assert flag(key) in flags, key
        assert record[key] == getattr(JOB_TRAINING, field.name), key


def test_a_flag_sets_its_setting_and_names_itself_in_errors() -> None:
    options = TrainOptions.from_mapping({"train_batch_size": "32", "rho": "0.9",
                                         "optimizer": "adadelta", "arch": "rnnencdec"},
                                        text=True)
    assert options.training.batch_size == 32 and options.training.rho == 0.9
    assert options.model.arch == "rnnencdec"
    assert options.train_config().batch_size == 32
    with pytest.raises(InputError, match="^--train-batch-size must be >= 1, got 0$"):
        TrainOptions.from_mapping({"train_batch_size": 0})
    with pytest.raises(InputError, match="^batch_size must be >= 1, got 0$"):
        TrainConfig(batch_size=0)                # the same check, named as the field


def test_the_resume_rule_has_one_source() -> None:
    """What TrainConfig refuses to change on resume is exactly what the command refuses."""
    fixed = {field.name for field, spec in TRAIN_SETTINGS if spec.on_resume == "fixed"}
    assert fixed == {"optimizer", "batch_size", "max_tokens", "bucket", "seed",
                     "early_stopping_metric"}
    base = dataclasses.replace(TrainOptions(), training=BASE)     # with dev evaluations
    stored_options = base.to_record()
    for field, spec in TRAIN_SETTINGS:
        if spec.flag == "":
            continue
        changed = _changed(field.name)
        given = dataclasses.replace(base, training=changed)
        refused_config = refused_command = False
        try:
            changed.resume_changes(BASE)
        except InputError:
            refused_config = True
        try:
            resume_changes(stored_options, given)
        except InputError:
            refused_command = True
        assert refused_config == refused_command == (field.name in fixed), field.name


def test_a_run_batched_by_tokens_may_resume_with_another_train_batch_size() -> None:
    """--train-batch-size forms no batch where --max-tokens does, before and after: a resumed
    run may change it, as its TrainConfig may (and it is logged); where either side batches by
    sentences it stays fixed, in the command's terms and the config's alike."""
    def given(**options: object) -> TrainOptions:
        return TrainOptions.from_mapping({"train_batch_size": 64, "max_tokens": 300, **options})

    stored = given().to_record()
    assert resume_changes(stored, given(train_batch_size=32)) == [
        "--train-batch-size 64 -> 32"]
    assert given(train_batch_size=32).training.resume_changes(given().training) == [
        "batch_size: 64 -> 32"]
    for before, after in ((300, None), (None, 300), (None, None)):
        old, new = given(max_tokens=before), given(max_tokens=after, train_batch_size=32)
        with pytest.raises(InputError, match="^--train-batch-size was 64 when this run began "
                                             "and is 32 now; a resumed run keeps it"):
            resume_changes(old.to_record(), new)
        with pytest.raises(InputError, match="^the checkpoint was trained with batch_size=64, "
                                             "not 32: a resumed run keeps its batch_size"):
            new.training.resume_changes(old.training)


def _changed(name: str) -> TrainConfig:
    """`BASE` with another valid value of the setting `name`."""
    value = getattr(BASE, name)
    literal = {"optimizer": "adam", "schedule": "inverse_sqrt", "amp": "bf16",
               "early_stopping_metric": "chrf"}
    candidates = ([literal[name]] if name in literal
                  else [not value] if isinstance(value, bool)
                  else [2, 8, 0.5, 0.25] if value is None
                  else [value * 2, value / 2, value + 1, 1, 0.5])
    for candidate in candidates:
        if isinstance(value, int) and not isinstance(candidate, int):
            continue
        try:
            return dataclasses.replace(BASE, **{name: candidate})
        except InputError:
            continue
    raise AssertionError(f"no other valid value of {name}")


def test_model_choices_take_model_config_declarations() -> None:
    model_fields = {field.name: spec for field, _, spec in declared(ModelConfig)}
    for field, _, spec in declared(ModelChoices):
        if field.name != "preset":
            assert spec is model_fields[field.name], field.name
    keys = {s.key for s in flat_settings(TrainOptions)}
    assert set(model_fields) <= keys
    assert ModelChoices(dropout=0.25).config(10, 12) == dataclasses.replace(
        ModelConfig(10, 12, embed_size=256, hidden_size=256, decoder_size=512, align_size=512,
                    maxout_size=256), dropout=0.25, init="glorot", layer_norm=True)


def test_model_sizes_override_the_preset() -> None:
    small = ModelChoices().config(10, 12)
    assert ModelChoices(preset="small", embed_size=None).config(10, 12) == small
    sized = ModelChoices(embed_size=128, hidden_size=64, decoder_size=96, align_size=32,
                         maxout_size=16, arch="rnnencdec").config(10, 12)
    assert sized == dataclasses.replace(small, embed_size=128, hidden_size=64, decoder_size=96,
                                        align_size=32, maxout_size=16, arch="rnnencdec")
    assert ModelChoices(preset="tiny", align_size=7).config(10, 12) == dataclasses.replace(
        ModelConfig(10, 12, embed_size=8, hidden_size=8, decoder_size=12, align_size=7,
                    maxout_size=6), init="glorot", layer_norm=True)
    assert ModelChoices(preset="tiny", align_size=7).name == "tiny, align_size=7"
    deeper = ModelChoices(preset="g2p", encoder_layers=2)
    assert deeper.config(10, 12).encoder_layers == 2
    assert deeper.name == "g2p, encoder_layers=2"


def test_model_size_flags_are_checked_and_fixed_on_resume() -> None:
    options = TrainOptions.from_mapping({"embed_size": "128", "maxout_size": "64"}, text=True)
    assert (options.model.embed_size, options.model.maxout_size) == (128, 64)
    assert options.model.hidden_size is None
    assert {"--embed-size", "--hidden-size", "--decoder-size", "--align-size",
            "--maxout-size"} <= _train_flags()
    with pytest.raises(InputError, match="^--embed-size must be >= 1, got 0$"):
        TrainOptions.from_mapping({"embed_size": "0"}, text=True)
    with pytest.raises(InputError, match="^--hidden-size must be an integer, got '1.5'$"):
        TrainOptions.from_mapping({"hidden_size": "1.5"}, text=True)
    with pytest.raises(InputError, match="^align_size must be >= 1, got 0$"):
        ModelChoices(align_size=0)
    with pytest.raises(InputError, match=r"--decoder-size was 256 when this run began.*keeps it "
                                         r"\(--decoder-size 256 resumes it; start a new run"):
        resume_changes(TrainOptions.from_mapping({"decoder_size": 256}).to_record(),
                       TrainOptions.from_mapping({"decoder_size": 512}))


def test_flag_words_give_a_value_as_typed() -> None:
    assert flag_words("layer_norm", True) == "--layer-norm"
    assert flag_words("layer_norm", False) == "--no-layer-norm"
    assert flag_words("train_src", "my corpus.en") == "--train-src 'my corpus.en'"
    assert flag_words("ema_decay", None) == "--ema-decay none"


def test_none_turns_off_an_optional_number() -> None:
    """An optional number with a default (the job's moving average, gradient clipping) is
    turned off as ``none``, on the command line and in a config file; where None is no value
    (--label-smoothing) or a string (--init-from), "none" is an ordinary value."""
    assert TrainOptions().training.ema_decay == JOB_TRAINING.ema_decay == 0.998
    for text in (True, False):
        options = TrainOptions.from_mapping({"ema_decay": "none", "clip_norm": "none"},
                                            text=text)
        assert (options.training.ema_decay, options.training.clip_norm) == (None, None)
        assert options.to_record()["ema_decay"] is None
    assert TrainOptions.from_mapping({"ema_decay": None}).training.ema_decay == 0.998
    with pytest.raises(InputError, match="^--label-smoothing must be a number, got 'none'$"):
        TrainOptions.from_mapping({"label_smoothing": "none"}, text=True)
    assert TrainOptions.from_mapping({"init_from": "none"}).init_from == "none"
    shown = {action.dest: action.help for action in _train_actions()}
    assert shown["ema_decay"].endswith("(default 0.998; none turns it off)")
    assert shown["label_smoothing"].endswith("(default 0.1)")


def test_a_run_begun_without_a_moving_average_takes_the_default_one_on_resume() -> None:
    """The job's moving average is an applied option: a run recorded without one (as every
    run of the default job was before it took one) resumes with it, and the change is logged;
    --ema-decay none resumes it unchanged."""
    without = TrainOptions.from_mapping({"ema_decay": "none"}).to_record()
    assert without["ema_decay"] is None
    assert resume_changes(without, TrainOptions()) == ["--ema-decay none -> 0.998"]
    assert resume_changes(without, TrainOptions.from_mapping({"ema_decay": "none"})) == []
    assert resume_changes(TrainOptions().to_record(), TrainOptions.from_mapping(
        {"ema_decay": "none"})) == ["--ema-decay 0.998 -> none"]


def test_a_run_begun_without_layer_norm_resumes_with_no_layer_norm() -> None:
    """Layer norm became the job's default later: a run recorded without it (or from before it
    was an option, when none had it) is refused under the new default in one line that says
    how to resume it, and resumes unchanged with --no-layer-norm."""
    without = TrainOptions.from_mapping({"layer_norm": False})
    recorded = without.to_record()
    recorded_before = {k: v for k, v in recorded.items() if k != "layer_norm"}
    for stored in (recorded, recorded_before):
        with pytest.raises(InputError, match=r"^--layer-norm was False when this run began and "
                                             r"is True now; a resumed run keeps it "
                                             r"\(--no-layer-norm resumes it; "):
            resume_changes(stored, TrainOptions())
        assert resume_changes(stored, without) == []


def test_a_run_recorded_before_encoder_layers_keeps_one_layer() -> None:
    """A run recorded before --encoder-layers was an option trained one layer: it resumes as it
    is, and a deeper encoder given on resume is refused in one line that says what resumes it."""
    before = {k: v for k, v in TrainOptions().to_record().items() if k != "encoder_layers"}
    assert resume_changes(before, TrainOptions()) == []
    with pytest.raises(InputError, match=r"^--encoder-layers was 1 when this run began and is 2 "
                                         r"now; a resumed run keeps it \(--encoder-layers 1 "
                                         r"resumes it; "):
        resume_changes(before, TrainOptions.from_mapping({"encoder_layers": 2}))


def test_model_attention_flags_choose_the_model_s_attention() -> None:
    """--attention, --attention-impl and --engine are ModelConfig's settings: checked as flags,
    in the job's model config, and fixed on resume, also for a run recorded before they were
    options (which trained the defaults)."""
    options = TrainOptions.from_mapping({"attention": "luong_general", "attention_impl":
                                         "reference", "engine": "reference"}, text=True)
    assert options.model.config(10, 12) == dataclasses.replace(
        ModelChoices().config(10, 12), attention="luong_general", attention_impl="reference",
        engine="reference")
    assert ModelChoices(preset="tiny", attention="luong_general").name == (
        "tiny, attention=luong_general")
    assert ModelChoices(attention="luong_dot").config(10, 12).attention == "luong_dot"  # 2H = D
    with pytest.raises(InputError, match="^--attention must be one of additive, luong_general, "
                                         "luong_dot, got 'dot'$"):
        TrainOptions.from_mapping({"attention": "dot"})
    with pytest.raises(InputError, match=r"^--attention luong_dot needs --decoder-size = 2 x "
                                         r"--hidden-size \(s_\{i-1\} . h_j\), got 12 and 8$"):
        TrainOptions.from_mapping({"preset": "tiny", "attention": "luong_dot"})
    with pytest.raises(InputError, match=r"^attention luong_dot needs decoder_size = 2 x "
                                         r"hidden_size"):
        ModelChoices(preset="tiny", attention="luong_dot")
    luong = TrainOptions.from_mapping({"attention": "luong_general"})
    with pytest.raises(InputError, match="--attention was 'additive' when this run began"):
        resume_changes(TrainOptions().to_record(), luong)
    recorded_before = {k: v for k, v in TrainOptions().to_record().items()
                       if k not in ("attention", "attention_impl", "engine")}
    with pytest.raises(InputError, match="--attention was 'additive' when this run began"):
        resume_changes(recorded_before, luong)
    assert resume_changes(recorded_before, TrainOptions()) == []
    # a checkpoint's model config from before: the defaults, the model every run then had
    stored = {k: v for k, v in tiny(10, 12).to_dict().items()
              if k not in ("attention", "attention_impl", "engine")}
    assert ModelConfig.from_dict(stored) == tiny(10, 12)


def _help_sections(command: str) -> dict[str, list[str]]:
    """The sections of `bahdanau COMMAND --help`, in order, each with the flags listed in it."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    sections: dict[str, list[str]] = {}
    current = None
    for line in sub.format_help().splitlines():
        if re.fullmatch(r"[a-z]+:", line):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line.startswith("  -"):
            current.append(line.split()[0].rstrip(","))
    return sections


def test_train_help_is_in_groups_each_flag_in_one() -> None:
    sections = _help_sections("train")
    assert list(sections) == ["options", *GROUPS]           # in this order, none left out
    assert sections["options"] == ["-h", "--config", "--quiet", "--verbose", "--no-progress"]
    listed = [f for name in GROUPS for f in sections[name]]
    flags = [flag(s.key) for s in flat_settings(TrainOptions)]
    assert sorted(listed) == sorted(flags)                  # every flag once, nothing else
    assert "--lr" in sections["optimisation"] and "--beam-size" in sections["decoding"]
    assert "--max-steps" in sections["limits"] and "--out" in sections["output"]
    assert "--keep-best" in sections["output"] and "--device" in sections["machine"]


def test_a_setting_without_a_group_takes_its_section_s() -> None:
    groups = {s.key: s.group for s in flat_settings(TrainOptions)}
    assert {groups[f.name] for f in dataclasses.fields(ModelChoices)} == {"model"}
    assert groups["lr"] == "optimisation" and groups["max_steps"] == "limits"
    assert set(groups.values()) == set(GROUPS)


def test_a_config_yaml_from_before_the_metric_was_recorded_is_bleu_s() -> None:
    """A run begun before config.yaml recorded --early-stopping-metric ranked by BLEU: resuming
    it with another metric is refused, with bleu it resumes unchanged."""
    stored = TrainOptions().to_record()
    del stored["early_stopping_metric"]
    with pytest.raises(InputError, match="^--early-stopping-metric was 'bleu' when this run "
                                         "began and is 'ppl' now"):
        resume_changes(stored, TrainOptions.from_mapping({"early_stopping_metric": "ppl",
                                                          "eval_every": 10}))
    assert resume_changes(stored, TrainOptions()) == []
