"""How far rounding can move a computed value: first-order bounds from the unit roundoff of every
value a computation materialises. Importable from any test module (`pythonpath = ["tests"]`).

A computation in floating point materialises values z_i (every result of every aten op, and
every parameter it reads), each the exact function of its already-rounded inputs up to an
error e_i: |e_i| <= u_i |z_i|, u_i the unit roundoff of the dtype z_i is stored in (2^-8 for
bfloat16, 2^-11 for float16, 2^-24 for float32: round to nearest), plus, for a sum of K terms
(a matrix product, a reduction, a softmax's normaliser), the K roundings of its accumulator:
at most K u_acc m_i, m_i the sum of the terms' magnitudes (|A| |B| for A B), u_acc = 2^-24 (CPU
kernels accumulate half precision in float32). To first order, the error of a scalar s computed
from them is

    delta s = sum_i (ds / dz_i) e_i,

so |delta s| <= sum_i |ds/dz_i| (u_i |z_i| + K_i u_acc m_i) (the worst case, `Bound.worst`),
and, modelling the roundings as independent mean-zero errors (Higham & Mary, "A new approach to
probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019; Hoeffding's inequality),
|delta s| <= lam * sqrt(sum_i (ds/dz_i)^2 ((u_i z_i)^2 + K_i (u_acc m_i)^2)) with probability at
least 1 - 2 exp(-lam^2 / 2) (`Bound.rms`, `Bound.likely`).

`Replay` measures the ds/dz_i in float64: `record` keeps every aten op of a float64 run of the
computation (forward and backward: a gradient is a computed value too), `Replay` runs the record
again under autograd, and differentiates each scalar of interest with respect to every result
and parameter at once. The dtype each value has in the run being bounded (float32, or
bfloat16/float16 under autocast) comes from a record of that run, matched op by op with the
float64 one (`roundoffs`); a value that autocast casts to a lower precision is counted at it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten

# Round to nearest: the largest relative error of storing a real number in the dtype.
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8,
                 torch.float16: 2.0**-11}

# Results that copy, move or select their inputs' values (or make constants): no rounding.
_EXACT = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select",
    "unsqueeze", "squeeze", "split", "split_with_sizes", "unsafe_split", "unbind", "alias",
    "clone", "contiguous", "cat", "stack", "index", "index_select", "gather", "embedding",
    "masked_fill", "zeros", "zeros_like", "new_zeros", "empty_like", "empty", "empty_strided",
    "new_empty", "new_empty_strided", "full", "full_like", "new_full", "fill", "zero", "copy",
    "_to_copy", "lift_fresh", "lift_fresh_copy", "slice_backward", "select_backward",
    "repeat_interleave", "as_strided", "ones", "ones_like", "new_ones", "where", "arange",
    "scalar_tensor", "repeat", "constant_pad_nd", "_pack_padded_sequence", "sort", "topk",
    "scatter", "neg", "flip", "narrow", "detach", "max", "min", "amax", "amin",
    "index_fill", "_pad_packed_sequence", "unfold"})


# In-place ops that change a tensor's shape or strides, not its values.
_RESHAPES = frozenset({"transpose", "t", "squeeze", "unsqueeze", "as_strided", "swapdims",
                       "swapaxes", "resize"})


# The unit roundoff of the accumulators of sums (matrix products, reductions) in the runs bounded.
ACCUMULATOR_ROUNDOFF = UNIT_ROUNDOFF[torch.float32]


@dataclass(frozen=True)
class Bound:
    """The first-order rounding bounds of one computed scalar (see the module docstring)."""

    worst: float        # no error can be larger, to first order
    rms: float          # the size of a typical error

    def likely(self, lam: float) -> float:
        """The smaller of the worst case and lam * rms (which holds with probability at least
        1 - 2 exp(-lam^2 / 2) when the roundings are independent)."""
        return min(self.worst, lam * self.rms)


@dataclass
class _Op:
    func: Any
    args: Any             # args and kwargs, tensors replaced by _Ref
    outputs: list[int | None]   # the record's key of each flat output tensor
    spec: Any             # how the flat outputs make the result
    dtypes: list[torch.dtype | None]
    shapes: list[tuple[int, ...] | None]


@dataclass(frozen=True)
class _Ref:
    key: int


class _Record(TorchDispatchMode):
    """Every aten op of a run, with its inputs as references to earlier results or to external
    tensors (parameters, inputs, constants: their values kept)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self.producer: dict[int, tuple[int, int]] = {}    # key -> (op, flat output index)
        self.external: dict[int, torch.Tensor] = {}       # key -> the tensor (alive)
        self.storage: dict[int, int] = {}                 # key -> its storage
        self.writes: dict[int, int] = {}                  # storage -> the last op writing it
        self.values: dict[int, torch.Tensor] = {}         # external key -> its value then
        self._alive: list[torch.Tensor] = []              # keeps every id unique

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        for x in tree_flatten((args, kwargs))[0]:
            if isinstance(x, torch.Tensor) and id(x) not in self.producer \
                    and id(x) not in self.external:
                self.external[id(x)] = x
                self.values[id(x)] = x.detach().clone()
                self._alive.append(x)
        refs = tree_map(lambda x: _Ref(id(x)) if isinstance(x, torch.Tensor) else x,
                        (args, kwargs))
        for x in tree_flatten((args, kwargs))[0]:
            if isinstance(x, torch.Tensor):
                self.storage.setdefault(id(x), _storage(x))
        if func._schema.is_mutable:
            written = kwargs.get("out", args[0] if args else None)
            if isinstance(written, torch.Tensor):
                self.writes[_storage(written)] = len(self.ops)
        out = func(*args, **kwargs)
        flat, spec = tree_flatten(out)
        keys: list[int | None] = []
        dtypes: list[torch.dtype | None] = []
        shapes: list[tuple[int, ...] | None] = []
        for i, x in enumerate(flat):
            if isinstance(x, torch.Tensor):
                self._alive.append(x)
                self.storage[id(x)] = _storage(x)
                self.producer[id(x)] = (len(self.ops), i)
                self.external.pop(id(x), None)
                keys.append(id(x))
                dtypes.append(x.dtype)
                shapes.append(tuple(x.shape))
            else:
                keys.append(None)
                dtypes.append(None)
                shapes.append(None)
        self.ops.append(_Op(func, refs, keys, spec, dtypes, shapes))
        return out


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):     # a tensor without storage
        return -id(t)


def record(run: Callable[[], Any]) -> tuple[_Record, Any]:
    """Run `run()` recording its aten ops; returns the record and what `run` returned."""
    with _Record() as rec:
        result = run()
    return rec, result


def _name(func: Any) -> str:
    return func.overloadpacket.__name__


def _signatures(rec: _Record, params: Sequence[torch.Tensor], table: dict[Any, int]
                ) -> list[int]:
    """Each op's place in the dataflow of its record, as an id interned in `table`: its name,
    its arguments (a tensor by the signature of what made it, a parameter by its position, a
    constant by its values, a floating dtype as any), so that two records of one computation in
    different dtypes give their corresponding ops one id, whatever order their backward ran in.
    A cast (``_to_copy``) is its input: the float64 run makes none."""
    position = {id(p): i for i, p in enumerate(params)}
    made: dict[int, int] = {}
    cast_of: dict[int, int] = {}                 # a cast's key -> its input's

    def intern(item: Any) -> int:
        return table.setdefault(item, len(table))

    def of(x: Any) -> Any:
        if isinstance(x, _Ref):
            key = cast_of.get(x.key, x.key)
            if key in made:
                return ("made", made[key])
            if key in position:
                return ("param", position[key])
            value = rec.values[key]
            small = value.numel() <= 64
            return ("const", tuple(value.shape),
                    tuple(value.double().reshape(-1).tolist()) if small else None)
        if isinstance(x, torch.dtype) and x.is_floating_point:
            return "float"
        return x

    out = []
    for op in rec.ops:
        args = tree_flatten(op.args)[0]
        if _name(op.func) == "_to_copy" and isinstance(args[0], _Ref):
            cast_of[op.outputs[0]] = cast_of.get(args[0].key, args[0].key)
            made.pop(op.outputs[0], None)
            out.append(-1)
            continue
        sig = intern((_name(op.func), tuple(of(x) for x in args)))
        for j, key in enumerate(op.outputs):
            if key is not None:
                made[key] = intern((sig, j))
                cast_of.pop(key, None)
        out.append(sig)
    return out


def roundoffs(exact: _Record, run: _Record, exact_params: Sequence[torch.Tensor],
              run_params: Sequence[torch.Tensor], *, least_matched: float = 0.8
              ) -> tuple[dict[tuple[int, int], float], list[float]]:
    """The unit roundoff of each value of `exact` (a float64 record) in `run` (a record of the
    same computation in the dtypes being bounded), by (op, output) of `exact`, and of each
    parameter; a value (or parameter) that `run` casts to a lower precision is counted at that
    precision.

    Ops correspond by their place in the dataflow (`_signatures`), and those left over (after
    a part that computes differently: the Triton kernel where float64 runs the reference
    attention) by their order, names and shapes (`difflib`). A dtype can pick another form of
    the same arithmetic here and there (an ``addmm_`` in float64 where half precision
    multiplies, casts and adds): the values of `exact` without a counterpart are counted at the
    lowest precision `run` holds anything in.

    Raises:
        AssertionError: the records are not the same computation (fewer than `least_matched` of
            the ops of `exact` have a counterpart).
    """
    table: dict[Any, int] = {}
    mine, theirs = _signatures(exact, exact_params, table), _signatures(run, run_params, table)
    waiting: dict[int, list[int]] = {}
    for i, sig in enumerate(theirs):
        waiting.setdefault(sig, []).append(i)
    for queue in waiting.values():
        queue.reverse()
    pairs = {i: waiting[sig].pop() for i, sig in enumerate(mine) if sig >= 0 and waiting.get(sig)}
    taken = set(pairs.values())
    rest = [i for i, sig in enumerate(mine) if sig >= 0 and i not in pairs]
    other = [i for i, sig in enumerate(theirs) if sig >= 0 and i not in taken]

    def key(op: _Op) -> tuple[str, Any]:
        return _name(op.func), op.shapes[0] if op.shapes else None

    matcher = difflib.SequenceMatcher(None, [key(exact.ops[i]) for i in rest],
                                      [key(run.ops[i]) for i in other], autojunk=False)
    pairs.update({rest[a + k]: other[b + k]
                  for a, b, size in matcher.get_matching_blocks() for k in range(size)})
    computing = [i for i, sig in enumerate(mine) if sig >= 0]
    matched = sum(i in pairs for i in computing)
    assert matched >= least_matched * len(computing), (
        f"the float64 and the bounded runs take different paths: {len(computing) - matched} of "
        f"{len(computing)} ops unmatched")
    # the lowest precision each value of `run` is held in: its own, or a cast of it
    held: dict[tuple[int, int], float] = {}
    cast: dict[int, float] = {}                  # key of a tensor -> the lowest cast of it
    for i, op in enumerate(run.ops):
        for j, dtype in enumerate(op.dtypes):
            if dtype is not None and dtype.is_floating_point:
                held[(i, j)] = UNIT_ROUNDOFF[dtype]
        if _name(op.func) == "_to_copy" and op.dtypes[0] in UNIT_ROUNDOFF:
            source = tree_flatten(op.args)[0][0]
            if isinstance(source, _Ref):
                unit = UNIT_ROUNDOFF[op.dtypes[0]]
                cast[source.key] = max(cast.get(source.key, 0.0), unit)
                if source.key in run.producer:
                    at = run.producer[source.key]
                    held[at] = max(held.get(at, 0.0), unit)
    lowest = max(held.values(), default=0.0)
    units = {}
    for i, op in enumerate(exact.ops):
        for j in range(len(op.outputs)):
            units[(i, j)] = held.get((pairs[i], j), lowest) if i in pairs else lowest
    params = [max(UNIT_ROUNDOFF[p.dtype], cast.get(id(p), 0.0)) for p in run_params]
    return units, params


class Replay:
    """A float64 record replayed under autograd: every computed value and every parameter is a
    point where a rounding error enters (`bounds` differentiates with respect to all of them).

    In-place ops are replayed out of place (into a tensor of the same strides, or written back
    into the view they changed), `detach` as an alias, so that gradients flow through what the
    record's backward read of its forward; the replay's results must equal the record's.
    """

    def __init__(self, rec: _Record, params: Sequence[torch.Tensor],
                 outputs: Sequence[torch.Tensor]) -> None:
        self.leaves = [p.detach().clone().requires_grad_() for p in params]
        env: dict[int, Any] = {id(p): leaf for p, leaf in zip(params, self.leaves, strict=True)}
        for key, value in rec.values.items():
            env.setdefault(key, value)
        self.points: list[torch.Tensor] = []        # every computed result
        self.values: list[torch.Tensor] = []        # |result|
        self.sums: list[tuple[int, torch.Tensor | None]] = []   # K and m of a sum, or (0, None)
        self.at: list[tuple[int, int]] = []         # (op, output) of each
        with torch.enable_grad():
            for index, op in enumerate(rec.ops):
                # a computing op reads a tensor whose storage a later op writes as a copy: what
                # autograd keeps of it must not change under the replay's later writes (a view
                # op reads the tensor itself, so that the writes reach the view)
                views = any(r.alias_info is not None for r in op.func._schema.returns)

                def read(x: Any, index: int = index, views: bool = views) -> Any:
                    if not isinstance(x, _Ref):
                        return x
                    value = env[x.key]
                    later = rec.writes.get(rec.storage.get(x.key, 0), -1) > index
                    copy = later and not views and isinstance(value, torch.Tensor)
                    return value.clone() if copy else value

                args, kwargs = tree_map(read, op.args)
                if op.func._schema.is_mutable:        # the tensor written is itself
                    key = (op.args[1]["out"] if "out" in op.args[1] else op.args[0][0]).key
                    if "out" in op.args[1]:
                        kwargs = {**kwargs, "out": env[key]}
                    else:
                        args = (env[key], *args[1:])
                result = self._run(index, op, args, kwargs)
                flat = tree_flatten(result)[0]
                for key, x in zip(op.outputs, flat, strict=True):
                    if key is not None:
                        env[key] = x
        self.outputs = [env[id(t)] for t in outputs]
        for got, want in zip(self.outputs, outputs, strict=True):
            scale = float(want.detach().abs().max()) if want.numel() else 0.0
            error = float((got.detach() - want.detach()).abs().max()) if want.numel() else 0.0
            assert error <= 1e-12 * (1.0 + scale), f"the replay differs from the run by {error}"

    def _point(self, index: int, j: int, value: torch.Tensor, name: str, args: Any,
               kwargs: Any) -> torch.Tensor:
        """Mark `value`, result j of op `index` (`name` of `args`), as a point where a rounding
        error enters."""
        if value.is_floating_point() and value.requires_grad:
            self.points.append(value)
            self.values.append(value.detach().abs())
            with torch.no_grad():
                self.sums.append(_accumulated(name, tree_map(_detached, args),
                                              tree_map(_detached, kwargs), value.detach()))
            self.at.append((index, j))
        return value

    def _run(self, index: int, op: _Op, args: Any, kwargs: Any) -> Any:
        func, name = op.func, _name(op.func)
        if name == "detach":
            return aten.alias.default(args[0])
        if not func._schema.is_mutable:
            result = func(*args, **kwargs)
            if name in _EXACT or not isinstance(result, torch.Tensor):
                return result
            return self._point(index, 0, result, name, args, kwargs)
        if "out" in kwargs:                      # an out= variant: the functional one, written
            target, base = kwargs["out"], name
            kwargs = {k: v for k, v in kwargs.items() if k != "out"}
            value = getattr(aten, base)(*args, **kwargs)
        else:                                    # in place: on a copy, written back below
            target, base = args[0], name.rstrip("_")
            if base in _RESHAPES:                # a new view of the same values
                return getattr(aten, base)(target, *args[1:], **kwargs)
            if base == "copy":
                value = args[1].to(target.dtype).expand(target.shape)
            elif base == "fill":
                value = (torch.full_like(target, args[1]) if not isinstance(args[1], torch.Tensor)
                         else args[1].to(target.dtype).expand(target.shape))
            else:
                value = getattr(aten, base)(target.clone(), *args[1:], **kwargs)
                args = (target, *args[1:])
        if base not in _EXACT:
            value = self._point(index, 0, value, base, args, kwargs)
        if target._is_view():                # another alias reads the change: write it back
            target.copy_(value)
            return target
        result = torch.empty_strided(target.shape, target.stride(), dtype=target.dtype,
                                     device=target.device)
        result.copy_(value)
        return result

    def bounds(self, scalars: Sequence[torch.Tensor], held: dict[tuple[int, int], float],
               param_roundoffs: Sequence[float]) -> list[Bound]:
        """The `Bound` of each scalar (computed from `self.outputs`), with the unit roundoff
        of each value and parameter in the run being bounded (`roundoffs`)."""
        inputs = [*self.points, *self.leaves]
        sizes = [x.numel() for x in inputs]
        worst, typical = [], []                  # per element: the error's bound, its size
        for at, value, (terms, magnitude) in zip(self.at, self.values, self.sums, strict=True):
            unit = held.get(at, 0.0)
            stored = torch.where(torch.isfinite(value), value, 0.0) * unit  # -inf: no error
            summed = (torch.zeros_like(stored) if magnitude is None or unit == 0.0 else
                      torch.where(torch.isfinite(magnitude), magnitude, 0.0)
                      * ACCUMULATOR_ROUNDOFF)
            worst.append((stored + terms * summed).reshape(-1))
            typical.append((stored.square() + terms * summed.square()).sqrt().reshape(-1))
        for leaf, unit in zip(self.leaves, param_roundoffs, strict=True):
            worst.append(leaf.detach().abs().reshape(-1) * unit)
            typical.append(worst[-1])
        worst_scale, typical_scale = torch.cat(worst), torch.cat(typical)
        out = []
        for scalar in scalars:
            grads = torch.autograd.grad(scalar, inputs, retain_graph=True, allow_unused=True)
            g = torch.cat([worst_scale.new_zeros(n) if g is None else g.reshape(-1)
                           for g, n in zip(grads, sizes, strict=True)]).abs()
            out.append(Bound(float((g * worst_scale).sum()), float((g * typical_scale).norm())))
        return out


def _detached(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


def _dim_size(x: torch.Tensor, dims: Any) -> int:
    dims = [dims] if isinstance(dims, int) else list(dims)
    size = 1
    for d in dims:
        size *= x.shape[d]
    return size


def _accumulated(name: str, args: Any, kwargs: Any, value: torch.Tensor
                 ) -> tuple[int, torch.Tensor | None]:
    """(K, m) of a result that sums K terms, m the sum of their magnitudes (an absolute bound on
    the terms' size where the result is a log); (0, None) for a result of one rounding."""
    if name in ("mm", "bmm", "mv", "dot"):
        a, b = args[0], args[1]
        return a.shape[-1], getattr(aten, name)(a.abs(), b.abs())
    if name in ("addmm", "baddbmm", "addmv"):
        c, a, b = args[0], args[1], args[2]
        beta, alpha = abs(kwargs.get("beta", 1)), abs(kwargs.get("alpha", 1))
        product = getattr(aten, name[3:])(a.abs(), b.abs())
        return a.shape[-1] + 1, beta * c.abs() + alpha * product
    if name in ("sum", "mean"):
        x = args[0]
        terms = max(1, x.numel() // max(value.numel(), 1))
        total = aten.sum(x.abs(), *args[1:], **{k: v for k, v in kwargs.items() if k != "dtype"})
        return terms, total / terms if name == "mean" else total
    if name == "_softmax":                          # positive terms: relative to the result
        return args[0].shape[args[1]], value.abs()
    if name in ("_log_softmax", "logsumexp"):       # the log of a sum: an absolute error
        return _dim_size(args[0], args[1]), torch.ones_like(value)
    if name == "_softmax_backward_data":            # out * (grad - sum(grad * out))
        grad, out, dim = args[0].abs(), args[1].abs(), args[2]
        return out.shape[dim], out * (grad + (grad * out).sum(dim, keepdim=True))
    if name == "_log_softmax_backward_data":        # grad - exp(out) * sum(grad)
        grad, out, dim = args[0].abs(), args[1], args[2]
        return out.shape[dim], grad + out.exp() * grad.sum(dim, keepdim=True)
    if name == "embedding_dense_backward":
        grad, indices = args[0], args[1]
        return indices.numel(), aten.embedding_dense_backward(grad.abs(), *args[1:], **kwargs)
    if name in ("index_add", "scatter_add"):
        source = args[3]
        return source.numel() // max(value.numel() // max(value.shape[0], 1), 1) + 1, \
            getattr(aten, name)(args[0].abs(), args[1], args[2], source.abs(), **kwargs)
    if name == "cumsum":
        return args[0].shape[args[1]], aten.cumsum(args[0].abs(), *args[1:], **kwargs)
    return 0, None
