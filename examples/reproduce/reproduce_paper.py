"""Small-scale reproduction of Bahdanau, Cho & Bengio (ICLR 2015) on Canadian Hansard en->fr.

The paper compares RNNencdec (a plain encoder-decoder) with RNNsearch (the same encoder-decoder
with additive attention), each trained on sentences of at most 30 or 50 words, and finds that:

1. RNNsearch beats RNNencdec in BLEU, on all test sentences and on those without [UNK] (Table 1);
2. RNNencdec degrades as the source sentence grows longer while RNNsearch holds up (Figure 2);
3. RNNsearch's soft alignments are sensible and non-monotonic where the word order of the two
   languages differs, e.g. adjective-noun order (Figure 3).

This script trains the four models RNNencdec-30, RNNencdec-50, RNNsearch-30 and RNNsearch-50
sequentially with the same sizes, vocabularies, seed, batch size and number of updates, decodes
the whole test set with beam search, and writes under OUT:

    <model>/checkpoints/         checkpoints of the `bahdanau.training` loop
    <model>/train.json           updates, parameters, training wall time, final training loss
    <model>/test.hyp.txt         detokenised test translations
    <model>/metrics.json         sacrebleu BLEU (all / without [UNK] / by source length)
    results.json                 all of the above for the four models, plus the settings
    bleu_by_length.png           Figure 2: BLEU against source length, four models
    alignment_<line>.png         Figure 3: RNNsearch-50 heat maps of a few test sentences

It is resume-safe: a model whose checkpoint has reached --max-steps is not trained again, and a
model whose metrics.json matches its checkpoint is not decoded again; an interrupted training run
continues from its latest checkpoint. From the repository root:

    python examples/reproduce/reproduce_paper.py                       # the documented run
    python examples/reproduce/reproduce_paper.py --max-steps 5 --test-size 50 \
        --out runs/reproduce-smoke                                     # a one-minute check

The Hansard folder (default ../shared/data/hansard-fr-en-100k) holds train/dev/test.{en,fr}.gz.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from bahdanau.checkpoint import CheckpointManager, model_from_checkpoint
from bahdanau.config import ModelConfig, TrainConfig
from bahdanau.data import DefaultTokenizer, Vocab, encode_pairs, read_parallel
from bahdanau.evaluate import (
    LengthBucket,
    Translation,
    has_unk,
    score_test_set,
    translate_corpus,
)
from bahdanau.models import build_model
from bahdanau.search import BeamSearch
from bahdanau.training import train

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
BUCKET_EDGES: tuple[int, ...] = (10, 20, 30, 40, 50, 60)


@dataclass(frozen=True)
class Settings:
    """Everything that defines the experiment; stored in results.json."""

    embed_size: int
    hidden_size: int
    decoder_size: int
    align_size: int
    maxout_size: int
    vocab_size: int
    max_steps: int
    batch_size: int
    lr: float
    seed: int
    threads: int
    beam_size: int
    max_len: int
    max_len_ratio: float
    decode_batch_size: int
    test_size: int | None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="../shared/data/hansard-fr-en-100k",
                   help="Hansard folder with {train,dev,test}.{en,fr}.gz")
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


def train_one(name: str, arch: str, max_len: int, cfg: ModelConfig, settings: Settings,
              train_pairs: list[tuple[str, str]], src_vocab: Vocab, tgt_vocab: Vocab,
              tokenizer: DefaultTokenizer, run_dir: Path, log_every: int) -> torch.nn.Module:
    """Train one model to `settings.max_steps` updates (or load it if it is already there)."""
    manager = CheckpointManager(run_dir / "checkpoints")
    latest = manager.latest()
    info = _read_json(run_dir / "train.json")
    if latest is not None and info is not None and info["updates"] >= settings.max_steps:
        _log(f"{name}: finished checkpoint {latest}, not retrained")
        model, _, _ = model_from_checkpoint(latest)
        return model
    examples = encode_pairs(train_pairs, src_vocab, tgt_vocab, tokenizer, max_len=max_len)
    torch.manual_seed(settings.seed)
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    _log(f"{name}: {arch}, {n_params:,} parameters, {len(examples):,} training pairs of at "
         f"most {max_len} tokens")
    tcfg = TrainConfig(optimizer="adam", lr=settings.lr, batch_size=settings.batch_size,
                       max_steps=settings.max_steps,
                       save_every=max(settings.max_steps // 4, 1), log_every=log_every,
                       seed=settings.seed)
    start = time.perf_counter()
    result = train(model, examples, tcfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                   checkpoint_dir=run_dir / "checkpoints", resume=True,
                   log=lambda line: _log(f"{name}: {line}"),
                   tokenizer=tokenizer)
    wall = time.perf_counter() - start
    info = {"model": name, "arch": arch, "max_train_len": max_len, "parameters": n_params,
            "training_pairs": len(examples), "updates": result.step,
            "epochs": round(result.step * settings.batch_size / len(examples), 3),
            "train_seconds": round(result.elapsed_s, 1),
            "wall_seconds_this_call": round(wall, 1),
            "seconds_per_update": round(result.elapsed_s / max(result.step, 1), 3),
            "final_train_loss": round(result.train_loss, 4),
            "loss_history": [{"step": h["step"], "loss": round(h["loss"], 4)}
                             for h in result.history]}
    _write_json(run_dir / "train.json", info)
    _log(f"{name}: {result.step} updates in {result.elapsed_s / 60:.1f} min, "
         f"final train loss {result.train_loss:.3f}")
    return model.eval()


def evaluate_one(name: str, model: torch.nn.Module, sources: list[str], references: list[str],
                 src_vocab: Vocab, tgt_vocab: Vocab, tokenizer: DefaultTokenizer,
                 settings: Settings, run_dir: Path) -> tuple[dict[str, Any], list[Translation]]:
    """Beam-search the test set and score it: BLEU all, without [UNK], by source length."""
    search = BeamSearch(beam_size=settings.beam_size, max_len=settings.max_len,
                        max_len_ratio=settings.max_len_ratio)
    start = time.perf_counter()
    out = translate_corpus(model, sources, src_vocab, tgt_vocab, tokenizer, search=search,
                           batch_size=settings.decode_batch_size)
    seconds = time.perf_counter() - start
    hyps = [t.text for t in out]
    metrics = {
        "model": name,
        **score_test_set(hyps, sources, references, src_vocab, tgt_vocab, tokenizer,
                       edges=BUCKET_EDGES),
        "beam_size": settings.beam_size, "decode_seconds": round(seconds, 1),
        "mean_hyp_tokens": round(sum(len(t.tokens) for t in out) / len(out), 2),
        "mean_ref_tokens": round(sum(len(tokenizer.tokenize(r)) for r in references)
                                 / len(references), 2),
    }
    (run_dir / "test.hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    _write_json(run_dir / "metrics.json", metrics)
    _log(f"{name}: BLEU {metrics['bleu']:.2f}, no-UNK {metrics['bleu_no_unk']} "
         f"({metrics['sentences_no_unk']} sentences), decoded in {seconds:.0f} s")
    return metrics, out


def _label(token: str) -> str:
    """A token without the tokenizer's attachment mark, for plot labels."""
    joiner = DefaultTokenizer.JOINER
    return token[1:] if len(token) > 1 and token.startswith(joiner) else token


def crossings(weights: torch.Tensor) -> int:
    """Pairs of target words (i < k) whose most attended source words are in reverse order."""
    peaks = weights[:-1].argmax(dim=1).tolist()                  # drop the eos row
    return sum(1 for i in range(len(peaks)) for k in range(i + 1, len(peaks))
               if peaks[k] < peaks[i])


def pick_alignment_sentences(sources: list[str], references: list[str],
                             translations: list[Translation], src_vocab: Vocab,
                             tokenizer: DefaultTokenizer, n: int) -> list[int]:
    """Test lines (0-based) for Figure 3.

    Candidates are sentences of 6-25 source tokens without [UNK] whose English side contains one
    of `SWAPPED_PAIRS`. Those whose RNNsearch-50 translation contains the reordered French phrase
    come first, then the rest; within each group the best translated (sentence BLEU against the
    reference) come first, so that the figures show readable translations. If there are fewer
    than `n` candidates, the most non-monotonic short sentences of the test set fill the rest.
    """
    def ok(i: int) -> bool:
        toks = tokenizer.tokenize(sources[i])
        return (6 <= len(toks) <= 25 and not has_unk(toks, src_vocab)
                and translations[i].hypothesis.attention is not None)

    def reordered(i: int) -> bool:
        return any(en in sources[i] and fr.lower() in translations[i].text.lower()
                   for en, fr in SWAPPED_PAIRS.items())

    usable = [i for i in range(len(sources)) if ok(i)]
    cued = [i for i in usable if any(en in sources[i] for en in SWAPPED_PAIRS)]
    quality = {i: sacrebleu.sentence_bleu(translations[i].text, [references[i]]).score
               for i in cued}
    picked = sorted(cued, key=lambda i: (not reordered(i), -quality[i]))[:n]
    rest = sorted((i for i in usable if i not in picked),
                  key=lambda i: -crossings(translations[i].hypothesis.attention))
    return picked + rest[: n - len(picked)]


def plot_alignments(lines: list[int], sources: list[str], translations: list[Translation],
                    tokenizer: DefaultTokenizer, out: Path) -> list[dict[str, Any]]:
    """Draw one heat map per chosen test line; returns what was drawn."""
    import matplotlib.pyplot as plt

    from bahdanau.plot import plot_alignment

    drawn = []
    for i in lines:
        t = translations[i]
        attention = t.hypothesis.attention
        if attention is None:
            continue
        path = out / f"alignment_{i + 1}.png"
        fig = plot_alignment(attention, [_label(w) for w in tokenizer.tokenize(sources[i])],
                             [*map(_label, t.tokens), "</s>"], path)
        plt.close(fig)
        drawn.append({"test_line": i + 1, "source": sources[i], "translation": t.text,
                      "crossings": crossings(attention), "png": path.name})
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
    torch.set_num_threads(args.threads)
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings(args.embed_size, args.hidden_size, args.decoder_size, args.align_size,
                        args.maxout_size, args.vocab_size, args.max_steps, args.batch_size,
                        args.lr, args.seed, args.threads, args.beam_size, args.max_len,
                        args.max_len_ratio, args.decode_batch_size, args.test_size)
    tokenizer = DefaultTokenizer()
    train_pairs = read_parallel(data / "train.en.gz", data / "train.fr.gz")
    test_pairs = read_parallel(data / "test.en.gz", data / "test.fr.gz")[: args.test_size]
    sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
    # One pair of vocabularies, from all training pairs, shared by the four models.
    src_vocab = Vocab.build((tokenizer.tokenize(s) for s, _ in train_pairs),
                            max_size=args.vocab_size)
    tgt_vocab = Vocab.build((tokenizer.tokenize(t) for _, t in train_pairs),
                            max_size=args.vocab_size)
    _log(f"{len(train_pairs):,} training pairs, {len(test_pairs):,} test pairs, vocabularies "
         f"{len(src_vocab):,} / {len(tgt_vocab):,} (specials included)")

    trained: dict[str, dict[str, Any]] = {}
    metrics: dict[str, dict[str, Any]] = {}
    rnnsearch_50: list[Translation] | None = None
    for name, arch, max_len in MODELS:
        run_dir = out / name
        run_dir.mkdir(exist_ok=True)
        cfg = ModelConfig(len(src_vocab), len(tgt_vocab), embed_size=args.embed_size,
                          hidden_size=args.hidden_size, decoder_size=args.decoder_size,
                          align_size=args.align_size, maxout_size=args.maxout_size, arch=arch)
        model = train_one(name, arch, max_len, cfg, settings, train_pairs, src_vocab, tgt_vocab,
                          tokenizer, run_dir, args.log_every)
        trained[name] = _read_json(run_dir / "train.json")
        done = _read_json(run_dir / "metrics.json")
        needs_output = name == "RNNsearch-50"                    # for the alignment figures
        if (done is not None and done["sentences"] == len(sources)
                and done.get("updates") == trained[name]["updates"] and not needs_output):
            _log(f"{name}: metrics.json is up to date, not decoded again")
            metrics[name] = done
            continue
        metrics[name], translations = evaluate_one(name, model, sources, references, src_vocab,
                                                   tgt_vocab, tokenizer, settings, run_dir)
        metrics[name]["updates"] = trained[name]["updates"]
        _write_json(run_dir / "metrics.json", metrics[name])
        if needs_output:
            rnnsearch_50 = translations

    plot_bleu(metrics, out / "bleu_by_length.png")
    alignments: list[dict[str, Any]] = []
    if rnnsearch_50 is not None:
        lines = pick_alignment_sentences(sources, references, rnnsearch_50, src_vocab,
                                         tokenizer, args.n_alignments)
        alignments = plot_alignments(lines, sources, rnnsearch_50, tokenizer, out)
        monotone = sum(1 for t in rnnsearch_50
                       if t.hypothesis.attention is not None
                       and crossings(t.hypothesis.attention) == 0)
        metrics["RNNsearch-50"]["sentences_with_monotonic_alignment"] = monotone
    _write_json(out / "results.json", {
        "settings": asdict(settings), "vocab_sizes": [len(src_vocab), len(tgt_vocab)],
        "train": trained, "test": metrics, "alignments": alignments,
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
    })
    print(f"\n{'model':<14}{'params':>12}{'min':>7}{'BLEU':>7}{'no-UNK':>8}  by length "
          f"{[f'{lo}-' for lo in (0, *BUCKET_EDGES)]}")
    for name, m in metrics.items():
        t = trained[name]
        by_len = " ".join(f"{b['bleu'] if b['bleu'] is not None else '-':>5}"
                          for b in m["bleu_by_length"])
        print(f"{name:<14}{t['parameters']:>12,}{t['train_seconds'] / 60:>7.1f}{m['bleu']:>7.2f}"
              f"{m['bleu_no_unk'] if m['bleu_no_unk'] is not None else '-':>8}  {by_len}")
    print(f"signature: {next(iter(metrics.values()))['bleu_signature']}")
    print(f"results: {out / 'results.json'}; plots: {out}")


if __name__ == "__main__":
    main()
