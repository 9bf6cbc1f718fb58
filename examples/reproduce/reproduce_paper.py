"""Reproduction of Bahdanau, Cho & Bengio (ICLR 2015) on a Canadian Hansard en->fr sample.

The paper compares RNNencdec (a plain encoder-decoder) with RNNsearch (the same encoder-decoder
with additive attention), each trained on sentences of at most 30 or 50 words, and finds that:

1. RNNsearch beats RNNencdec in BLEU, on all test sentences and on those without [UNK] (Table 1);
2. RNNencdec degrades as the source sentence grows longer while RNNsearch holds up (Figure 2);
3. RNNsearch's soft alignments are sensible and non-monotonic where the word order of the two
   languages differs, e.g. adjective-noun order (Figure 3).

This script trains RNNsearch-50 and RNNencdec-50 with the library's default recipe (Glorot
initialisation, Adam), and the same pair with the paper's own recipe (its initialisation,
Adadelta), all with the same sizes, vocabularies, seed and batches (`--models` also offers the
-30 pair). Each model is one run of the default training job, `bahdanau.jobs.run_train_job`
(what `bahdanau train` does), in OUT/<model>: it evaluates greedy dev BLEU every --eval-every
updates, keeps the best checkpoint, and stops after --patience evaluations without a better one
or at --max-epochs (the -paper models always train to --max-epochs). The script then decodes
the test set with that best checkpoint (beam search) and, once a model and its baseline are
both scored, writes the comparison. Under OUT:

    <model>/             the run folder (options.json, train.log, checkpoints/), test.hyp.txt
                         (detokenised test translations of best.pt) and scores.json (training
                         record with the dev curve, test BLEU all / without [UNK] / by length,
                         chrF, and how the attention's argmax treats reordered word pairs)
    results.json         every number of the report, with 95% paired bootstrap intervals
    results.md           Table 1, the paired differences, Figure 2 and the reordered-pair
                         counts as Markdown tables
    bleu_by_length.png   Figure 2: BLEU against source length with bootstrap intervals
    dev_curves.png       greedy dev BLEU against updates, every model
    alignment_<line>.png Figure 3: RNNsearch-50 heat maps (reordered pairs, a long sentence)

Everything is resumable and nothing is done twice: a finished run is not trained again, an
interrupted one continues from its latest checkpoint (exactly: model, optimizer, RNG and batch
position), and a model whose scores.json matches its best checkpoint is not decoded again. Two
processes can train two models at once (one thread each, `--threads 1`, the default); the last
to finish writes the full report. From the repository root:

    python examples/reproduce/reproduce_paper.py --models RNNsearch-50 RNNencdec-50 \
        --max-steps 6 --eval-every 3 --dev-size 20 --test-size 60 --out runs/reproduce-smoke
    python examples/reproduce/reproduce_paper.py --models RNNsearch-50 RNNencdec-50-paper &
    python examples/reproduce/reproduce_paper.py --models RNNencdec-50 RNNsearch-50-paper &
    wait; python examples/reproduce/reproduce_paper.py          # gathers; trains nothing new

The Hansard folder (--data, default data/hansard-fr-en-100k, which hansard_sample.py builds from
the public release) holds {train,dev,test}.{en,fr}.gz; the results are discussed in
docs/reproduction.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu
import torch
from sacrebleu.metrics import BLEU

import bahdanau
from bahdanau.checkpoint import load_checkpoint
from bahdanau.data import Tokenizer, Vocab, normalize_whitespace, read_lines, read_parallel
from bahdanau.evaluate import LengthBucket, Translation, has_unk, score_test_set, translate_corpus
from bahdanau.jobs import TrainOptions, run_train_job
from bahdanau.jobs.files import write_text
from bahdanau.jobs.flags import NONE
from bahdanau.jobs.report import alignment_title, plot_alignment_file
from bahdanau.search import BeamSearch
from bahdanau.training.runlog import LOGGER, LogFormatter
from bahdanau.translate import Translator


@dataclass(frozen=True)
class Model:
    """One model of the comparison: an architecture, the longest training sentence, a recipe,
    and whether patience on dev BLEU may stop it before --max-epochs."""

    arch: str               # rnnsearch or rnnencdec
    max_train_len: int      # the paper's -30 / -50
    recipe: str             # a key of RECIPES
    stops_early: bool = True


# How the weights are initialised and optimised. "adam-glorot" is the library's default job's
# (it learns about three times faster, docs/reproduction.md); "paper" is the paper's own recipe
# (appendix B: N(0, 0.01^2) and orthogonal initialisation, Adadelta with rho 0.95, eps 1e-6).
RECIPES: dict[str, dict[str, Any]] = {
    "adam-glorot": {"init": "glorot", "optimizer": "adam", "lr": 1e-3},
    "paper": {"init": "paper", "optimizer": "adadelta", "lr": 1.0},
}

MODELS: dict[str, Model] = {
    "RNNsearch-50": Model("rnnsearch", 50, "adam-glorot"),
    "RNNencdec-50": Model("rnnencdec", 50, "adam-glorot"),
    # the paper's recipe gets the whole budget: its dev BLEU stays near 2 for epochs while its
    # perplexity still falls, so patience would stop it without showing what the budget gives
    "RNNsearch-50-paper": Model("rnnsearch", 50, "paper", stops_early=False),
    "RNNencdec-50-paper": Model("rnnencdec", 50, "paper", stops_early=False),
    "RNNsearch-30": Model("rnnsearch", 30, "adam-glorot"),
    "RNNencdec-30": Model("rnnencdec", 30, "adam-glorot"),
}
DEFAULT_MODELS = ("RNNsearch-50", "RNNencdec-50", "RNNsearch-50-paper", "RNNencdec-50-paper")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/hansard-fr-en-100k",
                   help="Hansard folder with {train,dev,test}.{en,fr}.gz "
                        "(hansard_sample.py builds it)")
    p.add_argument("--out", default="runs/reproduce", help="output folder")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(DEFAULT_MODELS),
                   metavar="MODEL", help=f"the models to train and score, in this order (of "
                   f"{', '.join(MODELS)}; default: {' '.join(DEFAULT_MODELS)})")
    p.add_argument("--embed-size", type=int, default=128, help="E")
    p.add_argument("--hidden-size", type=int, default=128, help="H, encoder units per direction")
    p.add_argument("--decoder-size", type=int, default=256, help="D, decoder units")
    p.add_argument("--align-size", type=int, default=256, help="A, alignment model units")
    p.add_argument("--maxout-size", type=int, default=128, help="L, maxout units")
    p.add_argument("--vocab-size", type=int, default=10000, help="most frequent words per side")
    p.add_argument("--max-epochs", type=int, default=8, help="at most this many epochs per model")
    p.add_argument("--max-steps", type=int, default=None,
                   help="at most this many updates per model (default: no limit)")
    p.add_argument("--eval-every", type=int, default=500,
                   help="dev BLEU (greedy, --dev-size sentences) every N updates")
    p.add_argument("--dev-size", type=int, default=500)
    p.add_argument("--patience", type=int, default=3,
                   help="stop a model after N evaluations without a better dev BLEU (the "
                        "-paper models train to --max-epochs)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per update")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads per process (two processes can train two models "
                        "at once with one thread each)")
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--max-len", type=int, default=100, help="most target tokens")
    p.add_argument("--max-len-ratio", type=float, default=2.0,
                   help="also cap target length at RATIO x source length")
    p.add_argument("--decode-batch-size", type=int, default=64)
    p.add_argument("--test-size", type=int, default=None,
                   help="score only the first N test sentences (default: all)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--n-alignments", type=int, default=3, help="alignment heat maps to draw")
    p.add_argument("--log-every", type=int, default=100)
    return p.parse_args(argv)


def _log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def job_options(args: argparse.Namespace, name: str) -> TrainOptions:
    """The options of one model's training run (`bahdanau train`'s flags): dev BLEU every
    --eval-every updates, best.pt kept, no test set (the script scores best.pt itself)."""
    data, model = Path(args.data), MODELS[name]
    return TrainOptions.from_mapping({
        "train_src": str(data / "train.en.gz"), "train_tgt": str(data / "train.fr.gz"),
        "dev_src": str(data / "dev.en.gz"), "dev_tgt": str(data / "dev.fr.gz"),
        "dev_size": args.dev_size, "out": str(Path(args.out) / name),
        "vocab_size": args.vocab_size, "max_train_len": model.max_train_len,
        "arch": model.arch, **RECIPES[model.recipe], "embed_size": args.embed_size,
        "hidden_size": args.hidden_size, "decoder_size": args.decoder_size,
        "align_size": args.align_size, "maxout_size": args.maxout_size,
        "train_batch_size": args.batch_size, "max_epochs": args.max_epochs,
        "max_steps": args.max_steps, "eval_every": args.eval_every,
        "patience": args.patience if model.stops_early else None,
        "save_every": args.eval_every, "log_every": args.log_every, "seed": args.seed,
        "threads": args.threads,
        # the paper has none of them (the default job took label smoothing 0.1, layer norm and
        # a moving average of the weights later)
        "label_smoothing": 0.0, "layer_norm": False, "ema_decay": NONE,
    })


def train_one(name: str, options: TrainOptions, command: str) -> None:
    """Train one model in OUT/<model> until its epoch limit or patience stops it; a finished run
    is left as it is, an interrupted one continues from its latest checkpoint."""
    result = run_train_job(options, command=f"{command}  # {name}")
    if result.signal is not None:
        sys.exit(f"{name}: stopped by {result.stopped.upper()}; run the same command to continue")
    if not result.trained:
        _log(f"{name}: trained before ({result.stopped} at step {result.step})")


# ---------------------------------------------------------------- scoring one model's best.pt

# English word pairs that French translates in the other order ("federal government" ->
# "gouvernement fédéral"), frequent in the Hansard: the first French word translates the
# second English word and the last French word the first. Figure 3 and the crossing rate are
# about test sentences that contain one.
SWAPPED_PAIRS: dict[str, str] = {
    "federal government": "gouvernement fédéral", "Liberal government": "gouvernement libéral",
    "national defence": "défense nationale", "official languages": "langues officielles",
    "public service": "fonction publique", "human rights": "droits de la personne",
    "foreign affairs": "affaires étrangères", "official opposition": "opposition officielle",
    "international trade": "commerce international", "Supreme Court": "Cour suprême",
    "health care": "soins de santé", "social programs": "programmes sociaux",
    "economic development": "développement économique", "federal budget": "budget fédéral",
    "Reform Party": "Parti réformiste", "Liberal Party": "Parti libéral",
    "Criminal Code": "Code criminel", "Canadian Forces": "Forces canadiennes",
    "European Union": "Union européenne", "political party": "parti politique",
}

DEV_LINE = re.compile(r"step (\d+) \| dev bleu ([\d.]+) chrf ([\d.]+) ppl ([\d.]+)")
STOP_LINE = re.compile(r"trained (\d+) updates, stopped by (\w+)")
PAIRS_LINE = re.compile(r"data: (\d+) training pairs")
# what a scores.json holds; a file of another version is scored again
SCORES_VERSION = 2


def _write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def test_set(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The test sources and references the models are scored on (--test-size: the first N)."""
    pairs = read_parallel(Path(args.data) / "test.en.gz", Path(args.data) / "test.fr.gz")
    pairs = pairs[: args.test_size]
    return [s for s, _ in pairs], [t for _, t in pairs]


def training_record(run_dir: Path, batch_size: int) -> dict[str, Any]:
    """What the run's train.log and last checkpoint say of its training: updates, passes over
    the data, minutes, why it stopped, and the dev curve (step, greedy dev BLEU, chrF, ppl)."""
    log = (run_dir / "train.log").read_text(encoding="utf-8")
    curve = {int(m[1]): (float(m[2]), float(m[3]), float(m[4])) for m in DEV_LINE.finditer(log)}
    stops, pairs = STOP_LINE.findall(log), PAIRS_LINE.findall(log)
    last = max((run_dir / "checkpoints").glob("step_*.pt"))
    state = load_checkpoint(last)["train_state"]
    best = _read_json(run_dir / "checkpoints" / "best.json")
    return {
        "updates": state["step"], "training_pairs": int(pairs[-1]),
        "epochs": round(state["step"] * batch_size / int(pairs[-1]), 2),
        "train_minutes": round(state["elapsed_s"] / 60, 1),
        "stopped_by": stops[-1][1] if stops else None,
        "best_step": best["step"], "best_dev_bleu": round(best["metric"], 2),
        "dev_curve": [{"step": s, "bleu": b, "chrf": c, "ppl": p}
                      for s, (b, c, p) in sorted(curve.items())],
    }


def swapped_pair_positions(src_tokens: list[str], tgt_tokens: list[str], tokenizer: Tokenizer
                           ) -> list[tuple[str, int, int]]:
    """Occurrences of a `SWAPPED_PAIRS` pair translated in the reversed order: (the English
    pair, its position in the source, the position of its French phrase in the target)."""
    src, tgt = [t.lower() for t in src_tokens], [t.lower() for t in tgt_tokens]
    found = []
    for en, fr in SWAPPED_PAIRS.items():
        en_toks = [t.lower() for t in tokenizer.tokenize(en)]
        fr_toks = [t.lower() for t in tokenizer.tokenize(fr)]
        p = next((i for i in range(len(src) - 1) if src[i:i + 2] == en_toks), None)
        q = next((i for i in range(len(tgt) - len(fr_toks) + 1)
                  if tgt[i:i + len(fr_toks)] == fr_toks), None)
        if p is not None and q is not None:
            found.append((en, p, q))
    return found


def swapped_pair_attention(translations: list[Translation], sources: list[str],
                           tokenizer: Tokenizer) -> dict[str, Any]:
    """How the attention's argmax treats the reordered pairs of the test set: over every
    English pair of `SWAPPED_PAIRS` whose French phrase the model produced, how often the first
    French word's most attended source word comes after the last French word's (crossing), and
    how often they are exactly the swapped English words (second, first)."""
    pairs = crossing = exact = 0
    for t, source in zip(translations, sources, strict=True):
        if t.hypothesis.attention is None:
            return {}
        peaks = t.hypothesis.attention.argmax(dim=1).tolist()
        for en, p, q in swapped_pair_positions(tokenizer.tokenize(source), t.tokens, tokenizer):
            last = q + len(tokenizer.tokenize(SWAPPED_PAIRS[en])) - 1
            pairs += 1
            crossing += peaks[q] > peaks[last]
            exact += peaks[q] == p + 1 and peaks[last] == p
    return {"pairs": pairs, "crossing": crossing, "exact": exact,
            "crossing_rate": round(crossing / pairs, 3) if pairs else None,
            "exact_rate": round(exact / pairs, 3) if pairs else None}


def backward_steps(translations: list[Translation]) -> dict[str, Any]:
    """The control for `swapped_pair_attention`: over every two adjacent words of every
    translation, how often the second one's most attended source word comes before the first
    one's (the argmax steps backwards)."""
    steps = backward = 0
    for t in translations:
        if t.hypothesis.attention is None:
            return {}
        peaks = t.hypothesis.attention[:-1].argmax(dim=1).tolist()       # without the eos row
        steps += max(len(peaks) - 1, 0)
        backward += sum(b < a for a, b in itertools.pairwise(peaks))
    return {"steps": steps, "backward": backward,
            "rate": round(backward / steps, 3) if steps else None}


def score_one(name: str, args: argparse.Namespace, sources: list[str], references: list[str]
              ) -> dict[str, Any]:
    """Decode the test set with the run's best.pt (best dev BLEU) and score it, into
    OUT/<model>/test.hyp.txt and scores.json; done once per checkpoint, test set and
    `SCORES_VERSION`."""
    run_dir = Path(args.out) / name
    best = _read_json(run_dir / "checkpoints" / "best.json")
    scored = _read_json(run_dir / "scores.json")
    if (scored is not None and scored.get("version") == SCORES_VERSION
            and scored["best_step"] == best["step"] and scored["sentences"] == len(sources)):
        return scored
    start = time.perf_counter()
    translator = bahdanau.load(run_dir / "checkpoints" / "best.pt")
    search = BeamSearch(beam_size=args.beam_size, max_len=args.max_len,
                        max_len_ratio=args.max_len_ratio)
    translations = translate_corpus(translator.model, sources, translator.src_vocab,
                                    translator.tgt_vocab, translator.tokenizer, search=search,
                                    batch_size=args.decode_batch_size, progress=None)
    hyps = [t.text for t in translations]
    write_text(run_dir / "test.hyp.txt", "".join(h + "\n" for h in hyps))
    scores = {
        "version": SCORES_VERSION, "model": name, **asdict(MODELS[name]),
        **training_record(run_dir, args.batch_size),
        **score_test_set(hyps, sources, references, translator.src_vocab,
                         translator.tgt_vocab, translator.tokenizer),
        "decode_seconds": round(time.perf_counter() - start, 1),
        "swapped_pairs": swapped_pair_attention(translations, sources, translator.tokenizer),
        "backward_steps": backward_steps(translations),
    }
    _write_json(run_dir / "scores.json", scores)
    return scores


# ---------------------------------------------------------------- bootstrap intervals

class SentenceStats:
    """Per-sentence BLEU sufficient statistics of one system (n-gram matches and totals,
    hypothesis and reference lengths): the BLEU of any subset or resample is the BLEU of
    their sums, exactly sacrebleu's corpus BLEU of those sentences."""

    def __init__(self, hypotheses: list[str], references: list[str]) -> None:
        bleu = BLEU()
        rows = []
        for h, r in zip(hypotheses, references, strict=True):
            s = bleu.corpus_score([h], [[r]])
            rows.append([*s.counts, *s.totals, s.sys_len, s.ref_len])
        self.stats = np.array(rows, dtype=np.int64)

    def bleu(self, rows: np.ndarray) -> float:
        """Corpus BLEU of the sentences `rows` (indices, repeats allowed)."""
        total = self.stats[rows].sum(axis=0).tolist()
        return BLEU.compute_bleu(total[0:4], total[4:8], total[8], total[9],
                                 smooth_method="exp").score


def bootstrap(systems: dict[str, SentenceStats], subset: list[int], resamples: int, seed: int
              ) -> dict[str, Any]:
    """Paired bootstrap over the sentences `subset`: every system scores the same resamples.

    Returns per system its BLEU on the subset, the 2.5th and 97.5th percentiles of its
    resampled BLEU (a 95% interval), and the resampled BLEUs themselves (for ratios and
    differences); None for an empty subset.
    """
    if not subset:
        return {}
    rng = np.random.default_rng(seed)
    draws = rng.choice(np.array(subset), size=(resamples, len(subset)))
    rows = np.array(subset)
    result = {}
    for name, s in systems.items():
        samples = np.array([s.bleu(d) for d in draws])
        result[name] = {"bleu": round(s.bleu(rows), 2),
                        "low": round(float(np.percentile(samples, 2.5)), 2),
                        "high": round(float(np.percentile(samples, 97.5)), 2),
                        "samples": samples}
    return result


def interval(samples: np.ndarray, digits: int = 2) -> list[float]:
    """The 95% percentile interval of bootstrap samples."""
    return [round(float(np.percentile(samples, q)), digits) for q in (2.5, 97.5)]


# ---------------------------------------------------------------- the report

# (attention model, its baseline) pairs that the report compares, when both were scored
COMPARISONS = (("RNNsearch-50", "RNNencdec-50"), ("RNNsearch-50-paper", "RNNencdec-50-paper"),
               ("RNNsearch-30", "RNNencdec-30"))
BUCKET_EDGES = (10, 20, 30, 40, 50, 60)
LONG = 30          # "long sentences": at least this many source tokens


def _span(low: int, high: int | None) -> str:
    return f"{low}-{high - 1}" if high is not None else f"{low}+"


def compare(scores: dict[str, dict[str, Any]], sources: list[str], references: list[str],
            args: argparse.Namespace, tokenizer: Tokenizer, src_vocab: Vocab, tgt_vocab: Vocab
            ) -> dict[str, Any]:
    """Table 1 and Figure 2 with paired bootstrap intervals, the long-sentence BLEU, and the
    relative loss from the 10-19 to the 40-49 bucket, for every model in `scores`."""
    run = Path(args.out)
    refs = [normalize_whitespace(r) for r in references]
    stats = {name: SentenceStats(read_lines(run / name / "test.hyp.txt"), refs)
             for name in scores}
    src_tokens = [tokenizer.tokenize(s) for s in sources]
    lengths = [len(t) for t in src_tokens]
    no_unk = [i for i, (s, r) in enumerate(zip(src_tokens, refs, strict=True))
              if not has_unk(s, src_vocab) and not has_unk(tokenizer.tokenize(r), tgt_vocab)]
    everything = list(range(len(sources)))
    long = [i for i in everything if lengths[i] >= LONG]
    subsets = {"all": everything, "no_unk": no_unk, f"{LONG}+": long}
    bounds = [0, *BUCKET_EDGES]
    for low, high in zip(bounds, [*BUCKET_EDGES, None], strict=True):
        subsets[_span(low, high)] = [i for i in everything
                                     if lengths[i] >= low and (high is None or lengths[i] < high)]
    seeds = {name: k for k, name in enumerate(subsets)}
    boot = {name: bootstrap(stats, rows, args.bootstrap, args.seed + seeds[name])
            for name, rows in subsets.items()}
    table: dict[str, Any] = {
        "sentences": {name: len(rows) for name, rows in subsets.items()},
        "bleu": {model: {subset: {k: v for k, v in boot[subset][model].items() if k != "samples"}
                         for subset in subsets if boot[subset]}
                 for model in scores},
        "comparisons": [],
    }
    for search, encdec in COMPARISONS:
        if search not in scores or encdec not in scores:
            continue
        entry: dict[str, Any] = {"attention": search, "baseline": encdec}
        for subset in [k for k in ("all", "no_unk", f"{LONG}+") if boot[k]]:
            diff = boot[subset][search]["samples"] - boot[subset][encdec]["samples"]
            entry[subset] = {"difference": round(float(boot[subset][search]["bleu"]
                                                       - boot[subset][encdec]["bleu"]), 2),
                             "interval": interval(diff),
                             "p_baseline_not_worse": float(np.mean(diff <= 0))}
        short, longer = boot["10-19"], boot["40-49"]
        if short and longer and all(short[m]["bleu"] > 0 for m in (search, encdec)):
            ratio = {m: longer[m]["samples"] / np.maximum(short[m]["samples"], 1e-9)
                     for m in (search, encdec)}
            entry["bleu_40_49_over_10_19"] = {
                **{m: {"ratio": round(longer[m]["bleu"] / short[m]["bleu"], 3),
                       "interval": interval(ratio[m], 3)} for m in (search, encdec)},
                "difference_interval": interval(ratio[search] - ratio[encdec], 3)}
        table["comparisons"].append(entry)
    return table


def plot_figure_2(table: dict[str, Any], path: Path) -> None:
    """Figure 2: BLEU by source length with 95% bootstrap intervals, one line per model."""
    import matplotlib.pyplot as plt

    from bahdanau.plot import plot_bleu_by_length

    bounds = [0, *BUCKET_EDGES]
    spans = list(zip(bounds, [*BUCKET_EDGES, None], strict=True))
    systems = {model: [LengthBucket(low, high, table["sentences"][_span(low, high)],
                                    buckets[_span(low, high)]["bleu"]) for low, high in spans]
               for model, buckets in table["bleu"].items()}
    fig = plot_bleu_by_length(systems, title="BLEU by source length, Hansard en->fr test "
                                             "(95% bootstrap intervals)")
    ax = fig.axes[0]
    lines = list(ax.lines)             # one per model, before the error bars add their own
    for line, (model, buckets) in zip(lines, table["bleu"].items(), strict=True):
        cells = [buckets[_span(low, high)] for low, high in spans]
        ax.errorbar(bounds, [c["bleu"] for c in cells],
                    yerr=[[c["bleu"] - c["low"] for c in cells],
                          [c["high"] - c["bleu"] for c in cells]],
                    fmt="none", ecolor=line.get_color(), capsize=3, alpha=0.7)
        if model.endswith("-paper"):
            line.set_linestyle("--")
    ax.autoscale(axis="y")             # the plot fixed its limits before the bars were drawn
    ax.set_ylim(bottom=0)
    width, height = fig.get_size_inches()         # the legend beside the axes covers no bar
    fig.set_size_inches(width * 1.3, height)
    ax.legend(handles=lines, title="system", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def plot_dev_curves(scores: dict[str, dict[str, Any]], dev_size: int, path: Path) -> None:
    """Greedy dev BLEU against updates, one line per model."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.0), dpi=120, layout="constrained")
    for name, s in scores.items():
        ax.plot([p["step"] for p in s["dev_curve"]], [p["bleu"] for p in s["dev_curve"]],
                marker=".", linestyle="--" if name.endswith("-paper") else "-", label=name)
    ax.set_xlabel("updates")
    ax.set_ylabel(f"dev BLEU (greedy, first {dev_size} sentences)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path)
    plt.close(fig)


def pick_alignment_sentences(sources: list[str], references: list[str], hypotheses: list[str],
                             tokenizer: Tokenizer, src_vocab: Vocab, n: int) -> list[int]:
    """Test lines (0-based) for Figure 3: the n - 1 best translated (sentence BLEU) sentences of
    6-25 tokens, without [UNK], in which the model put a `SWAPPED_PAIRS` pair in the French
    order, then the best translated sentence of 30-50 tokens without [UNK]."""
    def usable(i: int, low: int, high: int) -> bool:
        tokens = tokenizer.tokenize(sources[i])
        return low <= len(tokens) <= high and not has_unk(tokens, src_vocab)

    def quality(i: int) -> float:
        return -sacrebleu.sentence_bleu(hypotheses[i], [references[i]]).score

    reordered = [i for i in range(len(sources)) if usable(i, 6, 25) and swapped_pair_positions(
        tokenizer.tokenize(sources[i]), tokenizer.tokenize(hypotheses[i]), tokenizer)]
    long = [i for i in range(len(sources)) if usable(i, LONG, 50)]
    return sorted(reordered, key=quality)[: n - 1] + sorted(long, key=quality)[:1]


def draw_alignments(args: argparse.Namespace, translator: Translator, sources: list[str],
                    references: list[str]) -> list[dict[str, Any]]:
    """Figure 3: RNNsearch-50's heat maps of the chosen test sentences, decoded again by its
    best.pt for their attention, as OUT/alignment_<line>.png."""
    run = Path(args.out)
    tokenizer = translator.tokenizer
    lines = pick_alignment_sentences(sources, references,
                                     read_lines(run / "RNNsearch-50" / "test.hyp.txt"),
                                     tokenizer, translator.src_vocab, args.n_alignments)
    search = BeamSearch(beam_size=args.beam_size, max_len=args.max_len,
                        max_len_ratio=args.max_len_ratio)
    translations = translate_corpus(translator.model, [sources[i] for i in lines],
                                    translator.src_vocab, translator.tgt_vocab, tokenizer,
                                    search=search, progress=None)
    drawn = []
    for i, t in zip(lines, translations, strict=True):
        path = run / f"alignment_{i + 1}.png"
        plot_alignment_file(path, t, tokenizer.tokenize(sources[i]),
                            alignment_title(f"RNNsearch-50, test line {i + 1}", sources[i]))
        drawn.append({"test_line": i + 1, "source": sources[i], "translation": t.text,
                      "reference": references[i], "png": path.name,
                      "swapped_pairs": swapped_pair_attention([t], [sources[i]], tokenizer)})
    return drawn


def _cell(c: dict[str, Any] | None) -> str:
    return "-" if c is None else f"{c['bleu']:.2f} [{c['low']:.2f}, {c['high']:.2f}]"


def _p_value(p: float, resamples: int) -> str:
    """A bootstrap p-value as text: below the resolution of `resamples` resamples if none."""
    return f"<{1 / resamples:g}" if p == 0 else f"={p:.3f}"


def markdown(results: dict[str, Any]) -> str:
    """The report's tables, in Markdown."""
    t, scores = results["table"], results["models"]
    resamples = results["settings"]["bootstrap"]
    n = t["sentences"]
    out = ["## Table 1: test BLEU (95% bootstrap intervals)", "",
           f"| model | recipe | updates | epochs | stopped by | minutes | all ({n['all']}) | "
           f"no [UNK] ({n['no_unk']}) | {LONG}+ tokens ({n[f'{LONG}+']}) | chrF |",
           "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for name, s in scores.items():
        b = t["bleu"][name]
        out.append(f"| {name} | {s['recipe']} | {s['updates']:,} | {s['epochs']} | "
                   f"{s['stopped_by']} | {s['train_minutes']} | {_cell(b.get('all'))} | "
                   f"{_cell(b.get('no_unk'))} | {_cell(b.get(f'{LONG}+'))} | {s['chrf']:.2f} |")
    out += ["", "## Paired differences (attention model minus baseline)", "",
            "| pair | all | no [UNK] | 30+ tokens | BLEU 40-49 / 10-19 (attention) | "
            "(baseline) | difference of the ratios |", "|---|---|---|---|---|---|---|"]
    for c in t["comparisons"]:
        cells = [f"{c[k]['difference']:+.2f} {c[k]['interval']}, "
                 f"p{_p_value(c[k]['p_baseline_not_worse'], resamples)}" if k in c else "-"
                 for k in ("all", "no_unk", f"{LONG}+")]
        r = c.get("bleu_40_49_over_10_19")
        cells += ([f"{r[c['attention']]['ratio']} {r[c['attention']]['interval']}",
                   f"{r[c['baseline']]['ratio']} {r[c['baseline']]['interval']}",
                   str(r["difference_interval"])] if r else ["-", "-", "-"])
        out.append(f"| {c['attention']} vs {c['baseline']} | {' | '.join(cells)} |")
    spans = [k for k in n if k not in ("all", "no_unk", f"{LONG}+")]
    out += ["", "## Figure 2: BLEU by source length (95% bootstrap intervals)", "",
            "| model | " + " | ".join(spans) + " |", "|---|" + "---:|" * len(spans),
            "| sentences | " + " | ".join(str(n[k]) for k in spans) + " |"]
    out += [f"| {name} | " + " | ".join(_cell(t["bleu"][name].get(k)) for k in spans) + " |"
            for name in scores]
    out += ["", "## Attention on reordered pairs (RNNsearch models, whole test set)", "",
            "| model | pairs produced in French order | argmax crosses | argmax on the "
            "swapped words exactly | control: any two adjacent words, argmax steps back |",
            "|---|---:|---:|---:|---:|"]
    for name, s in scores.items():
        p, control = s["swapped_pairs"], s["backward_steps"]
        if p:
            out.append(f"| {name} | {p['pairs']} | {p['crossing']} ({p['crossing_rate']}) | "
                       f"{p['exact']} ({p['exact_rate']}) | {control['backward']} of "
                       f"{control['steps']} ({control['rate']}) |")
    return "\n".join(out) + "\n"


def report(args: argparse.Namespace, sources: list[str], references: list[str]) -> None:
    """Gather the scored models' numbers into OUT/results.json and results.md and draw the
    figures; Figure 3 when RNNsearch-50 is scored."""
    out = Path(args.out)
    scores = {name: s for name in MODELS
              if (s := _read_json(out / name / "scores.json")) is not None
              and s["sentences"] == len(sources)}
    if not any(a in scores and b in scores for a, b in COMPARISONS):
        _log(f"no pair of models scored yet (scored: {', '.join(scores) or 'none'})")
        return
    # the vocabularies and tokenizer are every model's; RNNsearch-50 also draws Figure 3
    shown = "RNNsearch-50" if "RNNsearch-50" in scores else next(iter(scores))
    translator = bahdanau.load(out / shown / "checkpoints" / "best.pt")
    table = compare(scores, sources, references, args, translator.tokenizer,
                    translator.src_vocab, translator.tgt_vocab)
    plot_figure_2(table, out / "bleu_by_length.png")
    plot_dev_curves(scores, args.dev_size, out / "dev_curves.png")
    results = {"settings": {k: v for k, v in vars(args).items() if k != "models"},
               "models": scores, "table": table,
               "alignments": draw_alignments(args, translator, sources, references)
               if "RNNsearch-50" in scores else []}
    _write_json(out / "results.json", results)
    write_text(out / "results.md", markdown(results))
    print(markdown(results))
    _log(f"results: {out / 'results.json'}, {out / 'results.md'}; figures in {out}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # the jobs' log lines on the console, as `bahdanau train` shows them (train.log keeps them)
    console = logging.StreamHandler()
    console.setFormatter(LogFormatter())
    LOGGER.addHandler(console)
    LOGGER.setLevel(logging.INFO)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "examples/reproduce/reproduce_paper.py",
                          *(sys.argv[1:] if argv is None else argv)])
    sources, references = test_set(args)
    for name in args.models:
        _log(f"{name}: {MODELS[name].arch}, training pairs of at most "
             f"{MODELS[name].max_train_len} tokens, {MODELS[name].recipe} recipe, in {out / name}")
        train_one(name, job_options(args, name), command)
        s = score_one(name, args, sources, references)
        _log(f"{name}: best dev BLEU {s['best_dev_bleu']} at update {s['best_step']}; test BLEU "
             f"{s['bleu']}, chrF {s['chrf']}")
    report(args, sources, references)


if __name__ == "__main__":
    main()
