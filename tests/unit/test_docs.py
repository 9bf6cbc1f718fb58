"""The docs point at code that exists, by name: no line numbers, no pinned source.

* every public module, class, function and method has a docstring (what pdoc renders);
* every dotted name in backticks on a Markdown page imports
  (`bahdanau.decoder.AttentiveDecoder.step`, or a short form: `AttentiveDecoder.step`);
* every relative link of a Markdown page reaches a file, and a heading where it names one;
* pdoc builds the API reference without warnings (skipped when pdoc is not installed).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import bahdanau

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BUILD_API = DOCS / "build_api.py"

if not BUILD_API.is_file():
    pytest.skip("docs/ is not next to the tests (installed package)", allow_module_level=True)

PAGES = sorted({ROOT / "README.md", ROOT / "examples" / "README.md", *DOCS.rglob("*.md")}
               - set(DOCS.glob("_build/**/*.md")))
PAPER_MAP = DOCS / "paper-to-code.md"

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A dotted name, optionally called: `AttentiveDecoder.step`, `Vocab.build(..., max_size=30000)`.
DOTTED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?")
FILE_SUFFIXES = {"py", "md", "ipynb", "pt", "json", "txt", "png", "gz", "toml", "yml", "html"}
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


@cache
def build_api() -> Any:
    spec = importlib.util.spec_from_file_location("docs_build_api", BUILD_API)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def public_modules() -> tuple[str, ...]:
    """The modules the API reference documents (those whose optional dependency is missing are
    left out, as the build leaves them out)."""
    return tuple(build_api().public_modules()[0])


def prose(path: Path) -> str:
    """A page without its fenced code blocks (their code is run by the guide tests)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


# ---------------------------------------------------------------------------- docstrings
def _own_doc(cls: type) -> str | None:
    """The class's own docstring; None for none or the one dataclass/NamedTuple generate."""
    doc = cls.__dict__.get("__doc__")
    if not doc or doc.startswith(f"{cls.__name__}("):
        return None
    return doc


def _public_members(module: Any) -> list[tuple[str, Any]]:
    """`__all__`, else the classes and functions the module defines without a leading `_`."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name, value in vars(module).items()
                 if not name.startswith("_")
                 and (inspect.isclass(value) or inspect.isfunction(value))
                 and getattr(value, "__module__", None) == module.__name__]
    return [(f"{module.__name__}.{name}", getattr(module, name)) for name in names]


def _undocumented(qualname: str, obj: Any) -> list[str]:
    if inspect.ismodule(obj):
        return []                                     # checked as a module of its own
    if inspect.isclass(obj):
        missing = [] if _own_doc(obj) else [qualname]
        for name, member in vars(obj).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                member = member.fget
            elif isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif not inspect.isfunction(member):
                continue                              # fields, constants
            if not inspect.getdoc(getattr(obj, name)) and not inspect.getdoc(member):
                missing.append(f"{qualname}.{name}")
        return missing
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return [] if inspect.getdoc(obj) else [qualname]
    return []                                         # data: constants, type aliases


def test_every_public_name_has_a_docstring() -> None:
    modules = public_modules()
    assert {"bahdanau", "bahdanau.decoder", "bahdanau.attention", "bahdanau.engine"} <= set(
        modules)
    missing: list[str] = []
    seen: set[int] = set()
    for module_name in modules:
        module = importlib.import_module(module_name)
        if not (module.__doc__ or "").strip():
            missing.append(module_name)
        for qualname, obj in _public_members(module):
            if id(obj) not in seen:
                seen.add(id(obj))
                missing += _undocumented(qualname, obj)
    assert not missing, "public names without a docstring:\n  " + "\n  ".join(missing)


def test_every_top_level_name_is_public_and_importable() -> None:
    for name in bahdanau.__all__:
        assert hasattr(bahdanau, name), f"bahdanau.__all__ lists {name}, which is not defined"


# ---------------------------------------------------------------------------- symbol names
@cache
def roots() -> dict[str, list[Any]]:
    """The first part a short symbol may start with -> the objects it may name: `bahdanau`,
    the names of `bahdanau.__all__`, and the public classes of every public module."""
    found: dict[str, list[Any]] = {"bahdanau": [bahdanau]}
    for name in bahdanau.__all__:
        if name != "__version__":
            found.setdefault(name, []).append(getattr(bahdanau, name))
    for module_name in public_modules():
        for qualname, obj in _public_members(importlib.import_module(module_name)):
            if inspect.isclass(obj):
                candidates = found.setdefault(qualname.rsplit(".", 1)[1], [])
                if not any(obj is c for c in candidates):
                    candidates.append(obj)
    return found


@cache
def instance_attributes(cls: type) -> frozenset[str]:
    """Names a class's methods assign as `self.NAME = ...` (an `nn.Module`'s submodules and
    parameters are attributes of its instances, not of the class), and dataclass fields."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] != "bahdanau":
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                names.update(e.attr for e in elts if isinstance(e, ast.Attribute)
                             and isinstance(e.value, ast.Name) and e.value.id == "self")
    return frozenset(names)


class NeedsExtra(Exception):
    """A documented module exists but imports a package that is not installed (an extra)."""


def _attribute(owner: Any, name: str) -> tuple[bool, Any]:
    if inspect.ismodule(owner) and not hasattr(owner, name):
        module = f"{owner.__name__}.{name}"
        try:
            return True, importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module or importlib.util.find_spec(module) is None:
                return False, None                    # no such module
            raise NeedsExtra(f"{module} needs {exc.name}") from None   # it exists
    if hasattr(owner, name):
        return True, getattr(owner, name)
    if inspect.isclass(owner) and name in instance_attributes(owner):
        return True, None                             # an instance attribute: nothing beyond
    return False, None


def _walk(symbol: str) -> tuple[bool, Any]:
    """Whether a dotted name (`bahdanau.x.Y.z` or a short form from `roots`) names something,
    and what (None: nothing, or an attribute whose value is None)."""
    first, *rest = symbol.split(".")
    for obj in roots().get(first, []):
        for part in rest:
            if obj is None:
                break
            ok, obj = _attribute(obj, part)
            if not ok:
                break
        else:
            return True, obj
    return False, None


def resolves(symbol: str) -> bool:
    """Whether a dotted name (`bahdanau.x.Y.z` or a short form from `roots`) names something."""
    return _walk(symbol)[0]


def symbols(path: Path) -> list[str]:
    """The dotted names in backticks on a page whose first part is one of `roots`."""
    found = []
    for span in CODE_SPAN.findall(prose(path)):
        match = DOTTED.fullmatch(span.strip())
        if not match:
            continue
        name = match.group(1)
        if name.split(".")[0] in roots() and name.rsplit(".", 1)[-1] not in FILE_SUFFIXES:
            found.append(name)
    return found


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_symbol_on_the_page_resolves(page: Path) -> None:
    broken, unchecked = set(), set()
    for symbol in symbols(page):
        try:
            if not resolves(symbol):
                broken.add(symbol)
        except NeedsExtra as exc:                     # exists, but cannot be imported here
            unchecked.add(str(exc))
    assert not broken, (f"{rel(page)} names code that does not exist (renamed or moved? update "
                        "the page):\n  " + "\n  ".join(sorted(broken)))
    if unchecked:
        pytest.skip("the other names resolve; not checked without an optional extra: "
                    + "; ".join(sorted(unchecked)))


def test_symbol_resolution(tmp_path: Path) -> None:
    assert resolves("bahdanau.decoder.AttentiveDecoder.step")
    assert resolves("AttentiveDecoder.init_proj")           # set in __init__
    assert resolves("engine.DecoderEngine.step")
    assert resolves("bahdanau.kernels.resolve_impl")
    assert resolves("functional.maxout")
    assert resolves("DecoderEngine.features")               # a public class, short form
    assert not resolves("AttentiveDecoder.no_such_method")
    assert not resolves("bahdanau.functional.tanh_via_sigmoid")
    assert not resolves("bahdanau.no_such_module.thing")
    assert not resolves("bahdanau.kernels.no_such_module")
    page = tmp_path / "page.md"
    page.write_text("`AttentiveDecoder.step` and `Vocab.build(..., max_size=3)`, `x.y`, "
                    "`bahdanau train`, `functional.py`\n```python\n`bahdanau.nothing`\n```\n",
                    encoding="utf-8")
    assert symbols(page) == ["AttentiveDecoder.step", "Vocab.build"]


def test_a_module_needing_a_missing_extra_is_not_read_as_missing(monkeypatch) -> None:
    # without triton, `bahdanau.kernels.triton_attention` exists but cannot be imported: the
    # page tests skip it with the reason instead of calling it renamed or moved
    import bahdanau.kernels as kernels
    monkeypatch.setitem(sys.modules, "triton", None)          # `import triton` fails
    monkeypatch.delitem(sys.modules, "bahdanau.kernels.triton_attention", raising=False)
    monkeypatch.delattr(kernels, "triton_attention", raising=False)
    with pytest.raises(NeedsExtra, match=r"^bahdanau\.kernels\.triton_attention needs triton$"):
        resolves("bahdanau.kernels.triton_attention.additive_attention")
    assert not resolves("bahdanau.kernels.no_such_module")


# ---------------------------------------------------------------------------- the paper map
def _rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in text.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| paper |")]


def test_paper_map_names_code_in_every_row() -> None:
    """Each equation row names at least one symbol in its code column, and they all resolve
    (checked above); no line ranges or source links."""
    text = PAPER_MAP.read_text(encoding="utf-8")
    rows = _rows(text)
    assert len(rows) > 30
    for paper, equation, code, _notes in rows:
        names = CODE_SPAN.findall(code)
        assert names and all(n.startswith("bahdanau.") for n in names), (paper, equation, code)
    assert not re.search(r"\.py#L\d+|\.py:\d+", text), "line numbers in the paper map"


def test_paper_map_covers_the_paper() -> None:
    text = PAPER_MAP.read_text(encoding="utf-8")
    for section in ("3.1", "3.2", "A.1.1", "A.1.2", "A.2.1", "A.2.2", "B.1", "B.2", "4.1"):
        assert f"| {section} |" in text, section
    for name in ("attention.AdditiveAttention.weights", "attention.AdditiveAttention.W_a",
                 "attention.AdditiveAttention.U_a", "attention.AdditiveAttention.v_a",
                 "attention.AdditiveAttention.prepare", "functional.masked_softmax",
                 "decoder.AttentiveDecoder.init_state", "decoder.AttentiveDecoder.step",
                 "decoder.AttentiveDecoder.context", "decoder.AttentiveDecoder.update",
                 "decoder.AttentiveDecoder.readout", "functional.maxout",
                 "engine.DecoderEngine", "encoder.BiRNNEncoder", "encoder.init_recurrent_",
                 "training.make_optimizer", "config.TrainConfig.clip_norm",
                 "data.BucketBatchSampler", "search.BeamSearch"):
        assert f"`bahdanau.{name}" in text, name


# ---------------------------------------------------------------------------- links
def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)      # a link: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", path.read_text(encoding="utf-8")))
    for heading in HEADING.findall(prose(path)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(CODE_SPAN.sub("", prose(page))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):                 # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {rel(path)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{rel(page)} has broken links:\n  " + "\n  ".join(broken)


def test_link_checker(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## The `x.y` (part 2): done\n## Done\n"
                                       "## Done\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md) [b](other.md#the-xy-part-2-done) [c](other.md#done-1) "
                    "[d](#here) [e](https://example.org/x) `[f](nowhere.md)`\n"
                    "```\n[g](nowhere.md)\n```\n# Here\n[h](missing.md) [i](other.md#nope)\n",
                    encoding="utf-8")
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#nope: no heading #nope in other.md"]


# ---------------------------------------------------------------------------- pdoc
def test_api_reference_builds_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("pdoc")
    out = subprocess.run([sys.executable, str(BUILD_API), "--strict", "-o", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    for module in public_modules():
        page = tmp_path.joinpath(*module.split(".")).with_suffix(".html")
        assert page.is_file(), f"no page for {module}"
    decoder = (tmp_path / "bahdanau" / "decoder.html").read_text(encoding="utf-8")
    assert 'id="AttentiveDecoder.step"' in decoder
    # the landing page maps every module, one row each, linked to its page
    landing = (tmp_path / "bahdanau.html").read_text(encoding="utf-8")
    for module in public_modules()[1:]:
        link = "/".join(module.split(".")) + ".html"
        assert f'<td><code><a href="{link}">{module}</a></code></td>' in landing, module
    # maths rendered; NamedTuple fields with their types, not ForwardRef('Tensor')
    assert "MathJax" in (tmp_path / "bahdanau" / "functional.html").read_text(encoding="utf-8")
    assert "DecoderState</span><span class=\"signature pdoc-code multiline\">" in decoder or \
        "hidden: torch.Tensor" in re.sub(r"<[^>]+>", "", decoder)
    pages = [page.read_text(encoding="utf-8") for page in tmp_path.rglob("*.html")]
    assert not [page for page in pages if "ForwardRef" in page]


# ---------------------------------------------------------------------------- documented options
def option_table(page: Path, heading: str) -> list[str]:
    """The first column's names (in backticks) of the table under `heading` on `page`."""
    text = prose(page).split(f"\n{heading}\n", 1)[1]
    table = text.split("\n\n| ", 1)[1].split("\n\n", 1)[0]
    names: list[str] = []
    for row in _rows("| " + table):
        names += CODE_SPAN.findall(row[0])
    return names


CALL = re.compile(r"([A-Za-z_][\w.]*)\((.*)\)")
KEYWORD = re.compile(r"(?:^|[,(]\s*)([A-Za-z_]\w*)=")


def _named(symbol: str) -> Any:
    """The object a dotted name (as `resolves` reads it) names, or None."""
    return _walk(symbol)[1]


def unknown_keywords(page: Path) -> list[str]:
    """Calls in backticks on `page`, `Name(..., key=...)`, whose keyword `Name` does not take."""
    unknown = []
    for span in CODE_SPAN.findall(prose(page)):
        match = CALL.fullmatch(span.strip())
        if not match or match.group(1).split(".")[0] not in roots():
            continue
        try:
            target = _named(match.group(1))
        except NeedsExtra:                        # not importable here: the page test says so
            continue
        if not callable(target):
            continue
        parameters = inspect.signature(target).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        unknown += [f"{match.group(1)}({key}=...)" for key in KEYWORD.findall(match.group(2))
                    if key not in parameters and not takes_any]
    return unknown


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_documented_keyword_arguments_exist(page: Path) -> None:
    unknown = unknown_keywords(page)
    assert not unknown, f"{rel(page)} shows keywords that do not exist:\n  " + "\n  ".join(unknown)


def test_keyword_checker(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("`BeamSearch(bos_id=1, eos_id=2)`, `BeamSearch(beam_size=3)`, "
                    "`Vocab.build(..., max_size=30000)`, `Vocab.build(size=3)`\n",
                    encoding="utf-8")
    assert unknown_keywords(page) == ["BeamSearch(bos_id=...)", "BeamSearch(eos_id=...)",
                                      "Vocab.build(size=...)"]


def test_decoding_options_are_the_search_s_arguments() -> None:
    # the guide once listed bos_id/eos_id, which BeamSearch does not take
    documented = option_table(DOCS / "guides" / "decoding.md", "## Every option")
    fields = [f.name for f in dataclasses.fields(bahdanau.BeamSearch)]
    translate = inspect.signature(bahdanau.RNNSearch.translate).parameters
    assert documented == fields, "docs/guides/decoding.md's option table != BeamSearch's fields"
    # besides the search's settings, translate takes the batch and its phrases (per sentence)
    assert set(translate) - {"self", "src", "src_lengths", "constraints", "avoid"} == set(fields)
