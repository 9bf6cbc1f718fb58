"""Small-scale reproduction of Bahdanau, Cho & Bengio (ICLR 2015) on Canadian Hansard en->fr.

The paper compares RNNencdec (a plain encoder-decoder) with RNNsearch (the same encoder-decoder
with additive attention), each trained on sentences of at most 30 or 50 words, and finds that:

1. RNNsearch beats RNNencdec in BLEU, on all test sentences and on those without [UNK] (Table 1);
2. RNNencdec degrades as the source sentence grows longer while RNNsearch holds up (Figure 2);
3. RNNsearch's soft alignments are sensible and non-monotonic where the word order of the two
   languages differs, e.g. adjective-noun order (Figure 3).

This script trains the four models RNNencdec-30, RNNencdec-50, RNNsearch-30 and RNNsearch-50
sequentially with the same sizes, vocabularies, seed, batch size and number of updates. Each model
is one run of the default training job, `bahdanau.jobs.run_train_job` (what `bahdanau train`
does), in its own run folder: the job reads the Hansard files, builds the vocabularies (from all
training pairs, before the length filter, so the four models share them) and the model, trains
it, decodes the test set with beam search and scores it. The script then gathers the four runs'
scores and draws the figures. Under OUT:

    <model>/                     the run folder: config.yaml, train.log, checkpoints/,
                                 test.hyp.txt (detokenised test translations), metrics.json
                                 (sacrebleu BLEU: all, without [UNK], by source length)
    test.en, test.fr             with --test-size N: the first N test pairs, the runs' test set
    results.json                 the four models' training and test numbers, plus the settings
    bleu_by_length.png           Figure 2: BLEU against source length, four models
    alignment_<line>.png         Figure 3: RNNsearch-50 heat maps of a few test sentences

It is resume-safe, as the job is: a model whose run has reached --max-steps and holds its
metrics.json is neither trained nor decoded again (a metrics.json of another test set size is
scored again), and an interrupted training run continues from its latest checkpoint. The
sentences of Figure 3 are chosen from RNNsearch-50's test.hyp.txt; only they are decoded again,
by the model reloaded from its run folder, to draw their alignments. From the repository root:

    python examples/reproduce/reproduce_paper.py                       # the documented run
    python examples/reproduce/reproduce_paper.py --max-steps 5 --test-size 50 \
        --out runs/reproduce-smoke                                     # a one-minute check

The Hansard folder (default data/hansard-fr-en-100k, which hansard_sample.py builds from the
public release) holds train/dev/test.{en,fr}.gz (the runs have no dev evaluation: the last
checkpoint is scored).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu
import torch

import bahdanau
from bahdanau.data import Tokenizer, Vocab, read_lines, read_parallel
from bahdanau.evaluate import LengthBucket, Translation, has_unk, translate_corpus
from bahdanau.jobs import TestReport, TrainOptions, run_train_job
from bahdanau.jobs.report import alignment_title, plot_alignment_file
from bahdanau.search import BeamSearch
from bahdanau.training.runlog import LOGGER, LogFormatter

# (name, architecture, maximum training sentence length), in training order.
MODELS: tuple[tuple[str, str, int], ...] = (
    ("RNNencdec-30", "rnnencdec", 30),
    ("RNNencdec-50", "rnnencdec", 50),
    ("RNNsearch-30", "rnnsearch", 30),
    ("RNNsearch-50", "rnnsearch", 50),
)

# English word pairs that French translates in the other order ("federal government" ->
# "gouvernement fédéral"), frequent in the Hansard. Test sentences containing one are the
# candidates for the alignment figures.
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data/hansard-fr-en-100k",
                   help="Hansard folder with {train,dev,test}.{en,fr}.gz "
                        "(hansard_sample.py builds it)")
    p.add_argument("--out", default="runs/reproduce", help="output folder")
    p.add_argument("--embed-size", type=int, default=128, help="E")
    p.add_argument("--hidden-size", type=int, default=128, help="H, encoder units per direction")
    p.add_argument("--decoder-size", type=int, default=256, help="D, decoder units")
    p.add_argument("--align-size", type=int, default=256, help="A, alignment model units")
    p.add_argument("--maxout-size", type=int, default=128, help="L, maxout units")
    p.add_argument("--vocab-size", type=int, default=10000, help="most frequent words per side")
    p.add_argument("--max-steps", type=int, default=1000, help="updates per model")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per update")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--max-len", type=int, default=100, help="most target tokens")
    p.add_argument("--max-len-ratio", type=float, default=2.0,
                   help="also cap target length at RATIO x source length")
    p.add_argument("--decode-batch-size", type=int, default=64)
    p.add_argument("--test-size", type=int, default=None,
                   help="decode only the first N test sentences (default: all)")
    p.add_argument("--n-alignments", type=int, default=3, help="alignment heat maps to draw")
    p.add_argument("--log-every", type=int, default=50)
    return p.parse_args(argv)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def test_files(args: argparse.Namespace) -> tuple[Path, Path]:
    """The test pair the runs score: the Hansard's, or with --test-size its first pairs, written
    into OUT."""
    src, tgt = Path(args.data) / "test.en.gz", Path(args.data) / "test.fr.gz"
    if args.test_size is None:
        return src, tgt
    pairs = read_parallel(src, tgt)[: args.test_size]
    out = Path(args.out)
    for side, path in enumerate((out / "test.en", out / "test.fr")):
        path.write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    return out / "test.en", out / "test.fr"


def job_options(args: argparse.Namespace, name: str, arch: str, max_train_len: int,
                test: tuple[Path, Path]) -> TrainOptions:
    """The options of one model's run of the default job (`bahdanau train`'s flags)."""
    data = Path(args.data)
    return TrainOptions.from_mapping({
        "train_src": str(data / "train.en.gz"), "train_tgt": str(data / "train.fr.gz"),
        "test_src": str(test[0]), "test_tgt": str(test[1]), "out": str(Path(args.out) / name),
        "vocab_size": args.vocab_size, "max_train_len": max_train_len,
        "arch": arch, "init": "paper", "embed_size": args.embed_size,
        "hidden_size": args.hidden_size, "decoder_size": args.decoder_size,
        "align_size": args.align_size, "maxout_size": args.maxout_size,
        "optimizer": "adam", "lr": args.lr, "train_batch_size": args.batch_size,
        "max_steps": args.max_steps, "eval_every": 0, "save_every": max(args.max_steps // 4, 1),
        "log_every": args.log_every, "seed": args.seed, "threads": args.threads,
        "beam_size": args.beam_size, "max_len": args.max_len,
        "max_len_ratio": args.max_len_ratio, "batch_size": args.decode_batch_size,
    })


def train_one(name: str, options: TrainOptions, n_test: int, command: str) -> TestReport | None:
    """Train and score one model: a run of the default job in OUT/<model>, which trains on to
    --max-steps and scores the test set, or does nothing if it has done both. Returns the test
    report when the run scored the test set in this call."""
    run_dir = Path(options.out)
    scored = _read_json(run_dir / "metrics.json")
    if scored is not None and scored["sentences"] != n_test:
        _log(f"{name}: metrics.json scores {scored['sentences']} test sentences, not {n_test}: "
             "scored again")
        (run_dir / "metrics.json").unlink()
    result = run_train_job(options, command=f"{command}  # {name}")
    if result.signal is not None:
        sys.exit(f"{name}: stopped by {result.stopped.upper()}; run the same command to continue")
    if not result.trained:
        _log(f"{name}: trained and scored before, neither trained nor decoded again")
    return result.report


def evaluate_one(run_dir: Path, references: list[str], tokenizer: Tokenizer
                 ) -> dict[str, Any]:
    """One run's test scores (its metrics.json), with the mean lengths in tokens of its
    translations (test.hyp.txt) and of the references."""
    metrics = _read_json(run_dir / "metrics.json")
    hyps = read_lines(run_dir / "test.hyp.txt")
    metrics["mean_hyp_tokens"] = round(sum(len(tokenizer.tokenize(h)) for h in hyps)
                                       / len(hyps), 2)
    metrics["mean_ref_tokens"] = round(sum(len(tokenizer.tokenize(r)) for r in references)
                                       / len(references), 2)
    return metrics


def crossings(weights: torch.Tensor) -> int:
    """Pairs of target words (i < k) whose most attended source words are in reverse order."""
    peaks = weights[:-1].argmax(dim=1).tolist()                  # drop the eos row
    return sum(1 for i in range(len(peaks)) for k in range(i + 1, len(peaks))
               if peaks[k] < peaks[i])


def count_monotonic(run_dir: Path, report: TestReport) -> None:
    """Add to the run's metrics.json how many test translations have a monotonic alignment
    (no crossing), while the report's attention weights are at hand."""
    metrics = _read_json(run_dir / "metrics.json")
    metrics["sentences_with_monotonic_alignment"] = sum(
        1 for t in report.translations
        if t.hypothesis.attention is not None and crossings(t.hypothesis.attention) == 0)
    _write_json(run_dir / "metrics.json", metrics)


def pick_alignment_sentences(sources: list[str], references: list[str], translations: list[str],
                             src_vocab: Vocab, tokenizer: Tokenizer, n: int) -> list[int]:
    """Test lines (0-based) for Figure 3.

    Candidates are sentences of 6-25 source tokens without [UNK] whose English side contains one
    of `SWAPPED_PAIRS`. Those whose RNNsearch-50 translation contains the reordered French phrase
    come first, then the rest; within each group the best translated (sentence BLEU against the
    reference) come first, so that the figures show readable translations. If there are fewer
    than `n` candidates, the best translated of the other sentences of 6-25 tokens without
    [UNK] fill the rest.
    """
    def ok(i: int) -> bool:
        toks = tokenizer.tokenize(sources[i])
        return 6 <= len(toks) <= 25 and not has_unk(toks, src_vocab)

    def reordered(i: int) -> bool:
        return any(en in sources[i] and fr.lower() in translations[i].lower()
                   for en, fr in SWAPPED_PAIRS.items())

    usable = [i for i in range(len(sources)) if ok(i)]
    quality = {i: sacrebleu.sentence_bleu(translations[i], [references[i]]).score
               for i in usable}
    cued = [i for i in usable if any(en in sources[i] for en in SWAPPED_PAIRS)]
    picked = sorted(cued, key=lambda i: (not reordered(i), -quality[i]))[:n]
    rest = sorted((i for i in usable if i not in picked), key=lambda i: -quality[i])
    return picked + rest[: n - len(picked)]


def plot_alignments(lines: list[int], sources: list[str], translations: list[Translation],
                    tokenizer: Tokenizer, out: Path) -> list[dict[str, Any]]:
    """Draw one heat map per chosen test line (`translations` are theirs, in order); returns
    what was drawn."""
    drawn = []
    for i, t in zip(lines, translations, strict=True):
        if t.hypothesis.attention is None:
            continue
        path = out / f"alignment_{i + 1}.png"
        plot_alignment_file(path, t, tokenizer.tokenize(sources[i]),
                            alignment_title(f"RNNsearch-50, test line {i + 1}", sources[i]))
        drawn.append({"test_line": i + 1, "source": sources[i], "translation": t.text,
                      "crossings": crossings(t.hypothesis.attention), "png": path.name})
    return drawn


def plot_bleu(metrics: dict[str, dict[str, Any]], path: Path) -> None:
    """Figure 2: BLEU against source length for every model, on one figure."""
    import matplotlib.pyplot as plt

    from bahdanau.plot import plot_bleu_by_length

    systems = {name: [LengthBucket(b["low"], b["high"], b["sentences"], b["bleu"])
                      for b in m["bleu_by_length"]] for name, m in metrics.items()}
    fig = plot_bleu_by_length(systems, path,
                              title="BLEU by source length (Hansard en->fr test)")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # the jobs' log lines on the console, as `bahdanau train` shows them (train.log keeps them)
    console = logging.StreamHandler()
    console.setFormatter(LogFormatter())
    LOGGER.addHandler(console)
    LOGGER.setLevel(logging.INFO)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "examples/reproduce/reproduce_paper.py",
                          *(sys.argv[1:] if argv is None else argv)])
    test = test_files(args)
    test_pairs = read_parallel(*test)
    sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
    for name, arch, max_len in MODELS:
        _log(f"{name}: {arch} on training pairs of at most {max_len} tokens, in {out / name}")
        report = train_one(name, job_options(args, name, arch, max_len, test), len(sources),
                           command)
        if report is not None and arch == "rnnsearch":
            count_monotonic(out / name, report)

    # The figures' sentences, decoded again by the reloaded RNNsearch-50 for their attention.
    rnnsearch_50 = bahdanau.load(out / "RNNsearch-50")
    tokenizer = rnnsearch_50.tokenizer
    metrics = {name: evaluate_one(out / name, references, tokenizer) for name, _, _ in MODELS}
    plot_bleu(metrics, out / "bleu_by_length.png")
    lines = pick_alignment_sentences(sources, references,
                                     read_lines(out / "RNNsearch-50" / "test.hyp.txt"),
                                     rnnsearch_50.src_vocab, tokenizer, args.n_alignments)
    search = BeamSearch(beam_size=args.beam_size, max_len=args.max_len,
                        max_len_ratio=args.max_len_ratio)
    translations = translate_corpus(rnnsearch_50.model, [sources[i] for i in lines],
                                    rnnsearch_50.src_vocab, rnnsearch_50.tgt_vocab, tokenizer,
                                    search=search)
    alignments = plot_alignments(lines, sources, translations, tokenizer, out)
    _write_json(out / "results.json", {
        "settings": vars(args),
        "vocab_sizes": [len(rnnsearch_50.src_vocab), len(rnnsearch_50.tgt_vocab)],
        "test": metrics, "alignments": alignments,
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
    })
    edges = [b["low"] for b in next(iter(metrics.values()))["bleu_by_length"]]
    print(f"\n{'model':<14}{'updates':>8}{'min':>7}{'BLEU':>7}{'no-UNK':>8}  by length "
          f"{[f'{lo}-' for lo in edges]}")
    for name, m in metrics.items():
        by_len = " ".join(f"{b['bleu'] if b['bleu'] is not None else '-':>5}"
                          for b in m["bleu_by_length"])
        no_unk = m["bleu_no_unk"] if m["bleu_no_unk"] is not None else "-"
        print(f"{name:<14}{m['updates']:>8}{m['train_minutes']:>7.1f}{m['bleu']:>7.2f}"
              f"{no_unk:>8}  {by_len}")
    print(f"signature: {next(iter(metrics.values()))['bleu_signature']}")
    print(f"results: {out / 'results.json'}; plots: {out}")


if __name__ == "__main__":
    main()
