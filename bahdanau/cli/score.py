"""`bahdanau score`: how likely a checkpoint finds given translations (forced decoding).

Writes one line per sentence pair, tab-separated: log p(Y | X) (eos included, as the search's
`log_prob`), the score the search would rank Y by under --length-penalty/--alpha (its `score`),
and |Y|, the target's tokens plus eos. `bahdanau.evaluate.score_corpus` does the work.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bahdanau.checkpoint.manager import find_checkpoint
from bahdanau.data.text import read_lines
from bahdanau.errors import InputError
from bahdanau.evaluate import ForcedScore, score_corpus
from bahdanau.jobs.files import check_outputs, existing, stdout_as_dash, write_text
from bahdanau.jobs.options import ScoreOptions
from bahdanau.jobs.resolve import machine
from bahdanau.translate import load


def score_lines(scores: list[ForcedScore]) -> str:
    """The text `bahdanau score` writes: ``log_prob<TAB>score<TAB>n_tokens`` per sentence."""
    return "".join(f"{s.log_prob:.6f}\t{s.score:.6f}\t{s.n_tokens}\n" for s in scores)


def score(o: ScoreOptions) -> int:
    """`bahdanau score`: every input checked (files, line counts, empty lines) before scoring."""
    o = stdout_as_dash(o, "output")
    device = machine(o)
    src, tgt = existing(o.src, "--src"), existing(o.tgt, "--tgt")
    checkpoint = find_checkpoint(o.checkpoint, "--checkpoint")
    check_outputs({"--output": o.output}, {"--src": src, "--tgt": tgt, "--checkpoint": checkpoint})
    sources, targets = read_lines(src, non_empty=True), read_lines(tgt, non_empty=True)
    if len(sources) != len(targets):
        raise InputError(f"--src has {len(sources)} lines but --tgt has {len(targets)}")
    for what, path, lines in (("--src", src, sources), ("--tgt", tgt, targets)):
        empty = next((i for i, line in enumerate(lines, 1) if not line.strip()), None)
        if empty is not None:
            raise InputError(f"{what} {path}: line {empty} is empty; every line needs a "
                             "sentence to score")
    t = load(checkpoint, device=device)
    scores = score_corpus(t.model, sources, targets, t.src_vocab, t.tgt_vocab, t.tokenizer,
                          batch_size=o.batch_size, length_penalty=o.length_penalty,
                          alpha=o.alpha, device=device)
    text = score_lines(scores)
    if o.output:
        write_text(Path(o.output), text)
    else:
        sys.stdout.write(text)
    return 0
