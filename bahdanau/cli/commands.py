"""The commands besides train, each a thin shell over the library: prepare, translate, evaluate,
plot, average.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bahdanau._files import atomic_file
from bahdanau.checkpoint.averaging import average_checkpoints, select_checkpoints
from bahdanau.checkpoint.files import save_checkpoint
from bahdanau.data.corpus import TrainSentencePiece, prepare_corpus
from bahdanau.data.sentencepiece import SentencePieceTokenizer
from bahdanau.data.text import iter_lines, multi30k_files, read_lines
from bahdanau.data.tokenizers import DefaultTokenizer, Tokenizer
from bahdanau.data.vocab import Vocab
from bahdanau.errors import InputError
from bahdanau.evaluate import Translation, translate_corpus
from bahdanau.jobs.files import check_outputs, existing, read_sources, write_text
from bahdanau.jobs.options import (
    AverageOptions,
    EvaluateOptions,
    PlotOptions,
    PrepareOptions,
    TranslateOptions,
)
from bahdanau.jobs.report import plot_alignment_file, score_translations
from bahdanau.jobs.resolve import beam_search, checkpoint_paths, load_decoder, machine


def prepare(o: PrepareOptions) -> int:
    """`bahdanau prepare`: a corpus tokenised and encoded once, for train --data."""
    if o.train_src is not None and o.train_tgt is not None:   # check(): both or neither
        src, tgt = existing(o.train_src, "--train-src"), existing(o.train_tgt, "--train-tgt")
        shipped = None
    else:
        src_lang, tgt_lang = o.src_lang or "en", o.tgt_lang or "fr"
        src, tgt = multi30k_files("train", src_lang), multi30k_files("train", tgt_lang)
        shipped = {"corpus": "multi30k", "src_lang": src_lang, "tgt_lang": tgt_lang}
    if o.sentencepiece_model is not None:
        tokenizer: Any = SentencePieceTokenizer.load(
            existing(o.sentencepiece_model, "--sentencepiece-model"))
    elif o.tokenizer != "default":
        tokenizer = TrainSentencePiece(model_type=o.tokenizer, vocab_size=o.subword_vocab,
                                       max_sentences=o.sample_sentences)
    else:
        tokenizer = DefaultTokenizer(lowercase=o.lowercase, joiners=o.joiners)
    prepare_corpus(src, tgt, o.out, tokenizer=tokenizer, vocab_size=o.vocab_size,
                   max_len=o.max_len, max_ratio=o.max_ratio, strict=o.strict,
                   workers=o.workers, overwrite=o.overwrite, shipped=shipped,
                   log=lambda line: print(line, flush=True))
    return 0


# Sentences translated together: the paper's 20 batches, sorted by length within the window.
WINDOW_BATCHES = 20


def translate(o: TranslateOptions) -> int:
    """`bahdanau translate`: stdin or a file, translated to stdout.

    Translates in windows of WINDOW_BATCHES batches (one line at a time from a terminal): each
    window's output is printed, in input order, before the next is read, so memory stays
    bounded and a pipe sees results as they come. An empty line gives an empty output line."""
    device = machine(o)
    search = beam_search(o, o.n_best)
    path = existing(o.input, "--input")
    checkpoints = checkpoint_paths(o)
    check_outputs({"--alignments": o.alignments}, {"--input": path, **checkpoints})
    if sys.stdout is None or (path is None and sys.stdin is None):
        raise InputError("stdin or stdout is closed: translate reads stdin (or --input) and "
                         "writes stdout")
    model, src_vocab, tgt_vocab, tokenizer = load_decoder(o, checkpoints, device)
    with ExitStack() as stack:
        stream = stack.enter_context(path.open("rb")) if path else sys.stdin.buffer
        alignments = (stack.enter_context(atomic_file(Path(o.alignments)))
                      if o.alignments else None)
        progress = _Progress(path)
        lines = iter_lines(stream, str(path) if path else "<stdin>")
        # typed at a terminal: each line is answered at once
        size = 1 if path is None and sys.stdin.isatty() else o.batch_size * WINDOW_BATCHES
        done = 0
        while window := list(itertools.islice(lines, size)):
            sentences = [line for line in window if line.strip()]
            translated = iter(translate_corpus(
                model, sentences, src_vocab, tgt_vocab, tokenizer, search=search,
                batch_size=o.batch_size, unk_replace=o.unk_replace, device=device)
                if sentences else [])
            for line in window:
                t = next(translated) if line.strip() else None
                _print_translation(done, t, o.n_best, tokenizer, tgt_vocab)
                if alignments is not None:
                    alignments.write(_alignment_row(line, t, tokenizer).encode())
                done += 1
            sys.stdout.flush()
            progress.update(done, stream)
        progress.finish(done)
    return 0


def _print_translation(index: int, t: Translation | None, n_best: int,
                       tokenizer: Tokenizer, tgt_vocab: Vocab) -> None:
    """One line (its n-best lines with --n-best; none for an empty input line)."""
    if n_best == 1:
        print("" if t is None else t.text)
        return
    for hyp in [] if t is None else t.nbest:
        text = tokenizer.detokenize(tgt_vocab.decode(hyp.tokens))
        print(f"{index} ||| {text} ||| {hyp.score:.4f}")


def _alignment_row(line: str, t: Translation | None, tokenizer: Tokenizer) -> str:
    """The JSON line --alignments writes for one input line."""
    if t is None:
        return json.dumps({"source": [], "target": [], "weights": None}) + "\n"
    att = t.hypothesis.attention
    return json.dumps({"source": tokenizer.tokenize(line), "target": [*t.tokens, "</s>"],
                       "weights": None if att is None else
                       [[round(float(x), 5) for x in row] for row in att]}) + "\n"


class _Progress:
    """Sentences/s (and, reading a file, an ETA from the bytes read) on stderr, only when
    stderr is a terminal."""

    def __init__(self, path: Path | None) -> None:
        self.enabled = sys.stderr is not None and sys.stderr.isatty()
        self.size = path.stat().st_size if path else None
        self.start = time.perf_counter()

    def update(self, done: int, stream: Any) -> None:
        if not self.enabled:
            return
        seconds = time.perf_counter() - self.start
        line = f"{done} sentences, {done / max(seconds, 1e-9):.1f} sentences/s"
        if self.size:
            fraction = min(stream.tell() / self.size, 1.0)
            if fraction > 0:
                line += f", about {seconds * (1 - fraction) / fraction:.0f} s left"
        print(f"\r{line}\x1b[K", end="", file=sys.stderr, flush=True)

    def finish(self, done: int) -> None:
        if self.enabled:
            print(f"\r{done} sentences in {time.perf_counter() - self.start:.1f} s\x1b[K",
                  file=sys.stderr, flush=True)


def evaluate(o: EvaluateOptions) -> int:
    """`bahdanau evaluate`: the test-set report of a checkpoint (or an ensemble)."""
    device = machine(o)
    src, ref = existing(o.src, "--src"), existing(o.ref, "--ref")
    checkpoints = checkpoint_paths(o)
    check_outputs({"--output": o.output, "--json": o.json},
                   {"--src": src, "--ref": ref, **checkpoints})
    sources = read_sources(src)
    references = read_sources(ref, needed="the reference translation of its source line")
    if not references:
        raise InputError(f"{ref} is empty: at least one line is needed")
    if len(sources) != len(references):
        raise InputError(f"--src has {len(sources)} lines but --ref has {len(references)}")
    model, src_vocab, tgt_vocab, tokenizer = load_decoder(o, checkpoints, device)
    report = score_translations(model, sources, references, src_vocab, tgt_vocab, tokenizer, o,
                                device)
    print(*report.lines(), sep="\n")
    if o.output:
        write_text(Path(o.output), "".join(t.text + "\n" for t in report.translations))
    if o.json:
        write_text(Path(o.json), json.dumps(report.metrics(), indent=2) + "\n")
    return 0


def plot(o: PlotOptions) -> int:
    """`bahdanau plot`: the alignment heat map of one sentence."""
    from bahdanau.plot import check_image_path

    device = machine(o)
    search = beam_search(o)
    path = existing(o.input, "--input")
    checkpoints = checkpoint_paths(o)
    check_outputs({"--output": o.output}, {"--input": path, **checkpoints})
    check_image_path(o.output)
    sentence = o.sentence
    if sentence is None:
        assert path is not None                # check(): --sentence or --input
        lines = read_lines(path)
        line = o.line or 1
        if not 1 <= line <= len(lines):
            raise InputError(f"--line {line} is outside {o.input} (1..{len(lines)})")
        sentence = lines[line - 1]
        if not sentence.strip():
            raise InputError(f"--input {o.input}: line {line} is empty")
    model, src_vocab, tgt_vocab, tokenizer = load_decoder(o, checkpoints, device)
    if model.arch == "rnnencdec":
        what = ("is an RNNencdec model: it has" if len(o.checkpoint) == 1
                else "are RNNencdec models: they have")
        raise InputError(f"{' '.join(o.checkpoint)} {what} no alignment to plot")
    [translation] = translate_corpus(model, [sentence], src_vocab, tgt_vocab, tokenizer,
                                     search=search, unk_replace=o.unk_replace, device=device)
    note = plot_alignment_file(Path(o.output), translation, tokenizer.tokenize(sentence))
    print(translation.text)
    print(note)
    return 0


def average(o: AverageOptions) -> int:
    """`bahdanau average`: one checkpoint whose weights are the mean of several."""
    paths = select_checkpoints(o.checkpoint, last=o.last, best=o.best)
    check_outputs({"--output": o.output}, {f"--checkpoint {p}": p for p in paths})
    save_checkpoint(o.output, average_checkpoints(paths))
    print(f"averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''} "
          f"({', '.join(map(str, paths))}) into {o.output}")
    return 0
