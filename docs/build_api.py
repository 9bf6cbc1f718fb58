"""Build the HTML API reference of `bahdanau` with pdoc.

    pip install -e ".[docs]"
    python docs/build_api.py                  # into docs/_build/api/ (git-ignored)
    python docs/build_api.py -o DIR --strict  # exit status 1 on any pdoc warning

Every public module is documented: pdoc itself follows a package's `__all__`, which for
`bahdanau` lists the top-level names and only two submodules, so this script finds the modules
with pkgutil (new modules are picked up without editing it) and hands them to `pdoc.pdoc`.
Docstrings are Google style; formulas between ``$`` signs are rendered (MathJax). A module whose
optional dependency is missing (triton) is left out with a note, and pdoc is told not to walk
into it.

The landing page (``index.html`` opens the package's page) is the package docstring followed by
a module map: every documented module in one line, the first line of its docstring, generated
here so that it never misses a module. NamedTuple fields are shown with their types (pdoc cannot
evaluate the string annotations of the ``__new__`` that `typing.NamedTuple` generates, and would
show ``ForwardRef('Tensor')``): this script resolves them first, in their module.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pkgutil
import re
import sys
import typing
import warnings
from pathlib import Path

from bahdanau._about import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "_build" / "api"
OPTIONAL = set(EXTRAS)      # extras a module may need at import time

# pdoc warnings that are pdoc's own limitations, not faults of our docstrings or imports.
KNOWN: list[re.Pattern[str]] = []


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


def module_map(modules: list[str]) -> str:
    """A Markdown table of `modules` but the first (the package), one row each: the name (pdoc
    links it) and the first line of its docstring."""
    rows = ["| module | what it holds |", "| --- | --- |"]
    for name in modules[1:]:              # the package itself is the page they are on
        doc = (importlib.import_module(name).__doc__ or "").strip()
        first = doc.split("\n\n", 1)[0].replace("\n", " ").replace("|", "\\|")
        rows.append(f"| `{name}` | {first} |")
    return "\n".join(rows)


def resolve_namedtuple_fields(modules: list[str]) -> None:
    """Give the generated ``__new__`` of each NamedTuple in `modules` its fields' real types
    (from `typing.get_type_hints` in the class's module) instead of the strings that
    ``from __future__ import annotations`` leaves, which pdoc cannot evaluate there."""
    for name in modules:
        for value in vars(importlib.import_module(name)).values():
            if (isinstance(value, type) and issubclass(value, tuple)
                    and hasattr(value, "_fields") and value.__module__ == name):
                hints = typing.get_type_hints(value)
                value.__new__.__annotations__ = {
                    field: hints[field] for field in value._fields if field in hints}


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
    specs += [f"!{re.escape(name)}$" for name in skipped]   # nor into a module left out
    resolve_namedtuple_fields(modules)
    package = importlib.import_module(modules[0])
    package.__doc__ = (f"{(package.__doc__ or '').rstrip()}\n\n## Module map\n\n"
                       f"{module_map(modules)}\n")
    pdoc.render.configure(docformat="google", math=True,
                          footer_text=f"bahdanau {_version()}")
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
