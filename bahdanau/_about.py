"""What this copy of bahdanau is: its version, and the `versions` record of what a run ran on.

A run records `versions(device)` in its log header, ``options.json``, ``metrics.json`` and every
checkpoint, so that a result can be traced to the code, the libraries and the machine that made
it: the package, torch and Python versions, the git commit when the package runs from a checkout
(absent otherwise), the host and the device.

Standard library only at import (torch is imported by `versions`, when called): the `bahdanau`
command answers ``--version`` from here (`answer_version`) while the package starts, before the
imports that take seconds.
"""

from __future__ import annotations

import platform
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__version__ = "0.1.0"

__all__ = ["EXTRAS", "__version__", "answer_version", "git_commit", "version_line", "versions"]

# The optional extras of pyproject.toml (less `test` and `docs`), by the module each one
# installs: the one list that the lean-import test, the docs build (which leaves out a module
# whose extra is missing) and the tests that skip without an extra read; a test checks it
# against pyproject.toml.
EXTRAS: dict[str, str] = {"triton": "triton", "matplotlib": "plot", "yaml": "yaml",
                          "sentencepiece": "sentencepiece", "tensorboard": "tensorboard",
                          "tqdm": "progress", "safetensors": "share",
                          "sacremoses": "moses", "onnxruntime": "onnx"}


def version_line() -> str:
    """What ``bahdanau --version`` prints."""
    return f"bahdanau {__version__}"


def answer_version(argv: list[str]) -> None:
    """The `bahdanau` command's `argv` (its arguments) is ``--version`` alone: print
    `version_line` and end the process (status 0), before the package imports torch (about
    3 s); any other command line is left to `bahdanau.cli.main`."""
    if argv == ["--version"]:
        print(version_line())
        raise SystemExit(0)


@cache
def git_commit() -> str | None:
    """The commit checked out where the package's files are, when they are tracked in a git
    checkout (a clone installed with ``pip install -e``); None otherwise (an installed wheel,
    no git, or a package folder that git does not track)."""
    folder = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    if git("ls-files", "--error-unmatch", Path(__file__).name) is None:
        return None                  # not tracked: e.g. a venv inside some other checkout
    return git("rev-parse", "HEAD") or None


def device_name(device: torch.device | str | None) -> str | None:
    """The device as a record names it: "cpu", or "cuda:0 (NVIDIA H100 ...)"."""
    if device is None:
        return None
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def versions(device: torch.device | str | None = None) -> dict[str, Any]:
    """The record of what runs this code: {"bahdanau", "torch", "python", "git_commit" (only
    from a checkout), "host", "device" (None when not given)}; plain strings, checkpoint- and
    JSON-safe (torch.__version__ is a str subclass that torch.load(weights_only=True) refuses)."""
    import torch

    record: dict[str, Any] = {"bahdanau": __version__, "torch": str(torch.__version__),
                              "python": platform.python_version()}
    commit = git_commit()
    if commit is not None:
        record["git_commit"] = commit
    record["host"] = socket.gethostname()
    record["device"] = device_name(device)
    return record
