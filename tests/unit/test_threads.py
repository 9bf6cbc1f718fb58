"""`AdaptiveThreads` on a simulated machine: each thread count has a speed that can change
during the run (another program starts or stops), and the tuner sees only update times."""

from __future__ import annotations

import random

import pytest

from bahdanau.training.threads import AdaptiveThreads

IDLE = {1: 1100.0, 2: 1900.0}         # target tokens/s by thread count, as measured on 2 cores
BUSY = {1: 1250.0, 2: 550.0}          # ... beside one CPU-bound process
TOKENS = 1000                          # per update


def simulate(speeds, updates: int, most: int = 2, noise: float = 0.0, seed: int = 0
             ) -> tuple[AdaptiveThreads, list[int], float]:
    """Run `updates` updates; `speeds(update)` gives that update's speed by thread count.
    Returns the tuner, the thread count of each update and the total time."""
    counts: list[int] = []
    current = [most]
    tuner = AdaptiveThreads(most, set_threads=lambda n: current.__setitem__(0, n),
                            log=lambda line: None)
    rng, total = random.Random(seed), 0.0
    for update in range(updates):
        rate = speeds(update)[current[0]] * (1 + rng.uniform(-noise, noise))
        seconds = TOKENS / rate
        counts.append(current[0])
        total += seconds
        tuner.observe(TOKENS, seconds)
    return tuner, counts, total


def ideal_time(speeds, updates: int) -> float:
    return sum(TOKENS / max(speeds(u).values()) for u in range(updates))


def test_an_idle_machine_keeps_every_core_and_pays_little_for_the_trials() -> None:
    tuner, counts, total = simulate(lambda u: IDLE, 3000, noise=0.08)
    assert tuner.threads == 2
    assert counts.count(1) <= 0.02 * len(counts)       # trials only, doubling holds apart
    assert tuner.trials <= 6
    assert total <= 1.02 * ideal_time(lambda u: IDLE, 3000)


def test_a_busy_machine_gets_one_thread_after_the_first_trial() -> None:
    tuner, counts, total = simulate(lambda u: BUSY, 2000, noise=0.08)
    # a warm-up and a measurement at 2, a trial at 1, a measurement at 2, then a hold at 1
    assert counts[:32] == [2] * 32 and counts[32:40] == [1] * 8 and counts[40:48] == [2] * 8
    assert counts[48:48 + 96] == [1] * 96
    assert tuner.threads == 1 and counts.count(2) <= 48 + 4 * 8          # and its trials
    assert total <= 1.1 * ideal_time(lambda u: BUSY, 2000)
    assert total < 0.5 * 2000 * TOKENS / BUSY[2]          # under half the time of 2 threads


def test_another_program_starting_mid_run_is_followed_at_once() -> None:
    def speeds(update: int) -> dict[int, float]:
        return IDLE if update < 2000 else BUSY

    _, counts, _ = simulate(speeds, 2400)
    assert counts[1990:2000] == [2] * 10                  # idle: a long hold at 2
    # within a measurement that straddles the change, a slow one and a trial: then 1 thread,
    # but for a trial at 2 after each hold
    after = counts[2000 + 4 * 8:]                          # and one after the trial
    assert after[:80] == [1] * 80 and after.count(1) >= 0.9 * len(after)


def test_the_machine_freed_again_gets_its_cores_back() -> None:
    def speeds(update: int) -> dict[int, float]:
        return BUSY if update < 1000 else IDLE

    tuner, counts, _ = simulate(speeds, 4000)
    assert counts[999] == 1 and tuner.threads == 2
    back = 1000 + counts[1000:].index(2)       # at the next trial: a hold is at most 1,536
    assert back <= 1000 + 1536 + 16 and counts[back + 8:].count(1) <= 5 * 8   # trials


def test_many_cores_settle_on_the_fastest_count_by_halving() -> None:
    def speeds(update: int) -> dict[int, float]:
        return {n: 1000 * min(n, 8) / (1 + 0.3 * max(0, n - 8)) for n in (1, 2, 4, 8, 16)}

    tuner, counts, _ = simulate(speeds, 2000, most=16)
    assert tuner.threads == 8 and counts[-500:].count(8) >= 480


def test_one_core_is_left_alone() -> None:
    calls: list[int] = []
    tuner = AdaptiveThreads(1, set_threads=calls.append)
    for _ in range(100):
        tuner.observe(TOKENS, 1.0)
    assert calls == [1] and tuner.trials == 0


def test_a_slow_start_does_not_pass_for_a_slower_count() -> None:
    """The first updates of a run are slow (allocations, first shapes): a trial compares with
    the chosen count measured before and after it, so the idle machine keeps its cores."""
    def speeds(update: int) -> dict[int, float]:
        warming = 0.3 if update < 32 else 1.0     # slow through the first measurement
        return {n: rate * warming for n, rate in IDLE.items()}

    tuner, counts, _ = simulate(speeds, 200)
    assert tuner.threads == 2 and counts[48:].count(1) == 0


@pytest.mark.parametrize("kwargs", [{"most": 0}, {"most": 2, "trial": 0},
                                    {"most": 2, "trial": 16, "hold": 8},
                                    {"most": 2, "hold": 96, "longest_hold": 64}])
def test_bad_settings_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        AdaptiveThreads(set_threads=lambda n: None, **kwargs)
