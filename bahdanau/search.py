"""Greedy and beam search for models built from `AttentiveDecoder`, batched and exact.

All sentences of a batch and all K beams of a sentence advance together: decoder rows are
stored sentence-major (row n belongs to sentence n // K), and the per-sentence memory (annotations,
keys, precomputed values) is shared by the beams, never copied. Sentences that are done are
dropped from the batch at the host's next look (below), so their memory stops costing anything.

The steps read nothing back to the host: which hypotheses finish and which sentences are done is
found on the device, with masks, at every step. The host looks every `check_every` steps (k):
it stops when every sentence is done and drops the sentences that are. Between two checks a
sentence that is done keeps its rows, its beams scored -inf, so its steps change nothing: every
k finds the same hypotheses, k = 1 (the default) drops sentences as soon as they are done, and
a larger k lets k steps queue on a GPU without a wait, or replay as captured CUDA graphs
(`cuda_graphs`, `bahdanau.captured_step`).

Every hypothesis ends with eos. At a sentence's length cap only eos may follow, so the search
space is all y_1 .. y_n eos with min_len <= n <= cap and no pad or bos among the y_i, and
`log_prob` always includes eos. With a
beam as wide as that space the search is exhaustive (the tests check it against enumeration).

Length normalisation (`length_penalty`), with |Y| = len(tokens) + 1 (eos counted):
    "none"     score = log p(Y | X)                             (the paper)
    "average"  score = log p(Y | X) / |Y|
    "gnmt"     score = log p(Y | X) / ((5 + |Y|) / 6) ** alpha   (Wu et al. 2016)

Lexically constrained decoding (`constraints=` and `avoid=`, phrases each sentence's hypotheses
must or must not hold) is `bahdanau.constraints`, met at one seam: where `_Beams._step` picks a
step's candidates. A batch without phrases never reaches it.

Early stopping is exact for all three: a sentence stops once it has `n_best` finished hypotheses
and no live one can still beat the worst of them. Log-probabilities only decrease as tokens are
added, so a live hypothesis with log-probability l can at best score l (none), l / (cap + 1)
(average) or l / lp(cap + 1) (gnmt).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, cast

import torch
from torch import Tensor

from bahdanau._checks import (
    check_lengths,
    check_memory,
    check_tensor,
    check_type,
    is_finite_number,
    is_int,
)
from bahdanau.captured_step import CapturedStep, pad_to_bucket
from bahdanau.config import ModelConfig, model_vocabs
from bahdanau.constraints import LexicalBeams, compile_constraints
from bahdanau.errors import InputError
from bahdanau.kernels.grouped_topk import top_k

if TYPE_CHECKING:
    from bahdanau.decoder import StepOutput

LengthPenalty = Literal["none", "average", "gnmt"]
LENGTH_PENALTIES = ("none", "average", "gnmt")
# `check_every` where the decoder steps replay as CUDA graphs (the command line's --cuda-graphs):
# a look at the batch costs a sync, a late one up to k - 1 steps of finished sentences. On an
# H200 (small preset, batches of 80) captured searches with k = 8 ran 0.95 to 1.14 times as fast
# as with k = 1.
CAPTURED_CHECK_EVERY = 8

# one search step, over the batch's sentences: their original ids (B',), the (B', K) parents
# and tokens, and the (B', K, S) weights or None
_Step = tuple[Tensor, Tensor, Tensor, "Tensor | None"]
# the hypotheses of one step that end there: the step, the sentences' ids (B',), which of the
# (B', 2K) candidates finished, their log-probabilities and the beams they extend
_Finished = tuple[int, Tensor, Tensor, Tensor, Tensor]
_StepCall = Callable[[Tensor, Any, Any], "StepOutput"]


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
    top_token: Tensor        # (B', 2K) each candidate's token
    best_token: Tensor       # (B', K) each beam's most probable next token


def select_candidates(scores: Tensor, log_probs: Tensor, eos_id: int, *,
                      only_eos: Tensor | None = None) -> Selection:
    """One beam step: the best 2K extensions of K beams; eos ones finish, K others continue.

    Args:
        scores: (B', K) log-probabilities of the live beams (-inf for dead ones).
        log_probs: (B', K, V) next-token log-probabilities of each beam.
        eos_id: the end-of-sentence id.
        only_eos: optional (B',) bool, sentences at their length cap: their beams extend by
            eos alone, as if every other token of `log_probs` were -inf (found after the
            per-beam top 2K, so the (B', K, V) log-probabilities are not rewritten).
    Returns:
        A `Selection`. Among the 2K best extensions by total log-probability, those ending in
        eos within the first K finish; the first K that do not end in eos continue (there are at
        least K: each beam has one eos). The 2K best are found per beam first, then among the
        K x 2K survivors, which is exact: a global top-2K candidate is in its beam's top 2K.
    """
    n_live, beams, vocab = log_probs.shape
    width = min(2 * beams, vocab)
    beam_best, beam_token = top_k(log_probs, width)                        # (B', K, w)
    if only_eos is not None:                  # eos first, then -inf: the top of eos alone
        first = torch.arange(width, device=scores.device) == 0                # (w,)
        capped = only_eos[:, None, None]                                      # (B', 1, 1)
        eos_best = log_probs[..., eos_id, None].expand_as(beam_best)
        beam_best = torch.where(capped & first, eos_best,
                                beam_best.masked_fill(capped, float("-inf")))
        # eos moves to the front; where it was, the top token takes its place (one eos a beam)
        swapped = torch.where(beam_token == eos_id, beam_token[..., :1], beam_token)
        beam_token = torch.where(capped, swapped, beam_token).masked_fill(capped & first, eos_id)
    candidates = (scores[:, :, None] + beam_best).reshape(n_live, beams * width)
    top_scores, top_index = candidates.topk(min(2 * beams, beams * width), dim=1)
    top_parent = top_index // width
    top_token = beam_token.reshape(n_live, beams * width).gather(1, top_index)
    is_eos = top_token == eos_id
    rank = torch.arange(top_scores.shape[1], device=scores.device)
    finished = is_eos & (rank < beams) & torch.isfinite(top_scores)
    order = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :beams]
    return Selection(finished, top_scores, top_parent, top_scores.gather(1, order),
                     top_parent.gather(1, order), top_token.gather(1, order), top_token,
                     beam_token[..., 0])


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
        max_len_ratio: if set, each sentence's cap is also at most ceil(ratio * source length),
            but never below `min_len` (nor 1).
        min_len: eos is forbidden before this many tokens.
        length_penalty: "none" (the paper), "average" or "gnmt"; see the module docstring.
        alpha: exponent of the "gnmt" penalty.
        early_stopping: stop a sentence as soon as no live hypothesis can beat its n-best (exact);
            False runs every sentence to its cap.
        check_every: k, the steps between two looks of the host at the batch (are all
            sentences done? drop those that are); the steps in between read nothing back to the
            host. Every k gives the same hypotheses; 1 drops a sentence as soon as it is done,
            the fastest on a CPU, and a larger k costs up to k - 1 steps of finished sentences
            for never stalling a GPU's queue (see the module docstring).
        cuda_graphs: replay the decoder step as CUDA graphs, one recorded per shape
            (`bahdanau.captured_step.CapturedStep`): sources are padded to a multiple of
            `bahdanau.data.batching.SHAPE_MULTIPLE` and the batch keeps power-of-two groups of
            sentences, so the shapes repeat; CUDA only. The search keeps its graphs, and so the
            models it decoded with, between calls (`captured`): reuse one search per model.
        observe: called after each run of `check_every` steps with the target tokens they
            made (beam rows times steps) and the seconds they took (the encoder not counted):
            `bahdanau.training.threads.AdaptiveThreads.observe` sets torch's CPU threads from
            them. It changes no hypothesis.

    The special ids (bos, eos, pad) are `model.config`'s, which training, loading and
    `translate_corpus` check against the vocabularies; a model built without a config uses the
    default ids of `bahdanau.config` (`BOS_ID`, `EOS_ID`, `PAD_ID`, every `Vocab`'s): both as
    `bahdanau.config.model_vocabs` reads them.
    """

    beam_size: int = 5
    n_best: int = 1
    max_len: int = 100
    max_len_ratio: float | None = None
    min_len: int = 1
    length_penalty: LengthPenalty = "none"
    alpha: float = 0.6
    early_stopping: bool = True
    check_every: int = 1
    cuda_graphs: bool = False
    observe: Callable[[int, float], None] | None = field(default=None, compare=False,
                                                         repr=False)

    def __post_init__(self) -> None:
        for name in ("beam_size", "n_best", "max_len", "min_len", "check_every"):
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
        for name in ("early_stopping", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.check_every < 1:
            raise InputError(f"check_every must be an int >= 1, got {self.check_every}")
        if self.observe is not None and not callable(self.observe):
            raise InputError(f"observe must be a function of (tokens, seconds) or None, got "
                             f"{self.observe!r:.60}")
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

    @functools.cached_property
    def _graphs(self) -> dict[int, tuple[torch.nn.Module, tuple[int, ...], CapturedStep]]:
        """The captured steps of `cuda_graphs` by model: the model, where its parameters were
        and its `CapturedStep` (a cache filled by the calls, not a setting)."""
        return {}

    def memory_needed(self, model: torch.nn.Module, sentences: int, src_len: int
                      ) -> int | None:
        """About the bytes a search of `sentences` sentences of `src_len` source tokens needs
        at least, were every sentence to run to its length cap (a model that never ends one
        does): for each of its B x K beam rows, at a step, the logits and log-probabilities of
        the V target words, their top candidates and the decoder state, and, kept for every
        step up to the cap, the back-pointers and the S attention weights; for the batch, the
        annotations (2H) and keys (A) of each source position; None for a model without a
        `ModelConfig`. An `Ensemble` (`members`) holds every member's V scores and, of each
        member with a `ModelConfig`, its state, annotations and keys; the rest once."""
        held = getattr(model, "members", None)
        members = list(held) if isinstance(held, torch.nn.ModuleList) else [model]
        configs = [c for m in members if isinstance(c := getattr(m, "config", None), ModelConfig)]
        if not configs:
            return None
        first = next(iter(model.parameters()), None)
        size = 8 if first is not None and first.dtype == torch.float64 else 4   # the scores'
        vocab, rows = configs[0].tgt_vocab_size, sentences * self.beam_size
        steps = int(self.caps(torch.tensor([src_len]))[0]) + 1
        weights = src_len * size if any(c.arch != "rnnencdec" for c in configs) else 0  # (S,)
        scores = len(members) + (len(members) > 1)    # each member's and the combined (V,)
        per_step = (2 * vocab * scores * size             # logits, log-probabilities (V,)
                    + min(2 * self.beam_size, vocab) * (size + 8)   # top candidates, their ids
                    + 2 * sum(c.decoder_size for c in configs) * size)   # s_i, reordered
        history = steps * (16 + weights)                  # parent and token (int64), a_ij
        source = sum(2 * c.hidden_size + c.align_size for c in configs) * src_len * size
        return rows * (per_step + history) + sentences * source

    def check_memory(self, model: torch.nn.Module, sentences: int, src_len: int,
                     device: torch.device, what: str | None = None) -> None:
        """Refuse, before it allocates anything, a search (`memory_needed`) that needs more
        memory than `device` has available (`bahdanau._checks.check_memory`): one line saying
        `what` (default: the batch and its source length), how much and what to lower."""
        cap = int(self.caps(torch.tensor([src_len]))[0])
        what = what or f"searching {sentences:,} sentence(s) of {src_len:,} source tokens"
        check_memory(self.memory_needed(model, sentences, src_len), device,
                     f"{what} with a beam of {self.beam_size:,} and up to {cap:,} target tokens",
                     "lower the beam size, the maximum length or the sentences searched "
                     "together, or shorten the sentence")

    def caps(self, src_lengths: Tensor) -> Tensor:
        """(B,) most tokens each sentence may get before eos."""
        caps = torch.full_like(src_lengths, self.max_len)
        if self.max_len_ratio is not None:
            ratio_caps = torch.ceil(src_lengths.double() * self.max_len_ratio)
            ratio_caps = ratio_caps.clamp(max=self.max_len).long()   # a huge ratio: no overflow
            caps = torch.minimum(caps, ratio_caps.clamp(min=max(self.min_len, 1)))
        return caps

    @torch.inference_mode()
    def __call__(self, model: torch.nn.Module, src: Tensor, src_lengths: Tensor, *,
                 constraints: Sequence[Sequence[Sequence[int]]] | None = None,
                 avoid: Sequence[Sequence[Sequence[int]]] | None = None
                 ) -> list[list[Hypothesis]]:
        """Translate a padded batch.

        The search checks ranks and sizes; the values of the source (lengths in [1, S] and
        agreeing with the padding, ids in the vocabulary) are the model's to check, once, when
        the search calls `model.encode` (`RNNSearch.encode` runs `check_batch`).

        Args:
            model: an `RNNSearch` / `RNNEncDec`, or anything with the same `encode(src,
                src_lengths)` and `step` (a `DecoderState` of B rows and a memory with
                `select(keep)`); a step that takes `check` is called with `check=False`
                (`step_call`).
            src: (B, S) source ids, padded.
            src_lengths: (B,) real lengths.
            constraints: optional, one list of phrases per sentence (each a non-empty list of
                target ids; [] for none) that every hypothesis of the sentence holds, each
                contiguously (lexically constrained decoding, `bahdanau.constraints`).
            avoid: optional, one list of phrases per sentence that no hypothesis holds.
        Returns:
            For each sentence, its `n_best` hypotheses, best first.
        Raises:
            InputError: empty batch or bad shapes, `cuda_graphs` for tensors not on CUDA,
                a search needing more memory than the device has available (`check_memory`:
                before any allocation), what `model.encode` refuses (empty sentences, lengths
                that disagree with the padding, ids out of range), phrases that
                `compile_constraints` refuses (not one list per sentence, empty, not words of
                the target vocabulary, more than the sentence's cap allows), all before
                decoding; or scores that are not finite (NaN logits, or -inf for every way to
                end a sentence): never an empty or NaN-ranked result.
        """
        check_type("model", model, torch.nn.Module, "a torch.nn.Module such as RNNSearch")
        check_tensor("src", src, 2, integer=True)
        if src.shape[0] == 0 or src.shape[1] == 0:
            raise InputError(f"src has shape {tuple(src.shape)}: nothing to translate")
        check_lengths("src_lengths", src_lengths, src.shape[0], src.shape[1], values=False)
        if self.cuda_graphs and src.device.type != "cuda":
            raise InputError(f"cuda_graphs=True replays the decoder step as CUDA graphs, which "
                             f"needs the model and src on a CUDA device; src is on "
                             f"{src.device.type}")
        lexical = self._lexical(model, src_lengths, src.device, constraints, avoid)
        self.check_memory(model, src.shape[0], src.shape[1], src.device)
        was_training = model.training
        model.eval()
        try:
            # a Module, checked above; encode and step are the contract documented above
            decoding, lengths = cast(_Decoding, model), src_lengths.to(src.device)
            if not self.cuda_graphs:
                return self._search(decoding, src, lengths, step_call(decoding),
                                    fixed_rows=False, lexical=lexical)
            padded = pad_to_bucket(src, model_vocabs(model).pad_id)
            return self._search(decoding, padded, lengths, self._captured_step(model),
                                fixed_rows=True, lexical=lexical)
        finally:
            model.train(was_training)

    def _lexical(self, model: torch.nn.Module, src_lengths: Tensor, device: torch.device,
                 constraints: object, avoid: object) -> LexicalBeams | None:
        """The phrases' automata on the device (`bahdanau.constraints`), checked before any
        decoding; None without phrases (the plain search)."""
        if constraints is None and avoid is None:
            return None
        vocabs = model_vocabs(model)
        if vocabs.tgt_vocab_size is None:
            raise InputError("constraints and avoid need the model's target vocabulary size "
                             "(model.config.tgt_vocab_size)")
        automata = compile_constraints(constraints, avoid, self.caps(src_lengths).tolist(),
                                       vocabs.tgt_vocab_size,
                                       (vocabs.pad_id, vocabs.bos_id, vocabs.eos_id),
                                       label=lambda i: f"sentence {i} of the batch")
        if automata is None:
            return None
        return LexicalBeams.start(automata, self.beam_size, device, vocabs.pad_id)

    def captured(self, model: torch.nn.Module) -> CapturedStep | None:
        """The captured step this search holds for `model` (`cuda_graphs=True`), with its
        counts of graphs recorded and steps replayed; None before its first call."""
        held = self._graphs.get(id(model))
        return held[2] if held is not None and held[0] is model else None

    def _captured_step(self, model: torch.nn.Module) -> CapturedStep:
        """The `CapturedStep` of `model.step`, kept between calls while the model's parameters
        stay where its graphs read them."""
        where = tuple(p.data_ptr() for p in model.parameters())
        held = self._graphs.get(id(model))
        if held is None or held[0] is not model or held[1] != where:
            held = self._graphs[id(model)] = (model, where,
                                              CapturedStep(step_call(cast(_Decoding, model))))
        return held[2]

    def _search(self, model: _Decoding, src: Tensor, src_lengths: Tensor, step: _StepCall, *,
                fixed_rows: bool, lexical: LexicalBeams | None = None
                ) -> list[list[Hypothesis]]:
        """The search of one batch through `step` (model.step, or its captured graphs): runs of
        `check_every` steps, with the host's look at the batch after each (`_Beams.check`;
        `fixed_rows` keeps power-of-two groups of sentences), under the phrases of `lexical`."""
        beams = _Beams.start(self, model, src, src_lengths, step, lexical)
        end = int(beams.caps.max()) + 1                 # step `cap` may only end with eos
        for first in range(0, end, self.check_every):
            started, rows = time.perf_counter(), beams.tokens.shape[0]
            steps = range(first, min(first + self.check_every, end))
            beams.advance(steps)
            going = beams.check(fixed_rows)
            if self.observe is not None:
                self.observe(rows * len(steps), time.perf_counter() - started)
            if not going:
                break
        refuse_nan_scores(beams.nan)
        return self._collect(src.shape[0], src_lengths, beams.history, beams.finished)

    def _bound(self, scores: Tensor, caps: Tensor) -> Tensor:
        """(B',) the best score any live hypothesis could still reach."""
        best = scores.max(dim=1).values
        if self.length_penalty == "none":
            return best
        return length_normalise(best, caps + 1, self.length_penalty, self.alpha)

    def _collect(self, n_sent: int, src_lengths: Tensor, history: list[_Step],
                 finished: list[_Finished]) -> list[list[Hypothesis]]:
        """Follow back-pointers of the finished hypotheses (on the CPU, after the search)."""
        history, finished = _on_host(history), _on_host(finished)
        steps = [(a.tolist(), p.tolist(), t.tolist(), w) for a, p, t, w in history]
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
                                 "gives every ending a log-probability of -inf (or every way "
                                 "to hold its phrases leads to an avoided one)")
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


def step_call(model: _Decoding) -> _StepCall:
    """`model.step` as the search calls it: without its per-step check of the token ids (a
    read back to the host) where the step offers to skip it (`check=False`), as the search
    makes the tokens itself, from the model's own vocabulary."""
    step: Any = model.step                   # `check` is not part of the `_Decoding` contract
    if "check" in inspect.signature(step).parameters:
        return functools.partial(step, check=False)
    return step


@dataclass(eq=False)
class _Beams:
    """The search of one batch: its K beams per sentence and what they found, on the device.

    Rows are sentence-major (B' sentences, B'K rows). A sentence is `done` once it can gain
    nothing (at its cap, no live beam, or beaten under early stopping); it keeps stepping until
    the next check, its beams scored -inf, so nothing of it changes: no candidate of it is
    finite, so none finishes, its n-best stay and its NaNs are not counted.
    """

    search: BeamSearch
    step: _StepCall
    ids: tuple[int, int, int]     # bos, eos, pad
    active: Tensor                # (B',) the sentences' ids in the batch
    caps: Tensor                  # (B',) their length caps
    tokens: Tensor                # (B'K,) the last token of each beam
    state: Any                    # B'K rows of decoder state
    memory: Any                   # the B' sentences' memory
    scores: Tensor                # (B', K) log-probabilities of the beams, -inf when dead
    kept: Tensor                  # (B', n_best) best normalised finished scores, descending
    done: Tensor                  # (B',) bool
    nan: Tensor                   # () bool: a live beam's log-probability was NaN
    lexical: LexicalBeams | None = None   # the phrases of each sentence and each beam's state
    history: list[_Step] = field(default_factory=list)
    finished: list[_Finished] = field(default_factory=list)

    @classmethod
    def start(cls, search: BeamSearch, model: _Decoding, src: Tensor, src_lengths: Tensor,
              step: _StepCall, lexical: LexicalBeams | None = None) -> _Beams:
        """Encode the batch (the model checks its values) and set up one live beam each,
        under the phrases of `lexical` (None: none)."""
        vocabs = model_vocabs(model)
        bos, eos, pad = vocabs.bos_id, vocabs.eos_id, vocabs.pad_id
        K, n_sent, device = search.beam_size, src.shape[0], src.device
        state, memory = model.encode(src, src_lengths)
        active = torch.arange(n_sent, device=device)                           # original ids
        state = state.rows(active.repeat_interleave(K))                        # B*K rows
        dtype = torch.float64 if state.hidden.dtype == torch.float64 else torch.float32
        scores = torch.full((n_sent, K), float("-inf"), dtype=dtype, device=device)
        scores[:, 0] = 0.0                                                     # one live beam
        return cls(search, step, (bos, eos, pad), active, search.caps(src_lengths),
                   torch.full((n_sent * K,), bos, dtype=torch.long, device=device), state,
                   memory, scores,
                   torch.full((n_sent, search.n_best), float("-inf"), dtype=dtype,
                              device=device),
                   torch.zeros(n_sent, dtype=torch.bool, device=device),
                   torch.zeros((), dtype=torch.bool, device=device), lexical)

    def advance(self, steps: range) -> None:
        """Search steps `steps` (numbered from 0), reading nothing back to the host."""
        for index in steps:
            self._step(index)

    def _step(self, index: int) -> None:
        search, K, (bos, eos, pad) = self.search, self.search.beam_size, self.ids
        out = self.step(self.tokens, self.state, self.memory)
        n = self.active.shape[0]
        log_probs = torch.log_softmax(out.logits.to(self.scores.dtype), dim=-1).view(n, K, -1)
        for never in (pad, bos):                                     # never generated
            log_probs[..., never] = float("-inf")
        if index < search.min_len:
            log_probs[..., eos] = float("-inf")
        at_cap = self.caps <= index                                  # (B',) only eos left
        if self.lexical is None:
            sel = select_candidates(self.scores, log_probs, eos, only_eos=at_cap)
        else:                       # the seam of constrained decoding (bahdanau.constraints)
            log_probs = self.lexical.restrict(log_probs, self.caps - index - 1, eos)
            top = select_candidates(self.scores, log_probs, eos, only_eos=at_cap)
            choice, self.lexical = self.lexical.choose(self.scores, log_probs, top, eos)
            sel = Selection(*choice, top.best_token)
        normalised = length_normalise(sel.top_scores, index + 1, search.length_penalty,
                                      search.alpha)
        self.kept = update_kept(self.kept, normalised, sel.finished)
        self.finished.append((index, self.active, sel.finished, sel.top_scores,
                              sel.top_parent))
        # a NaN log-probability ranks first, so it continues; done sentences' are not counted
        self.nan = self.nan | (sel.scores.isnan() & ~self.done[:, None]).any()
        weights = None if out.weights is None else out.weights.view(n, K, -1)
        self.history.append((self.active, sel.parent, sel.token, weights))
        done = self.done | at_cap | ~torch.isfinite(sel.scores).any(1)
        if search.early_stopping:
            worst = self.kept[:, -1]
            done |= torch.isfinite(worst) & (worst >= search._bound(sel.scores, self.caps))
        self.done = done
        self.scores = sel.scores.masked_fill(done[:, None], float("-inf"))
        rows = (torch.arange(n, device=sel.parent.device)[:, None] * K + sel.parent).flatten()
        self.state, self.tokens = out.state.rows(rows), sel.token.flatten()

    def check(self, fixed_rows: bool) -> bool:
        """The host's look at the batch: False when every sentence is done; else the done
        sentences leave it. With `fixed_rows` the batch keeps a power of two of sentences (or
        all it has), the live ones and enough done ones, so its shapes come from a small set."""
        if bool(self.done.all()):
            return False
        if not bool(self.done.any()):
            return True
        keep = (~self.done).nonzero().flatten()
        if fixed_rows:
            size = min(self.done.shape[0], 1 << (keep.shape[0] - 1).bit_length())
            if size == self.done.shape[0]:
                return True
            extra = self.done.nonzero().flatten()[: size - keep.shape[0]]
            keep = torch.cat([keep, extra]).sort().values
        K = self.search.beam_size
        keep_rows = (keep[:, None] * K + torch.arange(K, device=keep.device)).flatten()
        self.active, self.caps, self.done = self.active[keep], self.caps[keep], self.done[keep]
        self.scores, self.kept = self.scores[keep], self.kept[keep]
        self.state, self.tokens = self.state.rows(keep_rows), self.tokens[keep_rows]
        self.memory = self.memory.select(keep)
        if self.lexical is not None:
            self.lexical = self.lexical.select(keep)
        return True


def _on_host(entries: list[Any]) -> list[Any]:
    """Tuples of tensors (and other values) with every tensor on the CPU, moved with one copy
    per dtype rather than one read per tensor."""
    unique = {id(t): t for entry in entries for t in entry if isinstance(t, Tensor)}
    tensors = list(unique.values())             # the sentences' ids are shared by many steps
    if not tensors or tensors[0].device.type == "cpu":
        return entries
    moved: dict[int, Tensor] = {}
    for dtype in {t.dtype for t in tensors}:
        group = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.reshape(-1) for t in group]).cpu()
        for t, part in zip(group, flat.split([t.numel() for t in group]), strict=True):
            moved[id(t)] = part.view(t.shape)
    return [tuple(moved[id(t)] if isinstance(t, Tensor) else t for t in entry)
            for entry in entries]


def greedy_search(model: torch.nn.Module, src: Tensor, src_lengths: Tensor, *,
                  max_len: int = 100, min_len: int = 1) -> list[Hypothesis]:
    """Greedy decoding: `BeamSearch(beam_size=1)`, one hypothesis per sentence."""
    search = BeamSearch(beam_size=1, max_len=max_len, min_len=min_len)
    return [hyps[0] for hyps in search(model, src, src_lengths)]
