"""Every benchmark script imports (what it uses of the library still exists) and prints its
--help: they are run by hand, so nothing else would notice a stale import."""

from __future__ import annotations

import json
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


def test_gpu_suite_smoke_runs_every_path_on_the_cpu(tmp_path) -> None:
    """`gpu_suite.py --smoke`: every section and path at tiny sizes on the CPU, no row failing;
    what needs a GPU says so; each path's update agrees with float64 to its precision."""
    out = tmp_path / "suite.json"
    script = Path(__file__).parents[2] / "examples" / "benchmarks" / "gpu_suite.py"
    result = subprocess.run([sys.executable, str(script), "--smoke", "--json", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert not [row for row in rows if "error" in row], result.stdout[-3000:]
    assert {row["section"] for row in rows} == {"check", "train", "attention", "decode"}
    for row in rows:
        if "graphs" in row["name"].split(" | ")[0].split():
            assert row.get("skipped") == "CUDA graphs need a GPU", row
    checks = [row for row in rows if row["section"] == "check" and "skipped" not in row]
    assert len(checks) >= 4
    for row in checks:        # the tiny model's errors stay within a few tens of roundoffs
        assert row["grad_rel"] < 30 * row["unit_roundoff"], row
    train = [row for row in rows if row["section"] == "train" and "skipped" not in row]
    assert train and all(row["tok_s"] > 0 for row in train)
    assert "=" * 100 in result.stdout                     # the closing table


def test_constraints_smoke_holds_every_constraint(tmp_path) -> None:
    """`bench_constraints.py --smoke`: an untrained tiny model on a few test sentences; every
    constraint taken from the references is held, and each row has its BLEU and time."""
    out = tmp_path / "constraints.json"
    script = Path(__file__).parents[2] / "examples" / "benchmarks" / "bench_constraints.py"
    result = subprocess.run([sys.executable, str(script), "--smoke", "--limit", "12",
                             "--max-len", "16", "--repeats", "1", "--threads", "1",
                             "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert [row["constraints"] > 0 for row in rows] == [False, True, True]
    assert all(row["held"] == row["constraints"] for row in rows)
    assert rows[2]["constraints"] > rows[1]["constraints"]
    assert all(row["seconds"] > 0 and row["bleu"] >= 0 and row["decoder_rows"] > 0 for row in rows)
