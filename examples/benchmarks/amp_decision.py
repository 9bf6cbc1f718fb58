"""Whether `--amp auto` should take bf16 on this machine: the default job in float32 and in bf16,
three seeds each, compared on val BLEU at equal updates and on speed.

Each run is the default job (`bahdanau train`, 5 epochs: the same updates in both precisions)
with `--seed S --amp {none,bf16} --threads N`, in its own folder under `--root`; its val BLEU
is `bahdanau evaluate` of its checkpoint on Multi30k val in the precision it trained in (what
`--amp auto` would give a user): `default_job_variants.py`'s runs, of two variants. The
decision (`bahdanau.training.precision`): bf16 is adopted on this machine's bf16 unit when its
mean val BLEU is within `QUALITY_MARGIN` (0.3) of float32's and its training took less time;
the script prints the `Decision` to record in `AUTO_BF16`.

Resumable: a finished run or evaluation is read back, not redone; an interrupted run resumes
(the same `bahdanau train` command continues it). Six runs take about as long as six default
jobs; run it on a machine with nothing else to do, as the times are compared.

    python examples/benchmarks/amp_decision.py --root runs/amp-decision
    python examples/benchmarks/amp_decision.py --root runs/amp-decision --dry-run   # commands
    python examples/benchmarks/amp_decision.py --root runs/amp-check --max-steps 200  # a try
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from default_job_variants import means, print_runs, run_one

from bahdanau.training.precision import QUALITY_MARGIN, bf16_unit

PRECISIONS = ("none", "bf16")


def decide(rows: list[dict]) -> dict:
    """The comparison and the verdict of `bahdanau.training.precision`'s rule."""
    mean = {amp: means(rows, amp) for amp in PRECISIONS}
    updates = {r["updates"] for r in rows}
    loss = mean["none"]["val_bleu"] - mean["bf16"]["val_bleu"]
    speed = mean["none"]["train_minutes"] / mean["bf16"]["train_minutes"]
    adopt = len(updates) == 1 and loss <= QUALITY_MARGIN and speed > 1
    return {"unit": bf16_unit(torch.device("cpu")), "equal_updates": len(updates) == 1,
            "val_bleu_float32": round(mean["none"]["val_bleu"], 2),
            "val_bleu_bf16": round(mean["bf16"]["val_bleu"], 2), "val_bleu_lost": round(loss, 2),
            "bf16_speedup": round(speed, 3), "adopt_bf16": adopt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="runs/amp-decision", help="one folder per run here")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=0,
                        help="updates a run (0: the default job's 5 epochs)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--json", help="also write the runs and the decision here")
    args = parser.parse_args()
    if bf16_unit(torch.device("cpu")) is None and not args.dry_run:
        parser.error("this CPU has no native bf16 (avx512_bf16 or AMX): --amp auto is float32 "
                     "here whatever the runs say")
    rows = [row for seed in args.seeds for amp in PRECISIONS
            if (row := run_one(Path(args.root), amp, seed, threads=args.threads,
                               train_options=["--amp", amp], evaluate_options=["--amp", amp],
                               max_steps=args.max_steps, dry_run=args.dry_run)) is not None]
    if args.dry_run:
        return
    print_runs(rows)
    decision = decide(rows)
    print(json.dumps(decision))
    evidence = (f"val BLEU {decision['val_bleu_bf16']} against {decision['val_bleu_float32']} "
                f"at equal updates ({len(args.seeds)} seeds), training "
                f"{decision['bf16_speedup']}x float32's speed (amp_decision.py)")
    summary = ("measured faster at equal quality" if decision["adopt_bf16"]
               else "measured no better")
    print(f'record in AUTO_BF16: "{decision["unit"]}": '
          f'Decision({decision["adopt_bf16"]}, "{summary}", "{evidence}"),')
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "decision": decision}) + "\n",
                                   encoding="utf-8")


if __name__ == "__main__":
    main()
