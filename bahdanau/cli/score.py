"""`bahdanau score`: how likely a checkpoint finds given translations (forced decoding).

Writes one line per sentence pair, tab-separated: log p(Y | X) (eos included, as the search's
`log_prob`), the score the search would rank Y by under --length-penalty/--alpha (its `score`),
and |Y|, the target's tokens plus eos. `bahdanau.evaluate.score_corpus` does the work.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bahdanau.checkpoint.reader import find_checkpoint
from bahdanau.evaluate import ForcedScore, score_corpus
from bahdanau.jobs.files import (
    check_outputs,
    existing,
    read_aligned,
    stdout_as_dash,
    to_stdout,
    write_text,
)
from bahdanau.jobs.options import ScoreOptions
from bahdanau.jobs.resolve import autocast, machine
from bahdanau.translate import load


def score_lines(scores: list[ForcedScore]) -> str:
    """The text `bahdanau score` writes: ``log_prob<TAB>score<TAB>n_tokens`` per sentence."""
    return "".join(f"{s.log_prob:.6f}\t{s.score:.6f}\t{s.n_tokens}\n" for s in scores)


def score(o: ScoreOptions) -> int:
    """`bahdanau score`: every input checked (files, line counts, empty lines) before scoring."""
    o = stdout_as_dash(o, "output")
    device = machine(o)
    precision = autocast(o.amp, device)
    src, tgt = existing(o.src, "--src"), existing(o.tgt, "--tgt")
    checkpoint = find_checkpoint(o.checkpoint, "--checkpoint")
    check_outputs({"--output": o.output}, {"--src": src, "--tgt": tgt, "--checkpoint": checkpoint})
    sources, targets = read_aligned(src, tgt, flags=("--src", "--tgt"),
                                    needed=("a sentence to score", "a sentence to score"))
    t = load(checkpoint, device=device, trust_code=o.trust_code)
    with precision:
        scores = score_corpus(t.model, sources, targets, t.src_vocab, t.tgt_vocab, t.tokenizer,
                              batch_size=o.batch_size, length_penalty=o.length_penalty,
                              alpha=o.alpha, device=device)
    text = score_lines(scores)
    if o.output:
        write_text(Path(o.output), text)
    else:
        with to_stdout():
            sys.stdout.write(text)
            sys.stdout.flush()
    return 0
