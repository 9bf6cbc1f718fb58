"""Lexically constrained decoding: phrases every translation must hold, and phrases none may.

`BeamSearch(...)(model, src, src_lengths, constraints=..., avoid=...)` takes, for each sentence,
a list of phrases (lists of target ids) that must each appear contiguously in every hypothesis
it returns, and a list of phrases that none may contain. This module is the whole of it; the
search meets it at one seam (`BeamSearch`'s `_Beams`): where the plain search picks each step's
candidates with `select_candidates`, a constrained batch calls `LexicalBeams.restrict` on the
step's log-probabilities, then `select_candidates`, then `LexicalBeams.choose`. A batch without
phrases never comes here, so the plain search stays exactly as it is.

What the phrases of one sentence allow is a deterministic automaton over the tokens a hypothesis
writes (`Automaton`, built once per set of phrases on the host): its states are the nodes of the
Aho-Corasick trie of all the sentence's phrases (the longest suffix of the hypothesis that
begins a phrase) together with the set of required phrases met so far. Writing a token moves the
state; a token that would complete an avoided phrase has no move. The automaton also knows, for
every state, `dist`: the fewest tokens a hypothesis there must still add before it holds every
required phrase (a breadth-first search backwards from the states that hold them all, never
through an avoided phrase). On the device each beam carries its state, one int, and each step
is tensor operations over the batch (nothing is read back to the host):

* `restrict`: a token is allowed only where the hypothesis can still hold every phrase within
  its length cap afterwards (`dist` of the state it leads to <= the tokens left), never where it
  completes an avoided phrase, and eos only once every phrase is held. So every finished
  hypothesis holds every phrase and no avoided one, and as long as the cap allows them (checked
  before decoding: `dist` of the start state <= the cap) every sentence finishes.
* `choose`, the dynamic beam allocation of Post & Vilar (2018), in the vectorised form of Hu et
  al. (2019): besides the 2K best candidates of `select_candidates`, every beam offers its best
  token, eos and each token of the sentence's phrases. Each candidate falls in the bank of the
  constraint tokens its hypothesis has met (those of the phrases it holds, and its progress into
  one it does not: `Automaton.met`), 0 .. C for C tokens in all. The beam is filled round robin:
  the best candidate of each bank (fullest bank first), then the second best of each, and so on,
  so each bank gets about K / (C + 1) places and a bank short of candidates leaves its places to
  the others. The K picked among all candidates decide which eos ones finish, the K picked among
  the others continue (as the plain search's first K and first K without eos).

With a beam wide enough to hold every candidate the search is exhaustive over the sequences that
satisfy the phrases (the tests check it against enumeration); with one bank (a sentence without
required phrases) the allocation is the plain search's order. Each sentence is searched on its
own (its own automaton, its own banks), so a sentence alone finds what it finds in a batch.

The phrases' tokens are ids; `bahdanau.evaluate.translate_corpus`, `Translator.translate` and the
command line (``--constraints``, ``--avoid``) take text and tokenise it with the model's tokenizer
(`bahdanau.phrases.encode_phrases`).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from bahdanau._checks import describe, is_int
from bahdanau.errors import InputError

__all__ = ["Automaton", "Choice", "LexicalBeams", "allocate", "automaton", "check_phrases",
           "compile_constraints"]

Phrase = tuple[int, ...]
# The most states an automaton may have. Its states are sets of met phrases times trie nodes,
# up to 2 ** (required phrases) x (1 + their tokens): 10 one-word phrases make 6,144 states, 8
# phrases of three words 5,376, 12 one-word phrases 28,672 (refused). Beyond it the phrases of
# a sentence are refused before decoding; at it, an automaton takes about 0.3 s to build on a
# CPU and its tables 1.5 MB (for 24 distinct tokens) per sentence of the batch.
MAX_STATES = 8192
# `Automaton.dist` of a state from which the phrases can no longer all be met
UNREACHABLE = 2**40


@dataclass(frozen=True)
class Automaton:
    """The phrases of one sentence as a deterministic automaton over the tokens written.

    State 0 is the start. A token that is a letter (a token of some phrase) moves by `moves`,
    any other word by `other`; -1 is no move (an avoided phrase would be completed, or no word
    outside the phrases exists).

    Attributes:
        letters: the distinct tokens of the phrases (J of them).
        moves: (S, J) the state after each letter, or -1.
        other: (S,) the state after a word that is no letter, or -1.
        dist: (S,) the fewest tokens to add before every required phrase is held (0: all are),
            `UNREACHABLE` when they no longer can be.
        met: (S,) the constraint tokens met: the tokens of the required phrases held, plus the
            longest start of one not yet held that the hypothesis ends with. The bank.
        total: the tokens of the required phrases, the fullest bank.
    """

    letters: tuple[int, ...]
    moves: tuple[tuple[int, ...], ...]
    other: tuple[int, ...]
    dist: tuple[int, ...]
    met: tuple[int, ...]
    total: int


@functools.lru_cache(maxsize=4096)
def automaton(positive: tuple[Phrase, ...], avoid: tuple[Phrase, ...], other_word: bool
              ) -> Automaton | None:
    """The `Automaton` of required phrases `positive` and avoided phrases `avoid`; `other_word`:
    the vocabulary has a word that no phrase holds. None past `MAX_STATES` states."""
    phrases = positive + avoid
    nodes = sorted({(), *(p[:k] for p in phrases for k in range(len(p) + 1))},
                   key=lambda node: (len(node), node))     # the trie's nodes, the root first
    node_id = {node: i for i, node in enumerate(nodes)}
    letters = tuple(sorted({t for p in phrases for t in p}))

    def ends(node: Phrase, phrase: Phrase) -> bool:
        return len(phrase) <= len(node) and node[len(node) - len(phrase):] == phrase

    def after(node: Phrase, token: int) -> int:        # the longest suffix that is a node
        text = node + (token,)
        found = next(text[k:] for k in range(len(text) + 1) if text[k:] in node_id)
        return -1 if any(ends(found, a) for a in avoid) else node_id[found]

    step = [[after(node, t) for t in letters] for node in nodes]    # moves between nodes
    held_at = [sum(1 << i for i, p in enumerate(positive) if ends(node, p)) for node in nodes]
    states: list[tuple[int, int]] = [(0, 0)]                 # (trie node, met phrases' bits)
    index = {states[0]: 0}

    def state(key: tuple[int, int]) -> int:
        if key not in index:
            index[key] = len(states)
            states.append(key)
        return index[key]

    moves, other = [], []
    for node, held in states:                                # grows as states are found
        moves.append(tuple(-1 if nxt < 0 else state((nxt, held | held_at[nxt]))
                           for nxt in step[node]))
        other.append(state((0, held)) if other_word else -1)
        if len(states) > MAX_STATES:
            return None
    dist = _distances(moves, other, [held == (1 << len(positive)) - 1 for _, held in states])
    met = tuple(sum(len(p) for i, p in enumerate(positive) if held >> i & 1)
                + max((k for i, p in enumerate(positive) if not held >> i & 1
                       for k in range(1, len(p)) if ends(nodes[node], p[:k])), default=0)
                for node, held in states)
    return Automaton(letters, tuple(moves), tuple(other), dist, met,
                     sum(len(p) for p in positive))


def _distances(moves: list[tuple[int, ...]], other: list[int], done: list[bool]
               ) -> tuple[int, ...]:
    """The fewest moves from each state to one that is `done` (breadth-first, backwards)."""
    before: list[list[int]] = [[] for _ in done]
    for s, row in enumerate(moves):
        for nxt in (*row, other[s]):
            if nxt >= 0:
                before[nxt].append(s)
    dist = [0 if d else UNREACHABLE for d in done]
    queue = deque(s for s, d in enumerate(done) if d)
    while queue:
        s = queue.popleft()
        for prev in before[s]:
            if dist[prev] == UNREACHABLE:
                dist[prev] = dist[s] + 1
                queue.append(prev)
    return tuple(dist)


def check_per_sentence(name: str, entries: object, n_sentences: int) -> Sequence[object]:
    """`entries`, checked to be a sequence of one entry (a list of phrases) per sentence.

    Raises:
        InputError: a str, something not a sequence, or a sequence of another length.
    """
    if (isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence)
            or len(entries) != n_sentences):
        raise InputError(f"{name} must hold one list of phrases per sentence ({n_sentences}), "
                         f"got {describe(entries)}")
    return entries


def check_phrases(name: str, entries: object, n_sentences: int, vocab_size: int,
                  specials: tuple[int, ...], label: Callable[[int], str]
                  ) -> list[tuple[Phrase, ...]] | None:
    """The phrases of `entries` (None, or one list of phrases per sentence, each phrase a
    non-empty list of target ids) as tuples, checked: words of the vocabulary, never one of
    `specials` (pad, bos, eos). None when `entries` is None.

    Raises:
        InputError: a wrong number of entries, or a phrase that is empty, not a list of ints, or
            holds an id outside [0, vocab_size) or a special id; named by `name` and `label(i)`.
    """
    if entries is None:
        return None
    out = []
    for i, phrases in enumerate(check_per_sentence(name, entries, n_sentences)):
        if isinstance(phrases, (str, bytes)) or not isinstance(phrases, Sequence):
            raise InputError(f"{name}, {label(i)}: expected a list of phrases, got "
                             f"{describe(phrases)}")
        for phrase in phrases:
            if (isinstance(phrase, (str, bytes)) or not isinstance(phrase, Sequence)
                    or not all(is_int(t) for t in phrase)):
                raise InputError(f"{name}, {label(i)}: a phrase must be a list of target ids, "
                                 f"got {describe(phrase)}")
            if not phrase:
                raise InputError(f"{name}, {label(i)}: a phrase is empty; a phrase needs at "
                                 "least one token")
            bad = next((t for t in phrase if not 0 <= t < vocab_size or t in specials), None)
            if bad is not None:
                raise InputError(f"{name}, {label(i)}: the phrase {list(phrase)} holds {bad}, "
                                 f"which is no word of the target vocabulary (a word is in "
                                 f"[0, {vocab_size}) and not pad, bos or eos {specials})")
        out.append(tuple(dict.fromkeys(tuple(p) for p in phrases)))   # in order, each once
    return out


def compile_constraints(constraints: object, avoid: object, caps: Sequence[int],
                        vocab_size: int, specials: tuple[int, ...], *,
                        label: Callable[[int], str] = lambda i: f"sentence {i}",
                        names: tuple[str, str] = ("constraints", "avoid")
                        ) -> list[Automaton] | None:
    """Each sentence's `Automaton`, checked before any decoding; None when no sentence has a
    phrase (the plain search).

    Args:
        constraints, avoid: None, or one list of phrases (lists of target ids) per sentence:
            those every hypothesis must hold, those none may.
        caps: each sentence's most tokens before eos (`BeamSearch.caps`).
        vocab_size: V of the target side.
        specials: the special ids no phrase may hold (pad, bos, eos).
        label: how a message names sentence i.
        names: how a message names `constraints` and `avoid`.
    Raises:
        InputError: what `check_phrases` refuses, or phrases of a sentence that no translation
            of at most its cap tokens can hold all of (or hold without an avoided phrase), or
            that make more than `MAX_STATES` states.
    """
    n = len(caps)
    positive = check_phrases(names[0], constraints, n, vocab_size, specials, label)
    avoided = check_phrases(names[1], avoid, n, vocab_size, specials, label)
    positive = positive or [()] * n
    avoided = avoided or [()] * n
    if not any(positive) and not any(avoided):
        return None
    words = vocab_size - len({s for s in specials if 0 <= s < vocab_size})
    out = []
    for i, (need, shun) in enumerate(zip(positive, avoided, strict=True)):
        letters = {t for p in need + shun for t in p}
        found = automaton(need, shun, words > len(letters))
        if found is None:
            raise InputError(f"{label(i)}: its phrases make more than {MAX_STATES} states to "
                             f"follow (each set of its {len(need)} required phrases met, at "
                             "each point inside them): give fewer phrases")
        if found.dist[0] == UNREACHABLE:
            raise InputError(f"{label(i)}: its phrases cannot all appear in a translation that "
                             "holds none of its avoided phrases")
        if found.dist[0] > caps[i]:
            raise InputError(f"{label(i)}: its phrases need at least {found.dist[0]} tokens, "
                             f"more than the {caps[i]} its translation may have (max_len, or "
                             "max_len_ratio x its source length): give fewer or shorter "
                             "phrases, or a larger max_len")
        out.append(found)
    return out


class _Top(Protocol):
    """What `choose` reads of `bahdanau.search.select_candidates`' result."""

    @property
    def top_scores(self) -> Tensor: ...
    @property
    def top_parent(self) -> Tensor: ...
    @property
    def top_token(self) -> Tensor: ...
    @property
    def best_token(self) -> Tensor: ...


class Choice(NamedTuple):
    """One constrained step for B' sentences over N candidates (the fields of
    `bahdanau.search.Selection` but its last, in its order)."""

    finished: Tensor         # (B', N) bool: eos candidates that finish
    top_scores: Tensor       # (B', N) candidate log-probabilities (-inf: none)
    top_parent: Tensor       # (B', N) beam each candidate extends
    scores: Tensor           # (B', K) log-probabilities of the continuing beams
    parent: Tensor           # (B', K) beam each continuing beam extends
    token: Tensor            # (B', K) its new token
    top_token: Tensor        # (B', N) each candidate's token


class LexicalBeams(NamedTuple):
    """The automata of B' sentences on the device, and the state of each of their K beams.

    Tables are padded across the batch: S states and J letters at most; -1 is no letter, or
    no move.
    """

    letters: Tensor    # (B', J) each sentence's letters, -1 after them
    moves: Tensor      # (B', S, J) state after a letter (-1: none)
    other: Tensor      # (B', S) state after any other word (-1: none)
    dist: Tensor       # (B', S) tokens still needed (`Automaton.dist`)
    met: Tensor        # (B', S) bank of each state
    state: Tensor      # (B', K) each beam's state
    banks: int         # C + 1 for the batch's fullest sentence
    pad_id: int        # where a missing letter points (never generated)

    @classmethod
    def start(cls, automata: Sequence[Automaton], beam_size: int, device: torch.device,
              pad_id: int) -> LexicalBeams:
        """The tables of `automata` (one per sentence) on `device`, every beam at the start."""
        n = len(automata)
        size = max(len(a.dist) for a in automata)
        width = max(1, *(len(a.letters) for a in automata))
        letters = torch.full((n, width), -1, dtype=torch.long)
        moves = torch.full((n, size, width), -1, dtype=torch.long)
        other = torch.full((n, size), -1, dtype=torch.long)
        dist = torch.full((n, size), UNREACHABLE, dtype=torch.long)
        met = torch.zeros((n, size), dtype=torch.long)
        for b, a in enumerate(automata):
            s, j = len(a.dist), len(a.letters)
            if j:
                letters[b, :j] = torch.tensor(a.letters)
                moves[b, :s, :j] = torch.tensor(a.moves)
            other[b, :s] = torch.tensor(a.other)
            dist[b, :s] = torch.tensor(a.dist)
            met[b, :s] = torch.tensor(a.met)
        return cls(letters.to(device), moves.to(device), other.to(device), dist.to(device),
                   met.to(device), torch.zeros((n, beam_size), dtype=torch.long, device=device),
                   max(a.total for a in automata) + 1, pad_id)

    def select(self, keep: Tensor) -> LexicalBeams:
        """The sentences `keep` (the search drops finished sentences)."""
        return self._replace(letters=self.letters[keep], moves=self.moves[keep],
                             other=self.other[keep], dist=self.dist[keep], met=self.met[keep],
                             state=self.state[keep])

    def _letter_ids(self) -> Tensor:
        """(B', J) the letters, with pad where a sentence has fewer (pad is never written)."""
        return torch.where(self.letters >= 0, self.letters, self.pad_id)

    def restrict(self, log_probs: Tensor, room: Tensor, eos_id: int) -> Tensor:
        """The step's log-probabilities with what the phrases forbid at -inf (in place).

        Args:
            log_probs: (B', K, V) next-token log-probabilities of each beam (pad and bos
                already -inf), changed in place.
            room: (B',) the tokens each sentence may still write after this one (its cap minus
                the step minus 1; below 0 at the cap, where only eos may follow).
            eos_id: the end-of-sentence id.
        Returns:
            (B', K, V): a token is kept where its state can still hold every phrase within
            `room` (and completes no avoided phrase), eos where every phrase is held.
        """
        n, beams, _ = log_probs.shape
        width = self.letters.shape[1]
        by_letter = self.moves.gather(1, self.state[..., None].expand(n, beams, width))
        by_other = self.other.gather(1, self.state)                          # (B', K)
        within = room[:, None]                                               # (B', 1)
        letter_ok = (by_letter >= 0) & (self.dist.gather(
            1, by_letter.clamp(min=0).flatten(1)).view(n, beams, width) <= within[..., None])
        other_ok = (by_other >= 0) & (self.dist.gather(1, by_other.clamp(min=0)) <= within)
        held = self.dist.gather(1, self.state) == 0                          # (B', K)
        ids = self._letter_ids()[:, None, :].expand(n, beams, width)         # (B', K, J)
        letters = log_probs.gather(2, ids).masked_fill(~letter_ok, float("-inf"))
        eos = log_probs[..., eos_id].masked_fill(~held, float("-inf"))       # a copy
        # + -inf where no other word may follow (+ 0 changes nothing): an add in place is
        # several times faster than a masked fill of (B', K, V) on a CPU
        log_probs.add_(torch.zeros_like(eos).masked_fill(~other_ok, float("-inf"))[..., None])
        log_probs.scatter_(2, ids, letters)             # padding writes -inf over pad
        log_probs[..., eos_id] = eos
        return log_probs

    def after(self, state: Tensor, token: Tensor) -> Tensor:
        """(B', N) the state after writing `token` (B', N) in `state` (B', N); -1: no move."""
        match = token[..., None] == self.letters[:, None, :]                 # (B', N, J)
        width = self.letters.shape[1]
        column = match.long().argmax(2)                 # the matching letter (0 if none)
        by_letter = self.moves.flatten(1).gather(1, state.clamp(min=0) * width + column)
        by_other = self.other.gather(1, state.clamp(min=0))
        return torch.where(match.any(2), by_letter, by_other)

    def choose(self, scores: Tensor, log_probs: Tensor, top: _Top, eos_id: int
               ) -> tuple[Choice, LexicalBeams]:
        """One step's candidates and the beams' banks (see the module docstring).

        Args:
            scores: (B', K) log-probabilities of the live beams (-inf for dead ones).
            log_probs: (B', K, V) as `restrict` returned them.
            top: `select_candidates` of `scores` and `log_probs` (with its `only_eos`): its
                candidates, and each beam's best token.
            eos_id: the end-of-sentence id.
        Returns:
            The `Choice` of the step, and these beams with the continuing beams' states.
        """
        n, beams, vocab = log_probs.shape
        extra = torch.cat([top.best_token[..., None],                        # best token
                           torch.full((n, beams, 1), eos_id, device=scores.device),
                           self._letter_ids()[:, None, :].expand(n, beams, -1)], dim=2)
        extra_lp = log_probs.gather(2, extra)           # at a cap all -inf but eos (restrict)
        per_beam = extra.shape[2]
        cand_score = torch.cat([top.top_scores,
                                (scores[..., None] + extra_lp).flatten(1)], dim=1)  # (B', N)
        cand_parent = torch.cat([top.top_parent, torch.arange(
            beams, device=scores.device).repeat_interleave(per_beam).expand(n, -1)], dim=1)
        cand_token = torch.cat([top.top_token, extra.flatten(1)], dim=1)
        key = cand_parent * vocab + cand_token
        earlier = torch.ones(key.shape[1], key.shape[1], dtype=torch.bool,
                             device=key.device).tril(-1)                     # [i, j]: j < i
        twice = ((key[:, :, None] == key[:, None, :]) & earlier).any(2)      # seen before
        cand_score = cand_score.masked_fill(twice, float("-inf"))
        is_eos = cand_token == eos_id
        parent_state = self.state.gather(1, cand_parent)
        state = torch.where(is_eos, parent_state, self.after(parent_state, cand_token))
        bank = self.met.gather(1, state.clamp(min=0))
        first = allocate(cand_score, bank, torch.ones_like(is_eos), beams, self.banks)
        finished = (torch.zeros_like(is_eos).scatter(1, first, True) & is_eos
                    & torch.isfinite(cand_score))
        going = allocate(cand_score, bank, ~is_eos, beams, self.banks)
        choice = Choice(finished, cand_score, cand_parent, cand_score.gather(1, going),
                        cand_parent.gather(1, going), cand_token.gather(1, going), cand_token)
        return choice, self._replace(state=state.gather(1, going).clamp(min=0))


def allocate(scores: Tensor, bank: Tensor, eligible: Tensor, k: int, banks: int) -> Tensor:
    """The k candidates a beam keeps, by dynamic beam allocation, round robin over the banks.

    Candidates are ranked by score within their bank; the beam takes every bank's first
    (fullest bank first), then every bank's second, and so on. A bank with fewer candidates
    leaves its places to the others. A NaN score ranks first (as in `torch.topk`), so the search
    sees it; candidates scored -inf come after every other, in their order; those not
    `eligible` last.

    Args:
        scores: (B', N) candidate log-probabilities, in the order that breaks ties.
        bank: (B', N) each candidate's bank, in [0, banks).
        eligible: (B', N) bool, the candidates that may be taken.
        k: how many to keep (<= N).
        banks: the number of banks.
    Returns:
        (B', k) the indexes of the kept candidates, in the order taken.
    """
    n, width = scores.shape
    live = eligible & (scores != float("-inf"))               # NaN is live
    order = torch.sort(scores.masked_fill(~live, float("-inf")), dim=1, descending=True,
                       stable=True).indices                   # NaN first, then by score
    sorted_bank = bank.gather(1, order)
    same = (sorted_bank[..., None] == torch.arange(banks, device=bank.device)) \
        & live.gather(1, order)[..., None]                    # (B', N, banks)
    rank_sorted = same.long().cumsum(1).gather(2, sorted_bank[..., None]).squeeze(2) - 1
    rank = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    position = torch.arange(width, device=scores.device).expand(n, width)
    last = (width + 1) * banks
    key = torch.where(live, rank * banks + (banks - 1 - bank),
                      torch.where(eligible, last + position, 2 * last + position))
    return key.topk(k, dim=1, largest=False, sorted=True).indices
