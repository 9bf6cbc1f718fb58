"""Evaluation with sacrebleu: corpus BLEU and chrF, BLEU without [UNK], BLEU by sentence length.

Scores are computed on detokenised hypotheses against raw references, with sacrebleu's defaults
(13a tokenisation for BLEU), and come with sacrebleu's signature so they can be reproduced;
`bahdanau.bleu_text.BleuText` chooses BLEU's case and tokenisation otherwise (Moses' tokenizer,
as the WMT shared tasks scored), and the signature says so.
`translate_corpus` turns raw sentences into detokenised translations with any model built from
our decoder (`translate_batches`: the same, batch by batch as each is done); the paper's "No
UNK" column and its Figure 2 (BLEU by source length) are `bleu_without_unk` and
`bleu_by_length`. `score_corpus` (and `score_ids` below it) scores given translations instead
of searching for them (forced decoding): log p(Y | X) of each target, and the length-normalised
score that `BeamSearch` would rank it by. Phrases given as text for constrained decoding
become target ids, checked against their sentences before any decoding, in
`bahdanau.phrases`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sacrebleu
import torch

from bahdanau._checks import (
    check_memory,
    check_strings,
    check_tokenizer,
    check_type,
    is_finite_number,
    is_int,
    resolve_device,
)
from bahdanau._progress import Bar, progress_bar
from bahdanau.alignments import replace_unk
from bahdanau.bleu_text import BleuText, Tokenize
from bahdanau.config import ModelConfig
from bahdanau.data.batching import Example, collate, pad_sources
from bahdanau.data.text import normalize_whitespace
from bahdanau.data.tokenizers import Tokenizer, sides, writes_lowercase
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.models import RNNSearch
from bahdanau.phrases import Phrases, check_constraints
from bahdanau.search import (
    LENGTH_PENALTIES,
    BeamSearch,
    Hypothesis,
    LengthPenalty,
    length_normalise,
    refuse_nan_scores,
)


@dataclass(frozen=True)
class CorpusScores:
    """Corpus-level scores with their sacrebleu signatures."""

    bleu: float
    chrf: float
    n_sentences: int
    bleu_signature: str
    chrf_signature: str


@dataclass(frozen=True)
class LengthBucket:
    """BLEU of the sentences whose source length (in tokens) lies in [low, high)."""

    low: int
    high: int | None           # None: no upper bound
    n_sentences: int
    bleu: float | None         # None when the bucket is empty


def _check_parallel(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    check_strings("hypotheses", hypotheses)
    check_strings("references", references)
    if len(hypotheses) != len(references):
        raise InputError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise InputError("no sentences to score")
    blank = next((i for i, ref in enumerate(references) if not ref.strip()), None)
    if blank is not None:                # sacrebleu would score it, against every word
        raise InputError(f"reference {blank + 1} is empty: every sentence needs its reference "
                         "translation")


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], *,
                lowercase: bool = False, tokenize: Tokenize = "13a",
                moses_lang: str | None = None) -> float:
    """sacrebleu corpus BLEU of detokenised text, one reference each: cased and 13a-tokenised
    by default; `lowercase`, `tokenize` and `moses_lang` choose otherwise (`BleuText`:
    ``tokenize="moses"`` scores Moses-tokenised text, as the WMT shared tasks did)."""
    _check_parallel(hypotheses, references)
    text = BleuText(lowercase=lowercase, tokenize=tokenize, moses_lang=moses_lang)
    return _bleu(text).corpus_score(text.prepare(hypotheses),
                                    [text.prepare(references)]).score


def _bleu(text: BleuText) -> sacrebleu.metrics.BLEU:
    """sacrebleu's BLEU for text read as `text` says (it has been `BleuText.prepare`d); Moses'
    tokens are meant, so sacrebleu's warning about tokenised input is not printed (`force`)."""
    return sacrebleu.metrics.BLEU(lowercase=text.lowercase, tokenize=text.sacrebleu_tokenize,
                                  force=text.tokenize == "moses")


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], *,
                  lowercase: bool = False, tokenize: Tokenize = "13a",
                  moses_lang: str | None = None) -> CorpusScores:
    """BLEU and chrF with their signatures. `lowercase`: both case-insensitive (the BLEU
    signature then says ``case:lc``; sacrebleu's chrF has no case option and is computed on
    lowercased text); `tokenize`, `moses_lang`: BLEU's tokenisation (`BleuText`; chrF, which
    reads characters, reads the same text, Moses-normalised for ``moses``)."""
    _check_parallel(hypotheses, references)
    text = BleuText(lowercase=lowercase, tokenize=tokenize, moses_lang=moses_lang)
    hyps, refs = text.prepare(hypotheses), text.prepare(references)
    if lowercase:   # sacrebleu's chrF has no lowercase option: lowercase the text itself
        hyps, refs = [h.lower() for h in hyps], [r.lower() for r in refs]
    bleu, chrf = _bleu(text), sacrebleu.metrics.CHRF()
    return CorpusScores(bleu.corpus_score(hyps, [refs]).score,
                        chrf.corpus_score(hyps, [refs]).score, len(hyps),
                        text.signature(str(bleu.get_signature())), str(chrf.get_signature()))


def has_unk(tokens: Sequence[str], vocab: Vocab) -> bool:
    """True if any token is outside `vocab` (would be encoded as [UNK])."""
    return any(token not in vocab for token in tokens)


def bleu_without_unk(hypotheses: Sequence[str], references: Sequence[str],
                     unk_flags: Sequence[bool], *, lowercase: bool = False,
                     tokenize: Tokenize = "13a", moses_lang: str | None = None
                     ) -> tuple[float | None, int]:
    """BLEU on the sentences whose flag is False (the paper's "No UNK" column).

    Args:
        hypotheses, references: detokenised text, line-aligned.
        unk_flags: per sentence, True if its source or reference has a word outside the
            vocabularies (see `has_unk`).
        lowercase, tokenize, moses_lang: how BLEU reads the text, as for `corpus_bleu`.
    Returns:
        (BLEU or None if no sentence is left, number of sentences kept).
    """
    _check_parallel(hypotheses, references)
    if len(unk_flags) != len(hypotheses):
        raise InputError(f"{len(unk_flags)} unk flags for {len(hypotheses)} sentences")
    keep = [i for i, flag in enumerate(unk_flags) if not flag]
    if not keep:
        return None, 0
    return corpus_bleu([hypotheses[i] for i in keep], [references[i] for i in keep],
                       lowercase=lowercase, tokenize=tokenize,
                       moses_lang=moses_lang), len(keep)


def bleu_by_length(source_lengths: Sequence[int], hypotheses: Sequence[str],
                   references: Sequence[str], edges: Sequence[int] = (10, 20, 30, 40, 50, 60),
                   *, lowercase: bool = False, tokenize: Tokenize = "13a",
                   moses_lang: str | None = None) -> list[LengthBucket]:
    """BLEU per source-length bucket: [0, e1), [e1, e2), ..., [e_last, inf) (paper Figure 2);
    `lowercase`, `tokenize` and `moses_lang` as for `corpus_bleu`."""
    _check_parallel(hypotheses, references)
    if len(source_lengths) != len(hypotheses):
        raise InputError(f"{len(source_lengths)} source lengths for {len(hypotheses)} sentences")
    if (not all(is_int(e) for e in edges) or list(edges) != sorted(set(edges))
            or (edges and edges[0] <= 0)):
        raise InputError(f"edges must be increasing positive ints, got {list(edges)}")
    bounds = [0, *edges]
    buckets = []
    for i, low in enumerate(bounds):
        high = bounds[i + 1] if i + 1 < len(bounds) else None
        idx = [j for j, n in enumerate(source_lengths) if n >= low and (high is None or n < high)]
        score = (corpus_bleu([hypotheses[j] for j in idx], [references[j] for j in idx],
                             lowercase=lowercase, tokenize=tokenize, moses_lang=moses_lang)
                 if idx else None)
        buckets.append(LengthBucket(low, high, len(idx), score))
    return buckets


def score_test_set(hypotheses: Sequence[str], sources: Sequence[str], references: Sequence[str],
                   src_vocab: Vocab, tgt_vocab: Vocab, tokenizer: Tokenizer, *,
                   edges: Sequence[int] = (10, 20, 30, 40, 50, 60),
                   bleu: BleuText | None = None) -> dict[str, Any]:
    """Every test-set score the paper reports, as a JSON-friendly dict (scores to 2 decimals).

    BLEU and chrF with signatures; BLEU on the pairs whose source and reference have no [UNK]
    (Table 1's second column); BLEU by source length in tokens (Figure 2). BLEU and chrF read
    the references with their whitespace normalised, as a word tokenizer's round trip
    normalises the hypotheses'; whether a reference holds [UNK] is decided on its tokens as
    written. A
    tokenizer that lowercases (`lowercase=True`) makes every score case-insensitive, and the
    BLEU signature says so (``case:lc``); so does `bleu` with ``lowercase=True``, and its
    ``tokenize`` sets BLEU's tokenisation (``moses``: the WMT shared tasks'), which the
    signature shows too.

    Args:
        hypotheses: detokenised translations, one per source sentence.
        sources, references: the raw source sentences and reference translations.
        src_vocab, tgt_vocab, tokenizer: what the model was trained with.
        edges: bucket edges of `bleu_by_length`.
        bleu: how BLEU reads the text (`BleuText`; default: sacrebleu's, cased unless the
            tokenizer writes lowercase, `writes_lowercase`).
    """
    bleu = bleu or BleuText()
    if writes_lowercase(tokenizer):
        bleu = dataclasses.replace(bleu, lowercase=True)
    how = dataclasses.asdict(bleu)                     # lowercase, tokenize, moses_lang
    refs = [normalize_whitespace(r) for r in references]
    scores = corpus_scores(hypotheses, refs, **how)
    src_tokens = [tokenizer.tokenize(s) for s in sources]
    target_tokenizer = sides(tokenizer)[1]
    flags = [has_unk(s, src_vocab) or has_unk(target_tokenizer.tokenize(r), tgt_vocab)
             for s, r in zip(src_tokens, references, strict=True)]   # r as written
    no_unk, n_no_unk = bleu_without_unk(hypotheses, refs, flags, **how)
    buckets = bleu_by_length([len(s) for s in src_tokens], hypotheses, refs, edges=edges, **how)
    return {
        "bleu": round(scores.bleu, 2), "chrf": round(scores.chrf, 2),
        "bleu_no_unk": None if no_unk is None else round(no_unk, 2),
        "sentences": scores.n_sentences, "sentences_no_unk": n_no_unk,
        "bleu_by_length": [{"low": b.low, "high": b.high, "sentences": b.n_sentences,
                            "bleu": None if b.bleu is None else round(b.bleu, 2)}
                           for b in buckets],
        "bleu_signature": scores.bleu_signature, "chrf_signature": scores.chrf_signature,
        "bleu_text": how,
    }


@dataclass(frozen=True)
class Translation:
    """A translated sentence: detokenised text, its target tokens and the best hypothesis."""

    text: str
    tokens: list[str]
    hypothesis: Hypothesis
    nbest: list[Hypothesis]


def _length_sorted(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices sorted by length, in chunks of `batch_size` (little padding in each)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def _numbering(lines: Sequence[int] | None, count: int) -> Callable[[int], int]:
    """The number the messages give sentence `i` of `count`: lines[i], or i + 1."""
    if lines is None:
        return lambda i: i + 1
    if len(lines) != count or not all(is_int(n) for n in lines):
        raise InputError(f"lines must be {count} ints, one per sentence, got {lines!r:.80}")
    return lambda i: lines[i]


def _check_translation_memory(model: torch.nn.Module, search: BeamSearch,
                              ids: list[list[int]], batches: list[list[int]],
                              number: Callable[[int], int], device: torch.device) -> None:
    """Before any decoding, each batch's search fits in memory (`BeamSearch.check_memory`):
    its longest sentence alone (named by `number`), then the batch."""
    for chunk in batches:                        # sorted by length: the longest is the last
        longest = chunk[-1]
        tokens = f"{len(ids[longest]):,} tokens"
        search.check_memory(model, 1, len(ids[longest]), device,
                            f"translating sentence {number(longest)} ({tokens})")
        search.check_memory(model, len(chunk), len(ids[longest]), device,
                            f"translating {len(chunk):,} sentences together (up to sentence "
                            f"{number(longest)}'s {tokens})")


def _bar(progress: str | None, total: int) -> Any:
    """The bar of a corpus of `total` sentences labelled `progress`; None: a bar that draws
    nothing (the caller draws its own)."""
    return progress_bar(progress, total=total, unit="sentences") if progress else Bar()


def _check_corpus_arguments(model: torch.nn.Module, sentences: Sequence[str], src_vocab: Vocab,
                            tgt_vocab: Vocab, tokenizer: Tokenizer, search: BeamSearch | None,
                            batch_size: int, unk_replace: bool) -> None:
    """`translate_corpus`'s arguments, each of its type, and vocabularies that agree with the
    model's config (a model built without one uses the Vocab ids)."""
    check_type("model", model, torch.nn.Module, "a torch.nn.Module such as RNNSearch")
    check_type("src_vocab", src_vocab, Vocab, "a Vocab")
    check_type("tgt_vocab", tgt_vocab, Vocab, "a Vocab")
    check_tokenizer("tokenizer", tokenizer)
    if search is not None:
        check_type("search", search, BeamSearch, "a BeamSearch or None")
    config = getattr(model, "config", None)
    if config is not None:
        config.check_vocabs(src_vocab, tgt_vocab)
    check_strings("sentences", sentences)
    if not (is_int(batch_size) and batch_size >= 1):
        raise InputError(f"batch_size must be an int >= 1, got {batch_size!r}")
    check_type("unk_replace", unk_replace, bool, "True or False")
    if unk_replace and getattr(model, "arch", None) == "rnnencdec":
        raise InputError("unk_replace needs attention weights, which RNNencdec does not have")


def translate_corpus(model: torch.nn.Module, sentences: Sequence[str], src_vocab: Vocab,
                     tgt_vocab: Vocab, tokenizer: Tokenizer, *, search: BeamSearch | None = None,
                     batch_size: int = 64, unk_replace: bool = False,
                     device: str | torch.device = "cpu",
                     progress: str | None = "translating",
                     constraints: Sequence[Sequence[str]] | None = None,
                     avoid: Sequence[Sequence[str]] | None = None,
                     lines: Sequence[int] | None = None) -> list[Translation]:
    """Translate raw sentences; results come back in input order.

    Sentences are sorted by length and batched (less padding); each is tokenised, encoded
    (unknown words -> [UNK]), searched, decoded and detokenised. Under `torch.autocast` the
    model runs in its precision and the search adds up log-probabilities in float32
    (docs/guides/decoding.md, "Mixed precision"). `translate_batches` gives the same
    translations batch by batch, as each is done.

    Args:
        model: an `RNNSearch` / `RNNEncDec` on `device`.
        sentences: raw source sentences (empty ones raise InputError naming the line).
        src_vocab, tgt_vocab: the model's vocabularies.
        tokenizer: the tokenizer used in training (for both sides).
        search: a `BeamSearch` (default: beam 5, at most 100 tokens).
        batch_size: sentences per batch.
        unk_replace: replace generated [UNK]s by the most attended source word (an extension
            beyond the paper; needs attention).
        device: where the model lives.
        progress: the label of the progress bar (sentences translated, on stderr, when bars
            are shown: `bahdanau._progress`); None: no bar (the caller draws its own).
        constraints: optional, one list of phrases (text) per sentence that its translation
            must hold, each contiguously ([] for none): lexically constrained decoding
            (`bahdanau.constraints`); each phrase is tokenised with `tokenizer`.
        avoid: optional, one list of phrases per sentence that its translation must not hold.
        lines: the number the messages give each sentence (its line in the caller's input;
            default: 1, 2, ...).
    Returns:
        One `Translation` per sentence, in input order.
    Raises:
        InputError: an argument of the wrong type, an empty sentence, `unk_replace` with
            RNNencdec, vocabularies whose sizes or special ids differ from `model.config`
            (see `ModelConfig.check_vocabs`), phrases that `check_constraints` refuses, or a
            sentence, or a batch, whose search needs more memory than `device` has available
            (`BeamSearch.check_memory`, naming the sentence); all before any decoding.
    """
    batches = translate_batches(model, sentences, src_vocab, tgt_vocab, tokenizer,
                                search=search, batch_size=batch_size, unk_replace=unk_replace,
                                device=device, constraints=constraints, avoid=avoid,
                                lines=lines)
    results: list[Translation | None] = [None] * len(sentences)
    with _bar(progress, len(sentences)) as bar:
        for batch in batches:
            for i, translation in batch:
                results[i] = translation
            bar.update(len(batch))
    return [r for r in results if r is not None]


def translate_batches(model: torch.nn.Module, sentences: Sequence[str], src_vocab: Vocab,
                      tgt_vocab: Vocab, tokenizer: Tokenizer, *,
                      search: BeamSearch | None = None, batch_size: int = 64,
                      unk_replace: bool = False, device: str | torch.device = "cpu",
                      constraints: Sequence[Sequence[str]] | None = None,
                      avoid: Sequence[Sequence[str]] | None = None,
                      lines: Sequence[int] | None = None
                      ) -> Iterator[list[tuple[int, Translation]]]:
    """`translate_corpus`'s translations, one batch at a time, as each batch is done.

    The batches are `translate_corpus`'s (the sentences sorted by length), taken in the order
    of their first sentence in the input: when a batch is done, every sentence before the
    first of the next one is translated, so a caller that prints in input order prints as
    early as these batches allow. Every check runs here, before the first batch is decoded.

    Args:
        model, sentences, src_vocab, tgt_vocab, tokenizer, search, batch_size, unk_replace,
            device, constraints, avoid, lines: as for `translate_corpus`.
    Returns:
        An iterator of batches, each a list of (index into `sentences`, `Translation`).
    Raises:
        InputError: as `translate_corpus`, when called.
    """
    _check_corpus_arguments(model, sentences, src_vocab, tgt_vocab, tokenizer, search,
                            batch_size, unk_replace)
    device = resolve_device(device)
    search = search or BeamSearch(beam_size=5)
    number = _numbering(lines, len(sentences))
    tokenized = [tokenizer.tokenize(s) for s in sentences]
    for i, (sentence, toks) in enumerate(zip(sentences, tokenized, strict=True)):
        if not toks or not sentence.strip():    # blank for any tokenizer (characters: spaces)
            raise InputError(f"sentence {number(i)} is empty")
    ids = [src_vocab.encode(toks) for toks in tokenized]
    positive, avoided = check_constraints([len(x) for x in ids], constraints, avoid, tgt_vocab,
                                          tokenizer, search,
                                          label=lambda i: f"sentence {number(i)}")
    batches = sorted(_length_sorted([len(x) for x in ids], batch_size), key=min)
    _check_translation_memory(model, search, ids, batches, number, device)
    return _decoded(model, search, ids, src_vocab.pad_id, tokenized, batches, tgt_vocab,
                    tokenizer, unk_replace, device, (positive, avoided))


def _decoded(model: torch.nn.Module, search: BeamSearch, ids: list[list[int]], pad_id: int,
             tokenized: list[list[str]], batches: list[list[int]], tgt_vocab: Vocab,
             tokenizer: Tokenizer, unk_replace: bool, device: torch.device,
             phrases: tuple[Phrases | None, Phrases | None]
             ) -> Iterator[list[tuple[int, Translation]]]:
    """`translate_batches`' batches searched (under each sentence's required and avoided
    phrases, as ids), decoded and detokenised, one at a time."""
    positive, avoided = phrases
    for chunk in batches:
        src, lengths = pad_sources([ids[i] for i in chunk], pad_id)
        found = search(model, src.to(device), lengths.to(device),
                       constraints=None if positive is None else [positive[i] for i in chunk],
                       avoid=None if avoided is None else [avoided[i] for i in chunk])
        done = []
        for i, hyps in zip(chunk, found, strict=True):
            best = hyps[0]
            words = tgt_vocab.decode(best.tokens)
            if unk_replace:
                words = replace_unk(best, tokenized[i], words,
                                    unk=tgt_vocab.id_to_token(tgt_vocab.unk_id))
            done.append((i, Translation(tokenizer.detokenize(words), words, best, hyps)))
        yield done


# ----------------------------------------------------------------------------------------------
# Forced decoding: the scores of given translations


@dataclass(frozen=True)
class ForcedScore:
    """How likely the model finds one given translation Y of a source X.

    Attributes:
        log_prob: log p(Y | X), the sum of the log-probabilities of Y's tokens and of eos: what
            `Hypothesis.log_prob` holds when the search finds Y.
        score: `log_prob` normalised as `BeamSearch(length_penalty=..., alpha=...)` ranks
            hypotheses (`bahdanau.search.length_normalise`): `Hypothesis.score` for Y.
        n_tokens: |Y|, the target's tokens plus eos, the length the normalisation uses.
    """

    log_prob: float
    score: float
    n_tokens: int


def score_ids(model: torch.nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
              batch_size: int = 64, length_penalty: LengthPenalty = "none", alpha: float = 0.6,
              device: str | torch.device = "cpu", progress: str | None = "scoring"
              ) -> list[ForcedScore]:
    """Score given target ids under the model by teacher forcing (forced decoding), batched.

    Each batch runs the model's teacher-forced `forward` (the path its loss takes, in eval mode,
    without gradients) on bos y_1 .. y_n, and sums log_softmax of the logits at y_1 .. y_n eos,
    the log-probabilities `BeamSearch` adds up when it generates the same tokens (in the same
    dtype: float32, or float64 for a float64 model; the sum is taken in float64). Under
    `torch.autocast` the model runs in its precision; the log-softmax stays float32.

    Args:
        model: an `RNNSearch` / `RNNEncDec` on `device` (an `Ensemble` only decodes).
        pairs: (source ids, target ids) per sentence, without bos and eos; a target may be
            empty (eos alone), a source may not.
        batch_size: sentences per batch (sorted by length, so padding stays small).
        length_penalty, alpha: the normalisation of `ForcedScore.score`, as `BeamSearch`'s.
        device: where the model lives.
        progress: the label of the progress bar (sentences scored, on stderr, when bars are
            shown: `bahdanau._progress`); None: no bar.
    Returns:
        One `ForcedScore` per pair, in input order.
    Raises:
        InputError: a bad argument, an empty source, ids outside the vocabularies (the
            model's `check_batch`), or a sentence, or a batch, that needs more memory than
            `device` has available (`_scoring_memory`, naming the sentence), before any batch
            is scored.
    """
    if not isinstance(model, RNNSearch):          # a Module's repr would run over many lines
        raise InputError(f"model must be an RNNSearch or RNNEncDec, got a "
                         f"{type(model).__name__} (an Ensemble only decodes)")
    if not (is_int(batch_size) and batch_size >= 1):
        raise InputError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if length_penalty not in LENGTH_PENALTIES:
        raise InputError(f"length_penalty must be one of {LENGTH_PENALTIES}, "
                         f"got {length_penalty!r}")
    if not (is_finite_number(alpha) and alpha >= 0):
        raise InputError(f"alpha must be a finite number >= 0, got {alpha!r}")
    examples = [Example(i, list(src), list(tgt)) for i, (src, tgt) in enumerate(pairs)]
    chunks = _length_sorted([len(ex.src) + len(ex.tgt) for ex in examples], batch_size)
    batches = [collate([examples[i] for i in chunk]) for chunk in chunks]  # checks every example
    device = resolve_device(device)
    for chunk, batch in zip(chunks, batches, strict=True):   # every value, before any work
        model.check_batch(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
        _check_scoring_memory(model, [examples[i] for i in chunk], device)
    log_probs: list[float] = [0.0] * len(examples)
    was_training = model.training
    model.eval()
    try:
        with _bar(progress, len(examples)) as bar:
            for batch in batches:
                batch = batch.to(device)
                values = _target_log_probs(model, batch)
                refuse_nan_scores(any(map(math.isnan, values)))       # a diverged model
                for index, value in zip(batch.indices.tolist(), values, strict=True):
                    log_probs[index] = value
                bar.update(len(values))
    finally:
        model.train(was_training)
    return [ForcedScore(lp, float(length_normalise(torch.tensor(lp, dtype=torch.float64),
                                                   len(ex.tgt) + 1, length_penalty, alpha)),
                        len(ex.tgt) + 1)
            for lp, ex in zip(log_probs, examples, strict=True)]




def _scoring_memory(model: torch.nn.Module, sentences: int, src_len: int, tgt_len: int
                   ) -> int | None:
    """About the bytes `score_ids` needs at least for a batch of `sentences` pairs of `src_len`
    source and `tgt_len` target tokens (eos counted): per target position of each row, the V
    logits and their log-softmax and the decoder's states, inputs and readout; per source
    position, the embeddings, annotations (2H), keys (A) and a step's energies (A). Linear in
    both lengths: teacher forcing keeps no (T, S) weights unless asked for them. From
    `model.config`; None for a model without a `ModelConfig`."""
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        return None
    first = next(iter(model.parameters()), None)
    size = 8 if first is not None and first.dtype == torch.float64 else 4
    per_target = (2 * config.tgt_vocab_size + 4 * config.decoder_size
                  + 3 * config.maxout_size + config.embed_size)
    per_source = config.embed_size + 4 * config.hidden_size + 2 * config.align_size
    return sentences * (tgt_len * per_target + src_len * per_source) * size


def _check_scoring_memory(model: torch.nn.Module, chunk: list[Example],
                          device: torch.device) -> None:
    """Refuse a batch of `chunk` whose scoring needs more memory than `device` has available:
    naming its sentence that needs the most, or, when each would fit alone, asking for a
    smaller batch."""
    def lengths(ex: Example) -> tuple[int, int]:
        return len(ex.src), len(ex.tgt) + 1                       # eos is scored too

    def alone(ex: Example) -> int:
        return _scoring_memory(model, 1, *lengths(ex)) or 0

    worst = max(chunk, key=alone)
    src_len, tgt_len = lengths(worst)
    check_memory(_scoring_memory(model, 1, src_len, tgt_len), device,
                 f"scoring sentence {worst.index + 1} ({src_len:,} source and {tgt_len:,} "
                 "target tokens)", "split or shorten that sentence")
    longest = (max(len(ex.src) for ex in chunk), max(len(ex.tgt) for ex in chunk) + 1)
    check_memory(_scoring_memory(model, len(chunk), *longest), device,
                 f"scoring {len(chunk):,} sentences together (up to {longest[0]:,} source and "
                 f"{longest[1]:,} target tokens)", "lower the batch size")


@torch.inference_mode()
def _target_log_probs(model: RNNSearch, batch: Any) -> list[float]:
    """log p(tgt_out | src) of each row of a checked `Batch`: teacher forcing, then log_softmax
    at the targets, summed over the real (non-pad) positions."""
    # without return_attention, forward gives the logits alone
    logits = cast(torch.Tensor, model(batch.src, batch.src_lengths, batch.tgt_in))  # (B, T, V)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    token = torch.log_softmax(logits.to(dtype), -1).gather(
        -1, batch.tgt_out[..., None]).squeeze(-1)                           # (B, T)
    real = batch.tgt_out != batch.pad_id
    return token.double().masked_fill(~real, 0.0).sum(1).tolist()


def score_corpus(model: torch.nn.Module, sources: Sequence[str], targets: Sequence[str],
                 src_vocab: Vocab, tgt_vocab: Vocab, tokenizer: Tokenizer, *,
                 batch_size: int = 64, length_penalty: LengthPenalty = "none",
                 alpha: float = 0.6, device: str | torch.device = "cpu",
                 progress: str | None = "scoring") -> list[ForcedScore]:
    """Score raw translations of raw sentences (forced decoding); see `score_ids`.

    Both sides are tokenised with `tokenizer` and encoded with the vocabularies, as in
    training: a target word outside `tgt_vocab` is scored as ``<unk>``.

    Args:
        model: an `RNNSearch` / `RNNEncDec` on `device`.
        sources, targets: line-aligned raw sentences; none may be empty.
        src_vocab, tgt_vocab, tokenizer: what the model was trained with.
        batch_size, length_penalty, alpha, device, progress: as for `score_ids`.
    Returns:
        One `ForcedScore` per sentence pair, in input order.
    Raises:
        InputError: lists of different lengths, an empty sentence (named by its 1-based line),
            vocabularies that do not fit the model, or what `score_ids` refuses; all before
            any scoring.
    """
    check_type("src_vocab", src_vocab, Vocab, "a Vocab")
    check_type("tgt_vocab", tgt_vocab, Vocab, "a Vocab")
    check_tokenizer("tokenizer", tokenizer)
    check_strings("sources", sources)
    check_strings("targets", targets)
    if len(sources) != len(targets):
        raise InputError(f"{len(sources)} sources but {len(targets)} targets")
    config = getattr(model, "config", None)
    if config is not None:  # a model built without a config uses the Vocab ids
        config.check_vocabs(src_vocab, tgt_vocab)
    pairs = []
    source_side, target_side = sides(tokenizer)
    for line, (src, tgt) in enumerate(zip(sources, targets, strict=True), start=1):
        src_tokens, tgt_tokens = source_side.tokenize(src), target_side.tokenize(tgt)
        for side, text, tokens in (("source", src, src_tokens), ("target", tgt, tgt_tokens)):
            if not tokens or not text.strip():
                raise InputError(f"{side} sentence {line} is empty")
        pairs.append((src_vocab.encode(src_tokens), tgt_vocab.encode(tgt_tokens)))
    return score_ids(model, pairs, batch_size=batch_size, length_penalty=length_penalty,
                     alpha=alpha, device=device, progress=progress)
