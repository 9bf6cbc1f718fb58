"""The guides in docs/guides run as written: every Python block, and every `bahdanau` command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bahdanau._about import EXTRAS
from bahdanau.cli import _COMMANDS, _config_file, build_parser
from bahdanau.errors import InputError
from bahdanau.jobs import TrainOptions

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GUIDES = ["own-corpus.md", "decoding.md", "alignments.md", "multi-gpu.md", "fused-kernel.md",
          "characters.md", "scoring.md", "own-attention.md"]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)

if not DOCS.is_dir():
    pytest.skip("docs/ is not next to the tests (installed package)", allow_module_level=True)


# The extras a guide's block may import (pyproject.toml's optional-dependencies): without one, the
# guide's blocks are skipped with the reason.
OPTIONAL = set(EXTRAS)


def blocks(path: Path, info: str) -> list[str]:
    """The bodies of the fenced blocks of `path` whose info string is exactly `info`."""
    return [body for tag, body in FENCE.findall(path.read_text(encoding="utf-8"))
            if tag.strip() == info]


@pytest.mark.parametrize("guide", GUIDES)
def test_python_blocks_run(guide: str, tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    path = DOCS / "guides" / guide
    code = blocks(path, "python")
    assert code, f"{guide} has no runnable python block"
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):   # the multi-GPU script runs as one process
        monkeypatch.delenv(var, raising=False)
    namespace: dict[str, object] = {"__name__": "__main__"}
    for i, body in enumerate(code):
        try:
            exec(compile(body, f"{path}:block{i + 1}", "exec"), namespace)
        except ModuleNotFoundError as exc:
            if exc.name not in OPTIONAL:
                raise AssertionError(f"{guide}, python block {i + 1} failed: {exc!r}") from exc
            pytest.skip(f"{guide}, python block {i + 1} needs {exc.name}, an optional extra "
                        "that is not installed")
        except Exception as exc:                                     # name the block
            raise AssertionError(f"{guide}, python block {i + 1} failed: {exc!r}") from exc


def test_guides_exclude_only_marked_blocks() -> None:
    """Python blocks are either run or explicitly marked `python no-run`."""
    for guide in GUIDES:
        tags = {tag.strip() for tag, _ in FENCE.findall((DOCS / "guides" / guide).read_text())}
        assert tags <= {"python", "python no-run", "bash", "yaml"}, (guide, tags)


def _commands(text: str) -> list[list[str]]:
    """`bahdanau ...` commands of bash blocks (continuations joined, after any pipe), and
    those that `torchrun ... -m bahdanau ...` starts."""
    out = []
    for body in (b for tag, b in FENCE.findall(text) if tag.strip() == "bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].split("|")[-1].strip()
            if line.startswith("torchrun ") and " -m bahdanau " in line:
                line = "bahdanau " + line.split(" -m bahdanau ", 1)[1]
            if line.startswith("bahdanau "):
                out.append(shlex.split(line)[1:])
    return out


@pytest.mark.parametrize("page", [*(f"guides/{g}" for g in GUIDES), "README.md",
                                  "../README.md", "default-job.md", "multi30k.md"])
def test_bahdanau_commands_parse(page: str) -> None:
    """Every option a page shows exists, with a valid value (argparse exits 2 otherwise), and
    the options of each command agree with one another (a train command on the user's own
    corpus names its length), as `bahdanau` checks them before it reads any file."""
    commands = _commands((DOCS / page).read_text(encoding="utf-8"))
    if page != "README.md":                              # docs/README.md shows none
        assert commands, f"{page} shows no bahdanau command"
    parser = build_parser()
    for argv in commands:
        shown = f"{page}: `bahdanau {shlex.join(argv)}`"
        try:
            args = vars(parser.parse_args(argv))
        except SystemExit as exc:
            if exc.code != 0:                                # --help exits 0
                raise AssertionError(f"{shown} does not parse") from exc
            continue
        command = args.pop("command")
        if args.pop("config", None) is not None or command not in _COMMANDS:
            continue                                     # a config file the page only names
        for name in ("quiet", "verbose", "no_progress"):
            args.pop(name)
        try:
            options = _COMMANDS[command][0].from_mapping(args, text=True)
            if isinstance(options, TrainOptions):
                options.limits                           # noqa: B018 (it checks)
        except InputError as exc:
            if "pip install 'bahdanau[" in str(exc):     # an extra this environment lacks
                continue
            raise AssertionError(f"{shown} is refused: {exc}") from exc


def test_links_between_docs_resolve() -> None:
    pages = [*DOCS.glob("*.md"), *DOCS.glob("guides/*.md")]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text("utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = (page.parent / target).resolve()
            if resolved == (DOCS / "guides" / "fused-kernel.md") and not resolved.exists():
                continue                       # written separately, with the Triton kernel
            assert resolved.exists(), f"{page.relative_to(ROOT)} links to missing {target}"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="torchrun with gloo on POSIX only")
def test_multi_gpu_script_under_torchrun(tmp_path) -> None:
    """The guide's script trains with two gloo CPU processes launched by torchrun."""
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    [script] = [b for b in blocks(DOCS / "guides" / "multi-gpu.md", "python")
                if b.startswith("# train_ddp.py")]
    (tmp_path / "train_ddp.py").write_text(script, encoding="utf-8")
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", "train_ddp.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("rank 0: 8 updates, stopped by max_steps") == 1
    assert sorted(p.name for p in (tmp_path / "runs/ddp/checkpoints").iterdir()) == [
        "step_00000004.pt", "step_00000008.pt"]


def test_yaml_configs_are_train_options(tmp_path) -> None:
    """Every YAML block of the README and guides is a `bahdanau train --config` file: known
    options of the declared types and ranges (read as `main` reads a --config file)."""
    pytest.importorskip("yaml")
    pages = [*(DOCS / "guides" / g for g in GUIDES), ROOT / "README.md", DOCS / "default-job.md"]
    configs = [body for page in pages for body in blocks(page, "yaml")]
    assert configs, "no page shows a config file"
    for i, body in enumerate(configs):
        path = tmp_path / f"config{i}.yaml"
        path.write_text(body, encoding="utf-8")
        TrainOptions.from_mapping(_config_file(str(path), TrainOptions), text=True)
