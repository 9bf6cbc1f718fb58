"""Grapheme-to-phoneme conversion on CMUdict: a word's letters in, its phonemes out.

The data is a folder of ``train.tsv`` and ``dev.tsv`` (``word<TAB>phones`` per line, phones
space-separated ARPAbet with stress digits 0/1/2; a word with several pronunciations has several
lines), e.g. a split of the CMU Pronouncing Dictionary made as its README says. The recipe never
copies it anywhere: it reads the folder given on its command line.

``train`` trains an RNNsearch of the `bahdanau.presets.g2p` sizes with bahdanau's trainer
(`bahdanau.training.train`): characters in (`bahdanau.CharTokenizer`), whitespace-separated
phonemes out (`bahdanau.WhitespaceTokenizer`), the two stored together in every checkpoint as a
`bahdanau.TokenizerPair`. The stress digits are stripped (39 phonemes) unless --keep-stress.
--dropout, --dropout-rnn-inputs and --dropout-deep-output are the model's three dropouts
(`bahdanau.ModelConfig`; 0.2, 0 and 0 by default), --label-smoothing the training loss's
(`bahdanau.TrainConfig`; 0.1 by default), --decoder its decoder form (the paper's by default,
or cgru: Nematus' conditional GRU), --layer-norm layer-normalises its GRU cells (off by
default), --encoder-layers stacks bidirectional layers in its encoder (1 by default), and
--ema-decay D keeps a moving average of the weights, which the dev evaluations
score and the checkpoints translate with (`bahdanau.TrainConfig`; none by default). Every
pronunciation of a training word is a training pair. Every --eval-every updates the dev words
are decoded greedily and scored (`bahdanau.error_rates`: a word is right when its output equals
any of its pronunciations); the checkpoint of the lowest dev WER is RUN/checkpoints/best.pt.
Adam's learning rate (--lr, 1e-3) halves after every two evaluations without a better dev WER
(--schedule plateau); --schedule linear makes it fall in a straight line to 0 at the run's last
update instead. The run is --max-steps updates (60,000, about 50 minutes on an idle 2-core
CPU), so its result does not depend on the machine's load; --minutes (60) caps the training
time on a slower or busier machine. The same command resumes a run where it stopped
(`bahdanau.training` restores the weights, the optimizer, the batch order and the clock), so a
run cut short loses at most the updates since its last checkpoint.

``evaluate`` decodes the words of a TSV file of the same format with beam 5 and writes
``{"wer": ..., "per": ..., "words": ...}`` (percentages; PER is the summed edit distance to each
word's closest pronunciation over those pronunciations' summed lengths). Whether stress is kept
follows the model: a model whose phonemes carry digits is scored against the stressed
references. Several --checkpoint decode as one ensemble (`bahdanau.Ensemble`: their next-phoneme
distributions averaged), e.g. the runs of two seeds.

Usage, from the repository root::

    python examples/g2p/cmudict.py train --data ../shared/data/cmudict --out runs/g2p
    python examples/g2p/cmudict.py evaluate --checkpoint runs/g2p \\
        --tsv ../shared/data/cmudict/dev.tsv --json runs/g2p/dev.json

A quick check of the whole recipe on a slice: ``train ... --limit 2000 --dev-limit 200
--max-steps 100 --eval-every 50``. docs/guides/characters.md shows the recipe, its numbers and
an alignment of a word to its phonemes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import typing
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from bahdanau import (
    BeamSearch,
    CharTokenizer,
    ModelConfig,
    TokenizerPair,
    TrainConfig,
    Vocab,
    WhitespaceTokenizer,
    build_model,
    encode_pairs,
    load,
    presets,
    translate_corpus,
)
from bahdanau.checkpoint import find_checkpoint
from bahdanau.config import DecoderKind
from bahdanau.data import sides
from bahdanau.error_rates import error_rates, group_references, read_reference_tsv
from bahdanau.errors import InputError
from bahdanau.jobs.files import existing
from bahdanau.jobs.flags import NONE
from bahdanau.settings import declared
from bahdanau.training import train

BEAM_SIZE = 5            # evaluate's beam
MAX_PHONEMES = 40        # the longest output searched for (CMUdict's longest word has 20-odd)
DECAY_PATIENCE = 2       # evaluations without a better dev WER before the learning rate halves
# The regularisers, with the recipe's defaults; each is the option of its name, declared and
# described by its config: the model's three dropouts, and the training loss's label smoothing.
DROPOUTS = {"dropout": 0.2, "dropout_rnn_inputs": 0.0, "dropout_deep_output": 0.0}
LOSS = {"label_smoothing": 0.1}     # chosen on dev: docs/guides/characters.md
DECODER = "paper"                   # the decoder form (--decoder)
LAYER_NORM = False                  # layer-normalised GRU cells (--layer-norm)
ENCODER_LAYERS = 1                  # bidirectional layers of the encoder (--encoder-layers)
EMA_DECAY = None                    # a moving average of the weights (--ema-decay)
SCHEDULE = "plateau"                # the learning rate's schedule (--schedule)
LEARNING_RATE = 1e-3                # Adam's (--lr)


def _decay(text: str) -> float | None:
    """--ema-decay's value: a number, or "none" for no average."""
    return None if text == NONE else float(text)


def _count(text: str) -> int:
    """The value of --limit, --dev-limit and --threads: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def strip_stress(phones: str) -> str:
    """ARPAbet without its stress digits: "K AE1 T" -> "K AE T"."""
    return " ".join(phone.rstrip("012") for phone in phones.split())


def read_pairs(path: Path, *, keep_stress: bool, limit: int | None = None
               ) -> tuple[list[str], list[str]]:
    """The (words, pronunciations) of a ``word<TAB>phones`` file, one pair a line, stress
    stripped unless `keep_stress`; with `limit`, the lines of its first `limit` words."""
    words, phones = read_reference_tsv(path)
    if not keep_stress:
        phones = [strip_stress(p) for p in phones]
    if limit is not None:
        kept = set(list(dict.fromkeys(words))[:limit])
        pairs = [(w, p) for w, p in zip(words, phones, strict=True) if w in kept]
        words, phones = [w for w, _ in pairs], [p for _, p in pairs]
    return words, phones


def _train(args: argparse.Namespace) -> dict[str, object]:
    data = Path(args.data)
    train_path = existing(str(data / "train.tsv"), "--data train.tsv", regular=True)
    dev_path = existing(str(data / "dev.tsv"), "--data dev.tsv", regular=True)
    words, phones = read_pairs(train_path, keep_stress=args.keep_stress, limit=args.limit)
    dev_words, dev_refs = read_pairs(dev_path, keep_stress=args.keep_stress,
                                     limit=args.dev_limit)
    tokenizer = TokenizerPair(CharTokenizer(), WhitespaceTokenizer())
    items, groups, _ = group_references(dev_words, dev_refs,
                                        tokenize=tokenizer.source.tokenize)
    src_vocab = Vocab.build(tokenizer.source.tokenize(w) for w in words)
    tgt_vocab = Vocab.build(tokenizer.target.tokenize(p) for p in phones)
    examples = encode_pairs(list(zip(words, phones, strict=True)), src_vocab, tgt_vocab,
                            tokenizer)
    config = replace(presets.g2p(len(src_vocab), len(tgt_vocab)), init="glorot",
                     decoder=args.decoder, layer_norm=args.layer_norm,
                     encoder_layers=args.encoder_layers,
                     **{name: getattr(args, name) for name in DROPOUTS})
    cfg = TrainConfig(optimizer="adam", lr=args.lr, schedule=args.schedule,
                      decay_patience=DECAY_PATIENCE,
                      batch_size=args.batch_size, eval_every=args.eval_every,
                      save_every=args.eval_every, early_stopping_metric="wer",
                      max_time_s=args.minutes * 60 if args.minutes else None,
                      max_steps=args.max_steps, seed=args.seed, ema_decay=args.ema_decay,
                      **{name: getattr(args, name) for name in LOSS})
    search = BeamSearch(beam_size=1, max_len=MAX_PHONEMES)

    def validate(model: torch.nn.Module) -> dict[str, float]:
        hyps = translate_corpus(model, items, src_vocab, tgt_vocab, tokenizer, search=search,
                                batch_size=256, progress=None)
        return error_rates([h.text for h in hyps], groups).as_dict()

    torch.manual_seed(args.seed)
    model = build_model(config)
    result = train(model, examples, cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                   checkpoint_dir=Path(args.out) / "checkpoints", validate=validate,
                   tokenizer=tokenizer, log=logging.getLogger("g2p").info,
                   extra={"g2p": {"keep_stress": args.keep_stress, "limit": args.limit}})
    return {"start_step": result.start_step, "step": result.step, "stopped": result.stopped,
            "best_dev_wer": result.best_metric, "best_step": result.best_step,
            "train_pairs": len(examples), "dev_words": len(items),
            "minutes": round(result.elapsed_s / 60, 2)}


def _evaluate(args: argparse.Namespace) -> dict[str, object]:
    tsv = existing(args.tsv, "--tsv", regular=True)
    translator = load([find_checkpoint(given, "--checkpoint") for given in args.checkpoint])
    keep_stress = any(phone[-1:].isdigit() for phone in translator.tgt_vocab.tokens)
    words, refs = read_pairs(tsv, keep_stress=keep_stress)
    items, groups, _ = group_references(words, refs,
                                        tokenize=sides(translator.tokenizer)[0].tokenize)
    start = time.perf_counter()
    hyps = translate_corpus(translator.model, items, translator.src_vocab, translator.tgt_vocab,
                            translator.tokenizer,
                            search=BeamSearch(beam_size=BEAM_SIZE, max_len=MAX_PHONEMES),
                            batch_size=256, progress=None)
    seconds = time.perf_counter() - start
    rates = error_rates([h.text for h in hyps], groups)
    report: dict[str, object] = {"wer": round(rates.wer, 2), "per": round(rates.per, 2),
                                 "words": rates.items, "beam_size": BEAM_SIZE,
                                 "models": len(args.checkpoint),
                                 "decode_seconds": round(seconds, 1),
                                 "keep_stress": keep_stress}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train", help="train (or resume) a G2P model")
    t.add_argument("--data", required=True, help="folder of train.tsv and dev.tsv")
    t.add_argument("--out", required=True, help="the run folder (its checkpoints/ resume)")
    t.add_argument("--keep-stress", action="store_true", help="keep the stress digits")
    t.add_argument("--max-steps", type=int, default=60_000,
                   help="updates of the run (default 60,000)")
    t.add_argument("--minutes", type=float, default=60.0,
                   help="cap on the training time, resumed runs included (default 60; 0: none)")
    t.add_argument("--eval-every", type=int, default=2000,
                   help="updates between dev evaluations and checkpoints")
    t.add_argument("--batch-size", type=int, default=64, help="words a batch")
    helps = {field.name: spec.help for config in (ModelConfig, TrainConfig)
             for field, _, spec in declared(config)}
    for name, default in {**DROPOUTS, **LOSS}.items():
        t.add_argument("--" + name.replace("_", "-"), type=float, default=default,
                       help=f"{helps[name]} (default {default:g})")
    t.add_argument("--decoder", choices=typing.get_args(DecoderKind), default=DECODER,
                   help=f"{helps['decoder']} (default {DECODER})")
    t.add_argument("--layer-norm", action=argparse.BooleanOptionalAction, default=LAYER_NORM,
                   help=f"{helps['layer_norm']} (default {'on' if LAYER_NORM else 'off'})")
    t.add_argument("--encoder-layers", type=_count, default=ENCODER_LAYERS,
                   help=f"{helps['encoder_layers']} (default {ENCODER_LAYERS})")
    t.add_argument("--schedule", choices=("plateau", "linear"), default=SCHEDULE,
                   help=f"{helps['schedule']} (default {SCHEDULE})")
    t.add_argument("--lr", type=float, default=LEARNING_RATE,
                   help=f"Adam's learning rate (default {LEARNING_RATE:g})")
    t.add_argument("--ema-decay", type=_decay, default=EMA_DECAY,
                   help=f"{helps['ema_decay']} (default {EMA_DECAY or NONE})")
    t.add_argument("--limit", type=_count, default=None, help="train on the first N words only")
    t.add_argument("--dev-limit", type=_count, default=None, help="score the first N dev words")
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--threads", type=_count, default=2, help="torch threads")
    e = commands.add_parser("evaluate", help="WER and PER of a model, beam 5")
    e.add_argument("--checkpoint", required=True, nargs="+",
                   help="a checkpoint, or a run folder; several decode as an ensemble")
    e.add_argument("--tsv", required=True, help="word<TAB>phones lines to score")
    e.add_argument("--json", required=True, help="where the scores go")
    e.add_argument("--threads", type=_count, default=2, help="torch threads")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads)
    try:
        report = _train(args) if args.command == "train" else _evaluate(args)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
