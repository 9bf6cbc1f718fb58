"""A guard that makes every Python-level read of tensor values back to the host raise: the
proof, on the CPU, that a stretch of code (a search's steps between two checks, a sync-free
update) never synchronises with the device.

Every way Python code reads a tensor's values to the host (`item`, `tolist`, `numpy`, `bool`,
`int`, `float`, `index`, `nonzero`, `torch.nonzero`, `torch.argwhere`, one-argument
`torch.where`, and indexing with a boolean mask, whose result's shape depends on the values)
raises `HostRead` inside `host_reads_refused()`, and so does every aten op that reads a value to
the host or whose result the data shapes (`_local_scalar_dense`, and the ops tagged
`dynamic_output_shape` or `data_dependent_output`), called from Python or from C++.

Importable from any test module (`pythonpath = ["tests"]` in pyproject.toml).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostRead(AssertionError):
    """A read of a tensor's values back to the host inside a window that forbids them."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise HostRead(f"{what} where host reads are refused")
    return refuse


def _is_mask(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in items)


@contextlib.contextmanager
def host_reads_refused() -> Iterator[None]:
    """Make every Python-level read of tensor values back to the host raise `HostRead`."""
    patch = pytest.MonkeyPatch()
    try:
        for name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                     "nonzero", "argwhere"):
            patch.setattr(torch.Tensor, name, _refuse(f"Tensor.{name}"))
        for name in ("nonzero", "argwhere"):
            patch.setattr(torch, name, _refuse(f"torch.{name}"))
        where, getitem, setitem = torch.where, torch.Tensor.__getitem__, torch.Tensor.__setitem__

        def one_argument_where(condition, *args, **kwargs):
            if not args and not kwargs:
                raise HostRead("torch.where(condition) where host reads are refused")
            return where(condition, *args, **kwargs)

        def masked_get(self, index):
            if _is_mask(index):
                raise HostRead("indexing with a boolean mask where host reads are refused")
            return getitem(self, index)

        def masked_set(self, index, value):
            if _is_mask(index):
                raise HostRead("indexing with a boolean mask where host reads are refused")
            return setitem(self, index, value)

        patch.setattr(torch, "where", one_argument_where)
        patch.setattr(torch.Tensor, "__getitem__", masked_get)
        patch.setattr(torch.Tensor, "__setitem__", masked_set)
        with _ValueDependentOpsRefused():
            yield
    finally:
        patch.undo()


class _ValueDependentOpsRefused(TorchDispatchMode):
    """Below Python, at the dispatcher: an op that reads a tensor's value to the host
    (`_local_scalar_dense`, what `item` and friends call, also from C++) or whose result's shape
    or value is decided by the data (aten's `dynamic_output_shape` and `data_dependent_output`
    tags: `masked_select`, `unique`, `repeat_interleave` of a tensor, `equal`, ...) raises."""

    _TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)

    # tagged for their boolean-mask form only: with integer indices the shape is the indices'
    _MASKABLE = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                 torch.ops.aten.index_put_.default)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tagged = any(tag in func.tags for tag in self._TAGS)
        if func in self._MASKABLE:
            tagged = any(_is_mask(i) for i in args[1] if i is not None)
        if func is torch.ops.aten._local_scalar_dense.default or tagged:
            raise HostRead(f"{func} where host reads are refused")
        return func(*args, **(kwargs or {}))
