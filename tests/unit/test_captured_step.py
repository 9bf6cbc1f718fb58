"""The captured decoder step (bahdanau.captured_step) and the search through it.

On a CPU the recording is `replay_eagerly`, which re-runs the step on the same static buffers
at each replay, as a CUDA graph re-runs its kernels on them: a step input that is not copied
into its buffer, or an output read after the next replay, gives wrong hypotheses here as on a
GPU. The search through it, with sources padded to a bucket and power-of-two groups of
sentences, must find the hypotheses of the plain search. The tests marked `gpu` run the same
comparisons through real CUDA graphs.
"""

from __future__ import annotations

import re

import pytest
import torch
from search_asserts import assert_same_hypotheses, random_model, reorder_tol

from bahdanau import BeamSearch, Ensemble, RNNEncDec
from bahdanau.captured_step import (
    CapturedStep,
    clone,
    copy_into,
    pad_to_bucket,
    replay_eagerly,
    signature,
)
from bahdanau.config import model_vocabs
from bahdanau.errors import InputError
from bahdanau.search import step_call

SRC = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [9, 10, 0, 0, 0, 0, 0], [4, 12, 13, 0, 0, 0, 0],
                    [7, 0, 0, 0, 0, 0, 0], [8, 8, 9, 9, 10, 0, 0], [13, 5, 0, 0, 0, 0, 0]])
LENGTHS = torch.tensor([7, 2, 3, 1, 5, 2])


# ---------------------------------------------------------------------------- the pieces
def test_pad_to_bucket_pads_to_the_next_multiple() -> None:
    for length, want in ((1, 8), (7, 8), (8, 8), (9, 16), (17, 24)):
        src = torch.arange(2 * length).view(2, length) + 4
        padded = pad_to_bucket(src, 0)
        assert padded.shape == (2, want)
        assert torch.equal(padded[:, :length], src) and not padded[:, length:].any()
    assert pad_to_bucket(SRC, 3, multiple=4)[:, 7:].eq(3).all()


def memory_of(net, src, lengths):
    with torch.inference_mode():
        return net.encode(src, lengths)[1]


def leaves(tree):
    """The tensors of a nested tuple, in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, tuple):
        return [t for field in tree for t in leaves(field)]
    return []


def test_copy_into_fills_the_static_memory_in_place() -> None:
    """A model's memory (a NamedTuple of NamedTuples, Nones and flags): the static copy keeps
    its tensors' storage and types, and holds the new batch's values after `copy_into`."""
    net = random_model()
    first = memory_of(net, SRC[:3], LENGTHS[:3])
    second = memory_of(net, SRC[3:], LENGTHS[3:])
    assert signature(first) == signature(second)
    static = clone(first)
    assert type(static) is type(first) and type(static.decoder) is type(first.decoder)
    where = [t.data_ptr() for t in leaves(static)]
    copy_into(static, second)
    assert [t.data_ptr() for t in leaves(static)] == where
    for got, want in zip(leaves(static), leaves(second), strict=True):
        assert torch.equal(got, want)
    assert len(leaves(static)) >= 5                 # annotations, mask, keys, values, weights


def test_signature_tells_shapes_dtypes_and_values_apart() -> None:
    t = torch.zeros(2, 3)
    base = signature((t, (None, True)))
    assert signature((torch.ones(2, 3), (None, True))) == base      # values of tensors: no
    for other in ((torch.zeros(2, 4), (None, True)), (t.double(), (None, True)),
                  (t, (None, False)), (t, (t, True))):
        assert signature(other) != base
    with pytest.raises(InputError, match="a captured step takes tensors, tuples of them and "
                                         "plain values, got a list"):
        signature((t, [t]))


def test_captured_step_records_once_per_signature_and_clones_its_outputs() -> None:
    calls = []

    def step(tokens, state, memory):
        calls.append(tokens.shape[0])
        return (tokens * 2 + memory, state + 1)

    captured = CapturedStep(step, record=replay_eagerly)
    out = captured(torch.tensor([1, 2]), torch.zeros(2), torch.tensor(10))
    again = captured(torch.tensor([3, 4]), torch.ones(2), torch.tensor(10))
    assert out[0].tolist() == [12, 14] and again[0].tolist() == [16, 18]    # not overwritten
    assert again[1].tolist() == [2.0, 2.0]
    captured(torch.tensor([1, 2, 3]), torch.zeros(3), torch.tensor(0))
    third = captured(torch.tensor([5]), torch.zeros(1), torch.tensor(1))
    assert third[0].tolist() == [11]
    assert (captured.graphs, captured.replays) == (3, 4)


# ---------------------------------------------------------------------------- the search
def eager_captured_search(search: BeamSearch, net, src, lengths, captured=None):
    """The search `cuda_graphs=True` runs, on a CPU: padded sources, power-of-two groups of
    sentences, the step through a `CapturedStep` replayed eagerly."""
    shapes = []

    def step(tokens, state, memory):
        shapes.append((tokens.shape[0], signature(memory)))
        return step_call(net)(tokens, state, memory)

    captured = captured or CapturedStep(step, record=replay_eagerly)
    with torch.inference_mode():
        padded = pad_to_bucket(src, model_vocabs(net).pad_id)
        found = search._search(net, padded, lengths, captured, fixed_rows=True)
    return found, captured, shapes


CASES = {
    "greedy-rnnsearch": (lambda: random_model(seed=1), dict(beam_size=1, max_len=9)),
    "beam-rnnsearch": (lambda: random_model(seed=2), dict(beam_size=3, n_best=2, max_len=9,
                                                          max_len_ratio=1.5, min_len=2)),
    "beam-rnnencdec": (lambda: random_model(RNNEncDec, seed=3),
                       dict(beam_size=4, n_best=2, max_len=8, length_penalty="gnmt")),
    "beam-reference": (lambda: random_model(seed=4, engine="reference"),
                       dict(beam_size=2, max_len=7, length_penalty="average")),
    "beam-float32": (lambda: random_model(seed=5, dtype=torch.float32),
                     dict(beam_size=3, n_best=3, max_len=8)),
    "beam-ensemble": (lambda: Ensemble([random_model(seed=6), random_model(RNNEncDec, seed=7)]),
                      dict(beam_size=3, n_best=2, max_len=8)),
}


@pytest.mark.parametrize("check_every", [1, 3, 1000])
@pytest.mark.parametrize("case", list(CASES))
def test_the_captured_search_finds_the_hypotheses_of_the_search(case, check_every) -> None:
    build, options = CASES[case]
    net = build()
    want = BeamSearch(**options)(net, SRC, LENGTHS)
    search = BeamSearch(**options, check_every=check_every)
    got, captured, shapes = eager_captured_search(search, net, SRC, LENGTHS)
    dtype = next(net.parameters()).dtype
    assert_same_hypotheses(got, want, tol=reorder_tol(dtype))
    # one recording per shape; the batch keeps 6 sentences or a power of two of them
    K = options["beam_size"]
    assert captured.graphs == len({shape for shape in shapes})
    assert {rows for rows, _ in shapes} <= {K * b for b in (6, 4, 2, 1)}
    assert captured.replays > captured.graphs


def test_the_recordings_serve_the_next_batches_with_their_own_memory() -> None:
    """Batches of the same shapes replay the first batch's recordings, with each batch's
    memory copied in: the hypotheses are each batch's own."""
    net = random_model(seed=8)
    search = BeamSearch(beam_size=2, n_best=2, max_len=6, check_every=2)
    order = torch.tensor([2, 0, 5, 1, 4, 3])
    batches = [(SRC, LENGTHS), (SRC[order], LENGTHS[order]),
               (torch.where(SRC > 0, (SRC - 1) % 12 + 4, 0), LENGTHS)]   # other words
    _, captured, _ = eager_captured_search(search, net, *batches[0])
    graphs = captured.graphs
    for src, lengths in batches[1:]:
        got, _, _ = eager_captured_search(search, net, src, lengths, captured)
        assert_same_hypotheses(got, search(net, src, lengths), tol=reorder_tol(torch.float64))
    assert captured.graphs <= graphs + 2           # the same shapes, give or take a group


def test_captured_is_none_until_a_cuda_search_ran() -> None:
    assert BeamSearch(cuda_graphs=True).captured(random_model()) is None


# ---------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("check_every", [1, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_graphs_find_the_hypotheses_of_the_search(case, check_every) -> None:
    build, options = CASES[case]
    net = build().cuda()
    src, lengths = SRC.cuda(), LENGTHS.cuda()
    want = BeamSearch(**options, check_every=check_every)(net, src, lengths)
    search = BeamSearch(**options, check_every=check_every, cuda_graphs=True)
    dtype = next(net.parameters()).dtype
    for _ in range(2):                             # recorded, then replayed from the start
        assert_same_hypotheses(search(net, src, lengths), want, tol=reorder_tol(dtype))
    captured = search.captured(net)
    assert captured is not None and 1 <= captured.graphs <= 4
    assert captured.replays >= 2 * captured.graphs


@pytest.mark.gpu
def test_cuda_graphs_follow_parameters_updated_in_place() -> None:
    net = random_model(seed=9).cuda()
    src, lengths = SRC.cuda(), LENGTHS.cuda()
    search = BeamSearch(beam_size=3, max_len=8, check_every=4, cuda_graphs=True)
    search(net, src, lengths)
    other = random_model(seed=10).cuda()
    net.load_state_dict(other.state_dict())          # in place: the same graphs, new weights
    assert_same_hypotheses(search(net, src, lengths),
                           BeamSearch(beam_size=3, max_len=8)(other, src, lengths),
                           tol=reorder_tol(torch.float64))


@pytest.mark.gpu
def test_cuda_graphs_recorded_under_autocast_cast_the_weights_at_each_replay() -> None:
    """Recorded under bf16 autocast, replayed in a later autocast block after the weights were
    updated in place: the replays cast the new weights (no cast cached by the recording)."""
    net = random_model(seed=11, dtype=torch.float32).cuda()
    src, lengths = SRC.cuda(), LENGTHS.cuda()
    search = BeamSearch(beam_size=3, max_len=8, check_every=4, cuda_graphs=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        search(net, src, lengths)
    other = random_model(seed=12, dtype=torch.float32).cuda()
    net.load_state_dict(other.state_dict())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = search(net, src, lengths)
        want = BeamSearch(beam_size=3, max_len=8, check_every=4)(other, src, lengths)
    assert_same_hypotheses(got, want, tol=reorder_tol(torch.bfloat16))


def test_a_recording_is_per_autocast_state() -> None:
    """The same inputs under autocast and without it are two recordings: each replays the casts
    of its own state."""
    def step(tokens, state, memory):
        return torch.mm(state, memory) + tokens[:, None]      # a matmul: autocast casts it

    gen = torch.Generator().manual_seed(0)
    tokens, state = torch.ones(3), torch.randn(3, 4, generator=gen)
    memory = torch.randn(4, 5, generator=gen)
    captured = CapturedStep(step, record=replay_eagerly)
    plain = captured(tokens, state, memory)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast, want = captured(tokens, state, memory), step(tokens, state, memory)
    assert captured.graphs == 2
    assert torch.equal(cast, want) and not torch.equal(cast, plain)
    assert torch.equal(captured(tokens, state, memory), plain)


def test_cuda_graphs_are_refused_for_cpu_tensors_in_one_line() -> None:
    with pytest.raises(InputError, match=re.escape("cuda_graphs=True")) as err:
        BeamSearch(cuda_graphs=True, beam_size=2)(random_model(), SRC, LENGTHS)
    assert "\n" not in str(err.value)
