"""``bahdanau release``: a trained model as a folder to share, with its model card.

`release_model` reads the checkpoint through the door (`bahdanau.checkpoint.read_checkpoint`:
a file, a run folder's best, a model folder), writes its model folder
(`bahdanau.checkpoint.release.write_release`) and a model card saying what the model is and how
it was trained: the architecture, sizes and parameter count, the training command (rebuilt from
the options the run recorded), the training data's digest, the best dev score (named by its
metric), the versions it was trained with and, from the run folder's ``metrics.json``, the test
scores, when they are this checkpoint's (they score the run's final weights).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from bahdanau._checks import JSON_ERRORS
from bahdanau._folders import Kind
from bahdanau.checkpoint.payload import model_skeleton
from bahdanau.checkpoint.reader import RUN_REPORT, find_checkpoint, read_checkpoint
from bahdanau.checkpoint.release import MANIFEST, check_new_release, write_release
from bahdanau.jobs.files import check_output_folder
from bahdanau.jobs.options import ReleaseOptions, TrainOptions, flag


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


def run_test_scores(checkpoint: Path, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The test scores of the run folder whose ``checkpoints`` hold `checkpoint` (its
    ``metrics.json``), when they score this checkpoint's weights: the run scores its final
    weights, so only a checkpoint whose step is the run's last update (metrics "updates") has
    them. None for another checkpoint, one elsewhere, or a run that scored none."""
    path = checkpoint.parent.parent / RUN_REPORT
    if not checkpoint.is_file() or checkpoint.parent.name != "checkpoints" or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, *JSON_ERRORS):
        return None
    state = payload.get("train_state")
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(data, dict) or step is None or data.get("updates") != step:
        return None
    return data


def model_card(payload: dict[str, Any], parameters: int, test: dict[str, Any] | None) -> str:
    """The README.md of a model folder: what the model is, how it was trained, its scores."""
    config = payload["model_config"]
    state = payload["train_state"] if isinstance(payload["train_state"], dict) else {}
    extra = payload["extra"] if isinstance(payload["extra"], dict) else {}
    sizes = ", ".join(f"{k} {config[k]}" for k in (
        "src_vocab_size", "tgt_vocab_size", "embed_size", "hidden_size", "decoder_size",
        "align_size", "maxout_size") if k in config)
    lines = [f"# {config.get('arch', 'rnnsearch')} translation model", "",
             "Written by `bahdanau release`. Load it with "
             "`bahdanau.load(FOLDER)`, translate with `bahdanau translate --checkpoint FOLDER`, "
             "fine-tune it with `bahdanau train --init-from FOLDER`.", "",
             "## Model", "",
             f"- architecture: {config.get('arch')} ({config.get('attention')} attention)",
             f"- sizes: {sizes}",
             f"- parameters: {parameters:,}",
             f"- weights: {'moving average (EMA)' if payload.get('ema') is not None else 'trained'}"
             " weights, as `model.safetensors`", "", "## Training", ""]
    command = train_command(extra.get("options"))
    lines.append(f"- command: `{command}`" if command else "- command: not recorded")
    if state.get("step") is not None:
        lines.append(f"- updates: {state['step']}")
    digest = state.get("examples_digest")
    lines.append(f"- training data digest (SHA-256 of the examples' ids): "
                 f"{digest if digest else 'not recorded'}")
    if state.get("best_metric") is not None:
        train_config = payload.get("train_config")
        metric = (train_config.get("early_stopping_metric", "bleu")
                  if isinstance(train_config, dict) else "score")
        lines.append(f"- best dev {metric} {state['best_metric']:.2f} at update "
                     f"{state.get('best_step')}")
    record = payload.get("versions")
    if isinstance(record, dict):
        trained = ", ".join(f"{k} {record[k]}" for k in ("bahdanau", "torch", "python",
                                                         "git_commit", "device") if record.get(k))
        lines.append(f"- trained with: {trained}")
    if test is not None and "bleu" in test:
        lines.append(f"- test: BLEU {test['bleu']:.2f}, chrF {test.get('chrf', float('nan')):.2f}"
                     f" ({test.get('sentences')} sentences, beam {test.get('beam_size')})")
    lines += ["", "## License", "",
              "Not stated. Whoever shares this model adds the license of the model and of its "
              "training data here.", "",
              "## Files", "",
              f"`{MANIFEST}` lists every file with its SHA-256; loading checks them.", ""]
    return "\n".join(lines)


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
    check_new_release(Path(o.out), o.overwrite)
    checkpoint = read_checkpoint(path)
    checkpoint.translation_weights()                # checks the weights whole first
    parameters = sum(p.numel() for p in model_skeleton(checkpoint.config).parameters())
    payload = checkpoint.payload
    card = model_card(payload, parameters, run_test_scores(path, payload))
    return write_release(payload, o.out, card=card, overwrite=o.overwrite)
