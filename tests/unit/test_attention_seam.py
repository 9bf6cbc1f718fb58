"""An attention of one's own: the base class of `bahdanau.Attention` asked only for scores.

The attention under test is the one docs/guides/own-attention.md shows, read from the guide
itself, so the guide's code is the tested code. It is held to a float64 reference computed here by
hand (softmax over the real positions of each row's sentence, context the weighted sum), trained
through the fast engine and the reference decoder, and beam-searched. The fast paths of
`AdditiveAttention` and `LuongAttention` equal their own `score` through the base class, and a
module that does not follow the seam is one `InputError` line saying what to implement.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from bahdanau import (
    AdditiveAttention,
    Attention,
    AttentiveDecoder,
    BeamSearch,
    BiRNNEncoder,
    LuongAttention,
    RNNSearch,
    functional,
    greedy_search,
    train_step,
)
from bahdanau.data import Batch
from bahdanau.errors import InputError

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "own-attention.md"
if not GUIDE.is_file():
    pytest.skip("docs/ is not next to the tests (installed package)", allow_module_level=True)


def guide_attention() -> type[Attention]:
    """The class the guide's first runnable block defines, executed as written."""
    blocks = [body for tag, body in re.findall(r"^```([^\n]*)\n(.*?)^```",
                                               GUIDE.read_text(encoding="utf-8"), re.S | re.M)
              if tag.strip() == "python"]
    namespace: dict[str, object] = {"__name__": "own_attention_guide"}
    exec(compile(blocks[0], f"{GUIDE}:block1", "exec"), namespace)
    return namespace["ScaledDotAttention"]  # type: ignore[return-value]


ScaledDotAttention = guide_attention()
V, E, H, D, A, L = 12, 6, 5, 7, 4, 3


def random_(module: nn.Module, seed: int, scale: float = 0.5) -> nn.Module:
    """Float64, every parameter drawn large enough that a mistake shows."""
    module = module.double()
    gen = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = scale * torch.randn(p.shape, generator=gen, dtype=torch.float64)
    return module


def model_with(attention: Attention, engine: str = "fast", seed: int = 0) -> RNNSearch:
    model = RNNSearch(BiRNNEncoder(V, E, H),
                      AttentiveDecoder(V, E, D, 2 * H, L, attention=attention), engine=engine)
    return random_(model, seed)  # type: ignore[return-value]


def source(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    src_lengths = torch.tensor([5, 2, 4])
    src = torch.randint(4, V, (3, 5), generator=gen)
    src[~functional.lengths_to_mask(src_lengths, 5)] = 0
    return src, src_lengths


# ------------------------------------------------------------------ the guide's attention, by hand
@pytest.mark.parametrize("beams", [1, 3])
def test_guide_attention_equals_a_hand_computed_reference(beams: int) -> None:
    """Weights and context of N = B*K rows against loops over real positions in float64: row n
    attends to sentence n // K only, padding gets exactly 0."""
    attention = random_(ScaledDotAttention(D, 2 * H, A), seed=2)
    gen = torch.Generator().manual_seed(3)
    annotations = torch.randn(3, 5, 2 * H, generator=gen, dtype=torch.float64)
    lengths = [5, 2, 4]
    mask = functional.lengths_to_mask(torch.tensor(lengths), 5)
    query = torch.randn(3 * beams, D, generator=gen, dtype=torch.float64)
    step = attention(query, attention.prepare(annotations, mask), annotations)
    W_q, W_k = attention.W_q.weight.detach(), attention.W_k.weight.detach()
    for n in range(3 * beams):
        b = n // beams
        q = [sum(float(W_q[a, d]) * float(query[n, d]) for d in range(D)) for a in range(A)]
        energies = []
        for j in range(lengths[b]):
            k = [sum(float(W_k[a, c]) * float(annotations[b, j, c]) for c in range(2 * H))
                 for a in range(A)]
            energies.append(sum(x * y for x, y in zip(q, k, strict=True)) / math.sqrt(A))
        top = max(energies)
        exps = [math.exp(e - top) for e in energies]
        weights = [x / sum(exps) for x in exps] + [0.0] * (5 - lengths[b])
        context = [sum(weights[j] * float(annotations[b, j, c]) for j in range(lengths[b]))
                   for c in range(2 * H)]
        assert step.weights[n].tolist() == pytest.approx(weights, abs=1e-12)
        assert (step.weights[n, lengths[b]:] == 0).all()
        assert step.context[n].tolist() == pytest.approx(context, abs=1e-12)


# ------------------------------------------------------------------ in a model
def test_guide_attention_engine_equals_reference_decoder() -> None:
    """The fast engine and the paper-shaped decoder compute the same loss and gradients with the
    user's attention (it is called through the seam only, so nothing of it is fused)."""
    src, src_lengths = source()
    tgt_in = torch.tensor([[1, 5, 6, 7], [1, 8, 0, 0], [1, 9, 4, 0]])
    tgt_out = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0], [9, 4, 2, 0]])
    results = []
    for engine in ("fast", "reference"):
        model = model_with(ScaledDotAttention(D, 2 * H, A), engine)
        loss, _ = model.loss(src, src_lengths, tgt_in, tgt_out)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (fast, fast_grads), (ref, ref_grads) = results
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_guide_attention_trains_and_beam_searches() -> None:
    """A few Adam steps lower the loss on a tiny batch; beam 1 is greedy; a beam of 4 over the
    batch finds what it finds for each sentence alone (the rows of a beam are laid out right)."""
    torch.manual_seed(0)
    model = RNNSearch(BiRNNEncoder(V, 16, 16),
                      AttentiveDecoder(V, 16, 24, 32, 8, attention=ScaledDotAttention(24, 32, 16)))
    sentences = [[5, 9, 7, 4], [8, 6], [10, 11, 5]]
    src = torch.tensor([s + [0] * (4 - len(s)) for s in sentences])
    src_lengths = torch.tensor([4, 2, 3])
    tgt_in = torch.tensor([[1] + s + [0] * (4 - len(s)) for s in sentences])
    tgt_out = torch.tensor([s + [2] + [0] * (4 - len(s)) for s in sentences])
    batch = Batch(src, src_lengths, tgt_in, tgt_out, torch.arange(3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = [train_step(model, batch, optimizer).loss_sum for _ in range(20)]
    assert losses[-1] < 0.2 * losses[0], losses
    model = random_(model.eval(), seed=4, scale=1.0)           # no ties, long hypotheses
    src, src_lengths = source()
    greedy = greedy_search(model, src, src_lengths, max_len=6)
    beam1 = BeamSearch(beam_size=1, max_len=6)(model, src, src_lengths)
    assert [h[0].tokens for h in beam1] == [h.tokens for h in greedy]
    wide = BeamSearch(beam_size=4, n_best=4, max_len=6)(model, src, src_lengths)
    for b in range(3):
        n = int(src_lengths[b])
        alone = BeamSearch(beam_size=4, n_best=4, max_len=6)(model, src[b:b + 1, :n],
                                                            src_lengths[b:b + 1])[0]
        assert [h.tokens for h in wide[b]] == [h.tokens for h in alone]
        for together, single in zip(wide[b], alone, strict=True):
            assert together.log_prob == pytest.approx(single.log_prob, abs=1e-10)
            torch.testing.assert_close(together.attention, single.attention)


# ------------------------------------------------------------------ fast paths against scores
@pytest.mark.parametrize("make", [
    lambda: AdditiveAttention(D, 2 * H, A, impl="reference"),
    lambda: AdditiveAttention(D, 2 * H, A, impl="sigmoid"),
    lambda: LuongAttention(D, 2 * H, form="general"),
    lambda: LuongAttention(2 * H, 2 * H, form="dot"),
], ids=["additive/reference", "additive/sigmoid", "luong_general", "luong_dot"])
def test_fast_weights_equal_the_base_class_over_score(make) -> None:
    """`weights` of the projected query (the path the decoder and the engine take) equals the
    base class's softmax over `score` of the decoder states, beam rows included."""
    attention = random_(make(), seed=5)
    gen = torch.Generator().manual_seed(6)
    annotations = torch.randn(3, 5, 2 * H, generator=gen, dtype=torch.float64)
    mask = functional.lengths_to_mask(torch.tensor([5, 2, 4]), 5)
    memory = attention.prepare(annotations, mask)
    states = torch.randn(3 * 2, attention.query_size, generator=gen, dtype=torch.float64)
    fast = attention.weights(attention.project_query(states), memory)
    torch.testing.assert_close(fast, Attention.weights(attention, states, memory),
                               rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ what does not follow the seam
class WrongShape(Attention):
    def __init__(self) -> None:
        super().__init__(query_size=D, key_size=2 * H)

    def score(self, query, keys):
        return keys.sum(-1).T                                     # (S, N), not (N, S)


class LayerFirst(Attention):
    def __init__(self) -> None:
        self.W = nn.Linear(D, 2 * H)
        super().__init__(query_size=D, key_size=2 * H)

    def score(self, query, keys):
        return keys.sum(-1)


class NoSizes(Attention):
    def __init__(self) -> None:
        super().__init__()

    def score(self, query, keys):
        return keys.sum(-1)


class NeverInitialised(Attention):
    def __init__(self) -> None:
        pass

    def score(self, query, keys):
        return keys.sum(-1)


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query_size, self.key_size = D, 2 * H


@pytest.mark.parametrize("build, match", [
    (Plain, r"^attention must be a bahdanau.Attention or None, got Plain: an attention "
            r"subclasses bahdanau.Attention"),
    (LayerFirst, r"^LayerFirst sets 'W' before super\(\).__init__ ran: "),
    (NoSizes, r"^NoSizes gave super\(\).__init__ no query_size and key_size: "),
    (NeverInitialised, r"^NeverInitialised never called super\(\).__init__\(query_size=Q, "
                       r"key_size=K\): "),
], ids=["plain-module", "layer-first", "no-sizes", "never-initialised"])
def test_a_module_off_the_seam_is_refused_when_the_model_is_built(build, match) -> None:
    with pytest.raises(InputError, match=match) as err:
        AttentiveDecoder(V, E, D, 2 * H, L, attention=build())
    assert "\n" not in str(err.value)
    assert "defines score(self, query, keys)" in str(err.value)


def test_scores_of_the_wrong_shape_are_refused_at_the_first_call() -> None:
    model = model_with(WrongShape())
    src, src_lengths = source()
    with pytest.raises(InputError, match=r"^WrongShape.score returned shape \(5, 3\), dtype "
                                         r"torch.float64; it must return floating-point "
                                         r"energies of shape \(N, S\) = \(3, 5\)"):
        model.translate(src, src_lengths, beam_size=1, max_len=3)


def test_keys_of_the_wrong_shape_are_refused_once_per_batch() -> None:
    class FlatKeys(ScaledDotAttention):
        def prepare_keys(self, annotations):
            return annotations.sum(-1)                            # (B, S), not (B, S, K)

    attention = FlatKeys(D, 2 * H, A)
    annotations, mask = torch.randn(3, 5, 2 * H), torch.ones(3, 5, dtype=torch.bool)
    with pytest.raises(InputError, match=r"^FlatKeys.prepare_keys returned shape \(3, 5\); it "
                                         r"must return \(B, S, K\) keys"):
        attention.prepare(annotations, mask)
