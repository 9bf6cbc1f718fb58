"""Tests for the run settings in bahdanau._checks: resolve_device, cpu_threads, the memory
checks.

Which accelerators exist is simulated by monkeypatching torch.cuda / torch.mps, so every branch
runs on any machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import bahdanau._checks as checks
from bahdanau._checks import (
    available_memory,
    check_memory,
    cpu_threads,
    format_bytes,
    resolve_device,
    usable_cores,
)
from bahdanau.errors import InputError


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "cpu:0"])
def test_devices_that_always_exist(device, no_gpu) -> None:
    assert resolve_device(device) == torch.device(device)


@pytest.mark.parametrize(("device", "match"), [("meta", "not on meta"), ("vulkan", "not on vulkan"),
                                               ("cpu:1", "one cpu device")])
def test_devices_models_cannot_run_on(device, match) -> None:
    with pytest.raises(InputError, match=match):
        resolve_device(device)


@pytest.mark.parametrize("text", ["foo", "", "CUDA", " cuda", "cuda:x", "cuda:-1", "cuda:0:1",
                                  "gpu"])
def test_strings_torch_cannot_parse(text: str) -> None:
    with pytest.raises(InputError, match=rf"^device {text!r} is not a device: expected 'cpu'"):
        resolve_device(text)


@pytest.mark.parametrize("value", [0, 1.5, None, ["cpu"]])
def test_values_that_are_not_device_strings(value) -> None:
    with pytest.raises(InputError, match=r"^device must be a device string"):
        resolve_device(value)                                     # type: ignore[arg-type]


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_without_cuda(device, no_gpu) -> None:
    with pytest.raises(InputError, match=r"^device 'cuda(:\d)?': CUDA is not available here$"):
        resolve_device(device)


@pytest.mark.parametrize(("device", "expected"), [
    ("cuda", torch.device("cuda")),                               # no index: the current device
    ("cuda:0", torch.device("cuda", 0)),
    ("cuda:1", torch.device("cuda", 1)),
    (torch.device("cuda", 1), torch.device("cuda", 1)),
])
def test_cuda_devices_present(device, expected, two_gpus) -> None:
    assert resolve_device(device) == expected


@pytest.mark.parametrize("index", [2, 7])
def test_cuda_index_out_of_range(index: int, two_gpus) -> None:
    with pytest.raises(InputError, match=rf"^device 'cuda:{index}': there is no CUDA device "
                                         rf"{index}, only 2 \(cuda:0 to cuda:1\)$"):
        resolve_device(f"cuda:{index}")


def test_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.mps, "is_available", lambda: False)
    with pytest.raises(InputError, match=r"^device 'mps': MPS is not available here$"):
        resolve_device("mps")
    monkeypatch.setattr(torch.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "device_count", lambda: 1)
    assert resolve_device("mps") == torch.device("mps")
    with pytest.raises(InputError, match=r"no MPS device 1, only 1"):
        resolve_device("mps:1")


def test_the_option_is_named(no_gpu) -> None:
    with pytest.raises(InputError, match=r"^--device 'foo' is not a device"):
        resolve_device("foo", "--device")
    with pytest.raises(InputError, match=r"^--device 'cuda': CUDA"):
        resolve_device("cuda", "--device")


def test_threads_are_at_most_the_usable_cores(monkeypatch) -> None:
    """--threads 100000 crashed every command (torch's pool of as many threads: rc 139)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert usable_cores() == 4
    assert [cpu_threads(n) for n in (None, 1, 4)] == [4, 1, 4]
    for threads in (5, 100000):
        with pytest.raises(InputError) as info:
            cpu_threads(threads)
        assert str(info.value) == (f"--threads {threads} is more than the 4 CPU cores this "
                                   "process may run on: give at most 4, or leave --threads out "
                                   "(the cores shared by the processes of this machine)")


def test_work_beyond_the_memory_available_is_one_line(monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(checks, "available_memory", lambda device: 2 * 10**9)
    check_memory(2 * 10**9, cpu, "doing it", "do less")              # exactly what there is
    check_memory(None, cpu, "doing it", "do less")                   # an unknown need
    with pytest.raises(InputError) as info:
        check_memory(8_700_000_000, cpu, "doing it", "do less")
    assert str(info.value) == ("doing it needs about 8.7 GB, more than the 2.0 GB of memory "
                               "available on cpu: do less")
    assert [format_bytes(n) for n in (512, 1500, 10**15 * 16)] == ["512 B", "1.5 kB",
                                                                  "16,000.0 TB"]


@pytest.mark.skipif(not Path("/proc/meminfo").is_file(), reason="reads /proc/meminfo (Linux)")
def test_the_cpu_s_available_memory_is_meminfo_s() -> None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            meminfo = int(line.split()[1]) * 1024
    available = available_memory(torch.device("cpu"))
    assert available is not None and 0 < available <= meminfo * 1.1   # it changes meanwhile
