"""`AdaptiveThreads` on a simulated machine: each thread count has a speed that can change
during the run (another program starts or stops), and the tuner sees only update times (a
training run's updates, or a search's steps with `AdaptiveThreads.for_decoding`)."""

from __future__ import annotations

import random

import pytest

from bahdanau.training.threads import AdaptiveThreads

IDLE = {1: 1100.0, 2: 1900.0}         # target tokens/s by thread count, as measured on 2 cores
BUSY = {1: 1250.0, 2: 550.0}          # ... beside one CPU-bound process
TOKENS = 1000                          # per update


def simulate(speeds, updates: int, most: int = 2, noise: float = 0.0, seed: int = 0,
             make=AdaptiveThreads) -> tuple[AdaptiveThreads, list[int], float]:
    """Run `updates` updates; `speeds(update)` gives that update's speed by thread count.
    Returns the tuner (`make(most, ...)`), the thread count of each update and the total
    time."""
    counts: list[int] = []
    current = [0]
    tuner = make(most, set_threads=lambda n: current.__setitem__(0, n), log=lambda line: None)
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


# A beam-5 step of the Multi30k recipe's model, target tokens (beam rows) per second, on 2 cores:
# beside two 1-thread training runs a step of 2 threads took 730 ms, one of 1 thread 35 ms
STEP_BUSY = {1: 4500.0, 2: 220.0}
STEP_IDLE = {1: 6000.0, 2: 8000.0}       # one thread at about 0.75 of two


def test_decoding_starts_at_one_thread_and_takes_two_on_an_idle_machine() -> None:
    tuner, counts, total = simulate(lambda u: STEP_IDLE, 600, noise=0.1,
                                    make=AdaptiveThreads.for_decoding)
    # a warm-up step and a measurement at 1, a trial at 2, a measurement at 1, then 2
    assert counts[:9] == [1, 1, 1, 2, 2, 1, 1, 2, 2]
    assert tuner.threads == 2 and counts[7:].count(1) <= 3 * 2      # trials only
    assert total <= 1.03 * ideal_time(lambda u: STEP_IDLE, 600)


def test_decoding_on_a_busy_machine_pays_one_step_for_each_trial_of_more_threads() -> None:
    """A trial at 2 threads that is twenty times slower ends after its first step, and the
    trials double their distance: 600 steps cost little more than one thread's."""
    tuner, counts, total = simulate(lambda u: STEP_BUSY, 600, noise=0.1,
                                    make=AdaptiveThreads.for_decoding)
    assert counts[:6] == [1, 1, 1, 2, 1, 1] and counts[6:6 + 128] == [1] * 128
    assert tuner.threads == 1 and counts.count(2) == tuner.trials <= 3
    assert total <= 1.2 * ideal_time(lambda u: STEP_BUSY, 600)
    assert total < 0.1 * 600 * TOKENS / STEP_BUSY[2]          # a tenth of 2 threads' time


def test_a_program_starting_mid_decoding_gets_one_thread_within_a_few_steps() -> None:
    def speeds(step: int) -> dict[int, float]:
        return STEP_IDLE if step < 300 else STEP_BUSY

    tuner, counts, _ = simulate(speeds, 400, make=AdaptiveThreads.for_decoding)
    assert counts[290:300] == [2] * 10
    # the slow measurement at 2 starts a trial at 1, measured again at 2, then a hold at 1
    assert counts[300:306] == [2, 1, 1, 2, 2, 1] and tuner.threads == 1
    assert counts[306:306 + 60] == [1] * 60 and counts[306:].count(2) == 1    # a trial


def test_a_slower_machine_at_one_thread_starts_no_trial_of_more() -> None:
    """At one thread a drop in speed means another program took a core: more threads would
    be slower still, so the hold goes on (with more threads it would start a trial)."""
    def speeds(step: int) -> dict[int, float]:
        slower = 1.0 if step < 100 else 0.2         # under a quarter: the `drop` of 2
        return {n: rate * slower for n, rate in STEP_BUSY.items()}

    tuner, counts, _ = simulate(speeds, 130, make=AdaptiveThreads.for_decoding)
    assert tuner.trials == 1 and counts[6:] == [1] * 124


def test_work_between_updates_runs_at_the_chosen_count_not_on_trial() -> None:
    current = [0]
    tuner = AdaptiveThreads(2, trial=1, warm_up=1, hold=4,
                            set_threads=lambda n: current.__setitem__(0, n),
                            log=lambda line: None)
    for _ in range(2):                      # a warm-up, a measurement at 2: on trial at 1
        tuner.observe(TOKENS, 1.0)
    assert current[0] == 1 and tuner.threads == 2
    with tuner.chosen():
        assert current[0] == 2
    assert current[0] == 1                  # back on trial
    tuner.observe(TOKENS, 2.0)              # the trial: slower; measured again at 2
    assert current[0] == 2
    with tuner.chosen():
        assert current[0] == 2
    assert current[0] == 2


@pytest.mark.parametrize("kwargs", [{"most": 2, "start": 3}, {"most": 2, "start": 0}])
def test_a_start_outside_the_counts_is_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        AdaptiveThreads(set_threads=lambda n: None, **kwargs)
