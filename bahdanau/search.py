"""Greedy and beam search for models built from `AttentiveDecoder`, batched and exact.

All sentences of a batch and all K beams of a sentence advance together: decoder rows are
stored sentence-major (row n belongs to sentence n // K), and the per-sentence memory (annotations,
keys, precomputed values) is shared by the beams, never copied. Sentences that are done are
dropped from the batch, so their memory stops costing anything.

Every hypothesis ends with eos. At a sentence's length cap only eos may follow, so the search
space is all y_1 .. y_n eos with min_len <= n <= cap and no pad or bos among the y_i, and
`log_prob` always includes eos. With a
beam as wide as that space the search is exhaustive (the tests check it against enumeration).

Length normalisation (`length_penalty`), with |Y| = len(tokens) + 1 (eos counted):
    "none"     score = log p(Y | X)                             (the paper)
    "average"  score = log p(Y | X) / |Y|
    "gnmt"     score = log p(Y | X) / ((5 + |Y|) / 6) ** alpha   (Wu et al. 2016)

Early stopping is exact for all three: a sentence stops once it has `n_best` finished hypotheses
and no live one can still beat the worst of them. Log-probabilities only decrease as tokens are
added, so a live hypothesis with log-probability l can at best score l (none), l / (cap + 1)
(average) or l / lp(cap + 1) (gnmt).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, cast

import torch
from torch import Tensor

from bahdanau._checks import check_lengths, check_tensor, check_type, is_finite_number, is_int
from bahdanau.config import BOS_ID, EOS_ID, PAD_ID
from bahdanau.errors import InputError

if TYPE_CHECKING:
    from bahdanau.decoder import StepOutput

LengthPenalty = Literal["none", "average", "gnmt"]
LENGTH_PENALTIES = ("none", "average", "gnmt")

# one search step, over the live sentences: their original ids (B',), the (B', K) parents and
# tokens, and the (B', K, S) weights or None
_Step = tuple[Tensor, Tensor, Tensor, "Tensor | None"]


class _Decoding(Protocol):
    """What the search calls on a model (`RNNSearch`, `RNNEncDec`, `Ensemble`)."""

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Any, Any]: ...

    def step(self, prev_tokens: Tensor, state: Any, memory: Any) -> StepOutput: ...


@dataclass(frozen=True)
class Hypothesis:
    """One translation of one sentence.

    Attributes:
        tokens: target ids, without bos and eos.
        log_prob: sum of the log-probabilities of the tokens and of eos.
        score: `log_prob` after length normalisation (equal to it with "none").
        attention: (len(tokens) + 1, S) alignment weights, one row per predicted token (the last
            row is eos), over the sentence's real source positions; None for models without
            attention (RNNencdec).
    """

    tokens: list[int]
    log_prob: float
    score: float
    attention: Tensor | None = field(default=None, repr=False)


def refuse_nan_scores(found: Tensor | bool) -> None:
    """Raise the one-line error for a model whose scores are NaN when `found` is true (a bool,
    or a one-element bool tensor, read here once). Every decoder and scorer of the package
    asks here: a NaN log-probability ranks first in an argmax or a top-k, so without the check
    a diverged model gives a silent wrong answer (tokens, or a score of nan).

    Raises:
        InputError: `found` is true.
    """
    if bool(found):
        raise InputError("the model's scores are NaN: its weights hold NaN or inf, or give "
                         "logits that overflow (a diverged training run)")


def length_normalise(log_prob: Tensor, length: Tensor | int, penalty: str, alpha: float
                     ) -> Tensor:
    """Score of hypotheses of `length` predicted tokens (eos included); see the module doc."""
    if penalty == "none":
        return log_prob
    length = torch.as_tensor(length, dtype=log_prob.dtype, device=log_prob.device)
    if penalty == "average":
        return log_prob / length
    return log_prob / ((5.0 + length) / 6.0) ** alpha


class Selection(NamedTuple):
    """The outcome of one beam step for B' sentences (see `select_candidates`)."""

    finished: Tensor         # (B', 2K) bool: eos candidates among the first K, finite score
    top_scores: Tensor       # (B', 2K) candidate log-probabilities, best first
    top_parent: Tensor       # (B', 2K) beam each candidate extends
    scores: Tensor           # (B', K) log-probabilities of the continuing beams
    parent: Tensor           # (B', K) beam each continuing beam extends
    token: Tensor            # (B', K) its new token


def select_candidates(scores: Tensor, log_probs: Tensor, eos_id: int) -> Selection:
    """One beam step: the best 2K extensions of K beams; eos ones finish, K others continue.

    Args:
        scores: (B', K) log-probabilities of the live beams (-inf for dead ones).
        log_probs: (B', K, V) next-token log-probabilities of each beam.
        eos_id: the end-of-sentence id.
    Returns:
        A `Selection`. Among the 2K best extensions by total log-probability, those ending in
        eos within the first K finish; the first K that do not end in eos continue (there are at
        least K: each beam has one eos). The 2K best are found per beam first, then among the
        K x 2K survivors, which is exact: a global top-2K candidate is in its beam's top 2K.
    """
    n_live, beams, vocab = log_probs.shape
    width = min(2 * beams, vocab)
    beam_best, beam_token = log_probs.topk(width, dim=2)                   # (B', K, w)
    candidates = (scores[:, :, None] + beam_best).reshape(n_live, beams * width)
    top_scores, top_index = candidates.topk(min(2 * beams, beams * width), dim=1)
    top_parent = top_index // width
    top_token = beam_token.reshape(n_live, beams * width).gather(1, top_index)
    is_eos = top_token == eos_id
    rank = torch.arange(top_scores.shape[1], device=scores.device)
    finished = is_eos & (rank < beams) & torch.isfinite(top_scores)
    order = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :beams]
    return Selection(finished, top_scores, top_parent, top_scores.gather(1, order),
                     top_parent.gather(1, order), top_token.gather(1, order))


def update_kept(kept: Tensor, new_scores: Tensor, finished: Tensor) -> Tensor:
    """The n best finished scores per sentence after adding `new_scores` where `finished`.

    Args:
        kept: (B', n) best normalised scores so far, descending, -inf where fewer than n.
        new_scores: (B', C) normalised scores of this step's candidates.
        finished: (B', C) bool, which candidates finished.
    Returns:
        (B', n) the updated best scores, descending.
    """
    merged = torch.cat([kept, new_scores.masked_fill(~finished, float("-inf"))], dim=1)
    return merged.topk(kept.shape[1], dim=1).values


@dataclass(frozen=True)
class BeamSearch:
    """Batched beam search; `beam_size=1` is greedy search.

    Args:
        beam_size: K, hypotheses kept per sentence.
        n_best: hypotheses returned per sentence, best first (<= beam_size).
        max_len: absolute cap on generated tokens (eos not counted).
        max_len_ratio: if set, each sentence's cap is also at most ceil(ratio * source length).
        min_len: eos is forbidden before this many tokens.
        length_penalty: "none" (the paper), "average" or "gnmt"; see the module docstring.
        alpha: exponent of the "gnmt" penalty.
        early_stopping: stop a sentence as soon as no live hypothesis can beat its n-best (exact);
            False runs every sentence to its cap.

    The special ids (bos, eos, pad) are `model.config`'s, which training, loading and
    `translate_corpus` check against the vocabularies; a model built without a config uses the
    default ids of `bahdanau.config` (`BOS_ID`, `EOS_ID`, `PAD_ID`, every `Vocab`'s).
    """

    beam_size: int = 5
    n_best: int = 1
    max_len: int = 100
    max_len_ratio: float | None = None
    min_len: int = 1
    length_penalty: LengthPenalty = "none"
    alpha: float = 0.6
    early_stopping: bool = True

    def __post_init__(self) -> None:
        for name in ("beam_size", "n_best", "max_len", "min_len"):
            if not is_int(getattr(self, name)):
                raise InputError(f"{name} must be an int, got {getattr(self, name)!r}")
        for name in ("max_len_ratio", "alpha"):
            value = getattr(self, name)
            if value is not None and not is_finite_number(value):
                raise InputError(f"{name} must be a finite number, got {value!r}")
        if self.beam_size < 1:
            raise InputError(f"beam_size must be an int >= 1, got {self.beam_size!r}")
        if not 1 <= self.n_best <= self.beam_size:
            raise InputError(f"n_best must be in [1, beam_size={self.beam_size}], "
                             f"got {self.n_best!r}")
        if self.min_len < 0:
            raise InputError(f"min_len must be >= 0, got {self.min_len}")
        if not isinstance(self.early_stopping, bool):
            raise InputError(f"early_stopping must be True or False, got {self.early_stopping!r}")
        if self.max_len > 2**31 - 1:
            raise InputError(f"max_len must be <= 2**31 - 1, got {self.max_len}")
        if self.max_len < max(self.min_len, 1):
            raise InputError(f"max_len ({self.max_len}) must be >= min_len ({self.min_len}) "
                             f"and >= 1")
        if self.max_len_ratio is not None and self.max_len_ratio <= 0:
            raise InputError(f"max_len_ratio must be > 0, got {self.max_len_ratio}")
        if self.alpha < 0:
            raise InputError(f"alpha must be >= 0, got {self.alpha}")
        if self.length_penalty not in LENGTH_PENALTIES:
            raise InputError(f"length_penalty must be one of {LENGTH_PENALTIES}, "
                             f"got {self.length_penalty!r}")

    def _ids(self, model: object) -> tuple[int, int, int]:
        """(bos, eos, pad) of `model.config`, or the default ids when the model has none."""
        config = getattr(model, "config", None)
        if config is None:
            return BOS_ID, EOS_ID, PAD_ID
        return config.bos_id, config.eos_id, config.pad_id

    def caps(self, src_lengths: Tensor) -> Tensor:
        """(B,) most tokens each sentence may get before eos."""
        caps = torch.full_like(src_lengths, self.max_len)
        if self.max_len_ratio is not None:
            ratio_caps = torch.ceil(src_lengths.double() * self.max_len_ratio)
            ratio_caps = ratio_caps.clamp(max=self.max_len).long()   # a huge ratio: no overflow
            caps = torch.minimum(caps, ratio_caps.clamp(min=max(self.min_len, 1)))
        return caps

    @torch.inference_mode()
    def __call__(self, model: torch.nn.Module, src: Tensor, src_lengths: Tensor
                 ) -> list[list[Hypothesis]]:
        """Translate a padded batch.

        The search checks ranks and sizes; the values of the source (lengths in [1, S] and
        agreeing with the padding, ids in the vocabulary) are the model's to check, once, when
        the search calls `model.encode` (`RNNSearch.encode` runs `check_batch`).

        Args:
            model: an `RNNSearch` / `RNNEncDec`, or anything with the same `encode(src,
                src_lengths)` and `step` (a `DecoderState` of B rows and a memory with
                `select(keep)`).
            src: (B, S) source ids, padded.
            src_lengths: (B,) real lengths.
        Returns:
            For each sentence, its `n_best` hypotheses, best first.
        Raises:
            InputError: empty batch or bad shapes, what `model.encode` refuses (empty
                sentences, lengths that disagree with the padding, ids out of range), or
                scores that are not finite (NaN logits, or -inf for every way to end a
                sentence): never an empty or NaN-ranked result.
        """
        check_type("model", model, torch.nn.Module, "a torch.nn.Module such as RNNSearch")
        check_tensor("src", src, 2, integer=True)
        if src.shape[0] == 0 or src.shape[1] == 0:
            raise InputError(f"src has shape {tuple(src.shape)}: nothing to translate")
        check_lengths("src_lengths", src_lengths, src.shape[0], src.shape[1], values=False)
        was_training = model.training
        model.eval()
        try:
            # a Module, checked above; encode and step are the contract documented above
            return self._search(cast(_Decoding, model), src, src_lengths.to(src.device))
        finally:
            model.train(was_training)

    def _search(self, model: _Decoding, src: Tensor, src_lengths: Tensor
                ) -> list[list[Hypothesis]]:
        bos, eos, pad = self._ids(model)
        never = [pad, bos]                                     # never generated
        K, n_best, penalty, alpha = self.beam_size, self.n_best, self.length_penalty, self.alpha
        state, memory = model.encode(src, src_lengths)         # the model checks the values
        n_sent, src_len = src.shape
        device = src.device
        caps = self.caps(src_lengths)                                          # (B,)
        active = torch.arange(n_sent, device=device)                           # original ids
        state = state.rows(active.repeat_interleave(K))                        # B*K rows
        tokens = torch.full((n_sent * K,), bos, dtype=torch.long, device=device)
        dtype = torch.float64 if state.hidden.dtype == torch.float64 else torch.float32
        scores = torch.full((n_sent, K), float("-inf"), dtype=dtype, device=device)
        scores[:, 0] = 0.0                                                     # one live beam
        kept = torch.full((n_sent, n_best), float("-inf"), dtype=dtype, device=device)
        history: list[_Step] = []                       # per step, over the original sentences
        finished: list[tuple[int, Tensor, Tensor, Tensor, Tensor]] = []
        nan = torch.zeros((), dtype=torch.bool, device=device)   # a score was NaN: read once
        for step in range(int(caps.max()) + 1):
            out = model.step(tokens, state, memory)
            n_live = active.shape[0]
            logits = torch.log_softmax(out.logits.to(dtype), dim=-1).view(n_live, K, -1)
            logits[..., never] = float("-inf")                               # pad, bos
            if step < self.min_len:
                logits[..., eos] = float("-inf")
            live_caps = caps[active]
            at_cap = live_caps <= step                                         # only eos left
            if bool(at_cap.any()):
                eos_col = logits[..., eos].clone()
                logits[at_cap] = float("-inf")
                logits[..., eos] = eos_col
            sel = select_candidates(scores, logits, eos)                    # log-probabilities
            normalised = length_normalise(sel.top_scores, step + 1, penalty, alpha)
            kept = update_kept(kept, normalised, sel.finished)
            if bool(sel.finished.any()):
                finished.append((step, active, sel.finished, sel.top_scores, sel.top_parent))
            scores, parent, token = sel.scores, sel.parent, sel.token
            nan |= scores.isnan().any()   # a NaN log-probability ranks first, so it continues
            weights = None if out.weights is None else out.weights.view(n_live, K, -1)
            history.append((active, parent, token, weights))
            # which sentences are done
            bound = self._bound(scores, live_caps)
            done = at_cap | ~torch.isfinite(scores).any(1)
            if self.early_stopping:
                done |= torch.isfinite(kept[:, -1]) & (kept[:, -1] >= bound)
            rows = (torch.arange(n_live, device=device)[:, None] * K + parent).flatten()
            state, tokens = out.state.rows(rows), token.flatten()
            if bool(done.all()):
                break
            if bool(done.any()):                                               # drop them
                keep = (~done).nonzero().flatten()
                keep_rows = (keep[:, None] * K + torch.arange(K, device=device)).flatten()
                active, scores, kept = active[keep], scores[keep], kept[keep]
                state, tokens = state.rows(keep_rows), tokens[keep_rows]
                memory = memory.select(keep)
        refuse_nan_scores(nan)
        return self._collect(n_sent, src_len, src_lengths, history, finished)

    def _bound(self, scores: Tensor, caps: Tensor) -> Tensor:
        """(B',) the best score any live hypothesis could still reach."""
        best = scores.max(dim=1).values
        if self.length_penalty == "none":
            return best
        return length_normalise(best, caps + 1, self.length_penalty, self.alpha)

    def _collect(self, n_sent: int, src_len: int, src_lengths: Tensor,
                 history: list[_Step],
                 finished: list[tuple[int, Tensor, Tensor, Tensor, Tensor]]
                 ) -> list[list[Hypothesis]]:
        """Follow back-pointers of the finished hypotheses (on the CPU, after the search)."""
        steps = [(a.tolist(), p.tolist(), t.tolist(), None if w is None else w.cpu())
                 for a, p, t, w in history]
        position = [{sent: i for i, sent in enumerate(a)} for a, _, _, _ in steps]
        lengths = src_lengths.tolist()
        candidates: list[list[tuple[float, float, int, int]]] = [[] for _ in range(n_sent)]
        for step, active, done_now, top_scores, parent in finished:
            for i, rank in done_now.nonzero().tolist():
                log_prob = float(top_scores[i, rank])
                score = float(length_normalise(torch.tensor(log_prob, dtype=torch.float64),
                                               step + 1, self.length_penalty, self.alpha))
                candidates[int(active[i])].append((score, log_prob, step,
                                                   int(parent[i, rank])))
        results = []
        for sent in range(n_sent):
            if not candidates[sent]:     # finite log-probabilities always let eos end one
                raise InputError(f"sentence {sent} of the batch got no hypothesis: the model "
                                 "gives every ending a log-probability of -inf")
            best = sorted(candidates[sent], key=lambda c: (-c[0], c[2]))[: self.n_best]
            hyps = []
            for score, log_prob, step, beam in best:
                weights = steps[step][3]
                rows = [] if weights is None else [weights[position[step][sent], beam]]  # eos
                tokens = []
                for s in range(step - 1, -1, -1):  # beam `beam` at step s+1 was made at step s
                    _, parents, new_tokens, weights = steps[s]
                    i = position[s][sent]
                    tokens.append(new_tokens[i][beam])
                    beam = parents[i][beam]
                    if weights is not None:
                        rows.append(weights[i, beam])
                tokens.reverse()
                attention = (torch.stack(rows[::-1])[:, : lengths[sent]]
                             if rows else None)
                hyps.append(Hypothesis(tokens, log_prob, score, attention))
            results.append(hyps)
        return results


def greedy_search(model: torch.nn.Module, src: Tensor, src_lengths: Tensor, *,
                  max_len: int = 100, min_len: int = 1) -> list[Hypothesis]:
    """Greedy decoding: `BeamSearch(beam_size=1)`, one hypothesis per sentence."""
    search = BeamSearch(beam_size=1, max_len=max_len, min_len=min_len)
    return [hyps[0] for hyps in search(model, src, src_lengths)]


def replace_unk(hypothesis: Hypothesis, src_tokens: Sequence[str], tgt_tokens: Sequence[str], *,
                unk: str = "<unk>", dictionary: Mapping[str, str] | None = None) -> list[str]:
    """Replace each generated [UNK] by the source word it attends to most.

    An extension beyond the paper (Luong et al. 2015's "unk replace", with attention standing in
    for the alignment model): the source word is copied, or translated through `dictionary` if
    it has an entry.

    Args:
        hypothesis: a hypothesis with attention (from `RNNSearch`).
        src_tokens: the S source tokens of its sentence (real positions only).
        tgt_tokens: the hypothesis' tokens as strings (`len(hypothesis.tokens)` of them).
        unk: the unknown-word token.
        dictionary: optional source word -> target word mapping.
    Returns:
        The target tokens with [UNK]s replaced.
    Raises:
        InputError: no attention (RNNencdec), or lengths that do not match the attention.
    """
    if hypothesis.attention is None:
        raise InputError("replace_unk needs attention weights; RNNencdec has none")
    rows, cols = hypothesis.attention.shape
    if len(tgt_tokens) != rows - 1 or len(src_tokens) != cols:
        raise InputError(f"attention is {tuple(hypothesis.attention.shape)} but there are "
                         f"{len(tgt_tokens)} target and {len(src_tokens)} source tokens")
    out = list(tgt_tokens)
    for i, token in enumerate(tgt_tokens):
        if token == unk:
            word = src_tokens[int(hypothesis.attention[i].argmax())]
            out[i] = dictionary.get(word, word) if dictionary else word
    return out


def argmax_alignment(hypothesis: Hypothesis) -> list[tuple[int, int]]:
    """Hard alignment: each target token j with the source position i it attends to most.

    The (i, j) pairs, 0-based, in target order, are what Pharaoh / fast_align files write as
    ``i-j`` (source first). Positions count the tokens the model reads and writes (the
    tokenizer's tokens or subword pieces, before detokenisation); eos has no pair (its row of
    attention is left out), and ties go to the first source position.

    Raises:
        InputError: no attention (RNNencdec).
    """
    if hypothesis.attention is None:
        raise InputError("an alignment needs attention weights; RNNencdec has none")
    best = hypothesis.attention[:-1].argmax(dim=1).tolist()       # one per target token
    return [(int(i), j) for j, i in enumerate(best)]
