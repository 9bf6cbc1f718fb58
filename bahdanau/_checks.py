"""Input validation shared by the modules: every failure is an `InputError` naming the argument.

Besides the tensor checks the models use, `resolve_device` checks a device string against what
this machine has, `default_device` / `default_threads` say what the command line uses when
--device / --threads are not given, `cpu_threads` bounds --threads by the usable cores, and
`check_memory` refuses work whose memory estimate exceeds what a device has available.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypeGuard

import torch
from torch import Tensor

from bahdanau.errors import InputError

# What `json.loads` of a user's file raises when it is not JSON: JSONDecodeError and
# UnicodeDecodeError (both ValueErrors), and RecursionError for one nested too deeply to parse
# ("[" * 200000): catch these, never ValueError alone.
JSON_ERRORS = (ValueError, RecursionError)


def is_int(value: object) -> TypeGuard[int]:
    """True for an int that is not a bool (True is an int to Python, not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_optional_positive_int(name: str, value: object) -> None:
    """`value` is None or an int >= 1 (not a bool); InputError naming `name` otherwise."""
    if value is not None and (not is_int(value) or value < 1):
        raise InputError(f"{name} must be a positive int or None, got {value!r}")


def check_count(name: str, value: object) -> None:
    """`value` is an int >= 0 (not a bool), e.g. an epoch or a position; InputError naming
    `name` otherwise."""
    if not is_int(value) or value < 0:
        raise InputError(f"{name} must be an int >= 0, got {value!r}")


def check_sizes(owner: str, **sizes: object) -> None:
    """Every size is an int >= 1 (not a bool): a layer of size 0 builds, then fails, or worse
    returns empty tensors, only when it is called. InputError naming `owner` and the size."""
    for name, value in sizes.items():
        if not is_int(value) or value < 1:
            raise InputError(f"{owner}: {name} must be a positive int, got {value!r}")


def is_finite_number(value: object) -> TypeGuard[float]:
    """True for a finite int or float that is not a bool (nan and inf are not)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def describe(value: object) -> str:
    """The type and a short repr of a value, for the end of an error message."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def check_type(name: str, value: object, types: type | tuple[type, ...], expected: str) -> None:
    """`value` must be an instance of `types`; else InputError "`name` must be `expected`"."""
    if not isinstance(value, types):
        raise InputError(f"{name} must be {expected}, got {describe(value)}")


def check_path(name: str, value: object) -> Path:
    """A path argument (a str or os.PathLike, not empty) as a `Path`."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise InputError(f"{name} must be a path (a non-empty str or os.PathLike), "
                         f"got {describe(value)}")
    return Path(value)


def check_strings(name: str, values: object) -> None:
    """A sequence of str (a list of sentences), not one str and no other items."""
    if isinstance(values, str):
        raise InputError(f"{name} must be a list of str, not one str")
    if isinstance(values, bytes) or not isinstance(values, Sequence):
        raise InputError(f"{name} must be a list of str, got {describe(values)}")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise InputError(f"{name}[{i}] must be a str, got {describe(value)}")


def check_tokenizer(name: str, tokenizer: object) -> None:
    """An instance with `tokenize` and `detokenize` methods (a `bahdanau.Tokenizer`)."""
    if isinstance(tokenizer, type) or not all(
            callable(getattr(tokenizer, method, None)) for method in ("tokenize", "detokenize")):
        raise InputError(f"{name} must be a tokenizer instance with tokenize() and detokenize() "
                         f"(e.g. DefaultTokenizer()), got {describe(tokenizer)}")


# Accelerators whose torch module (torch.cuda, torch.mps, torch.xpu) says what is usable here.
_ACCELERATORS = {"cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}


def resolve_device(device: str | torch.device, name: str = "device") -> torch.device:
    """The `torch.device` that `device` names, once it is known to be usable on this machine.

    Args:
        device: a device string ("cpu", "cuda", "cuda:1", "mps") or a `torch.device`.
        name: the argument or option to name in the error (e.g. "--device").
    Returns:
        `torch.device(device)`; "cuda" stays without an index (the current CUDA device).
    Raises:
        InputError: `device` is neither a str nor a torch.device, torch cannot parse it, it is
            not cpu, CUDA, MPS or XPU (e.g. "meta"), or it names a backend that is unavailable
            or an index beyond the devices present.
    """
    if not isinstance(device, (str, torch.device)):
        raise InputError(f"{name} must be a device string such as 'cpu' or 'cuda:0', "
                         f"got {type(device).__name__} {device!r}")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise InputError(f"{name} {str(device)!r} is not a device: expected 'cpu', 'cuda', "
                         f"'cuda:N' or 'mps', for example") from None
    if resolved.type != "cpu" and resolved.type not in _ACCELERATORS:
        raise InputError(f"{name} {str(device)!r}: models train and translate on cpu, "
                         f"{', '.join(_ACCELERATORS)}, not on {resolved.type}")
    if resolved.type == "cpu" and resolved.index not in (None, 0):
        raise InputError(f"{name} {str(device)!r}: there is one cpu device, 'cpu'")
    backend = _ACCELERATORS.get(resolved.type)
    if backend is not None:
        module = getattr(torch, resolved.type)
        if not module.is_available():
            raise InputError(f"{name} {str(device)!r}: {backend} is not available here")
        count = module.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise InputError(f"{name} {str(device)!r}: there is no {backend} device "
                             f"{resolved.index}, only {count} ({resolved.type}:0 to "
                             f"{resolved.type}:{count - 1})")
    return resolved


def default_device() -> str:
    """What --device auto means: "cuda" when torch sees a CUDA device, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def default_threads() -> int:
    """Torch CPU threads when --threads is not given: OMP_NUM_THREADS where the user set it,
    else the usable cores shared by the processes of this machine (LOCAL_WORLD_SIZE, set by
    torchrun; 1 without it), at least 1 and at most the usable cores.

    OMP_NUM_THREADS counts only where this is the machine's one process (LOCAL_WORLD_SIZE
    unset or 1): torchrun starting several processes on a machine sets it to 1 for each, unless
    the user set it, and its 1 cannot be told from the user's, so there the cores are shared.

    Raises:
        InputError: OMP_NUM_THREADS or LOCAL_WORLD_SIZE is set but is not a positive integer.
    """
    cores, local = usable_cores(), launcher_value("LOCAL_WORLD_SIZE")
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp and (not omp.isdigit() or int(omp) < 1):
        raise InputError(f"OMP_NUM_THREADS must be a positive integer (torch CPU threads), got "
                         f"{omp!r}: unset it, or give --threads N")
    if omp and local == 1:
        return min(int(omp), cores)
    return max(1, cores // local)


def cpu_threads(given: int | None, name: str = "--threads") -> int:
    """The torch CPU threads to use: `given`, or `default_threads()` when None.

    More threads than the usable cores are refused rather than allowed as oversubscription:
    torch's threads run compute-bound kernels and each parallel op waits for its slowest
    thread, so a thread beyond the cores only waits for one (`bahdanau.training.threads`
    measures this), and torch does not bound its pool itself (100,000 threads crash the
    process).

    Raises:
        InputError: `given` is more than the usable cores (`usable_cores`), naming `name`.
    """
    if given is None:
        return default_threads()
    cores = usable_cores()
    if given > cores:
        raise InputError(f"{name} {given} is more than the {cores} CPU core"
                         f"{'s' if cores != 1 else ''} this process may run on: give at most "
                         f"{cores}, or leave {name} out (the cores shared by the processes of "
                         "this machine)")
    return given


def available_memory(device: torch.device) -> int | None:
    """The bytes a new allocation on `device` may take now, as far as the machine says.

    On a CUDA device: what the driver has free plus what torch's allocator holds unused. On
    the CPU: MemAvailable of /proc/meminfo (lowered to what the process's cgroup still allows,
    where one sets a limit), else the free physical pages (`os.sysconf`). None where nothing
    says (another accelerator, another platform): then nothing is refused.
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                limit = _cgroup_room()
                return available if limit is None else min(available, limit)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _cgroup_room() -> int | None:
    """What this process's cgroup (v2) still allows it to allocate, None without a limit."""
    try:
        entry = Path("/proc/self/cgroup").read_text().splitlines()[0]
        folder = Path("/sys/fs/cgroup") / entry.split("::", 1)[1].lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((folder / "memory.current").read_text()))
    except (OSError, ValueError, IndexError):
        return None


def check_memory(needed: int | None, device: torch.device, what: str, lower: str) -> None:
    """Refuse work that needs more memory than `device` has available, before it allocates.

    Args:
        needed: about the bytes `what` needs (None: unknown, nothing checked).
        device: where it would allocate them (`available_memory`).
        what: what needs them ("translating sentence 3 (40,000 tokens) with a beam of 5").
        lower: how to need less ("lower the beam size").
    Raises:
        InputError: "{what} needs about N GB, more than the M GB of memory available on
            {device}: {lower}".
    """
    if needed is None:
        return
    available = available_memory(device)
    if available is not None and needed > available:
        raise InputError(f"{what} needs about {format_bytes(needed)}, more than the "
                         f"{format_bytes(available)} of memory available on {device}: {lower}")


def format_bytes(n: int) -> str:
    """`n` bytes in decimal units: "512 B", "1.5 MB", "8.7 GB", "1,200.0 TB"."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


# What torchrun tells each process it starts (its environment variables), and their unset value.
_LAUNCHER = {
    "WORLD_SIZE": ("processes in all", 1),
    "LOCAL_WORLD_SIZE": ("processes on this machine", 1),
    "RANK": ("this process's rank", 0),
    "LOCAL_RANK": ("this process's rank on this machine", 0),
}


def launcher_value(variable: str) -> int:
    """WORLD_SIZE, LOCAL_WORLD_SIZE, RANK or LOCAL_RANK as torchrun sets it; unset: 1 for the
    sizes, 0 for the ranks.

    Raises:
        InputError: the variable is set to something else than an integer >= its unset value.
    """
    meaning, unset = _LAUNCHER[variable]
    value = os.environ.get(variable, "").strip() or str(unset)
    if not value.isdigit() or int(value) < unset:
        raise InputError(f"{variable} must be an integer >= {unset} ({meaning}), got {value!r}")
    return int(value)


def shape_str(t: Tensor) -> str:
    return str(tuple(t.shape))


def check_tensor(name: str, t: object, ndim: int, *, integer: bool = False,
                 floating: bool = False, boolean: bool = False) -> Tensor:
    """Check type, rank and dtype family of an argument; return it typed as a Tensor.

    `integer` means int64 or int32, the index dtypes that embedding and gather accept.
    """
    if not isinstance(t, Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise InputError(f"{name} must have {ndim} dims, got shape {shape_str(t)}")
    if integer and t.dtype not in (torch.int64, torch.int32):
        raise InputError(f"{name} must hold integers of dtype torch.int64 (or torch.int32), "
                         f"got dtype {t.dtype}")
    if floating and not t.dtype.is_floating_point:
        raise InputError(f"{name} must be floating point, got dtype {t.dtype}")
    if boolean and t.dtype != torch.bool:
        raise InputError(f"{name} must be a bool mask (True at real tokens), got dtype {t.dtype}")
    return t


def check_dims(what: str, pairs: Sequence[tuple[str, Tensor, int, int]]) -> None:
    """All (name, tensor, dim, expected) must agree: tensor.shape[dim] == expected."""
    for name, t, dim, expected in pairs:
        if t.shape[dim] != expected:
            raise InputError(
                f"{what}: {name} has shape {shape_str(t)}, expected size {expected} at dim {dim}"
            )


def check_has_values(name: str, t: Tensor) -> None:
    """A tensor whose values a check reads: not on the meta device, which holds none."""
    if t.device.type == "meta":
        raise InputError(f"{name} is on the meta device, which holds no values to check; "
                         "trace shapes with torch.compile or torch.export, which skip value checks")


def check_token_ids(name: str, ids: Tensor, vocab_size: int) -> None:
    """Token ids must lie in [0, vocab_size)."""
    if ids.numel() == 0:
        return
    check_has_values(name, ids)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(
            f"{name} holds token id {bad}, outside the vocabulary of size {vocab_size}"
        )


def check_mask_rows(name: str, mask: Tensor) -> None:
    """Every row of a (B, S) mask needs at least one real token."""
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        rows = torch.nonzero(empty).flatten().tolist()[:8]
        raise InputError(f"{name} {shape_str(mask)} has rows with no real token: rows {rows}")


def check_lengths(name: str, lengths: Tensor, batch: int, max_len: int, *,
                  values: bool = True) -> None:
    """(B,) integer lengths for B rows padded to `max_len`, and with `values` (which reads the
    tensor, a device sync) 1 <= length <= max_len."""
    check_tensor(name, lengths, 1, integer=True)
    if lengths.shape[0] != batch:
        raise InputError(
            f"{name} has shape {shape_str(lengths)}, expected ({batch},) for the batch"
        )
    if batch == 0:
        raise InputError(f"{name}: empty batch")
    if max_len == 0:
        raise InputError(f"{name}: the batch is padded to length 0, so no sequence has a token")
    if not values:
        return
    check_has_values(name, lengths)
    low, high = int(lengths.min()), int(lengths.max())
    if low < 1:
        raise InputError(f"{name} holds length {low}: every sequence needs at least one token")
    if high > max_len:
        raise InputError(f"{name} holds length {high}, longer than the padded length {max_len}")


def check_end_padding(name: str, ids: Tensor, pad_id: int) -> Tensor:
    """(B, T) ids with pad_id only at the end of each row and at least one real token per row;
    returns the (B,) counts of real tokens."""
    real = ids != pad_id
    token_after_pad = ~real[:, :-1] & real[:, 1:]
    if bool(token_after_pad.any()):
        row, pos = (int(i) for i in torch.nonzero(token_after_pad)[0])
        raise InputError(f"{name} row {row} has pad_id (={pad_id}) at position {pos} before a "
                         "token: padding must come only at the end of a row")
    check_mask_rows(name, real)
    return real.sum(dim=1)


def check_padding(name: str, ids: Tensor, lengths: Tensor, pad_id: int) -> None:
    """(B, S) ids hold pad_id exactly at the positions past each row's length."""
    real = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths.to(ids.device)[:, None]
    wrong = (ids == pad_id) == real                              # pad inside, or a token after
    if bool(wrong.any()):
        row, pos = (int(i) for i in torch.nonzero(wrong)[0])
        where = "inside" if pos < int(lengths[row]) else "after"
        raise InputError(f"{name} row {row} has {'pad_id' if where == 'inside' else 'a token'} "
                         f"at position {pos}, {where} its length {int(lengths[row])}: lengths "
                         f"and padding (pad_id={pad_id}) disagree")
