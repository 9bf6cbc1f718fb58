"""Two searches' results compared hypothesis by hypothesis, and the random models the search
tests decode with. Importable from any test module (`pythonpath = ["tests"]`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from bahdanau import RNNSearch, presets
from bahdanau.search import Hypothesis


def random_model(cls: type[RNNSearch] = RNNSearch, seed: int = 0, *, vocab: int = 16,
                 scale: float = 1.0, dtype: torch.dtype = torch.float64, engine: str = "fast"
                 ) -> RNNSearch:
    """A tiny model (16 source words, `vocab` target words) in eval mode, its weights drawn
    from N(0, scale^2) by a generator seeded with `seed` (also torch's seed): peaked
    distributions, different per seed, sentences of varied lengths."""
    torch.manual_seed(seed)
    model = cls.from_config(replace(presets.tiny(16, vocab), engine=engine)).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model.eval()


def assert_same_hypotheses(got: Sequence[Sequence[Hypothesis]],
                           want: Sequence[Sequence[Hypothesis]], *, tol: float = 0.0) -> None:
    """The same hypotheses for every sentence, in the same order: equal tokens, and scores,
    log-probabilities and attention within `tol` (0: equal)."""
    for hyps, ref_hyps in zip(got, want, strict=True):
        for hyp, ref in zip(hyps, ref_hyps, strict=True):
            assert hyp.tokens == ref.tokens
            assert math.isclose(hyp.score, ref.score, rel_tol=0, abs_tol=tol)
            assert math.isclose(hyp.log_prob, ref.log_prob, rel_tol=0, abs_tol=tol)
            assert (hyp.attention is None) == (ref.attention is None)
            if ref.attention is not None:
                torch.testing.assert_close(hyp.attention, ref.attention, rtol=0, atol=tol)


def reorder_tol(dtype: torch.dtype, *, steps: int = 10, inner: int = 32,
                magnitude: float = 1e3) -> float:
    """How far the scores of the same hypotheses may differ between two searches that do the
    same arithmetic with the sums in another order: other rows sharing a matrix product (the
    BLAS picks its kernel by the number of rows), or a source padded further (longer masked
    rows in the softmax and the context sum). Each sum of `inner` terms moves by at most
    inner * eps * sum|terms| (sum|terms| < `magnitude` for the tests' tiny models with N(0, 1)
    weights), over `steps` steps."""
    return steps * inner * torch.finfo(dtype).eps * magnitude
