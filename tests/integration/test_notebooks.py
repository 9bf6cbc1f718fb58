"""The example notebooks in examples/ run end to end, in their small (CI) setting.

Each notebook is executed by nbclient in a fresh kernel; any cell error fails the test. The
kernel is the `python3` kernel, which jupyter_client starts with this interpreter
(`sys.executable`), so the notebooks see the same environment as the tests. The kernel's
environment sets `BAHDANAU_EXAMPLE_SCALE=1` (the small setting the notebooks document),
a non-interactive matplotlib backend, and `TRITON_INTERPRET=1` when no CUDA device is available.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT_S = 300   # per cell; a notebook is meant to take well under a minute in all

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["BAHDANAU_EXAMPLE_SCALE"] = "1"
    env["MPLBACKEND"] = "Agg"                      # no display: figures are drawn, not shown
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(name: str, env: dict[str, str] | None = None) -> Any:
    """Execute the notebook `name`; returns it with its outputs."""
    path = EXAMPLES / name
    if not path.is_file():
        pytest.skip(f"{path} is not next to the tests (installed package)")
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:                    # stored without outputs
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{name}: a code cell has stored outputs; clear them before committing")
    # One more cell, in memory only: which interpreter did the kernel run?
    notebook.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.prefix)"))
    client = nbclient.NotebookClient(
        notebook, timeout=TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    start = time.perf_counter()
    client.execute(env=env or _kernel_env())      # raises CellExecutionError on any error
    print(f"{name}: {time.perf_counter() - start:.1f} s")
    prefix = notebook.cells[-1].outputs[0]["text"].strip()
    assert Path(prefix) == Path(sys.prefix), (
        f"the kernel ran in the environment {prefix}, not in this one ({sys.prefix})")
    return notebook


@pytest.mark.notebook
def test_quickstart() -> None:
    """It runs, and its training cell shows the log lines it promises, which the library logs
    to the `bahdanau` logger: one every log_every = 400 // 5 updates, so five when all 400
    updates run, and one per 80 updates done when its time cap stops it first (a busy
    machine)."""
    notebook = _run("01_quickstart.ipynb")
    [cell] = [c for c in notebook.cells if c.cell_type == "code" and "= train(" in c.source]
    text = "".join(out.get("text", "") for out in cell.outputs if out["output_type"] == "stream")
    logged = [int(line.split()[1]) for line in text.splitlines()
              if line.startswith("step ") and "loss" in line]
    done = re.search(r"^(\d+) updates in .* \(stopped by (\w+)\)", text, re.M)
    assert done is not None, text
    updates, stopped = int(done[1]), done[2]
    assert (updates, stopped) == (400, "max_steps") or stopped == "max_time", text
    assert logged == list(range(80, updates + 1, 80)), text


@pytest.mark.notebook
def test_custom_pipeline() -> None:
    _run("02_custom_pipeline.ipynb")


@pytest.mark.notebook
def test_rnnsearch_vs_rnnencdec() -> None:
    _run("03_rnnsearch_vs_rnnencdec.ipynb")


@pytest.mark.notebook
def test_fused_attention() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install 'bahdanau[triton]')")
    env = _kernel_env()
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"              # the CPU interpreter: checks, not speed
    _run("04_fused_attention.ipynb", env)
