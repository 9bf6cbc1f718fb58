"""The generated docs (docs/paper-to-code.md, docs/api.md) are current and point at the code."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bahdanau

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "docs" / "generate.py"
HOW = "regenerate with `python docs/generate.py` and commit the result"

if not GENERATOR.is_file():
    pytest.skip("docs/ is not next to the tests (installed package)", allow_module_level=True)


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("docs_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclass/NamedTuple creation looks it up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("name", ["paper-to-code.md", "api.md"])
def test_generated_file_is_current(gen, name: str) -> None:
    path = ROOT / "docs" / name
    assert path.is_file(), f"docs/{name} is missing: {HOW}"
    expected = gen.OUTPUTS[name]()
    committed = path.read_text(encoding="utf-8")
    if committed != expected:
        pairs = zip(committed.splitlines(), expected.splitlines(), strict=False)
        diff = [f"line {i + 1}:\n  committed: {a}\n  generated: {b}"
                for i, (a, b) in enumerate(pairs) if a != b][:3]
        pytest.fail(f"docs/{name} is stale: {HOW}.\nFirst differences:\n" + "\n".join(diff))


def test_every_top_level_name_is_documented() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    index = text.split("## `bahdanau`: the top-level names", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| \[?`([^`]+)`", index, re.M))
    assert rows == set(bahdanau.__all__)
    headings = set(re.findall(r"^### `([^`]+)`", text, re.M))
    modules = set(re.findall(r"^## `(bahdanau\.[a-z_]+)`", text, re.M))
    for name in bahdanau.__all__:
        obj = getattr(bahdanau, name)
        if name == "__version__":
            continue
        if hasattr(obj, "__path__") or type(obj).__name__ == "module":
            assert obj.__name__ in modules, name
        else:
            assert name in headings, f"{name} has no section in docs/api.md"


@pytest.mark.parametrize("module", ["functional", "search", "data", "train", "checkpoint",
                                    "evaluate", "plot", "datasets", "presets", "config",
                                    "kernels"])
def test_submodule_public_names_are_documented(module: str) -> None:
    """Every public function and class a user imports from a submodule has a section."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split(f"## `bahdanau.{module}`\n", 1)[1].split("\n## `", 1)[0]
    mod = importlib.import_module(f"bahdanau.{module}")
    names = getattr(mod, "__all__", None) or [
        n for n, v in vars(mod).items()
        if not n.startswith("_") and callable(v) and getattr(v, "__module__", "") == mod.__name__]
    assert names
    for name in names:
        assert f"`{name}`" in section, f"bahdanau.{module}.{name} missing from docs/api.md"


def _spans(path: Path) -> dict[str, tuple[int, int]]:
    """Every function and class of a file: qualified name -> (first line incl. decorators, last)."""
    spans: dict[str, tuple[int, int]] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                spans[prefix + child.name] = (first, child.end_lineno)
                walk(child, prefix + child.name + ".")

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return spans


def test_paper_map_line_ranges_point_at_the_named_code() -> None:
    """Each link's lines hold what its label names, checked with ast, not with inspect."""
    text = (ROOT / "docs" / "paper-to-code.md").read_text(encoding="utf-8")
    links = re.findall(r"`([\w.]+)` \[[\w.]+:[\d-]+\]\(\.\./(bahdanau/[\w/]+\.py)#L(\d+)"
                       r"(?:-L(\d+))?\)", text)
    assert len(links) > 60
    for label, rel, first, last in links:
        path = ROOT / rel
        first, last = int(first), int(last or first)
        spans = _spans(path)
        lines = path.read_text(encoding="utf-8").splitlines()
        name = label.split(".", 1)[1] if label.split(".")[0] in (
            "functional", "presets", "encoder") else label
        if name in spans and first != last:              # a whole function or class
            assert spans[name] == (first, last), (label, rel, first, last, spans[name])
        elif name in spans:                               # one line inside it
            start, end = spans[name]
            assert start <= first <= end, (label, rel, first)
        else:                                             # an attribute: Class.attr
            owner, attr = name.rsplit(".", 1)
            start, end = spans[owner]
            assert start <= first <= end and re.search(rf"\b{attr}\b", lines[first - 1]), (
                label, rel, first, lines[first - 1])


def test_paper_map_covers_the_appendix() -> None:
    text = (ROOT / "docs" / "paper-to-code.md").read_text(encoding="utf-8")
    for section in ("A.1.1", "A.1.2", "A.2.1", "A.2.2", "B.1", "B.2"):
        assert f"| {section} |" in text, section
    for code_name in ("AdditiveAttention.W_a", "AdditiveAttention.U_a", "AdditiveAttention.v_a",
                      "AdditiveAttention.precompute_keys", "AttentiveDecoder.init_proj",
                      "functional.maxout", "AttentiveDecoder.readout_state",
                      "AttentiveDecoder.output", "encoder.init_recurrent_", "make_optimizer"):
        assert f"`{code_name}`" in text, code_name


def test_stale_file_is_reported(gen, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(gen, "OUTPUTS", {"page.md": lambda: "current\n"})
    monkeypatch.setattr(gen, "DOCS", tmp_path)
    assert gen.main(["--check"]) == 1                          # missing counts as stale
    assert gen.main([]) == 0
    assert (tmp_path / "page.md").read_text(encoding="utf-8") == "current\n"
    assert gen.main(["--check"]) == 0
    (tmp_path / "page.md").write_text("old\n", encoding="utf-8")
    assert gen.main(["--check"]) == 1
    assert "stale: page.md; run `python docs/generate.py`" in capsys.readouterr().err
    assert (tmp_path / "page.md").read_text(encoding="utf-8") == "old\n"   # --check writes nothing


def test_locate_rejects_a_needle_that_is_gone(gen) -> None:
    from bahdanau import functional

    where = gen.locate(functional.maxout)
    source = (ROOT / "bahdanau" / "functional.py").read_text(encoding="utf-8").splitlines()
    assert source[where.first - 1].startswith("def maxout(")
    with pytest.raises(LookupError, match="update PAPER_MAP"):
        gen.locate(functional.maxout, "no such text")


def test_render_doc_google_sections(gen) -> None:
    doc = '''Summary line with <unk> and `<s>`.

    Details::

        code = 1

    Args:
        x: (B, S) ids,
            continued.
        a, b: pair.
    Returns:
        The answer
        on two lines.
    Raises:
        ValueError: bad x.
    '''
    assert gen.render_doc(doc) == (
        "Summary line with &lt;unk> and `<s>`.\n\nDetails:\n\n```text\ncode = 1\n```\n\n"
        "**Args**\n\n- `x`: (B, S) ids, continued.\n- `a, b`: pair.\n\n"
        "**Returns**\n\nThe answer on two lines.\n\n**Raises**\n\n- `ValueError`: bad x.\n")


def test_slug_matches_github_anchors(gen) -> None:
    seen: dict[str, int] = {}
    assert gen.slug("`bahdanau.search`", seen) == "bahdanausearch"
    assert gen.slug("`greedy_search`", seen) == "greedy_search"
    assert gen.slug("`greedy_search`", seen) == "greedy_search-1"


def test_generator_never_imports_triton() -> None:
    code = ("import runpy, sys\n"
            f"g = runpy.run_path({str(GENERATOR)!r}, run_name='docs_generate')\n"
            "g['api_reference']()\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m == 'triton' or m.endswith('triton_attention')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
