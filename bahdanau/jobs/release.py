"""``bahdanau release``: a trained model as a folder to share, with its model card.

`release_model` reads the checkpoint through the door (`bahdanau.checkpoint.read_checkpoint`:
a file, a run folder's best, a model folder), writes its model folder
(`bahdanau.checkpoint.release.write_release`) and a model card in the Hugging Face format
(`model_card`): YAML metadata (languages, licence, tags, data sets, metrics, the model-index of
its own test scores, and a ``bahdanau`` entry with the command, the run, its scores and the
versions), then what the model is and how it was trained, in words. What the card says of the
run comes from the checkpoint's `bahdanau.checkpoint.RunRecord`: the options the run recorded
(the training command, the language pair and the data), the training data's digest and the
run's test report (``metrics.json``), also for an average, which keeps its members' record.
The licence is the one the user states (``--license``); the card says "not stated" without it.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from bahdanau._folders import Kind
from bahdanau.checkpoint.reader import Checkpoint, find_checkpoint, read_checkpoint
from bahdanau.checkpoint.release import MANIFEST, write_release
from bahdanau.checkpoint.sections import EMA, EXTRA
from bahdanau.data.text import MULTI30K_LANGS
from bahdanau.jobs.files import check_output_folder
from bahdanau.jobs.options import ReleaseOptions, TrainOptions, flag
from bahdanau.model_folder import check_model_folder_to_write
from bahdanau.parts import class_path


def train_command(options: Any) -> str | None:
    """``bahdanau train`` with the options a run recorded that differ from the defaults; None
    when the checkpoint records none (or not as the command line writes them)."""
    if not isinstance(options, dict):
        return None
    defaults = TrainOptions().to_record()
    words = ["bahdanau", "train"]
    for key, value in options.items():
        if key not in defaults or value == defaults[key]:
            continue
        if isinstance(value, bool):
            words.append(flag(key) if value else "--no-" + flag(key)[2:])
        elif value is None:
            continue
        else:
            words.append(flag(key))
            words.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    return shlex.join(words)


def own_test_scores(checkpoint: Checkpoint) -> dict[str, Any] | None:
    """The run's test report (``metrics.json``) when it scores this checkpoint's weights: the
    run scores its final weights, so only a checkpoint whose step is the run's last update
    (the report's "updates") has them. None for another checkpoint, an average, one outside a
    run folder, or a run that scored none."""
    report = checkpoint.run.report
    if report is None or checkpoint.step is None or report.get("updates") != checkpoint.step:
        return None
    return report


def training_data(options: Any) -> tuple[list[str], list[str], str]:
    """(languages, data set ids, the data in words) of the options a run recorded: the
    shipped Multi30k's pair, or the user's files or prepared corpus (languages not recorded)."""
    if not isinstance(options, dict):
        return [], [], "not recorded"
    if options.get("data"):
        return [], [], f"the prepared corpus {options['data']} (bahdanau prepare)"
    if options.get("train_src"):
        return [], [], f"{options['train_src']} and {options.get('train_tgt')}"
    src = options.get("src_lang") or MULTI30K_LANGS[0]
    tgt = options.get("tgt_lang") or MULTI30K_LANGS[1]
    return [src, tgt], ["multi30k"], f"Multi30k {src}-{tgt}, shipped with bahdanau"


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON and YAML have no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _scores(report: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of a test report, and how its BLEU and chrF were computed."""
    return _finite({k: report.get(k) for k in ("bleu", "chrf", "sentences", "beam_size",
                                                "updates", "bleu_signature", "chrf_signature")})


def card_metadata(checkpoint: Checkpoint, license: str | None) -> dict[str, Any]:
    """The YAML metadata of the model card (the Hugging Face card format), as plain values."""
    run, options = checkpoint.run, checkpoint.run.options
    languages, datasets, _ = training_data(options)
    own, state = own_test_scores(checkpoint), checkpoint.train_state or {}
    meta: dict[str, Any] = {"language": languages} if languages else {}
    if license is not None:
        meta["license"] = license
    meta |= {"library_name": "bahdanau", "pipeline_tag": "translation",
             "tags": ["translation", "bahdanau", _arch(checkpoint)],
             **({"datasets": datasets} if datasets else {}), "metrics": ["bleu", "chrf"]}
    if own is not None:
        pair = "-".join(languages) if languages else "translation"
        meta["model-index"] = [{"name": _arch(checkpoint), "results": [{
            "task": {"type": "translation", "name": f"Translation {pair}"},
            "dataset": {"type": datasets[0] if datasets else "own",
                        "name": "test set of the run"},
            "metrics": [_metric_entry(own, "bleu", "BLEU"), _metric_entry(own, "chrf", "chrF")]
        }]}]
    members = _members(checkpoint)
    meta["bahdanau"] = _finite({
        "command": train_command(options), "run_id": run.run_id,
        "updates": checkpoint.step,
        **({"averaged_steps": [m.get("step") for m in members]} if members else {}),
        "examples_digest": run.examples_digest,
        "best_dev": ({"metric": _metric(checkpoint), "value": state.get("best_metric"),
                      "step": state.get("best_step")}
                     if state.get("best_metric") is not None else None),
        "test": _scores(own) if own is not None else None,
        "run_test": _scores(run.report) if run.report is not None else None,
        "versions": checkpoint.versions})
    return meta


def _metric_entry(report: dict[str, Any], metric: str, name: str) -> dict[str, Any]:
    """One score of the model-index, with its sacrebleu signature (case, tokenisation,
    version) when the report has it: a BLEU means little without it."""
    entry = {"type": metric, "value": _finite(report.get(metric)), "name": name}
    signature = report.get(f"{metric}_signature")
    return entry | ({"args": {"signature": signature}} if signature else {})


def _arch(checkpoint: Checkpoint) -> str:
    """What the model is: its config's arch, or its class's for a model assembled from parts."""
    if checkpoint.blueprint is not None:
        return str(getattr(checkpoint.blueprint.root, "arch", checkpoint.blueprint.root.__name__))
    return checkpoint.config.arch


def _config(checkpoint: Checkpoint) -> dict[str, Any]:
    """The model config as the card tells it; for a model assembled from parts, its sizes and
    its attention's class (config.json records every part)."""
    if checkpoint.blueprint is None:
        return checkpoint.config.to_dict()
    model: Any = checkpoint.skeleton()
    decoder, attention = model.decoder, getattr(model.decoder, "attention", None)
    src, tgt = model.vocab_sizes
    return {"arch": _arch(checkpoint), "src_vocab_size": src, "tgt_vocab_size": tgt,
            "embed_size": decoder.embed_size, "hidden_size": model.encoder.hidden_size,
            "decoder_size": decoder.hidden_size, "maxout_size": decoder.maxout_size,
            "attention": None if attention is None else class_path(type(attention))}


def _metric(checkpoint: Checkpoint) -> str:
    """The name of the dev metric the run ranked its checkpoints by."""
    config = checkpoint.train_config
    return config.get("early_stopping_metric", "bleu") if isinstance(config, dict) else "score"


def front_matter(meta: dict[str, Any]) -> str:
    """`meta` as the YAML front matter of a card: one key a line, each value in JSON's flow
    style, which YAML reads as it is (JSON is YAML)."""
    lines = [f"{key}: {json.dumps(value, ensure_ascii=False, allow_nan=False)}"
             for key, value in meta.items()]
    return "\n".join(["---", *lines, "---", ""])


def model_card(checkpoint: Checkpoint, license: str | None = None) -> str:
    """The README.md of a model folder: the metadata, what the model is, how it was trained,
    its scores and its licence."""
    meta = card_metadata(checkpoint, license)
    config, facts = _config(checkpoint), meta["bahdanau"]
    sizes = ", ".join(f"{k} {config[k]}" for k in (
        "src_vocab_size", "tgt_vocab_size", "embed_size", "hidden_size", "encoder_layers",
        "decoder_size", "align_size", "maxout_size") if k in config)
    parameters = sum(p.numel() for p in checkpoint.skeleton().parameters())
    languages, _, data = training_data(checkpoint.run.options)
    lines = [front_matter(meta), f"# {config.get('arch', 'rnnsearch')} translation model", "",
             "Written by `bahdanau release`. Load it with "
             "`bahdanau.load(FOLDER)`, translate with `bahdanau translate --checkpoint FOLDER`, "
             "fine-tune it with `bahdanau train --init-from FOLDER`.", "",
             "## Model", "",
             f"- language pair: {' -> '.join(languages) if languages else 'not recorded'}",
             f"- architecture: {config.get('arch')} ({config.get('attention')} attention)",
             f"- sizes: {sizes}",
             f"- parameters: {parameters:,}",
             f"- weights: {_weights(checkpoint)}, as `model.safetensors`", "",
             "## Training", "",
             f"- command: `{facts['command']}`" if facts["command"] else "- command: not recorded",
             f"- training data: {data}"]
    lines += _training_lines(checkpoint, facts)
    lines += ["", "## License", "",
              *(([f"{meta['license']} (as stated by whoever released the model; the training "
                  "data's own licence applies to it)"]) if "license" in meta else
                ["Not stated. Whoever shares this model states the licence of the model and of "
                 "its training data (`bahdanau release --license SPDX-ID`)."]), "",
              "## Files", "",
              f"`{MANIFEST}` lists every file with its SHA-256; loading checks them.", ""]
    return "\n".join(lines)


def _members(checkpoint: Checkpoint) -> list[dict[str, Any]]:
    """The members of an average (its extra["averaged_from"]); [] for another checkpoint."""
    extra = checkpoint.payload[EXTRA]
    members = extra.get("averaged_from") if isinstance(extra, dict) else None
    return [m for m in members if isinstance(m, dict)] if isinstance(members, list) else []


def _weights(checkpoint: Checkpoint) -> str:
    """Which weights the folder holds, in words."""
    members = _members(checkpoint)
    if members:
        steps = ", ".join(str(m.get("step")) for m in members)
        return f"the average of {len(members)} checkpoints (updates {steps})"
    return "moving average (EMA)" if checkpoint.payload.get(EMA) is not None else "trained"


def _training_lines(checkpoint: Checkpoint, facts: dict[str, Any]) -> list[str]:
    """The card's lines on the run: updates, data digest, scores, versions."""
    lines = [f"- updates: {facts['updates']}"] if facts["updates"] is not None else []
    digest = facts["examples_digest"]
    lines.append(f"- training data digest (SHA-256 of the examples' ids): "
                 f"{digest if digest else 'not recorded'}")
    if facts["best_dev"] is not None:
        best = facts["best_dev"]
        lines.append(f"- best dev {best['metric']} {best['value']:.2f} at update {best['step']}")
    record = facts["versions"]
    if isinstance(record, dict):
        trained = ", ".join(f"{k} {record[k]}" for k in ("bahdanau", "torch", "python",
                                                         "git_commit", "device") if record.get(k))
        lines.append(f"- {'averaged' if 'averaged_steps' in facts else 'trained'} with: "
                     f"{trained}")
    if facts["test"] is not None:
        lines.append(f"- test: {_score_words(facts['test'])}")
    elif facts["run_test"] is not None and "averaged_steps" in facts:
        lines.append(f"- the run's test scores (its final weights, update "
                     f"{facts['run_test'].get('updates')}; this average is not scored): "
                     f"{_score_words(facts['run_test'])}")
    return lines


def _score_words(scores: dict[str, Any]) -> str:
    def number(value: Any) -> str:
        return f"{value:.2f}" if isinstance(value, (int, float)) else "-"

    return (f"BLEU {number(scores.get('bleu'))}, chrF {number(scores.get('chrf'))} "
            f"({scores.get('sentences')} sentences, beam {scores.get('beam_size')})")


def release_model(o: ReleaseOptions) -> Path:
    """Write the model folder of `o.checkpoint` into `o.out` (``bahdanau release``).

    Raises:
        InputError: no checkpoint there or a damaged one (named); an --out that is a file, a
            model folder (without --overwrite), a folder of another kind or of other files
            (whatever --overwrite), a place that cannot be replaced, or that holds a run, is
            inside one's files, inside a model folder, a prepared corpus or an exported folder,
            or holds the checkpoint (unless it is a model folder already:
            `check_output_folder`), all before any work; or safetensors is not installed.
    """
    path = find_checkpoint(o.checkpoint, "--checkpoint")
    check_output_folder("--out", o.out, {"--checkpoint": path}, writes=Kind.MODEL)
    check_model_folder_to_write(Path(o.out), o.overwrite)
    checkpoint = read_checkpoint(path, trust_code=o.trust_code)
    checkpoint.translation_weights()                # checks the weights whole first
    card = model_card(checkpoint, o.license)
    return write_release(checkpoint.payload, o.out, card=card, overwrite=o.overwrite)
