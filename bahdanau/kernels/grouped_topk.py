"""The k largest values of each row in two stages on a CPU: twin of ``torch.topk(x, k, dim=-1)``.

A beam step picks each beam's best 2K next tokens out of a vocabulary of thousands, and on a
CPU `torch.topk` took twice the time of the log-softmax before it (14% of a beam-5 search of the
default job's model, one thread; 6% once grouped, as measured with torch.profiler). `top_k` first
takes the maximum of each of G groups of a row's values (token t is in group t mod G: a strided
maximum, vectorised across the groups), then the k best groups by their maxima, then the k best
values of those k groups (and the few tokens past the last whole group). The answer is exact:
a value outside the chosen groups is at most its group's maximum, which is at most each of the
k chosen maxima, so at least k values of the chosen groups are at least as large. NaN counts as
the largest, as in `torch.topk`. The values equal `torch.topk`'s; the indices too, except which
of several equal values is taken (which `torch.topk` does not specify either).

Elsewhere than on a CPU, and for rows too short to gain, it is `torch.topk` itself.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MIN_GROUPS_PER_K = 4     # fewer groups than this many times k: a plain topk is as fast


def grouping(n: int, k: int) -> tuple[int, int] | None:
    """(group size, groups) of `top_k`'s two stages for rows of n values, or None where a plain
    `torch.topk` is as fast (fewer than MIN_GROUPS_PER_K * k groups)."""
    group_size = max(1, math.isqrt(n // k))     # about sqrt(nk) groups and as many candidates
    groups = n // group_size
    return (group_size, groups) if groups >= MIN_GROUPS_PER_K * k else None


def top_k(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(the k largest of each row of `values` along its last dim, largest first; their indices).

    Args:
        values: (..., n) floating-point values, n >= k.
        k: how many to keep, at least 1.
    """
    *lead, n = values.shape
    stages = grouping(n, k)
    if values.device.type != "cpu" or stages is None:
        return values.topk(k, dim=-1)
    group_size, groups = stages
    rows = values.reshape(-1, n)
    whole = rows[:, : groups * group_size].view(rows.shape[0], group_size, groups)
    best_groups = whole.amax(dim=1).topk(k, dim=1).indices                      # (R, k)
    members = torch.arange(0, groups * group_size, groups, device=values.device)  # (size,)
    candidates = (best_groups[:, :, None] + members).flatten(1)               # (R, k * size)
    tail = torch.arange(groups * group_size, n, device=values.device)
    candidates = torch.cat([candidates, tail.expand(rows.shape[0], -1)], dim=1)
    best, where = rows.gather(1, candidates).topk(k, dim=1)
    return best.view(*lead, k), candidates.gather(1, where).view(*lead, k)
