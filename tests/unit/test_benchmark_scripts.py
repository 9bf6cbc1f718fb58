"""Every benchmark script imports (what it uses of the library still exists) and prints its
--help: they are run by hand, so nothing else would notice a stale import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[2] / "examples" / "benchmarks").glob("*.py"))


def test_there_are_benchmark_scripts() -> None:
    assert len(SCRIPTS) >= 7


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_script_imports_and_has_help(script) -> None:
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
