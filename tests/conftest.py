"""Shared test setup: hypothesis profiles, the seed fixture, and skipping GPU tests without CUDA."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Test models are tiny: one thread avoids OpenMP spin-waiting, which on a busy 2-core runner
# made small backward passes up to 100x slower than on one thread. Set again before every test
# (`_one_thread`), since a command-line run inside a test sets the threads it is given.
torch.set_num_threads(1)

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test starts on one torch thread, and the thread count is put back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seed() -> torch.Generator:
    """Seed torch's global RNG with 0 and return a separate generator, also seeded 0."""
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when CUDA is not available."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)
