"""A decoder step recorded once per input shape as a CUDA graph, then replayed.

On a GPU a search step of a small model is a few dozen short kernels, and launching them costs
more than running them. A CUDA graph records the kernels of one call of `model.step` once and
replays them all with one launch. A graph holds fixed addresses and shapes, so `CapturedStep`
keeps, per input signature (the shapes, dtypes and devices of the tokens, the decoder state and
the memory, and the plain values in them), one recording with its own static input buffers:

    tokens (N,), state (N rows), memory (B sentences)   copied into that graph's buffers
    replay                                               the recorded kernels, one launch
    logits, state, weights                               cloned out of the graph's outputs

Tokens and state are copied in at every call; the memory only when the caller passes another
memory object (a new batch, or the batch after finished sentences were dropped), so a memory
must not be changed in place between calls. The recordings read the model's parameters where
they were when recorded: updates in place (an optimizer step, `load_state_dict`) are seen,
parameters replaced by new tensors are not (`BeamSearch` records again when they move).

Shapes come from a small set when the caller makes them so: `BeamSearch(cuda_graphs=True)`
pads the source to a multiple of `bahdanau.data.batching.SHAPE_MULTIPLE` (`pad_to_bucket`;
padding changes nothing: the encoder stops at each sentence's length and attention gives
padding the weight 0) and keeps its sentences in power-of-two groups between checks.

The recording itself (`cuda_graph`) is the recipe of PyTorch's CUDA-graphs notes: warm-up calls
on a side stream, then `torch.cuda.graph` into a memory pool that the step's graphs share. The
rest, the signatures and the static buffers, is plain torch and runs anywhere: `CapturedStep`
takes the recording function as an argument, so it is tested on a CPU with `replay_eagerly`,
which re-runs the step on the same static buffers, as a graph replays its kernels on them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from bahdanau._checks import is_int
from bahdanau.data.batching import SHAPE_MULTIPLE
from bahdanau.errors import InputError

__all__ = ["CapturedStep", "autocast_state", "clone", "copy_into", "cuda_graph",
           "pad_to_bucket", "replay_eagerly", "signature"]

WARMUP_CALLS = 3         # calls on a side stream before recording (lazy initialisation, tuning)

T = TypeVar("T")
# How a step is recorded: given a function of no arguments that calls the step on the static
# buffers, return a function that replays it (writing the same outputs) and those outputs.
Record = Callable[[Callable[[], T]], tuple[Callable[[], None], T]]
Step = Callable[[Tensor, Any, Any], Any]


def pad_to_bucket(src: Tensor, pad_id: int, multiple: int = SHAPE_MULTIPLE) -> Tensor:
    """(B, S) source ids padded with `pad_id` to (B, S') with S' the multiple of `multiple` at
    or above S. The lengths stay as they are: the model reads only each sentence's first
    `src_lengths[b]` positions, so the hypotheses do not change.

    Raises:
        InputError: `multiple` is not an int >= 1.
    """
    if not is_int(multiple) or multiple < 1:
        raise InputError(f"multiple must be an int >= 1, got {multiple!r}")
    short = -src.shape[1] % multiple
    return torch.nn.functional.pad(src, (0, short), value=pad_id) if short else src


def signature(tree: Any) -> Hashable:
    """What a recording depends on: the types, and for each tensor its shape, dtype and device,
    of a (nested) tuple of tensors and plain values (None, bool, int, float, str), the values
    themselves included (a recording fixes them).

    Raises:
        InputError: something else in the tree.
    """
    if isinstance(tree, Tensor):
        return (tuple(tree.shape), tree.dtype, tree.device)
    if isinstance(tree, tuple):
        return (type(tree), tuple(signature(field) for field in tree))
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return (type(tree), tree)
    raise InputError(f"a captured step takes tensors, tuples of them and plain values, got a "
                     f"{type(tree).__name__}")


def _map(fn: Callable[[Tensor], Tensor], tree: Any) -> Any:
    """`tree` with `fn` applied to every tensor (NamedTuples keep their type)."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, tuple):
        fields = [_map(fn, field) for field in tree]
        return type(tree)(*fields) if hasattr(tree, "_fields") else tuple(fields)
    return tree


def copy_into(static: Any, tree: Any) -> None:
    """Copy every tensor of `tree` into the tensor at the same place of `static` (same
    `signature`)."""
    if isinstance(static, Tensor):
        static.copy_(tree)
    elif isinstance(static, tuple):
        for static_field, field in zip(static, tree, strict=True):
            copy_into(static_field, field)


def clone(tree: Any) -> Any:
    """A copy of `tree` with every tensor cloned."""
    return _map(torch.clone, tree)


def cuda_graph(pool: Any = None) -> Record[Any]:
    """The recording function of CUDA graphs: warm-up calls on a side stream, then one
    `torch.cuda.graph` capture into `pool` (a `torch.cuda.graph_pool_handle()`, shared by the
    graphs of one `CapturedStep`).

    Under `torch.autocast` the warm-ups and the capture run with autocast's cache of cast
    weights off: a cached cast would be recorded as a read of a copy that the end of the
    autocast block frees and that an update of the weights leaves stale; without the cache each
    replay casts the weights it reads."""

    def record(call: Callable[[], T]) -> tuple[Callable[[], None], T]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with _uncached_autocast("cuda"):
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    call()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs = call()
        return graph.replay, outputs

    return record


def _uncached_autocast(device: str) -> AbstractContextManager[Any]:
    """The autocast state that is on for `device`, with its cache of cast weights off."""
    if not torch.is_autocast_enabled(device):
        return nullcontext()
    return torch.autocast(device, dtype=torch.get_autocast_dtype(device), cache_enabled=False)


def autocast_state(device: str) -> Hashable:
    """What a recording under autocast depends on: whether it is on for `device`, and its dtype
    (a recording casts as autocast did when it was made)."""
    if not torch.is_autocast_enabled(device):
        return None
    return torch.get_autocast_dtype(device)


def replay_eagerly(call: Callable[[], T]) -> tuple[Callable[[], None], T]:
    """A recording function for any device: `call` runs again at each replay, on the same
    static buffers, and its results are copied into the first call's outputs, as a CUDA graph
    writes its outputs in place. A step that reads anything but its static buffers is caught by
    it as by a graph."""
    outputs = call()
    return (lambda: copy_into(outputs, call())), outputs


@dataclass
class _Graph:
    """One recording: its replay, its static inputs and outputs, and the memory copied in."""

    replay: Callable[[], None]
    inputs: tuple[Tensor, Any, Any]       # tokens, state, memory
    outputs: Any
    memory: Any                           # the caller's memory last copied into inputs[2]


class CapturedStep:
    """`step(tokens, state, memory)`, recorded once per input signature and replayed.

    Args:
        step: the step to record, e.g. `model.step` (it must read nothing back to the host:
            a CUDA graph cannot record a sync).
        record: how a step is recorded (`cuda_graph()`, the default, or `replay_eagerly`).

    Calls return what `step` returns, cloned out of the recording's outputs (a later replay
    overwrites those, and the graphs of one `CapturedStep` share one memory pool).
    `graphs` counts the recordings held and `replays` the calls served by them, so
    `replays / graphs` is the steps replayed per recorded shape.
    """

    def __init__(self, step: Step, *, record: Record[Any] | None = None) -> None:
        if record is None:
            record = cuda_graph(torch.cuda.graph_pool_handle())
        self.step, self.record = step, record
        self._graphs: dict[Hashable, _Graph] = {}
        self.replays = 0

    @property
    def graphs(self) -> int:
        """The number of recordings held (one per input signature seen)."""
        return len(self._graphs)

    def __call__(self, tokens: Tensor, state: Any, memory: Any) -> Any:
        """`step(tokens, state, memory)` through the recording for these inputs' signature
        (recorded at the first call with it)."""
        key = (autocast_state(tokens.device.type), signature((tokens, state, memory)))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._record(tokens, state, memory)
        else:
            copy_into(graph.inputs[0], tokens)
            copy_into(graph.inputs[1], state)
            if graph.memory is not memory:
                copy_into(graph.inputs[2], memory)
                graph.memory = memory
        graph.replay()
        self.replays += 1
        return clone(graph.outputs)

    def _record(self, tokens: Tensor, state: Any, memory: Any) -> _Graph:
        """A recording of `step` on static copies of these inputs."""
        inputs = (tokens.clone(), clone(state), clone(memory))
        replay, outputs = self.record(lambda: self.step(*inputs))
        return _Graph(replay, inputs, outputs, memory)
