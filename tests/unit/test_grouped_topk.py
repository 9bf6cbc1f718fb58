"""`bahdanau.kernels.grouped_topk.top_k` against its twin `torch.topk`: the same values always,
the same indices where no two values tie, and always indices that hold those values."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bahdanau.kernels.grouped_topk import grouping, top_k


def _values(seed: int, shape: tuple[int, ...], kind: str, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "continuous":
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    values = torch.randint(0, 4, shape, generator=gen).to(dtype)          # many ties
    special = torch.rand(shape, generator=gen) < 0.3
    fill = {"ties": 1.0, "-inf": float("-inf"), "nan": float("nan")}[kind]
    return values.masked_fill(special, fill)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 3), n=st.integers(1, 4000),
       k=st.integers(1, 20), kind=st.sampled_from(["continuous", "ties", "-inf", "nan"]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_top_k_is_torch_topk(seed, rows, n, k, kind, dtype) -> None:
    k = min(k, n)
    values = _values(seed, (rows, 2, n), kind, dtype)
    best, index = top_k(values, k)
    expected_best, expected_index = values.topk(k, dim=-1)
    torch.testing.assert_close(best, expected_best, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(values.gather(-1, index), best, rtol=0, atol=0, equal_nan=True)
    assert (index.sort(dim=-1).values.diff(dim=-1) > 0).all()      # k distinct positions
    if kind == "continuous":
        assert torch.equal(index, expected_index)


def test_a_beam_step_takes_the_grouped_path_and_finds_the_same_tokens() -> None:
    # a beam of 5 over a 10,004-token vocabulary: each beam's best 10 of its log-probabilities
    n, k = 10_004, 10
    assert grouping(n, k) is not None
    log_probs = torch.log_softmax(torch.randn(7, 5, n, generator=torch.Generator().manual_seed(3))
                                  * 4, dim=-1)
    log_probs[..., 0:2] = float("-inf")                                   # pad and bos
    best, index = top_k(log_probs, k)
    expected_best, expected_index = log_probs.topk(k, dim=-1)
    assert torch.equal(best, expected_best) and torch.equal(index, expected_index)


def test_the_best_values_in_the_tail_past_the_last_whole_group_are_found() -> None:
    n, k = 1_000, 3                      # groups of 18: 55 of them, the last 10 values a tail
    size, groups = grouping(n, k)
    assert (size, groups) == (18, 55) and n - size * groups == 10
    values = torch.zeros(2, n)
    values[0, -3:] = torch.tensor([5.0, 7.0, 6.0])
    values[1, [0, -1, 500]] = torch.tensor([1.0, 9.0, 2.0])
    best, index = top_k(values, k)
    assert best.tolist() == [[7.0, 6.0, 5.0], [9.0, 2.0, 1.0]]
    assert index.tolist() == [[n - 2, n - 1, n - 3], [n - 1, 500, 0]]
