"""--amp's names and what --amp auto picks (`bahdanau.training.precision`), on simulated
hardware: bf16 only where the device has a native bf16 unit and the recorded decision for that
unit adopted it; float32 everywhere else."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from training_fixtures import one_line_error

from bahdanau.jobs.resolve import autocast
from bahdanau.training import precision
from bahdanau.training.precision import Decision, amp_dtype, precision_line, resolve_amp

CPU = torch.device("cpu")


@pytest.mark.parametrize("name, dtype", [("none", None), ("bf16", torch.bfloat16),
                                         ("fp16", torch.float16)])
def test_the_named_precisions_name_themselves(name, dtype) -> None:
    assert resolve_amp(name, CPU) == (name, f"--amp {name}")
    assert amp_dtype(name, CPU) is dtype
    one_line_error(lambda: resolve_amp("bf32", CPU), "--amp must be one of none, bf16, fp16, auto",
                   "'bf32'")


def test_auto_is_bf16_only_on_a_native_unit_with_an_adopted_decision(monkeypatch) -> None:
    monkeypatch.setattr(precision, "bf16_unit", lambda device: None)
    assert resolve_amp("auto", CPU) == ("none", "--amp auto; cpu has no native bf16")
    monkeypatch.setattr(precision, "bf16_unit", lambda device: "cpu-amx")
    monkeypatch.setitem(precision.AUTO_BF16, "cpu-amx", Decision(False, "not measured yet", ""))
    assert resolve_amp("auto", CPU) == ("none", "--amp auto; bf16 on cpu-amx not measured yet")
    assert isinstance(autocast("auto", CPU), nullcontext)
    assert precision_line("auto", CPU) == "float32 (--amp auto; bf16 on cpu-amx not measured yet)"
    monkeypatch.setitem(precision.AUTO_BF16, "cpu-amx", Decision(True, "faster", ""))
    assert resolve_amp("auto", CPU)[0] == "bf16" and amp_dtype("auto", CPU) is torch.bfloat16
    context = autocast("auto", CPU)
    assert isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16
    assert precision_line("auto", CPU).startswith("bf16 (--amp auto; bf16 native on cpu-amx")


def test_every_bf16_unit_has_a_decision_and_this_machine_names_its_own() -> None:
    """A unit `bf16_unit` can report always has a recorded decision (else auto would fail)."""
    assert precision.bf16_unit(CPU) in (None, *precision.AUTO_BF16)
    assert precision.bf16_unit(torch.device("meta")) is None
    amx, avx512 = torch.cpu._is_amx_tile_supported(), torch.cpu._is_avx512_bf16_supported()
    assert precision.bf16_unit(CPU) == ("cpu-amx" if amx else "cpu-avx512_bf16" if avx512
                                        else None)

