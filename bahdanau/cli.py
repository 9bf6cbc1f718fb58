"""The `bahdanau` command: train, translate, evaluate, plot.

`bahdanau train` with no options is the default job: a small RNNsearch trained on the shipped
Multi30k English->French data within a time budget, then evaluated on test_2016_flickr (BLEU with
sacrebleu's signature, BLEU without [UNK], BLEU by length), with translations and an alignment
plot written to the output folder. Every failure a user can cause (bad option, missing file,
corrupt checkpoint) ends with one `bahdanau: error: ...` line and exit status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from bahdanau import presets
from bahdanau.checkpoint import (
    CheckpointManager,
    load_checkpoint,
    model_from_checkpoint,
    upgrade_payload,
)
from bahdanau.data import DefaultTokenizer, Vocab, encode_pairs, read_parallel
from bahdanau.datasets import multi30k_files, read_lines
from bahdanau.errors import InputError
from bahdanau.evaluate import corpus_bleu, score_test_set, translate_corpus
from bahdanau.models import build_model
from bahdanau.plot import PlotDependencyError
from bahdanau.search import BeamSearch
from bahdanau.train import TrainConfig, train

PRESETS = ("tiny", "small", "rnnsearch_50")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:                   # one line, no usage dump
        self.exit(2, f"bahdanau: error: {message} (see '{self.prog} --help')\n")


class UsageError(InputError):
    """A problem with the command line or its files, reported as one line."""


def _search_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam-size", type=int, default=5, help="beam width; 1 is greedy (default 5)")
    p.add_argument("--max-len", type=int, default=100, help="most target tokens (default 100)")
    p.add_argument("--max-len-ratio", type=float, default=None,
                   help="also cap target length at RATIO x source length")
    p.add_argument("--min-len", type=int, default=1, help="fewest target tokens (default 1)")
    p.add_argument("--length-penalty", choices=["none", "average", "gnmt"], default="none",
                   help="length normalisation of scores (default none, as in the paper)")
    p.add_argument("--alpha", type=float, default=0.6, help="exponent of the gnmt penalty")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default 64)")
    p.add_argument("--unk-replace", action="store_true",
                   help="replace generated <unk> by the most attended source word "
                        "(an extension beyond the paper)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `bahdanau` command."""
    parser = _Parser(prog="bahdanau", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train a model, then evaluate it on the test set",
                       description="Train RNNsearch/RNNencdec and evaluate it. Without options: "
                       "the default job on the shipped Multi30k en->fr data.")
    t.add_argument("--src-lang", default="en", help="source language of the shipped data")
    t.add_argument("--tgt-lang", default="fr", help="target language of the shipped data")
    for split in ("train", "dev", "test"):
        t.add_argument(f"--{split}-src", help=f"{split} source file (default: shipped Multi30k)")
        t.add_argument(f"--{split}-tgt", help=f"{split} target file (default: shipped Multi30k)")
    t.add_argument("--preset", choices=PRESETS, default="small",
                   help="model sizes (default small: E=256, H=256, D=512, A=512, maxout 256)")
    t.add_argument("--arch", choices=["rnnsearch", "rnnencdec"], default="rnnsearch")
    t.add_argument("--gru-form", choices=["torch", "paper"], default="torch")
    t.add_argument("--dropout", type=float, default=0.0)
    t.add_argument("--vocab-size", type=int, default=10000,
                   help="most frequent words kept per side (the paper: 30000; default 10000)")
    t.add_argument("--lowercase", action="store_true", help="lowercase both sides")
    t.add_argument("--max-train-len", type=int, default=50,
                   help="drop training pairs longer than this many tokens (default 50)")
    t.add_argument("--optimizer", choices=["adadelta", "adam"], default="adam",
                   help="adam (default: it converges within a short budget) or adadelta "
                        "(the paper: rho 0.95, eps 1e-6)")
    t.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 1e-3 for adam, 1.0 for adadelta)")
    t.add_argument("--train-batch-size", type=int, default=64, help="sentences per update")
    t.add_argument("--max-steps", type=int, default=None, help="stop after this many updates")
    t.add_argument("--max-epochs", type=int, default=None, help="stop after this many epochs")
    t.add_argument("--time-budget", type=float, default=12.0,
                   help="minutes of training (default 12; 0: no limit)")
    t.add_argument("--eval-every", type=int, default=0,
                   help="dev BLEU (greedy, --dev-size sentences) every N updates (0: never)")
    t.add_argument("--dev-size", type=int, default=500)
    t.add_argument("--patience", type=int, default=None,
                   help="stop after N dev evaluations without improvement")
    t.add_argument("--save-every", type=int, default=500, help="checkpoint every N updates")
    t.add_argument("--out", default="runs/multi30k-en-fr", help="output folder")
    t.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from the latest checkpoint in OUT (default: yes); "
                        "--no-resume needs an OUT without checkpoints")
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    t.add_argument("--device", default="cpu")
    t.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                   help="mixed precision (GPU)")
    t.add_argument("--log-every", type=int, default=100)
    _search_options(t)

    for name, helptext in (("translate", "translate stdin or a file to stdout"),
                           ("evaluate", "BLEU/chrF of a checkpoint on a test set"),
                           ("plot", "alignment heat map of one sentence")):
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.add_argument("--checkpoint", required=True,
                       help="a checkpoint file, or a training output folder (its best, else "
                            "latest checkpoint)")
        p.add_argument("--device", default="cpu")
        p.add_argument("--threads", type=int, default=2)
        _search_options(p)
        if name == "translate":
            p.add_argument("--input", help="source file (default: stdin)")
            p.add_argument("--n-best", type=int, default=1,
                           help="hypotheses per sentence; >1 prints 'i ||| text ||| score'")
            p.add_argument("--alignments", help="write JSON lines with tokens and weights here")
        elif name == "evaluate":
            p.add_argument("--src", required=True, help="source file")
            p.add_argument("--ref", required=True, help="reference file")
            p.add_argument("--output", help="write the translations here")
            p.add_argument("--json", help="write the scores here")
        else:
            p.add_argument("--sentence", help="the source sentence")
            p.add_argument("--input", help="a source file (with --line)")
            p.add_argument("--line", type=int, default=1, help="1-based line of --input")
            p.add_argument("--output", default="alignment.png", help="image file to write")
    return parser


# --------------------------------------------------------------------------------- helpers
def _existing(path: str | None, what: str) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} not found: {path}")
    return p


def _pairs(args: argparse.Namespace, split: str) -> list[tuple[str, str]]:
    src, tgt = getattr(args, f"{split}_src"), getattr(args, f"{split}_tgt")
    if (src is None) != (tgt is None):
        raise UsageError(f"give both --{split}-src and --{split}-tgt, or neither")
    if src is not None:
        return read_parallel(_existing(src, f"--{split}-src"), _existing(tgt, f"--{split}-tgt"))
    shipped = {"train": "train", "dev": "val", "test": "test_2016_flickr"}[split]
    return read_parallel(multi30k_files(shipped, args.src_lang),
                         multi30k_files(shipped, args.tgt_lang))


def _search(args: argparse.Namespace, n_best: int = 1) -> BeamSearch:
    return BeamSearch(beam_size=args.beam_size, n_best=n_best, max_len=args.max_len,
                      max_len_ratio=args.max_len_ratio, min_len=args.min_len,
                      length_penalty=args.length_penalty, alpha=args.alpha)


def _checkpoint_file(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        manager = CheckpointManager(p / "checkpoints" if (p / "checkpoints").is_dir() else p)
        found = manager.best() or manager.latest()
        if found is None:
            raise UsageError(f"no checkpoint in {path}")
        return found
    if not p.is_file():
        raise UsageError(f"checkpoint not found: {path}")
    return p


def _load(args: argparse.Namespace) -> tuple[torch.nn.Module, Vocab, Vocab, DefaultTokenizer]:
    payload = upgrade_payload(load_checkpoint(_checkpoint_file(args.checkpoint)))
    model, src_vocab, tgt_vocab = model_from_checkpoint(payload, device=args.device)
    settings = payload["extra"].get("tokenizer", {})
    return model, src_vocab, tgt_vocab, DefaultTokenizer(lowercase=settings.get("lowercase",
                                                                                False))


def _report(model, sources: list[str], references: list[str], src_vocab: Vocab, tgt_vocab: Vocab,
            tokenizer: DefaultTokenizer, args: argparse.Namespace, search: BeamSearch
            ) -> tuple[dict[str, Any], list]:
    start = time.perf_counter()
    out = translate_corpus(model, sources, src_vocab, tgt_vocab, tokenizer, search=search,
                           batch_size=args.batch_size, unk_replace=args.unk_replace,
                           device=args.device)
    seconds = time.perf_counter() - start
    metrics = score_test_set([t.text for t in out], sources, references, src_vocab, tgt_vocab,
                             tokenizer)
    metrics.update(beam_size=args.beam_size, decode_seconds=round(seconds, 2))
    return metrics, out


def _print_metrics(metrics: dict[str, Any]) -> None:
    print(f"BLEU {metrics['bleu']:.2f}  chrF {metrics['chrf']:.2f}  "
          f"({metrics['sentences']} sentences, beam {metrics['beam_size']}, "
          f"{metrics['decode_seconds']:.1f} s)")
    print(f"  {metrics['bleu_signature']}")
    no_unk = metrics["bleu_no_unk"]
    print(f"BLEU without [UNK]: {'-' if no_unk is None else f'{no_unk:.2f}'} "
          f"({metrics['sentences_no_unk']} sentences)")
    print("BLEU by source length:")
    for b in metrics["bleu_by_length"]:
        if b["sentences"]:
            span = f"{b['low']}-{b['high'] - 1}" if b["high"] is not None else f"{b['low']}+"
            print(f"  {span:>7} tokens: {b['bleu']:6.2f}  ({b['sentences']} sentences)")


def _plot_one(out_path: Path, translation, src_tokens: list[str]) -> str:
    from bahdanau.plot import PlotDependencyError, plot_alignment

    if translation.hypothesis.attention is None:
        return "no alignment plot: the model has no attention"
    label = DefaultTokenizer.display                           # drop the attachment mark
    try:
        plot_alignment(translation.hypothesis.attention, [label(t) for t in src_tokens],
                       [*map(label, translation.tokens), "</s>"], out_path)
    except PlotDependencyError as exc:
        return f"no alignment plot: {exc}"
    return f"alignment plot: {out_path}"


# --------------------------------------------------------------------------------- commands
def _train(args: argparse.Namespace) -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError("the train command runs one process; for several GPUs call "
                         "bahdanau.train.train under torchrun (docs/guides/multi-gpu.md)")
    search = _search(args)                                        # checked before any work
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = DefaultTokenizer(lowercase=args.lowercase)
    train_pairs, dev_pairs, test_pairs = (_pairs(args, s) for s in ("train", "dev", "test"))
    src_vocab = Vocab.build((tokenizer.tokenize(s) for s, _ in train_pairs),
                            max_size=args.vocab_size)
    tgt_vocab = Vocab.build((tokenizer.tokenize(t) for _, t in train_pairs),
                            max_size=args.vocab_size)
    examples = encode_pairs(train_pairs, src_vocab, tgt_vocab, tokenizer,
                            max_len=args.max_train_len)
    cfg = getattr(presets, args.preset)(len(src_vocab), len(tgt_vocab))
    cfg = replace(cfg, arch=args.arch, gru_form=args.gru_form, dropout=args.dropout)
    torch.manual_seed(args.seed)
    model = build_model(cfg).to(args.device)
    limits = [args.max_steps, args.max_epochs, args.time_budget or None]
    if all(x is None for x in limits):
        raise UsageError("set --max-steps, --max-epochs or a non-zero --time-budget")
    tcfg = TrainConfig(optimizer=args.optimizer, lr=args.lr, batch_size=args.train_batch_size,
                       max_steps=args.max_steps, max_epochs=args.max_epochs,
                       max_time_s=args.time_budget * 60 if args.time_budget else None,
                       eval_every=args.eval_every or 10**12, save_every=args.save_every,
                       patience=args.patience, amp=args.amp, log_every=args.log_every,
                       seed=args.seed)
    print(f"data: {len(examples)} training pairs (of {len(train_pairs)}), vocabularies "
          f"{len(src_vocab)} / {len(tgt_vocab)}; model {args.arch} ({args.preset}), "
          f"{sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
    dev_sources = [s for s, _ in dev_pairs[: args.dev_size]]
    dev_refs = [t for _, t in dev_pairs[: args.dev_size]]

    def validate(m: torch.nn.Module) -> float:
        hyps = translate_corpus(m, dev_sources, src_vocab, tgt_vocab, tokenizer,
                                search=BeamSearch(beam_size=1, max_len=args.max_len),
                                batch_size=args.batch_size, device=args.device)
        return corpus_bleu([h.text for h in hyps], dev_refs)

    result = train(model, examples, tcfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                   checkpoint_dir=out / "checkpoints", resume=args.resume,
                   validate=validate if args.eval_every else None,
                   log=lambda line: print(line, flush=True), device=args.device,
                   extra={"tokenizer": {"name": "default", "lowercase": args.lowercase}})
    print(f"trained {result.step} updates, stopped by {result.stopped}, "
          f"{result.elapsed_s / 60:.1f} min", flush=True)
    model.eval()
    sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
    metrics, translations = _report(model, sources, references, src_vocab, tgt_vocab, tokenizer,
                                    args, search)
    (out / "test.hyp.txt").write_text("".join(t.text + "\n" for t in translations),
                                      encoding="utf-8")
    pick = min(range(len(sources)), key=lambda i: abs(len(tokenizer.tokenize(sources[i])) - 12))
    plot_note = _plot_one(out / "alignment.png", translations[pick],
                          tokenizer.tokenize(sources[pick]))
    metrics.update(updates=result.step, train_minutes=round(result.elapsed_s / 60, 2),
                   wall_minutes=round((time.perf_counter() - start) / 60, 2),
                   arch=args.arch, preset=args.preset)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    _print_metrics(metrics)
    print(f"translations: {out / 'test.hyp.txt'}; {plot_note}; metrics: {out / 'metrics.json'}")
    print(f"total wall time {metrics['wall_minutes']:.1f} min")


def _translate(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    model, src_vocab, tgt_vocab, tokenizer = _load(args)
    if args.n_best > args.beam_size:
        raise UsageError(f"--n-best ({args.n_best}) cannot exceed --beam-size ({args.beam_size})")
    path = _existing(args.input, "--input")
    lines = read_lines(path) if path else sys.stdin.read().splitlines()
    out = translate_corpus(model, lines, src_vocab, tgt_vocab, tokenizer,
                           search=_search(args, args.n_best), batch_size=args.batch_size,
                           unk_replace=args.unk_replace, device=args.device)
    for i, t in enumerate(out):
        if args.n_best == 1:
            print(t.text)
        else:
            for hyp in t.nbest:
                text = tokenizer.detokenize(tgt_vocab.decode(hyp.tokens))
                print(f"{i} ||| {text} ||| {hyp.score:.4f}")
    if args.alignments:
        with open(args.alignments, "w", encoding="utf-8") as f:
            for line, t in zip(lines, out, strict=True):
                att = t.hypothesis.attention
                f.write(json.dumps({"source": tokenizer.tokenize(line),
                                    "target": [*t.tokens, "</s>"],
                                    "weights": None if att is None else
                                    [[round(float(x), 5) for x in row] for row in att]}) + "\n")


def _evaluate(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    model, src_vocab, tgt_vocab, tokenizer = _load(args)
    sources = read_lines(_existing(args.src, "--src"))
    references = read_lines(_existing(args.ref, "--ref"))
    if len(sources) != len(references):
        raise UsageError(f"--src has {len(sources)} lines but --ref has {len(references)}")
    metrics, out = _report(model, sources, references, src_vocab, tgt_vocab, tokenizer, args,
                           _search(args))
    _print_metrics(metrics)
    if args.output:
        Path(args.output).write_text("".join(t.text + "\n" for t in out), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


def _plot(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    if (args.sentence is None) == (args.input is None):
        raise UsageError("give --sentence or --input (with --line), not both")
    sentence = args.sentence
    if sentence is None:
        lines = read_lines(_existing(args.input, "--input"))
        if not 1 <= args.line <= len(lines):
            raise UsageError(f"--line {args.line} is outside {args.input} (1..{len(lines)})")
        sentence = lines[args.line - 1]
    model, src_vocab, tgt_vocab, tokenizer = _load(args)
    [translation] = translate_corpus(model, [sentence], src_vocab, tgt_vocab, tokenizer,
                                     search=_search(args), unk_replace=args.unk_replace,
                                     device=args.device)
    note = _plot_one(Path(args.output), translation, tokenizer.tokenize(sentence))
    print(translation.text)
    if not note.startswith("alignment plot"):
        raise UsageError(note)
    print(note)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bahdanau` console script and `python -m bahdanau`."""
    args = build_parser().parse_args(argv)
    command = {"train": _train, "translate": _translate, "evaluate": _evaluate, "plot": _plot}
    try:
        command[args.command](args)
    except (InputError, OSError, PlotDependencyError) as exc:
        print(f"bahdanau: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bahdanau: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
