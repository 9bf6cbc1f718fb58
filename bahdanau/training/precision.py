"""The precision a run trains and decodes in: what each `--amp` name means, and what `auto` picks.

`--amp none`, `bf16` and `fp16` name themselves (`AMP_DTYPES`: the dtype `torch.autocast` runs
in, None for float32). `--amp auto` picks bf16 only where the hardware has native bf16 units
*and* a recorded decision (`AUTO_BF16`) says bf16 measured faster there and kept quality: the
default job's val BLEU at equal updates within `QUALITY_MARGIN` of float32, over three seeds
(`examples/benchmarks/amp_decision.py` runs that comparison and prints the decision to record
here). Everywhere else, and until a decision is recorded, `auto` is float32. `resolve_amp`
turns a name into the one that runs and the reason, which a training run logs on its first line.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from bahdanau.errors import InputError

# --amp's names -> the autocast dtype of `bahdanau.train_step` (None: no autocast, float32);
# "auto" resolves to one of them first (`resolve_amp`)
AMP_DTYPES: dict[str, torch.dtype | None] = {
    "none": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# the most a bf16 default may cost: val BLEU at equal updates, mean over three seeds
QUALITY_MARGIN = 0.3


class Decision(NamedTuple):
    """Whether `--amp auto` takes bf16 on one kind of bf16 unit, and the evidence."""

    bf16: bool        # adopted: measured faster and within QUALITY_MARGIN
    summary: str      # a few words for the log line
    evidence: str     # what was measured, with the command, or what is still missing


# --amp auto on each kind of native bf16 unit: the one place a measurement flips the default.
AUTO_BF16: dict[str, Decision] = {
    # a CPU with AMX tiles (Intel Sapphire Rapids and later): not measured yet
    "cpu-amx": Decision(False, "not measured yet", "no CPU with AMX was at hand"),
    # a CPU with avx512_bf16 and no AMX (here a 2-core Xeon VM): bf16 measured slower
    "cpu-avx512_bf16": Decision(False, "measured slower", (
        "measured slower: training 1,568 against 817 ms an update, beam 5 search 0.62x and "
        "greedy 0.55x float32's speed (bench_train.py --threads 1 --warmup 3 --measure 20 "
        "--amp bf16; bench_search.py --threads 1 --batch-sizes 64 --beams 1 5 --limit 256 "
        "--amp bf16); the quality runs (amp_decision.py) are not needed while it is slower")),
    # a GPU with bf16 tensor cores: not measured against the default job
    "cuda": Decision(False, "not measured yet", "the default job's quality at equal updates "
                     "in bf16 on a GPU has no three-seed run yet"),
}


def bf16_unit(device: torch.device) -> str | None:
    """The kind of native bf16 unit `device` has (a key of `AUTO_BF16`), or None."""
    if device.type == "cuda":
        return "cuda" if torch.cuda.is_bf16_supported(including_emulation=False) else None
    if device.type != "cpu":
        return None
    if torch.cpu._is_amx_tile_supported():
        return "cpu-amx"
    if torch.cpu._is_avx512_bf16_supported():
        return "cpu-avx512_bf16"
    return None


def resolve_amp(amp: str, device: torch.device) -> tuple[str, str]:
    """The --amp that runs on `device` ("none", "bf16" or "fp16") and why, in a few words:
    `amp` itself, or for "auto" what `AUTO_BF16` records for this device's bf16 unit.

    Raises:
        InputError: `amp` is not one of --amp's names.
    """
    if amp != "auto":
        if amp not in AMP_DTYPES:
            raise InputError(f"--amp must be one of {', '.join(AMP_DTYPES)}, auto, got "
                             f"{amp!r}")
        return amp, f"--amp {amp}"
    unit = bf16_unit(device)
    if unit is None:
        return "none", f"--amp auto; {device.type} has no native bf16"
    decision = AUTO_BF16[unit]
    if not decision.bf16:
        return "none", f"--amp auto; bf16 on {unit} {decision.summary}"
    return "bf16", f"--amp auto; bf16 native on {unit}, measured faster at equal quality"


def precision_line(amp: str, device: torch.device) -> str:
    """What a run logs of its precision: e.g. "float32 (--amp auto; bf16 on cpu-avx512_bf16
    measured slower)"."""
    resolved, reason = resolve_amp(amp, device)
    return f"{'float32' if resolved == 'none' else resolved} ({reason})"


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of --amp `amp` on `device` (None: float32), "auto" resolved."""
    return AMP_DTYPES[resolve_amp(amp, device)[0]]
