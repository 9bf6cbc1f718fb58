"""The default job with and without a change, several seeds each, compared on val BLEU at equal
updates and on training time: how a change earns a place in the default job.

Each run is the default job (`bahdanau train`, 5 epochs: the same updates for every variant)
with `--seed S --threads N` and the variant's options, in its own folder `ROOT/NAME-seedS`; its
val BLEU is `bahdanau evaluate` of its checkpoint on Multi30k val (beam search as the default
job's). The first variant is the one the others are compared with. Test BLEU, which the default
job writes, is printed and chooses nothing.

Resumable: a finished run or evaluation is read back, not redone; an interrupted run resumes
(the same `bahdanau train` command continues it). Run it on a machine with nothing else to do
when the times matter; the val BLEU of a run does not depend on the machine's load beyond the
last bits that the thread count changes (`--threads` fixes it).

    python examples/benchmarks/default_job_variants.py --root runs/ln-default \\
        --variant plain "--no-layer-norm" --variant ln "--layer-norm"
    python examples/benchmarks/default_job_variants.py --root runs/ln-default --dry-run \\
        --variant plain "--no-layer-norm" --variant ln "--layer-norm"      # commands only
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from bahdanau.data import multi30k_files


def run_one(root: Path, name: str, seed: int, *, threads: int, train_options: list[str],
            evaluate_options: list[str], max_steps: int = 0, dry_run: bool = False
            ) -> dict | None:
    """Train and evaluate one run of the default job (its commands printed as they start), or
    read back what is done: {variant, seed, updates, train_minutes, val_bleu, test_bleu}.
    None on a dry run."""
    out = root / f"{name}-seed{seed}"
    machine = ["--threads", str(threads), "--device", "cpu"]
    train = [sys.executable, "-m", "bahdanau", "train", "--out", str(out), "--seed", str(seed),
             *machine, *(["--max-steps", str(max_steps)] if max_steps else []), *train_options]
    evaluate = [sys.executable, "-m", "bahdanau", "evaluate", "--checkpoint", str(out),
                "--src", str(multi30k_files("val", "en")),
                "--ref", str(multi30k_files("val", "fr")), *machine, *evaluate_options,
                "--output", str(out / "val.hyp.txt"), "--json", str(out / "val.json")]
    for done, command in ((out / "metrics.json", train), (out / "val.json", evaluate)):
        if done.is_file():
            continue
        print(shlex.join(command), flush=True)
        if not dry_run:
            subprocess.run(command, check=True)
    if dry_run:
        return None
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    val = json.loads((out / "val.json").read_text(encoding="utf-8"))
    return {"variant": name, "seed": seed, "updates": metrics["updates"],
            "train_minutes": metrics["train_minutes"], "val_bleu": val["bleu"],
            "test_bleu": metrics["bleu"]}


def print_runs(rows: list[dict]) -> None:
    """One line a run: its variant, seed, updates, training minutes, val and test BLEU."""
    width = 1 + max(len(row["variant"]) for row in rows)
    for row in rows:
        print(f"{row['variant']:>{width}} seed {row['seed']}: {row['updates']} updates, "
              f"{row['train_minutes']:.1f} min, val BLEU {row['val_bleu']:.2f}, "
              f"test BLEU {row['test_bleu']:.2f}")


def means(rows: list[dict], name: str) -> dict:
    """A variant's mean val BLEU and training minutes over its seeds."""
    mine = [row for row in rows if row["variant"] == name]
    return {key: statistics.mean(row[key] for row in mine) for key in ("val_bleu", "train_minutes")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="one folder per run here")
    parser.add_argument("--variant", nargs=2, action="append", required=True,
                        metavar=("NAME", "OPTIONS"),
                        help="a variant's name and its `bahdanau train` options, quoted as one "
                             "argument (\"\" for none); the first is the baseline")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=0,
                        help="updates a run (0: the default job's 5 epochs)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--json", help="also write the runs and the comparison here")
    args = parser.parse_args()
    names = [name for name, _ in args.variant]
    if len(set(names)) != len(names) or len(names) < 2:
        parser.error("give at least two --variant, each with its own name")
    rows = [row for seed in args.seeds for name, options in args.variant
            if (row := run_one(Path(args.root), name, seed, threads=args.threads,
                               train_options=shlex.split(options), evaluate_options=[],
                               max_steps=args.max_steps, dry_run=args.dry_run)) is not None]
    if args.dry_run:
        return
    print_runs(rows)
    base = means(rows, names[0])
    width = 1 + max(map(len, names))
    comparison = {}
    for name in names:
        mine = means(rows, name)
        comparison[name] = {"val_bleu": round(mine["val_bleu"], 2),
                            "val_bleu_gained": round(mine["val_bleu"] - base["val_bleu"], 2),
                            "time_ratio": round(mine["train_minutes"] / base["train_minutes"], 3)}
        print(f"{name:>{width}}: mean val BLEU {mine['val_bleu']:.2f} "
              f"({comparison[name]['val_bleu_gained']:+.2f}), training time "
              f"{comparison[name]['time_ratio']:.3f}x {names[0]}'s "
              f"({len(args.seeds)} seeds, equal updates: {len({r['updates'] for r in rows}) == 1})")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "comparison": comparison}) + "\n",
                                   encoding="utf-8")


if __name__ == "__main__":
    main()
