"""The public package: lean import, complete __all__, typed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bahdanau


def test_import_is_lean() -> None:
    code = ("import sys, torch, bahdanau\n"
            "optional = ('triton', 'matplotlib', 'sentencepiece', 'tensorboard')\n"
            "print(sorted(m for m in optional if m in sys.modules), torch.cuda.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[] False"


def test_all_names_exist() -> None:
    missing = [name for name in bahdanau.__all__ if not hasattr(bahdanau, name)]
    assert missing == []
    assert len(set(bahdanau.__all__)) == len(bahdanau.__all__)


def test_py_typed_ships() -> None:
    assert (Path(bahdanau.__file__).parent / "py.typed").is_file()
