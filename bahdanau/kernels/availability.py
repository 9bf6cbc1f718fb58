"""Whether the Triton kernels can run, and on what: what `bahdanau.kernels` (the switch) and
`bahdanau.kernels.triton_attention` (the kernels, which the switch imports lazily) both read.

A module of its own so that the kernels never import the switch that imports them.
"""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["FUSED_DTYPES", "has_triton", "interpreting"]

FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)   # what the Triton kernel takes


def has_triton() -> bool:
    """True if the `triton` package can be imported (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1: Triton kernels run on CPU tensors, in its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
