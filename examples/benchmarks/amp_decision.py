"""Whether `--amp auto` should take bf16 on this machine: the default job in float32 and in bf16,
three seeds each, compared on val BLEU at equal updates and on speed.

Each run is the default job (`bahdanau train`, 5 epochs: the same updates in both precisions)
with `--seed S --amp {none,bf16} --threads N`, in its own folder under `--root`; its val BLEU
is `bahdanau evaluate` of its checkpoint on Multi30k val in the precision it trained in (what
`--amp auto` would give a user). The decision (`bahdanau.training.precision`): bf16 is adopted
on this machine's bf16 unit when its mean val BLEU is within `QUALITY_MARGIN` (0.3) of float32's
and its training took less time; the script prints the `Decision` to record in `AUTO_BF16`.

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
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from bahdanau.data import multi30k_files
from bahdanau.training.precision import QUALITY_MARGIN, bf16_unit

PRECISIONS = ("none", "bf16")


def train_command(args: argparse.Namespace, amp: str, seed: int, out: Path) -> list[str]:
    command = [sys.executable, "-m", "bahdanau", "train", "--out", str(out), "--seed", str(seed),
               "--amp", amp, "--threads", str(args.threads), "--device", "cpu"]
    return command + (["--max-steps", str(args.max_steps)] if args.max_steps else [])


def evaluate_command(args: argparse.Namespace, amp: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "bahdanau", "evaluate", "--checkpoint", str(out),
            "--src", str(multi30k_files("val", "en")), "--ref", str(multi30k_files("val", "fr")),
            "--amp", amp, "--threads", str(args.threads), "--device", "cpu",
            "--output", str(out / "val.hyp.txt"), "--json", str(out / "val.json")]


def run_one(args: argparse.Namespace, amp: str, seed: int) -> dict | None:
    """Train and evaluate one run, or read back what is done; None on a dry run."""
    out = Path(args.root) / f"{amp}-seed{seed}"
    steps = [(out / "metrics.json", train_command(args, amp, seed, out)),
             (out / "val.json", evaluate_command(args, amp, out))]
    for done, command in steps:
        if done.is_file():
            continue
        print(" ".join(command), flush=True)
        if not args.dry_run:
            subprocess.run(command, check=True)
    if args.dry_run:
        return None
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    val = json.loads((out / "val.json").read_text(encoding="utf-8"))
    return {"amp": amp, "seed": seed, "updates": metrics["updates"],
            "train_minutes": metrics["train_minutes"], "val_bleu": val["bleu"],
            "test_bleu": metrics["bleu"]}


def decide(rows: list[dict]) -> dict:
    """The comparison and the verdict of `bahdanau.training.precision`'s rule."""
    mean = {amp: {key: statistics.mean(r[key] for r in rows if r["amp"] == amp)
                  for key in ("val_bleu", "train_minutes")} for amp in PRECISIONS}
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
            if (row := run_one(args, amp, seed)) is not None]
    if args.dry_run:
        return
    for row in rows:
        print(f"{row['amp']:>5} seed {row['seed']}: {row['updates']} updates, "
              f"{row['train_minutes']:.1f} min, val BLEU {row['val_bleu']:.2f}, "
              f"test BLEU {row['test_bleu']:.2f}")
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
