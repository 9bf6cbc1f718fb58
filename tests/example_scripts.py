"""The scripts under examples/, imported as modules by the tests that check them.

Importable from any test module (`pythonpath = ["tests"]` in pyproject.toml).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).parents[1] / "examples"


def load_example(relative: str) -> ModuleType:
    """The script examples/`relative` as a module, registered under its file name (its
    dataclasses need to find their module)."""
    path = EXAMPLES / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
