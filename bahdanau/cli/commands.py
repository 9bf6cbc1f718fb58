"""The commands besides train, each a thin shell over the library: prepare, translate, evaluate,
plot, average, release.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from bahdanau._folders import Kind
from bahdanau._progress import Bar, clear_bars, progress_bar
from bahdanau.alignments import argmax_alignment
from bahdanau.checkpoint.averaging import average_checkpoints, select_checkpoints
from bahdanau.checkpoint.files import save_checkpoint
from bahdanau.checkpoint.sections import EXTRA
from bahdanau.data.corpus import TrainSentencePiece, prepare_corpus
from bahdanau.data.sentencepiece import SentencePieceTokenizer
from bahdanau.data.text import iter_lines, multi30k_files, read_lines
from bahdanau.data.tokenizers import (
    CharTokenizer,
    DefaultTokenizer,
    Tokenizer,
    TokenizerPair,
    WhitespaceTokenizer,
    sides,
)
from bahdanau.data.vocab import Vocab
from bahdanau.data.workers import Stopped, ignore_stop_signals
from bahdanau.error_rates import ErrorRates, error_rates, group_references
from bahdanau.errors import InputError
from bahdanau.evaluate import Translation, translate_batches, translate_corpus
from bahdanau.jobs.files import (
    STDOUT,
    check_output_folder,
    check_outputs,
    existing,
    output_file,
    read_aligned,
    stdout_as_dash,
    to_stdout,
    write_text,
)
from bahdanau.jobs.options import (
    PREPARE_WORDS,
    AverageOptions,
    EvaluateOptions,
    PhraseOptions,
    PlotOptions,
    PrepareOptions,
    ReleaseOptions,
    TranslateOptions,
)
from bahdanau.jobs.release import release_model
from bahdanau.jobs.report import alignment_title, plot_alignment_file, score_translations
from bahdanau.jobs.resolve import (
    PhraseLists,
    autocast,
    beam_search,
    check_line_phrases,
    checkpoint_paths,
    decoding_threads,
    load_decoder,
    machine,
    phrase_files,
)

_LOG = logging.getLogger(__name__)


def _word_tokenizer(o: PrepareOptions) -> Tokenizer:
    """prepare's --tokenizer default or char, a `TokenizerPair` with --target-tokenizer."""
    def named(name: str) -> Tokenizer:
        if name == "char":
            return CharTokenizer()
        if name == "whitespace":
            return WhitespaceTokenizer()
        return DefaultTokenizer(lowercase=o.lowercase, joiners=o.joiners)

    if o.target_tokenizer == "same":
        return named(o.tokenizer)
    return TokenizerPair(named(o.tokenizer), named(o.target_tokenizer))


def prepare(o: PrepareOptions) -> int:
    """`bahdanau prepare`: a corpus tokenised and encoded once, for train --data. SIGINT,
    SIGTERM or SIGHUP (a closed terminal) stop it with one line (nothing is left in --out, the
    lock is released) and exit 128 + the signal; signals after the first change nothing."""
    if o.train_src is not None and o.train_tgt is not None:   # check(): both or neither
        src, tgt = existing(o.train_src, "--train-src"), existing(o.train_tgt, "--train-tgt")
        shipped = None
    else:
        src_lang, tgt_lang = o.src_lang or "en", o.tgt_lang or "fr"
        src, tgt = multi30k_files("train", src_lang), multi30k_files("train", tgt_lang)
        shipped = {"corpus": "multi30k", "src_lang": src_lang, "tgt_lang": tgt_lang}
    check_output_folder("--out", o.out, {"--train-src": src, "--train-tgt": tgt},
                        writes=Kind.PREPARED)
    vocab_size = o.vocab_size
    if o.sentencepiece_model is not None:
        tokenizer: Any = SentencePieceTokenizer.load(
            existing(o.sentencepiece_model, "--sentencepiece-model"))
    elif o.tokenizer in ("bpe", "unigram"):
        tokenizer = TrainSentencePiece(model_type=o.tokenizer, vocab_size=o.subword_vocab,
                                       max_sentences=o.sample_sentences)
    else:
        tokenizer = _word_tokenizer(o)
        vocab_size = PREPARE_WORDS if vocab_size is None else vocab_size
    try:
        prepare_corpus(src, tgt, o.out, tokenizer=tokenizer, vocab_size=vocab_size,
                       max_len=o.max_len, max_ratio=o.max_ratio, strict=o.strict,
                       workers=o.workers, overwrite=o.overwrite, shipped=shipped)
    except Stopped as stop:
        ignore_stop_signals()                # the process ends with this stop: one line
        print(f"bahdanau: prepare {stop}: nothing was written in {o.out}", file=sys.stderr)
        return 128 + stop.signum
    return 0


# Sentences translated together: the paper's 20 batches, sorted by length within the window.
WINDOW_BATCHES = 20
READ_BYTES = 1 << 16       # read at a time: the bar of a file's bytes moves by at most this much


def translate(o: TranslateOptions) -> int:
    """`bahdanau translate`: stdin or a file, translated to stdout.

    Translates in windows of at most WINDOW_BATCHES batches, sorted by length within the
    window; a file's windows are full, a pipe's or a terminal's hold the lines that have
    arrived (at least one), so a line sent is answered without waiting for more. Each batch's
    translations are printed (and flushed) in input order as soon as the lines before them
    are: the window's batches are taken in the order of their first line
    (`bahdanau.evaluate.translate_batches`), and the bar moves with each batch. Memory stays
    bounded. An empty line gives an empty output line. With --constraints or --avoid the whole
    input is read first, and every line's phrases checked, before any line is translated."""
    o = stdout_as_dash(o, "alignments")
    device = machine(o)
    precision = autocast(o.amp, device)
    search = beam_search(o, o.n_best, decoding_threads(o, device))
    path = existing(o.input, "--input")
    checkpoints = checkpoint_paths(o)
    if o.alignments == STDOUT:
        raise InputError("--alignments -: stdout carries the translations; write the "
                         "alignments to a file")
    check_outputs({"--alignments": o.alignments}, {"--input": path, **checkpoints,
                                                   **_phrase_inputs(o)})
    phrases = phrase_files(o)
    if sys.stdout is None or (path is None and sys.stdin is None):
        raise InputError("stdin or stdout is closed: translate reads stdin (or --input) and "
                         "writes stdout")
    loaded = load_decoder(o, checkpoints, device)
    if o.alignments and o.alignments_format == "pharaoh" and loaded.model.arch == "rnnencdec":
        raise InputError("--alignments-format pharaoh needs attention weights; "
                         f"{' '.join(o.checkpoint)} has none (RNNencdec)")
    with ExitStack() as stack:
        stream = stack.enter_context(_unbuffered_input(path))
        alignments = (stack.enter_context(output_file(o.alignments))
                      if o.alignments else None)
        lines = iter_lines(stream, str(path) if path else "<stdin>", chunk_size=READ_BYTES)
        constrained = phrases != (None, None)
        if constrained:                  # every line's phrases checked before any is translated
            every = list(lines)
            check_line_phrases(o, phrases, every, loaded, search)
            lines = iter(every)
        # a pipe or FIFO given as --input (/dev/stdin, <(zcat x.gz)) has no size and no
        # position: its lines are counted, as stdin's are, and read as they arrive
        sized = path is not None and stream.seekable() and not constrained
        size = o.batch_size * WINDOW_BATCHES
        windows = (iter(lambda: list(itertools.islice(lines, size)), []) if sized or constrained
                   else _arrived(lines, size))
        done = read = 0
        # typed at a terminal: each line is answered at once, and no bar is drawn
        interactive = path is None and sys.stdin.isatty() and not constrained
        with _input_bar(path if sized else None, interactive) as bar:
            for window in windows:
                position = stream.tell() if sized else read + len(window)  # bytes, or lines
                per_line = (position - read) / len(window)
                out = _WindowOutput(window, done, o.n_best, loaded.tokenizer, loaded.tgt_vocab,
                                    alignments, o.alignments_format or "json")
                out.print_ready()                               # empty lines first
                bar.update(per_line * (len(window) - len(out.sentences)))
                for count in _translated(out, loaded, o, search, precision, device,
                                         _window_phrases(phrases, window, done)):
                    bar.update(per_line * count)
                done, read = done + len(window), position
    return 0


def _phrase_inputs(o: PhraseOptions) -> dict[str, Path | None]:
    """--constraints and --avoid as inputs that no output may overwrite."""
    return {"--constraints": existing(o.constraints, "--constraints"),
            "--avoid": existing(o.avoid, "--avoid")}


def _window_phrases(phrases: PhraseLists, window: list[str], first: int
                    ) -> dict[str, list[list[str]] | None]:
    """The `constraints` and `avoid` of the non-empty lines of `window`, which begins at input
    line `first` (0-based)."""
    return {name: None if lists is None else
            [p for line, p in zip(window, lists[first:first + len(window)], strict=True)
             if line.strip()]
            for name, lists in zip(("constraints", "avoid"), phrases, strict=True)}


def _unbuffered_input(path: Path | None) -> AbstractContextManager[BinaryIO]:
    """The input, unbuffered: --input, or stdin's descriptor duplicated (a thread reads a pipe,
    `_arrived`, and the process may end while it waits in a read: on an unbuffered file it
    holds no lock that the interpreter's exit would wait for). A stdin with no descriptor (a
    notebook's, or a program's own stream given to `bahdanau.cli.main`) is read as it is, and
    left open."""
    if path is not None:
        return path.open("rb", buffering=0)
    try:
        descriptor = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):   # io.UnsupportedOperation is an OSError
        return nullcontext(sys.stdin.buffer)
    return open(os.dup(descriptor), "rb", buffering=0)


class _Failed(NamedTuple):
    error: Exception                  # what reading the input raised (invalid UTF-8, gzip)


_END = object()                       # the input has ended


def _arrived(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    """The windows of a pipe or a terminal: a thread reads `lines` ahead (at most `size` of
    them), and each window is what has arrived, up to `size` lines, waiting only for its first.
    An error of the input comes after the lines before it."""
    arrived: queue.Queue[Any] = queue.Queue(maxsize=size)

    def read() -> None:
        try:
            for line in lines:
                arrived.put(line)
        except Exception as error:          # raised in the translating thread, in its turn
            arrived.put(_Failed(error))
        arrived.put(_END)

    threading.Thread(target=read, name="translate input", daemon=True).start()
    while True:
        window: list[str] = []
        item = arrived.get()                                # waits for the first line
        while isinstance(item, str):
            window.append(item)
            if len(window) == size:
                break
            try:
                item = arrived.get_nowait()
            except queue.Empty:
                break
        if window:
            yield window
        if isinstance(item, _Failed):
            raise item.error
        if item is _END:
            return


def _translated(out: _WindowOutput, loaded: Any, o: TranslateOptions, search: Any,
                precision: Any, device: Any, phrases: dict[str, list[list[str]] | None]
                ) -> Iterator[int]:
    """Translate `out`'s window batch by batch (under the `constraints` and `avoid` of its
    non-empty lines, `phrases`), printing what is ready after each; yields the number of lines
    each batch translated."""
    numbers = [out.first + i + 1 for i in out.sentences]
    sentences = [out.window[i] for i in out.sentences]
    if not sentences:
        return
    with precision:
        batches = translate_batches(
            loaded.model, sentences, loaded.src_vocab, loaded.tgt_vocab, loaded.tokenizer,
            search=search, batch_size=o.batch_size, unk_replace=o.unk_replace, device=device,
            lines=numbers, **phrases)
        for batch in batches:
            for k, translation in batch:
                out.ready[out.sentences[k]] = translation
            out.print_ready()
            yield len(batch)


class _WindowOutput:
    """The output of one window of input lines: each line's translation printed, with its
    --alignments row, in input order, as soon as it and the lines before it are translated."""

    def __init__(self, window: list[str], first: int, n_best: int, tokenizer: Tokenizer,
                 tgt_vocab: Vocab, alignments: BinaryIO | None, form: str) -> None:
        self.window, self.first, self.n_best = window, first, n_best
        self.tokenizer, self.tgt_vocab, self.alignments, self.form = (tokenizer, tgt_vocab,
                                                                     alignments, form)
        self.sentences = [i for i, line in enumerate(window) if line.strip()]
        # a line's translation (None for an empty line) once it is known
        self.ready: dict[int, Translation | None] = {
            i: None for i, line in enumerate(window) if not line.strip()}
        self.printed = 0

    def print_ready(self) -> int:
        """Print the lines now ready in order, flushed; how many were printed."""
        start = self.printed
        with clear_bars():
            while self.printed in self.ready:
                i = self.printed
                t = self.ready.pop(i)
                with to_stdout():
                    _print_translation(self.first + i, t, self.n_best, self.tokenizer,
                                       self.tgt_vocab)
                if self.alignments is not None:
                    self.alignments.write(_alignment_row(self.window[i], t, self.tokenizer,
                                                         self.form).encode())
                self.printed += 1
            with to_stdout():
                sys.stdout.flush()
        return self.printed - start


def _print_translation(index: int, t: Translation | None, n_best: int,
                       tokenizer: Tokenizer, tgt_vocab: Vocab) -> None:
    """One line (its n-best lines with --n-best; none for an empty input line)."""
    if n_best == 1:
        print("" if t is None else t.text)
        return
    for hyp in [] if t is None else t.nbest:
        text = tokenizer.detokenize(tgt_vocab.decode(hyp.tokens))
        print(f"{index} ||| {text} ||| {hyp.score:.4f}")


def _alignment_row(line: str, t: Translation | None, tokenizer: Tokenizer,
                   form: str = "json") -> str:
    """The line --alignments writes for one input line: JSON, or Pharaoh ``i-j`` pairs (an
    empty line for an empty input line)."""
    if form == "pharaoh":
        pairs = [] if t is None else argmax_alignment(t.hypothesis)
        return " ".join(f"{i}-{j}" for i, j in pairs) + "\n"
    if t is None:
        return json.dumps({"source": [], "target": [], "weights": None}) + "\n"
    att = t.hypothesis.attention
    return json.dumps({"source": tokenizer.tokenize(line), "target": [*t.tokens, "</s>"],
                       "weights": None if att is None else
                       [[round(float(x), 5) for x in row] for row in att]}) + "\n"


def _input_bar(path: Path | None, interactive: bool) -> Any:
    """The progress bar of translate: the bytes of a file read (`path`), or the lines of
    stdin or a pipe (None)."""
    if interactive:
        return Bar()
    if path is None:
        return progress_bar("translating", unit="lines")
    return progress_bar("translating", total=path.stat().st_size, unit="B", unit_scale=True)


def evaluate(o: EvaluateOptions) -> int:
    """`bahdanau evaluate`: the test-set report of a checkpoint (or an ensemble); with --json -
    or --output -, that output goes to stdout and the report to stderr."""
    o = stdout_as_dash(o, "output", "json")
    device = machine(o)
    precision = autocast(o.amp, device)
    if o.output == STDOUT and o.json == STDOUT:
        raise InputError("--output - and --json - both ask for stdout; give one of them a file")
    src, ref = existing(o.src, "--src"), existing(o.ref, "--ref")
    checkpoints = checkpoint_paths(o)
    check_outputs({"--output": o.output, "--json": o.json},
                   {"--src": src, "--ref": ref, **checkpoints, **_phrase_inputs(o)})
    sources, references = read_aligned(
        src, ref, flags=("--src", "--ref"),
        needed=("a sentence to translate", "the reference translation of its source line"))
    phrases = phrase_files(o)
    threads = decoding_threads(o, device)           # the model loads at its first count
    t = load_decoder(o, checkpoints, device)
    check_line_phrases(o, phrases, sources, t, beam_search(o))
    with precision:
        report = score_translations(t.model, sources, references, t.src_vocab, t.tgt_vocab,
                                    t.tokenizer, o, device, phrases=phrases,
                                    bleu=o.bleu, threads=threads)
    lines, metrics = report.lines(), report.metrics()
    if o.metric:
        rates = _error_rates(sources, references, report.translations, t.tokenizer)
        lines.append(f"{'  '.join(f'{n.upper()} {rates.as_dict()[n]:.2f}' for n in o.metric)}"
                     f"  ({rates.items} sources, {len(sources)} lines)")
        metrics.update(rates.as_dict(o.metric), items=rates.items)
    print(*lines, sep="\n", file=sys.stderr if STDOUT in (o.output, o.json) else sys.stdout)
    if o.output:
        write_text(o.output, "".join(t.text + "\n" for t in report.translations))
    if o.json:
        write_text(o.json, json.dumps(metrics, indent=2) + "\n")
    return 0


def _error_rates(sources: list[str], references: list[str], translations: list[Translation],
                 tokenizer: Tokenizer) -> ErrorRates:
    """evaluate --metric: the lines grouped by source (`group_references`), each item's
    hypothesis its first line's translation, tokens the model's target tokens."""
    source_side, target_side = sides(tokenizer)
    _, groups, first = group_references(sources, references, tokenize=source_side.tokenize)
    return error_rates([translations[i].text for i in first], groups,
                       tokenize=target_side.tokenize)


# The longest sentence `plot` draws, in source tokens, refused before the model runs: a plot
# shows at most `bahdanau.plot.MAX_CELLS` columns legibly, and the cost of decoding grows with it.
PLOT_MAX_TOKENS = 100


def plot(o: PlotOptions) -> int:
    """`bahdanau plot`: the alignment heat map of one sentence (at most PLOT_MAX_TOKENS
    tokens), titled with the checkpoint, its step and the sentence."""
    from bahdanau.plot import check_image_path

    o = stdout_as_dash(o, "output")
    if o.output == STDOUT:
        raise InputError("--output -: a plot is an image file; give a file name (e.g. "
                         "alignment.png or .pdf)")
    device = machine(o)
    precision = autocast(o.amp, device)
    search = beam_search(o, threads=decoding_threads(o, device))
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
    _check_plot_length(len(sentence.split()), "words")   # no tokenizer splits fewer tokens
    t = load_decoder(o, checkpoints, device)
    model, src_vocab, tgt_vocab, tokenizer = t.model, t.src_vocab, t.tgt_vocab, t.tokenizer
    if model.arch == "rnnencdec":
        what = ("is an RNNencdec model: it has" if len(o.checkpoint) == 1
                else "are RNNencdec models: they have")
        raise InputError(f"{' '.join(o.checkpoint)} {what} no alignment to plot")
    src_tokens = tokenizer.tokenize(sentence)
    _check_plot_length(len(src_tokens), "tokens")
    with precision:
        [translation] = translate_corpus(model, [sentence], src_vocab, tgt_vocab, tokenizer,
                                         search=search, unk_replace=o.unk_replace, device=device)
    model_name = " + ".join(str(path) if step is None else f"{path} (step {step})"
                            for path, step in zip(checkpoints.values(), t.steps, strict=True))
    note = plot_alignment_file(Path(o.output), translation, src_tokens,
                               alignment_title(model_name, sentence))
    print(translation.text)
    print(note)
    return 0


def _check_plot_length(count: int, unit: str) -> None:
    if count > PLOT_MAX_TOKENS:
        raise InputError(f"the sentence has {count} {unit}; plot draws sentences of at most "
                         f"{PLOT_MAX_TOKENS} tokens (a wider plot cannot be read)")


def average(o: AverageOptions) -> int:
    """`bahdanau average`: one checkpoint whose weights are the mean of several."""
    o = stdout_as_dash(o, "output")
    if o.output == STDOUT:
        raise InputError("--output -: a checkpoint is a binary file; give a file name")
    paths = select_checkpoints(o.checkpoint, last=o.last, best=o.best)
    check_outputs({"--output": o.output}, {f"--checkpoint {p}": p for p in paths})
    averaged = average_checkpoints(paths, allow_different_runs=o.allow_different_runs)
    unknown = [m["file"] for m in averaged[EXTRA]["averaged_from"] if m["run_id"] is None]
    if unknown and len(paths) > 1 and o.last is None and o.best is None:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        _LOG.warning(f"{unknown[0]}{more} record no run id (saved by an earlier version): "
                     "that the checkpoints come from one run is not checked")
    save_checkpoint(o.output, averaged)
    print(f"averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''} "
          f"({', '.join(map(str, paths))}) into {o.output}")
    return 0


def release(o: ReleaseOptions) -> int:
    """`bahdanau release`: a trained model as a folder to share (docs/release-format.md)."""
    out = release_model(o)
    print(f"wrote the model folder {out} (weights, config, vocabularies, tokenizer, README.md, "
          "manifest.json); load it with bahdanau.load or --checkpoint")
    return 0
