"""Lexically constrained decoding on Multi30k test_2016_flickr: satisfaction, BLEU and speed.

The experiment of Post & Vilar (2018, section 5): constraints taken from the reference. Each
test sentence is first translated without constraints (beam 5, as the default job decodes);
then, per sentence, one or two random reference words or bigrams that the unconstrained
translation does not hold (fixed seed; words of the target vocabulary, whose tokens the
tokenizer gives back alone) become its constraints, and the test set is translated again.
Printed: the share of constraints the translations hold (the search guarantees 100%), BLEU and
chrF of each (sacrebleu, against the references), and the decoding time of plain beam 5 and of
each constrained run, in the same run: --repeats rounds of the three, the fastest pass of each
kept (rounds, not one setting after another, so that the machine's other work falls on all).
Beside the wall-clock times, the CPU time of this process (with --threads 1, close to what the
run costs whatever else the machine runs) and the decoder rows each run computed (sentences x
beams, summed over the steps): the work, which the machine's load does not change.

    bahdanau train --out runs/default                   # the default job
    python examples/benchmarks/bench_constraints.py --checkpoint runs/default
    python examples/benchmarks/bench_constraints.py --smoke     # an untrained tiny model, seconds
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time

import torch

from bahdanau import BeamSearch, RNNSearch, presets
from bahdanau.data import (
    DefaultTokenizer,
    Vocab,
    multi30k_files,
    read_lines,
    read_parallel,
    sides,
)
from bahdanau.evaluate import corpus_scores, translate_corpus
from bahdanau.translate import Translator, load


def holds(words: list[str], phrase: list[str]) -> bool:
    """`phrase` appears contiguously in `words`."""
    n = len(phrase)
    return any(words[i:i + n] == phrase for i in range(len(words) - n + 1))


def reference_phrases(t: Translator, reference: str, output: list[str]) -> list[list[str]]:
    """The reference's words and bigrams that `output` does not hold: each token a word of the
    target vocabulary with a letter in it, that the tokenizer gives back alone."""
    target = sides(t.tokenizer)[1]                  # target text is the target side's
    tokens = target.tokenize(reference)
    ok = [w in t.tgt_vocab and any(c.isalpha() for c in w) and target.tokenize(w) == [w]
          for w in tokens]
    found = [[w] for w, good in zip(tokens, ok, strict=True) if good]
    found += [tokens[i:i + 2] for i in range(len(tokens) - 1) if ok[i] and ok[i + 1]]
    unique = list(dict.fromkeys(tuple(p) for p in found if not holds(output, p)))
    return [list(p) for p in unique]


def pick(candidates: list[list[list[str]]], count: int, seed: int) -> list[list[str]]:
    """Per sentence, `count` random phrases of its candidates (as text; fewer if it has fewer)."""
    rng = random.Random(seed)
    return [[" ".join(p) for p in rng.sample(c, min(count, len(c)))] for c in candidates]


def count_rows(model: torch.nn.Module) -> list[int]:
    """Count the rows of every call of `model.step` into the list returned (one number)."""
    step, rows = model.step, [0]

    @functools.wraps(step)              # keeps the signature the search reads (`check`)
    def counted(prev_tokens, *args, **kwargs):
        rows[0] += prev_tokens.shape[0]
        return step(prev_tokens, *args, **kwargs)

    model.step = counted
    return rows


def timed(t: Translator, sources: list[str], search: BeamSearch, batch_size: int,
          rows: list[int], constraints: list[list[str]] | None = None
          ) -> tuple[tuple[float, float], int, list]:
    """The wall-clock and CPU seconds of one translation of `sources`, the decoder rows it
    computed (`rows` is `count_rows`'), and what it found."""
    rows[0] = 0
    start, cpu = time.perf_counter(), time.process_time()
    out = translate_corpus(t.model, sources, t.src_vocab, t.tgt_vocab, t.tokenizer,
                           search=search, batch_size=batch_size, constraints=constraints,
                           progress=None)
    return (time.perf_counter() - start, time.process_time() - cpu), rows[0], out


def smoke_translator(max_size: int) -> Translator:
    """An untrained tiny model with Multi30k vocabularies (for --smoke: the script's paths)."""
    torch.manual_seed(0)
    tok = DefaultTokenizer()
    pairs = read_parallel(multi30k_files("train", "en"), multi30k_files("train", "fr"))[:2000]
    src_vocab = Vocab.build((tok.tokenize(s) for s, _ in pairs), max_size=max_size)
    tgt_vocab = Vocab.build((tok.tokenize(t) for _, t in pairs), max_size=max_size)
    model = RNNSearch.from_config(presets.tiny(len(src_vocab), len(tgt_vocab))).eval()
    return Translator(model, tok, src_vocab, tgt_vocab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a trained model (run folder or checkpoint file)")
    parser.add_argument("--smoke", action="store_true",
                        help="an untrained tiny model instead, on --limit sentences")
    parser.add_argument("--limit", type=int, default=1000, help="test sentences to decode")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--max-len", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1, help="of the random constraints")
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds of the three settings; the fastest pass of each kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if (args.checkpoint is None) == (not args.smoke):
        parser.error("give --checkpoint PATH, or --smoke")

    torch.set_num_threads(args.threads)
    t = smoke_translator(1000) if args.smoke else load(args.checkpoint)
    sources = read_lines(multi30k_files("test_2016_flickr", "en"))[: args.limit]
    references = read_lines(multi30k_files("test_2016_flickr", "fr"))[: args.limit]
    search = BeamSearch(beam_size=args.beam_size, max_len=args.max_len)
    counter = count_rows(t.model)
    settings: dict[int, list[list[str]] | None] = {0: None}        # constraints per sentence
    seconds: dict[int, tuple[float, float]] = {}             # wall-clock, CPU
    rows_of: dict[int, int] = {}
    found: dict[int, list] = {}
    for _ in range(args.repeats):
        for count in (0, 1, 2):
            if count not in settings:       # from the first unconstrained translations
                candidates = [reference_phrases(t, ref, out.tokens)
                              for ref, out in zip(references, found[0], strict=True)]
                settings[count] = pick(candidates, count, args.seed + count)
            took, rows_of[count], found[count] = timed(t, sources, search, args.batch_size,
                                                       counter, settings[count])
            best = seconds.get(count, took)
            seconds[count] = (min(took[0], best[0]), min(took[1], best[1]))
    rows = []
    for count, given in settings.items():
        phrases = given or [[] for _ in sources]
        held = sum(holds(out.tokens, sides(t.tokenizer)[1].tokenize(p))
                   for out, ps in zip(found[count], phrases, strict=True) for p in ps)
        name = f"beam {args.beam_size}" + (f", {count} from the reference" if count else "")
        rows.append(dict(setting=name, seconds=seconds[count][0],
                         cpu_seconds=seconds[count][1], decoder_rows=rows_of[count],
                         constraints=sum(map(len, phrases)),
                         sentences=sum(1 for ps in phrases if ps), held=held,
                         **score(found[count], references)))
    report(rows, len(sources), args)


def score(found: list, references: list[str]) -> dict:
    scores = corpus_scores([out.text for out in found], references)
    return dict(bleu=round(scores.bleu, 2), chrf=round(scores.chrf, 2))


def report(rows: list[dict], n: int, args: argparse.Namespace) -> None:
    base = {key: rows[0][key] for key in ("seconds", "cpu_seconds", "decoder_rows")}
    print(f"{n} test_2016_flickr sentences, {torch.get_num_threads()} threads, "
          f"{'untrained tiny model' if args.smoke else args.checkpoint}")
    print(f"{'setting':30} {'constraints':>11} {'held':>7} {'BLEU':>6} {'chrF':>6} "
          f"{'seconds':>8} {'x plain':>7} {'CPU s':>7} {'x plain':>7} {'rows x plain':>12}")
    for row in rows:
        for key, name in (("seconds", "ratio"), ("cpu_seconds", "cpu_ratio"),
                          ("decoder_rows", "rows_ratio")):
            row[name] = round(row[key] / base[key], 2)
        held = f"{100 * row['held'] / row['constraints']:.1f}%" if row["constraints"] else "-"
        print(f"{row['setting']:30} {row['constraints']:>11} {held:>7} {row['bleu']:>6.2f} "
              f"{row['chrf']:>6.2f} {row['seconds']:>8.1f} {row['ratio']:>7.2f} "
              f"{row['cpu_seconds']:>7.1f} {row['cpu_ratio']:>7.2f} {row['rows_ratio']:>12.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"sentences": n, "threads": torch.get_num_threads(), "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
