"""The search's steps read nothing back to the host: the proof, on the CPU.

Every Python-level read of tensor values back to the host (`host_reads.host_reads_refused`:
`item`, `tolist`, `numpy`, `bool`, `int`, `float`, `index`, `nonzero`, `argwhere`, one-argument
`torch.where`, indexing with a boolean mask) raises while the `check_every` steps between two
checks run (`bahdanau.search._Beams.advance`, wrapped). The encode and set-up of a batch and the
checks themselves stay outside the window. The search must still complete, every call of the
model's step must have come inside a window, and the hypotheses must be those of the unguarded
search, for greedy and beam search, RNNSearch and RNNEncDec, float64 and float32 (the
oneDNN-packed step), the reference engine, and an Ensemble; and so for constrained decoding.

Reads made by C++ code without a Python call (a kernel that syncs inside ATen) are not seen
here; on a GPU, recording the step as a CUDA graph (`bahdanau.captured_step`) refuses those.
"""

from __future__ import annotations

import functools

import pytest
import torch
from host_reads import HostRead, host_reads_refused
from search_asserts import assert_same_hypotheses, random_model, reorder_tol

from bahdanau import BeamSearch, Ensemble, RNNEncDec
from bahdanau import search as search_module
from bahdanau.errors import InputError

SRC = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 0, 0, 0], [4, 12, 13, 0, 0], [7, 0, 0, 0, 0]])
LENGTHS = torch.tensor([5, 2, 3, 1])


def test_the_guard_refuses_every_host_read_and_is_lifted_after() -> None:
    """The window is not vacuous: each read raises inside it, and works again after it."""
    t, mask = torch.tensor([1.0, 0.0]), torch.tensor([True, False])
    reads = [lambda: t[0].item(), lambda: t.tolist(), lambda: t.numpy(),
             lambda: bool(mask.any()), lambda: int(t[0]), lambda: float(t[0]),
             lambda: range(torch.tensor(2)), lambda: mask.nonzero(), lambda: mask.argwhere(),
             lambda: torch.nonzero(mask), lambda: torch.argwhere(mask),
             lambda: torch.where(mask), lambda: t[mask], lambda: t.__setitem__(mask, 0.0),
             lambda: t.masked_select(mask), lambda: torch.unique(t),
             lambda: t.repeat_interleave(torch.tensor([1, 2])), lambda: torch.equal(t, t),
             lambda: torch.allclose(t, t), lambda: torch.is_nonzero(t[:1])]
    with host_reads_refused():
        for read in reads:
            with pytest.raises(HostRead):
                read()
        selected = torch.where(mask, t, -t)                              # a read-free select
        assert float(torch.tensor(3.0).add(1).sum().numel()) == 1.0   # plain Python numbers
    assert torch.equal(selected, torch.tensor([1.0, -0.0]))
    for read in reads:
        read()


def guarded_search(search: BeamSearch, net: torch.nn.Module, monkeypatch, **phrases
                   ) -> tuple[list, dict]:
    """`search(net, SRC, LENGTHS, **phrases)` with host reads refused during every run of
    steps, and the model's steps counted inside and outside those runs."""
    counts = {"inside": 0, "outside": 0, "windows": 0}
    inside = [False]
    advance, step = search_module._Beams.advance, net.step

    def guarded_advance(self, steps):
        counts["windows"] += 1
        with host_reads_refused():
            inside[0] = True
            try:
                advance(self, steps)
            finally:
                inside[0] = False

    @functools.wraps(step)            # keeps step's signature (its `check` keyword)
    def counted_step(*args, **kwargs):
        counts["inside" if inside[0] else "outside"] += 1
        return step(*args, **kwargs)

    monkeypatch.setattr(search_module._Beams, "advance", guarded_advance)
    monkeypatch.setattr(net, "step", counted_step)
    return search(net, SRC, LENGTHS, **phrases), counts


CASES = {
    "greedy-rnnsearch": (lambda: random_model(), dict(beam_size=1, max_len=9)),
    "beam-rnnsearch": (lambda: random_model(seed=1), dict(beam_size=3, n_best=2, max_len=8,
                                                   length_penalty="gnmt", min_len=2)),
    "beam-rnnencdec": (lambda: random_model(RNNEncDec, seed=2), dict(beam_size=3, max_len=7,
                                                              max_len_ratio=2.0)),
    "greedy-rnnencdec": (lambda: random_model(RNNEncDec, seed=3), dict(beam_size=1, max_len=6)),
    "beam-float32-packed": (lambda: random_model(seed=4, dtype=torch.float32),
                            dict(beam_size=4, n_best=2, max_len=8, length_penalty="average")),
    "beam-reference-engine": (lambda: random_model(seed=5, engine="reference"),
                              dict(beam_size=2, max_len=6)),
    "beam-ensemble": (lambda: Ensemble([random_model(seed=6), random_model(RNNEncDec, seed=7)]),
                      dict(beam_size=3, n_best=2, max_len=7)),
    "greedy-ensemble": (lambda: Ensemble([random_model(seed=8), random_model(seed=9)]),
                        dict(beam_size=1, max_len=7)),
}


@pytest.mark.parametrize("check_every", [1, 4, 1000])
@pytest.mark.parametrize("case", list(CASES))
def test_steps_between_checks_read_nothing_back(case, check_every, monkeypatch) -> None:
    build, options = CASES[case]
    net = build()
    want = BeamSearch(**options)(net, SRC, LENGTHS)                     # unguarded, k = 1
    search = BeamSearch(**options, check_every=check_every)
    got, counts = guarded_search(search, net, monkeypatch)
    assert_same_hypotheses(got, want, tol=reorder_tol(next(net.parameters()).dtype))
    assert counts["outside"] == 0, "a decoder step ran outside the guarded runs of steps"
    assert counts["inside"] >= 2 and counts["windows"] >= 1
    if check_every == 1000:
        assert counts["windows"] == 1           # every step of the batch in one window


# phrases each sentence's hypotheses must hold, and must not (bahdanau.constraints)
PHRASES = dict(constraints=[[[4, 5]], [], [[9], [13, 13]], [[6]]], avoid=[[], [[15]], [], [[7]]])


@pytest.mark.parametrize("check_every", [1, 4, 1000])
@pytest.mark.parametrize("case", ["greedy-rnnsearch", "beam-rnnsearch", "beam-rnnencdec",
                                  "beam-float32-packed", "beam-ensemble"])
def test_constrained_steps_between_checks_read_nothing_back(case, check_every,
                                                            monkeypatch) -> None:
    """The constrained step (restrict, the candidates, the bank allocation) too."""
    build, options = CASES[case]
    net = build()
    want = BeamSearch(**options)(net, SRC, LENGTHS, **PHRASES)          # unguarded, k = 1
    search = BeamSearch(**options, check_every=check_every)
    got, counts = guarded_search(search, net, monkeypatch, **PHRASES)
    assert_same_hypotheses(got, want, tol=reorder_tol(next(net.parameters()).dtype))
    assert counts["outside"] == 0 and counts["inside"] >= 2
    assert all(any(h.tokens[i:i + 2] == [4, 5] for i in range(len(h.tokens))) for h in got[0])


@pytest.mark.parametrize("build", [random_model,
                                   lambda: Ensemble([random_model(seed=1), random_model(seed=2)])],
                         ids=["model", "ensemble"])
def test_the_model_s_own_check_is_a_host_read(build) -> None:
    """Why the search passes `check=False`: the step's check of the token ids reads them (an
    ensemble's, through its first member); without the guard it refuses a bad id."""
    net = build()
    with torch.inference_mode():
        state, memory = net.encode(SRC, LENGTHS)
        tokens = torch.ones(4, dtype=torch.long)
        with host_reads_refused():
            with pytest.raises(HostRead):
                net.step(tokens, state, memory)
            net.step(tokens, state, memory, check=False)
        with pytest.raises(InputError, match="prev_tokens holds token id 16, outside the "
                                             "vocabulary of size 16"):
            net.step(torch.tensor([1, 16, 1, 1]), state, memory)
