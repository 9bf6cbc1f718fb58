"""A model's test-set report: translate, score, print, and draw one sentence's alignment.

`score_translations` translates the sources and scores them as the paper does (BLEU with
sacrebleu's signature, chrF, BLEU without [UNK], BLEU by source length) into a `TestReport`;
`TestReport.lines` is what the commands print, `TestReport.metrics` what they write as JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bahdanau.bleu_text import BleuText
from bahdanau.data.tokenizers import DefaultTokenizer, Tokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.evaluate import Translation, score_test_set, translate_corpus
from bahdanau.jobs.options import SearchOptions
from bahdanau.jobs.resolve import beam_search
from bahdanau.plot import PlotDependencyError
from bahdanau.training.threads import AdaptiveThreads


@dataclass(frozen=True)
class TestReport:
    """A model's scores on a test set, and the translations they score.

    `scores` is `bahdanau.evaluate.score_test_set`'s: BLEU and chrF with their signatures, BLEU
    without [UNK] and BLEU by source length, rounded to 2 decimals.
    """

    scores: dict[str, Any]
    search: SearchOptions             # what decoded the translations
    decode_seconds: float
    translations: list[Translation]

    @property
    def bleu(self) -> float:
        """Corpus BLEU (sacrebleu)."""
        return float(self.scores["bleu"])

    def _search_settings(self) -> dict[str, Any]:
        """The search's settings that change its outputs' scores: the beam size, the length
        penalty and, for gnmt, its alpha."""
        s = self.search
        alpha = {"alpha": s.alpha} if s.length_penalty == "gnmt" else {}
        return {"beam_size": s.beam_size, "length_penalty": s.length_penalty, **alpha}

    def metrics(self) -> dict[str, Any]:
        """The report as JSON values: the scores, the search's settings and the decoding
        time."""
        return {**self.scores, **self._search_settings(),
                "decode_seconds": round(self.decode_seconds, 2)}

    def _search(self) -> str:
        """The search, as the first line says it: "beam 5", "beam 5, average length penalty",
        "beam 5, gnmt length penalty (alpha 0.6)"."""
        s = self._search_settings()
        penalty = "" if s["length_penalty"] == "none" else f", {s['length_penalty']} length penalty"
        alpha = f" (alpha {s['alpha']})" if "alpha" in s else ""
        return f"beam {s['beam_size']}{penalty}{alpha}"

    def lines(self) -> list[str]:
        """The report as the commands print it."""
        m = self.scores
        no_unk = m["bleu_no_unk"]
        lines = [f"BLEU {m['bleu']:.2f}  chrF {m['chrf']:.2f}  ({m['sentences']} sentences, "
                 f"{self._search()}, {self.decode_seconds:.1f} s)",
                 f"  {m['bleu_signature']}",
                 f"BLEU without [UNK]: {'-' if no_unk is None else f'{no_unk:.2f}'} "
                 f"({m['sentences_no_unk']} sentences)",
                 "BLEU by source length:"]
        for b in m["bleu_by_length"]:
            if b["sentences"]:
                span = f"{b['low']}-{b['high'] - 1}" if b["high"] is not None else f"{b['low']}+"
                lines.append(f"  {span:>7} tokens: {b['bleu']:6.2f}  "
                             f"({b['sentences']} sentences)")
        return lines


def score_translations(model: torch.nn.Module, sources: list[str], references: list[str],
                       src_vocab: Vocab, tgt_vocab: Vocab, tokenizer: Tokenizer,
                       options: SearchOptions, device: torch.device,
                       phrases: tuple[Any, Any] = (None, None),
                       bleu: BleuText | None = None,
                       threads: AdaptiveThreads | None = None) -> TestReport:
    """Translate `sources` with the search of `options` and score them against `references`.

    Args:
        model: the model (or ensemble), in eval mode.
        sources, references: the raw source sentences and their reference translations.
        src_vocab, tgt_vocab, tokenizer: what the model was trained with.
        options: the search settings (beam, lengths, penalty), batch size and --unk-replace.
        device: where to decode.
        phrases: each sentence's required and avoided phrases (text), or None
            (`translate_corpus`'s `constraints` and `avoid`).
        bleu: how BLEU reads the text (default: sacrebleu's 13a, cased unless the tokenizer
            lowercases).
        threads: the decoding command's `AdaptiveThreads`, which the search's steps feed
            (`bahdanau.jobs.resolve.beam_search`); None: the threads stay as they are.
    """
    start = time.perf_counter()
    out = translate_corpus(model, sources, src_vocab, tgt_vocab, tokenizer,
                           search=beam_search(options, threads=threads),
                           batch_size=options.batch_size, unk_replace=options.unk_replace,
                           device=device,
                           constraints=phrases[0], avoid=phrases[1])
    seconds = time.perf_counter() - start
    scores = score_test_set([t.text for t in out], sources, references, src_vocab, tgt_vocab,
                            tokenizer, bleu=bleu)
    return TestReport(scores, options, seconds, out)


def typical_sentence(sources: list[str], tokenizer: Tokenizer) -> int:
    """The index of the sentence whose alignment a run shows: the first of about 12 tokens."""
    return min(range(len(sources)), key=lambda i: abs(len(tokenizer.tokenize(sources[i])) - 12))


def alignment_labels(translation: Translation, src_tokens: list[str]
                     ) -> tuple[list[str], list[str]]:
    """The source and target axis labels of an alignment (without the attachment mark)."""
    label = DefaultTokenizer.display
    return [label(t) for t in src_tokens], [*map(label, translation.tokens), "</s>"]


def alignment_title(model: str, source: str) -> str:
    """The title of an alignment plot: which model (a checkpoint and its step, a run) on its
    first line, the source sentence quoted on the second (the plot shortens both to fit)."""
    return f"{model}\n\u201c{' '.join(source.split())}\u201d"


def plot_alignment_file(out_path: Path, translation: Translation, src_tokens: list[str],
                        title: str | None = None) -> str:
    """Draw `translation`'s alignment into `out_path` under `title` (`alignment_title`); returns
    the line that says where it went (or why there is none: no attention, or no matplotlib)."""
    from bahdanau.plot import plot_alignment

    if translation.hypothesis.attention is None:
        return "no alignment plot: the model has no attention"
    try:
        figure = plot_alignment(translation.hypothesis.attention,
                                *alignment_labels(translation, src_tokens), out_path,
                                title=title)
    except PlotDependencyError as exc:
        return f"no alignment plot: {exc}"
    import matplotlib.pyplot as plt

    plt.close(figure)                        # saved: pyplot would otherwise keep it open
    return f"alignment plot: {out_path}"
