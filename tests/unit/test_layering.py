"""The package's structure, held: floors import downward, and every module imports first.

* every module under bahdanau/ imports first in a fresh process, as users import it (the package,
  then the module) and on its own (bahdanau/__init__.py not run first);
* no import circle among the package's modules, counting every import statement, at module
  level or inside a function: a function-level import that closes a circle imports fine and
  hides the circle from the import tests, so the graph of statements is checked itself;
* every import statement, at module level or inside a function, reaches only a unit on a lower
  floor of `FLOORS`, or one listed before it on its own floor (docs/package-map.md draws them);
* no private name (`_name`) is taken from another module; private modules (`bahdanau._checks`)
  are fine;
* `bahdanau.config` is a leaf: it imports `bahdanau.errors`, `bahdanau._checks` and
  `bahdanau.settings` (how a setting is declared), nothing else;
* no module is longer than 650 lines, no function longer than 80;
* docs/package-map.md names every unit of `FLOORS`.

Imports under ``if TYPE_CHECKING:`` obey the same floors: a type-only import is still a
dependency of a lower floor on a higher one, and the way import circles hide. A lower floor that
needs a higher floor's type names a Protocol of its own (as `bahdanau.attention.Attention` is
the decoder's view of any attention).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from bahdanau._about import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
if (ROOT / "bahdanau" / "__init__.py").is_file():
    PACKAGE = ROOT / "bahdanau"                           # the source tree next to the tests
else:                                                     # an installed package
    PACKAGE = Path(importlib.util.find_spec("bahdanau").origin).parent
MAP = ROOT / "docs" / "package-map.md"

# The floors, bottom to top: the single source of truth, drawn in docs/package-map.md. A unit is
# a top-level module (`search`) or a subpackage with all its modules (`data`); "__init__" is
# bahdanau/__init__.py, the package's public names. A unit may import the units of lower floors
# and the units listed before it on its own floor, never one listed after it; the modules of one
# unit import each other freely (the import tests catch their circles).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves", ("errors", "_checks", "_files", "_folders", "_sealed", "_pt2_archive",
                "_progress", "_about", "_interrupt", "settings", "config", "presets")),
    ("data", ("data",)),
    # The model reads nothing of data/ (its special ids are config's); data sits below it so
    # that the floors above (scores, checkpoints, training) may read both.
    ("model", ("parts", "model_folder", "functional", "kernels", "layer_norm", "encoder",
               "attention", "decoder", "conditional_decoder", "engine", "captured_step",
               "constraints", "search", "alignments", "models", "ensemble")),
    ("scores", ("bleu_text", "phrases", "evaluate", "plot", "error_rates")),
    ("checkpoints", ("checkpoint",)),
    ("use", ("translate", "training", "serving")),
    ("jobs", ("jobs",)),
    ("commands", ("cli", "__main__")),
    ("package", ("__init__",)),
)

# (importing module, imported module) -> why it may go against the floors. None today.
UPWARD_EXCEPTIONS: dict[tuple[str, str], str] = {}

LEAF = "bahdanau.config"
LEAF_IMPORTS = {"bahdanau.errors", "bahdanau._checks", "bahdanau.settings"}

MAX_MODULE_LINES = 650
MAX_FUNCTION_LINES = 80

# Imported by some modules at module level and not installed by `pip install bahdanau`.
OPTIONAL = set(EXTRAS)
# Importing it runs the command line (`python -m bahdanau`); its imports are checked with ast.
NOT_IMPORTED = {"bahdanau.__main__"}


# ---------------------------------------------------------------------------- the modules
def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name, from its files."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def unit(module: str) -> str:
    """The unit of FLOORS a module belongs to: `bahdanau.data.vocab` -> "data"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


RANK = {name: (floor, place) for floor, (_, names) in enumerate(FLOORS)
        for place, name in enumerate(names)}
FLOOR_OF = {name: floor for floor, names in FLOORS for name in names}


@dataclass(frozen=True)
class Import:
    """One module of the package reached by an import statement of another."""

    importer: str          # bahdanau.search
    line: int
    statement: str         # from bahdanau.data.vocab import Vocab
    target: str            # bahdanau.data.vocab
    name: str | None       # the name taken from target ("Vocab"); None when target is imported

    def where(self) -> str:
        return f"{rel(modules()[self.importer])}:{self.line} `{self.statement}`"


def _source(node: ast.ImportFrom, importer: str) -> str:
    """The absolute module a `from` import reads: `from . import x` in bahdanau.data.vocab is
    `bahdanau.data`."""
    if not node.level:
        return node.module or ""
    is_package = modules()[importer].name == "__init__.py"
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def tree(module: str) -> ast.Module:
    path = modules()[module]
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@cache
def imports(module: str) -> tuple[Import, ...]:
    """Every import of a package module in `module`, wherever it is (functions included)."""
    found = []
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            found += [Import(module, node.lineno, ast.unparse(node), alias.name, None)
                      for alias in node.names if alias.name.split(".")[0] == "bahdanau"]
        elif isinstance(node, ast.ImportFrom):
            source = _source(node, module)
            if source.split(".")[0] != "bahdanau":
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules():            # from bahdanau import functional
                    found.append(Import(module, node.lineno, ast.unparse(node), submodule, None))
                else:                                 # from bahdanau.search import BeamSearch
                    found.append(Import(module, node.lineno, ast.unparse(node), source,
                                        alias.name))
    return tuple(sorted(found, key=lambda i: (i.line, i.target)))


def all_imports() -> list[Import]:
    return [i for module in modules() for i in imports(module)]


# ---------------------------------------------------------------------------- import circles
# Run as `python -c IMPORT_EACH MODULE...`. It loads the third-party modules the package loads,
# then forks one child per module and mode, so each child imports its module first: no module of
# the package is loaded before it. Mode "user": `import bahdanau.x.y` (bahdanau/__init__.py runs
# first and decides the order); mode "alone": bahdanau/__init__.py is not run, so the module's own
# imports decide the order. Prints {mode: {module: null | {"error", "missing"}}} as JSON.
IMPORT_EACH = r'''
import compileall, importlib, importlib.util, json, os, sys, tempfile, traceback, types

names = sys.argv[1:]
folder = tempfile.mkdtemp()


def import_first(name, mode):
    if mode == "alone" and name != "bahdanau":
        spec = importlib.util.find_spec("bahdanau")
        package = types.ModuleType("bahdanau")           # the package, its __init__ not run
        package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["bahdanau"] = package
    try:
        importlib.import_module(name)
    except BaseException as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        return {"error": traceback.format_exc(), "missing": missing}
    return None


def fork(job, out):
    pid = os.fork()
    if pid == 0:
        try:
            result = job()
        except BaseException:
            result = {"error": traceback.format_exc(), "missing": None}
        with open(out, "w") as f:
            json.dump(result, f)
        os._exit(0)
    return pid


def third_party():
    # Import everything once; the modules from outside the package that brought in.
    before = set(sys.modules)
    for name in names:
        import_first(name, "user")
    return sorted(n for n in sys.modules if n not in before and n.split(".")[0] != "bahdanau")


import torch  # noqa: E402,F401  (the package's heaviest dependency: loaded once, shared)

os.waitpid(fork(third_party, folder + "/third_party.json"), 0)
with open(folder + "/third_party.json") as f:
    for name in json.load(f):
        try:
            importlib.import_module(name)
        except BaseException:
            pass
sys.pycache_prefix = folder + "/pycache"     # the package compiled once, outside its tree
sys.dont_write_bytecode = False
compileall.compile_dir(importlib.util.find_spec("bahdanau").submodule_search_locations[0],
                       quiet=2)

jobs = [(mode, name) for mode in ("user", "alone") for name in names]
cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count())
workers = max(1, min(8, len(cores)))
running, results = {}, {"user": {}, "alone": {}}
for i, (mode, name) in enumerate(jobs):
    out = f"{folder}/{i}.json"
    running[fork(lambda: import_first(name, mode), out)] = (mode, name, out)
    while len(running) >= workers or (running and i == len(jobs) - 1):
        pid, _ = os.wait()
        mode_, name_, out_ = running.pop(pid)
        try:
            with open(out_) as f:
                results[mode_][name_] = json.load(f)
        except (OSError, ValueError):
            results[mode_][name_] = {"error": "the child process died", "missing": None}
print(json.dumps(results))
'''


@cache
def import_reports() -> dict[str, dict[str, dict | None]]:
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    names = [name for name in modules() if name not in NOT_IMPORTED]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", IMPORT_EACH, *names], capture_output=True,
                         text=True, timeout=600, env=env, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def failures(mode: str) -> list[str]:
    """The distinct import errors of a mode (the end of each traceback, which names the module
    and the import), each with the modules whose first import ran into it."""
    by_error: dict[str, list[str]] = {}
    for name, report in import_reports()[mode].items():
        if report and (report["missing"] or "").split(".")[0] not in OPTIONAL:
            error = "\n      ".join(report["error"].strip().splitlines()[-6:])
            by_error.setdefault(error, []).append(name)
    return [f"importing {', '.join(names[:6])}{f' and {len(names) - 6} more' * (len(names) > 6)}"
            f":\n      {error}" for error, names in by_error.items()]


def test_every_module_imports_first() -> None:
    """`python -c "import bahdanau.x.y"` works for every module, each in a fresh process."""
    failed = failures("user")
    assert not failed, ("a module fails to import first (`python -c 'import MODULE'`), an "
                        "import circle?\n  " + "\n  ".join(failed))


def test_every_module_imports_on_its_own() -> None:
    """Every module imports first with bahdanau/__init__.py not run before it, so the order
    that the package's own imports happen to set up does not hide a circle."""
    failed = failures("alone")
    assert not failed, ("a module fails to import first without bahdanau/__init__.py run "
                        "before it, an import circle?\n  " + "\n  ".join(failed))


def import_graph() -> dict[str, dict[str, Import]]:
    """importer -> {imported module: the first statement that imports it}, for every import
    statement of the package (functions and ``if TYPE_CHECKING:`` blocks included)."""
    graph: dict[str, dict[str, Import]] = {module: {} for module in modules()}
    for i in all_imports():
        if i.target in modules() and i.target != i.importer:
            graph[i.importer].setdefault(i.target, i)
    return graph


def import_circles(graph: dict[str, dict[str, Import]]) -> list[list[Import]]:
    """One circle of statements through each group of modules that reach each other
    (Tarjan's strongly connected components, then a shortest way back within the group)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:              # the package's graph is a few hundred deep
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_circle_through(group[0], set(group), graph) for group in groups]


def _circle_through(start: str, group: set[str], graph: dict[str, dict[str, Import]]
                    ) -> list[Import]:
    """The shortest chain of import statements from `start` back to it, inside `group`."""
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target, statement in graph[module].items():
                if target == start:
                    return paths[module] + [statement]
                if target in group and target not in paths:
                    paths[target] = paths[module] + [statement]
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in a circle it cannot get back to")


def test_no_import_circle_even_through_function_level_imports() -> None:
    circles = import_circles(import_graph())
    described = [" -> ".join([c[0].importer, *(i.target for i in c)]) + "\n      "
                 + "\n      ".join(i.where() for i in c) for c in circles]
    assert not circles, ("import circles among the package's modules (a function-level import "
                         "hides one from the import tests; move the shared piece down, or "
                         "take the call up to the caller):\n  " + "\n  ".join(described))


# ---------------------------------------------------------------------------- floors
def test_floors_name_every_unit() -> None:
    units = {unit(name) for name in modules()}
    listed = [name for _, names in FLOORS for name in names]
    assert len(listed) == len(set(listed)), f"a unit is listed twice in FLOORS: {listed}"
    assert not units - set(listed), (f"units missing from FLOORS in tests/unit/test_layering.py: "
                                     f"{sorted(units - set(listed))}; add each on its floor")
    assert not set(listed) - units, (f"FLOORS lists units that do not exist: "
                                     f"{sorted(set(listed) - units)}")


def upward(i: Import) -> bool:
    """Whether an import goes against FLOORS."""
    here, there = unit(i.importer), unit(i.target)
    if here == there or (i.importer, i.target) in UPWARD_EXCEPTIONS:
        return False
    return there not in RANK or here not in RANK or RANK[there] >= RANK[here]


def _against(i: Import) -> str:
    here, there = unit(i.importer), unit(i.target)
    if FLOOR_OF.get(here) == FLOOR_OF.get(there):
        return f"{here} imports {i.target}, listed after it on floor {FLOOR_OF[here]!r}"
    return (f"{here} (floor {FLOOR_OF.get(here)!r}) imports {i.target} "
            f"(floor {FLOOR_OF.get(there)!r}, not below it)")


def test_layers_only_import_downward() -> None:
    bad = [f"{i.where()}: {_against(i)}" for i in all_imports() if upward(i)]
    assert not bad, ("imports against the floors (FLOORS in tests/unit/test_layering.py, drawn "
                     "in docs/package-map.md):\n  " + "\n  ".join(bad)
                     + "\nmove the shared piece down, or take the call up to the caller")


def test_exceptions_are_still_needed() -> None:
    used = {(i.importer, i.target) for i in all_imports()}
    stale = sorted(set(UPWARD_EXCEPTIONS) - used)
    assert not stale, f"UPWARD_EXCEPTIONS lists imports that are gone: {stale}"


# ---------------------------------------------------------------------------- private names
def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(module: str) -> list[str]:
    """`from bahdanau.x import _name`, and `x._name` on a module of the package, in `module`."""
    found = [f"{i.where()}: takes {i.name} from {i.target}" for i in imports(module)
             if i.name and _is_private(i.name) and i.target != module]
    aliases: dict[str, str] = {}                       # local name -> module it names
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.split(".")[0] == "bahdanau":
                    aliases[alias.asname] = alias.name     # import bahdanau.x.y as z
                elif alias.name.split(".")[0] == "bahdanau":
                    aliases["bahdanau"] = "bahdanau"       # import bahdanau.x.y
        elif isinstance(node, ast.ImportFrom):
            source = _source(node, module)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules():
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            dotted = _dotted(node.value)
            if not dotted or dotted.split(".")[0] not in aliases:
                continue
            head, *rest = dotted.split(".")
            owner = ".".join([aliases[head], *rest])
            if owner in modules() and owner != module:
                found.append(f"{rel(modules()[module])}:{node.lineno} `{ast.unparse(node)}`: "
                             f"reads {node.attr} of {owner}")
    return found


def test_no_private_name_crosses_modules() -> None:
    bad = [use for module in modules() for use in private_uses(module)]
    assert not bad, ("private names used outside their module (make the name public where it "
                     "is defined, or keep the use inside it):\n  " + "\n  ".join(bad))


# ---------------------------------------------------------------------------- config
def test_config_is_a_leaf() -> None:
    reached = imports(LEAF)
    data = [i.where() for i in reached if unit(i.target) == "data"]
    assert not data, (f"{LEAF} imports bahdanau.data: " + "; ".join(data) + ". config is the "
                      "leaf every floor reads; what data shares with it (the special ids) is "
                      "defined in config and read by data, never the other way")
    others = [i.where() for i in reached if i.target not in LEAF_IMPORTS]
    assert not others, (f"{LEAF} may import only {sorted(LEAF_IMPORTS)}:\n  "
                        + "\n  ".join(others))


# ---------------------------------------------------------------------------- sizes
def test_no_module_over_the_line_limit() -> None:
    long = [f"{rel(path)}: {n} lines" for path in modules().values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, (f"modules over {MAX_MODULE_LINES} lines (one idea per module; split "
                      "it):\n  " + "\n  ".join(long))


def function_lengths(module: str) -> dict[str, int]:
    """Lines from `def` to the last line of every function and method, by qualified name."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name)
            else:
                visit(child, prefix)

    visit(tree(module), module)
    return lengths


def long_functions() -> dict[str, str]:
    return {name: f"{name} ({rel(path)}): {n} lines"
            for module, path in modules().items()
            for name, n in function_lengths(module).items() if n > MAX_FUNCTION_LINES}


def test_no_function_over_the_line_limit() -> None:
    long = long_functions()
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split into named "
                      "steps):\n  " + "\n  ".join(long.values()))


# ---------------------------------------------------------------------------- the map
def test_package_map_names_every_unit() -> None:
    if not MAP.parent.is_dir():
        pytest.skip("docs/ is not next to the tests (installed package)")
    text = MAP.read_text(encoding="utf-8")
    missing = [name for _, names in FLOORS for name in names if name not in
               {"__init__", "__main__"} and f"`bahdanau.{name}" not in text]
    assert not missing, f"{MAP.name} does not name these units of FLOORS: {missing}"
