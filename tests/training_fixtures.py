"""Tiny random training data and models shared by the training and checkpoint tests.

Importable from any test module (`pythonpath = ["tests"]` in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from bahdanau.data import Example
from bahdanau.models import RNNSearch, build_model
from bahdanau.presets import tiny


def random_examples(n: int, seed: int = 0) -> list[Example]:
    """`n` examples of 1 to 6 random word ids (4..15) per side, for `presets.tiny()` models."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        s, t = torch.randint(1, 7, (2,), generator=g).tolist()
        out.append(Example(i, torch.randint(4, 16, (s,), generator=g).tolist(),
                           torch.randint(4, 16, (t,), generator=g).tolist()))
    return out


def tiny_model(seed: int = 0, **changes) -> RNNSearch:
    """`presets.tiny()` with `changes`, its weights drawn after `torch.manual_seed(seed)`."""
    torch.manual_seed(seed)
    return build_model(replace(tiny(), **changes))
