"""The public package: lean import, complete __all__, typed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import bahdanau
from bahdanau._about import EXTRAS


def test_import_is_lean() -> None:
    """`import bahdanau` loads no optional extra (beyond what torch itself loads: torch.hub
    imports tqdm when it is installed) and does not touch CUDA."""
    code = ("import sys, torch\n"
            "before = set(sys.modules)\n"
            "import bahdanau\n"
            "from bahdanau._about import EXTRAS\n"
            "print(sorted(m for m in EXTRAS if m in set(sys.modules) - before),"
            " torch.cuda.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[] False"


@pytest.mark.parametrize("argv0", ["bahdanau", "/usr/local/bin/bahdanau"])
def test_version_is_answered_without_torch(argv0) -> None:
    """`bahdanau --version` (the console script: the CLI's entry imported with that command
    line) prints the version without importing torch (about 3 s); imported by a program, or
    with another command line, the package loads as before."""
    code = ("import sys\n"
            f"sys.argv = [{argv0!r}, '--version']\n"
            "try:\n"
            "    from bahdanau.cli import main\n"
            "    main()\n"
            "except SystemExit as stop:\n"
            "    print(stop.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout == f"bahdanau {bahdanau.__version__}\n0 False\n", out.stderr
    module = subprocess.run([sys.executable, "-m", "bahdanau", "--version"],
                            capture_output=True, text=True, timeout=120, check=True)
    assert module.stdout == f"bahdanau {bahdanau.__version__}\n"
    library = ("import sys; sys.argv = ['prog', '--version']; import bahdanau; "
               "print('torch' in sys.modules, bahdanau.RNNSearch.__name__)")
    out = subprocess.run([sys.executable, "-c", library], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout == "True RNNSearch\n"


def test_extras_are_pyproject_optional_dependencies() -> None:
    """`bahdanau._about.EXTRAS` names every extra of pyproject.toml a user installs, and one of
    each extra's packages provides the module it is listed under (onnx: the runtime, beside the
    exporter's packages)."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    pyproject = Path(bahdanau.__file__).parents[1] / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("pyproject.toml is not next to the package (installed package)")
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    assert set(EXTRAS.values()) == set(extras) - {"test", "docs", "dev"}   # tools, and all of them
    for module, extra in EXTRAS.items():
        names = {re.split(r"[<>=!~ \[]", requirement)[0].lower()
                 for requirement in extras[extra]}
        assert names & {module, "pyyaml"}, (module, extra, extras[extra])


def test_all_names_exist() -> None:
    missing = [name for name in bahdanau.__all__ if not hasattr(bahdanau, name)]
    assert missing == []
    assert len(set(bahdanau.__all__)) == len(bahdanau.__all__)


def test_py_typed_ships() -> None:
    assert (Path(bahdanau.__file__).parent / "py.typed").is_file()
