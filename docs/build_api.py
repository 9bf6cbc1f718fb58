"""Build the HTML API reference of `bahdanau` with pdoc.

    pip install -e ".[docs]"
    python docs/build_api.py                  # into docs/_build/api/ (git-ignored)
    python docs/build_api.py -o DIR --strict  # exit status 1 on any pdoc warning

Every public module is documented: pdoc itself follows a package's `__all__`, which for
`bahdanau` lists the top-level names and only two submodules, so this script finds the modules
with pkgutil (new modules are picked up without editing it) and hands them to `pdoc.pdoc`.
Docstrings are Google style. A module whose optional dependency is missing (triton) is left out
with a note.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pkgutil
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "_build" / "api"
OPTIONAL = {"triton", "matplotlib"}       # extras a module may need at import time

# pdoc warnings that are pdoc's own limitations, not faults of our docstrings or imports.
KNOWN = [
    # typing.NamedTuple + `from __future__ import annotations`: the generated __init__'s
    # annotations cannot be evaluated (mitmproxy/pdoc#765); the signature still renders.
    re.compile(r"Error parsing type annotation ForwardRef\(.*\) for [\w.]+\.__init__\."),
]


def public_modules(package: str = "bahdanau") -> tuple[list[str], dict[str, str]]:
    """Every importable module of `package` with no `_`-prefixed part, and those left out.

    Returns:
        The module names, package first, and {module: reason} for modules whose optional
        dependency is not installed.
    """
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.")
                         if not any(p.startswith("_") for p in m.name.split("."))]
    kept, skipped = [], {}
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in OPTIONAL:
                raise
            skipped[name] = f"needs {exc.name}"
            continue
        kept.append(name)
    return kept, skipped


def build(output: Path) -> list[str]:
    """Render every public module into `output`; returns pdoc's warnings, known ones removed."""
    import pdoc
    import pdoc.extract

    modules, skipped = public_modules()
    for name, reason in skipped.items():
        print(f"left out {name}: {reason}", file=sys.stderr)
    specs: list[str] = []
    covered: set[str] = set()
    for name in modules:                   # pdoc walks a package's own __all__ submodules
        if name not in covered:            # too; skip those so no module is added twice
            specs.append(name)
            covered.update(pdoc.extract.walk_specs([name]))
    pdoc.render.configure(docformat="google", footer_text=f"bahdanau {_version()}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*specs, output_directory=output)
    messages = [str(w.message) for w in caught]
    return [m for m in messages if not any(k.search(m) for k in KNOWN)]


def _version() -> str:
    return importlib.import_module("bahdanau").__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT,
                        help=f"output folder (default: {OUTPUT.relative_to(ROOT)})")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 if pdoc warns (import errors, bad annotations)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("pdoc") is None:
        print('pdoc is not installed: pip install -e ".[docs]"', file=sys.stderr)
        return 2
    problems = build(args.output)
    for message in problems:
        print(f"pdoc warning: {message}", file=sys.stderr)
    print(f"wrote {args.output / 'index.html'}")
    return 1 if problems and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
