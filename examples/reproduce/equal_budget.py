"""Quality at equal training wall time: our default job against OpenNMT-py.

One call runs ONE measurement and appends one JSON line to a results table
(``examples/reproduce/results/equal_budget.jsonl``); a measurement already in the table is
skipped, so a long comparison can stop and resume at any point (``--force`` redoes one; redoing
a training run overwrites its folder, so redo the decode-only settings on it with ``--force`` too).

Protocol
--------
* Data: Multi30k en->fr. Training = train (29,000 pairs), dev = val (1,014), test =
  test_2016_flickr (1,000). Ours trains on the shipped copy (bahdanau/_data/multi30k, identical to
  ../shared/data/multi30k) with its own tokenizer; OpenNMT-py reads the same files Moses-tokenised
  by the peer harness's ``prepare_multi30k.py`` (done here on first use).
* OpenNMT-py runs through the peer harness, by path (``--peers-bench``, default
  ../shared/peers-bench; it is not part of this repository): ``run_opennmt.sh`` with
  ``WARMUP`` + ``MEASURE`` = ``--updates`` updates, ``SEED`` = the seed, its fixed comparable
  configuration (GRU bi-encoder 2x256, decoder 512, MLP attention, 10k vocabularies, Adam 1e-3,
  batch 64 sentences, clip 1, no dropout, training pairs up to 80 tokens), then beam-5 (and
  greedy) decoding of the test set. Its training wall time is the train phase's wall clock
  (GNU time, ``process_wall_s_train`` of its summary.json: interpreter start, data, vocabulary
  loading, all updates, the final checkpoint); ``onmt_build_vocab`` (a few seconds) runs before
  it, untimed by the harness, and is recorded separately (``build_vocab_s``).
* Ours: ``python -m bahdanau train`` (the default job with ``--label-smoothing 0``, as OpenNMT-py
  here, plus the setting's flags). Its training wall time is measured here the same way: from
  starting the process to the ``trained N updates`` line (after the last checkpoint is
  written), i.e. start-up, data loading, vocabularies and dev evaluations included, test
  decoding excluded. ``--time-budget`` only counts the training loop, so it is set to the
  target wall time minus the start-up overhead (``--overhead-s``; by default the median
  overhead of our earlier runs in the table, else 5 s). The protocol asks for our
  training wall time within +-3 % of OpenNMT-py's: ``ours --match-opennmt UPDATES`` aims at the
  mean training wall time of the OpenNMT-py runs with that many updates in the table, and prints
  and records the difference (``wall_vs_opennmt_pct``).
* Scoring, identical for both sides: sacrebleu corpus BLEU (13a, default settings) and chrF on
  detokenised output against the RAW references (../shared/data/multi30k/{val,
  test_2016_flickr}.fr.gz), with the brevity penalty and the hypothesis/reference length ratio.
  Our hypotheses are already detokenised text; OpenNMT-py's are detokenised with sacremoses
  (``MosesDetokenizer('fr')``, run with a python that has sacremoses: ``--moses-python``,
  default the peer harness's joeynmt venv). Dev BLEU: beam 5 on val, both sides (OpenNMT-py via
  ``onmt_translate`` on the Moses-tokenised val.en with the harness's decoding flags).
* Settings (``SETTINGS`` below): a training setting is a list of ``bahdanau train`` flags; a
  decode-only setting names a ``base`` training setting and re-decodes dev and test from that
  run's final checkpoint (``bahdanau evaluate``) with other search flags, without retraining.
  Decode-only settings with ``opennmt`` flags can also re-decode OpenNMT-py's checkpoint.
  Decisions are taken on dev BLEU, never on test.
* Seeds: ``SEEDS``, fixed before running. Runs go one at a time on an otherwise idle machine:
  before training, ours waits until other processes use < 15 % of the CPUs (at most
  ``--idle-wait-max`` s), and records the load average, a GEMM canary (peer harness's
  ``cpu_canary.py``) before and after, and the share of the machine other processes used while
  it trained; above 10 % the record is flagged ``contended`` and the table leaves it out (rerun it
  with ``--force``). The peer harness does the same for its phases (``IDLE_WAIT_MAX``,
  ``ATTEMPTS``, ``CONTENTION_PCT``).

How to run the whole comparison (from the repository root, on an idle machine)
--------------------------------------------------------------------------------
Once: ``PEERS_DIR=$HOME/.cache/bahdanau-peers bash ../shared/peers-bench/setup.sh``. Then, for a
budget of U OpenNMT-py updates (300 updates ~ 3.3 min of training, 920 ~ 9.4 min)::

    S=examples/reproduce/equal_budget.py
    for seed in 1 2 3; do python $S opennmt --seed $seed --updates 300; done
    for seed in 1 2 3; do
        for setting in default maxlen80 dropout0.3; do
            python $S ours --setting $setting --seed $seed --match-opennmt 300
        done
        for setting in lp-average gnmt0.6 gnmt1.0; do               # decode only
            python $S ours --setting $setting --seed $seed --match-opennmt 300
            python $S opennmt --setting $setting --seed $seed --updates 300
        done
    done
    python $S table                 # mean +- std per budget, side and setting (markdown)

Our run folders go to runs/equal_budget/ (git-ignored), OpenNMT-py's too. A quick smoke test of
the plumbing, writing nowhere near the real table::

    E=runs/eb-smoke      # git-ignored, like every run folder
    python $S --results $E/results.jsonl --runs $E/runs ours --seed 1 --minutes 0.5 \
        --extra-flags='--max-steps 20 --max-len 20' --extra-decode-flags='--max-len 20'
    python $S --results $E/results.jsonl --runs $E/runs opennmt --seed 1 \
        --updates 10 --warmup 5 --idle-wait-max 60
    python $S --results $E/results.jsonl table
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import gzip
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sacrebleu

REPO = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3)  # fixed before running; every setting and both sides use all of them

# Named settings. "train": flags added to `bahdanau train` (a training setting). "base" +
# "decode": re-decode the final checkpoint of the base setting's run (same seed and budget) with
# these search flags, without training; "opennmt": the same change for OpenNMT-py's
# onmt_translate (None: not available there). "note": shown by `table` and stored in records.
# A decode-only setting on another base, e.g. {"base": "maxlen80", "decode": [...]}, needs
# that base's runs (same seeds and budget) in the table first.
def _decode_only(base: str, penalty: str, alpha: str | None = None) -> dict[str, Any]:
    """A setting that re-decodes `base`'s training run with a length penalty."""
    ours = ["--length-penalty", penalty] + (["--alpha", alpha] if alpha else [])
    onmt = {"average": ["-length_penalty", "avg", "-alpha", "1.0"],
            "gnmt": ["-length_penalty", "wu", "-alpha", alpha or "0.6"]}[penalty]
    return {"base": base, "decode": ours, "opennmt": onmt}


# Every training setting of ours trains without label smoothing, layer norm and a moving average
# of the weights: OpenNMT-py's configuration here has none of them (run_opennmt.sh:
# label_smoothing 0.0, an RNN without layer norm, no average), and every record in the table was
# made before the default job took them (docs/default-job.md#label-smoothing,
# docs/default-job.md#layer-norm, docs/default-job.md#a-moving-average-of-the-weights).
AS_RECORDED = ["--label-smoothing", "0", "--no-layer-norm", "--ema-decay", "none"]
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"train": [], "note": "the command line's defaults at the recorded commit "
                                     "(Glorot initialisation since the default changed), "
                                     "without label smoothing and layer norm"},
    "glorot": {"train": ["--init", "glorot"],
               "note": "OpenNMT-py's initialisation (param_init_glorot), the default now"},
    "paper-init": {"train": ["--init", "paper"],
                   "note": "the paper's initialisation (the default before; records made then "
                           "ran without the flag and were relabelled from 'default')"},
    "maxlen80": {"train": ["--max-train-len", "80"],
                 "note": "OpenNMT-py already keeps training pairs up to 80 tokens"},
    "dropout0.3": {"train": ["--dropout", "0.3"],
                   "note": "counts only beside OpenNMT-py with dropout 0.3 too, which "
                           "run_opennmt.sh fixes at 0 (not measured here)"},
    "moses": {"train": [], "moses": True,
              "note": "trained and decoded on the Moses-tokenised text OpenNMT-py reads "
                      "(our tokenizer on top of it), output Moses-detokenised before scoring"},
    "joiners": {"train": ["--joiners", "punctuation"],
                "note": "words stay the same token next to punctuation (l'homme: l ￭'￭ homme)"},
    **{f"{prefix}{name}": _decode_only(base, *penalty)
       for base, prefix in (("default", ""), ("glorot", "glorot-"), ("paper-init", "paper-init-"))
       for name, penalty in (("lp-average", ("average",)), ("gnmt0.6", ("gnmt", "0.6")),
                             ("gnmt1.0", ("gnmt", "1.0")))},
}

# The Moses-tokenised Multi30k files (in --onmt-data) of each split, for the "moses" setting.
MOSES_FILES = {"val": "val.src", "test_2016_flickr": "test.src"}
DEFAULT_OVERHEAD_S = 5.0  # our start-up, data and vocabularies before the budget counts (idle)
IDLE_MAX_BUSY = 15        # % of the machine others may use before we start (as the peer harness)
CONTENTION_PCT = float(os.environ.get("CONTENTION_PCT", "10"))

MOSES = r"""
import sys
from sacremoses import MosesDetokenizer, MosesTokenizer
mode, lang = sys.argv[1], sys.argv[2]
tok, detok = MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)
for line in sys.stdin:
    if mode == "tok":      # as the peer harness's prepare_multi30k.py
        out = tok.tokenize(line.strip(), escape=False, return_str=True)
    else:                  # the inverse: nothing was escaped
        out = detok.detokenize(line.split(), unescape=False)
    sys.stdout.write(out + "\n")
"""


# ------------------------------------------------------------------------------ small helpers
def log(msg: str) -> None:
    print(f"[equal_budget] {msg}", flush=True)


def read_text_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout
    return {"git_commit": git("rev-parse", "HEAD").strip(),
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip())}


def score(hyps: list[str], refs: list[str], prefix: str) -> dict[str, Any]:
    """sacrebleu BLEU (13a, defaults) and chrF of detokenised `hyps` against raw `refs`."""
    if len(hyps) != len(refs):
        raise SystemExit(f"{prefix}: {len(hyps)} hypotheses for {len(refs)} references")
    bleu = sacrebleu.metrics.BLEU()
    b = bleu.corpus_score(hyps, [refs])
    chrf = sacrebleu.metrics.CHRF()
    c = chrf.corpus_score(hyps, [refs])
    return {f"{prefix}_bleu": round(b.score, 2), f"{prefix}_chrf": round(c.score, 2),
            f"{prefix}_bp": round(b.bp, 4), f"{prefix}_len_ratio": round(b.sys_len / b.ref_len, 4),
            f"{prefix}_sys_len": b.sys_len, f"{prefix}_ref_len": b.ref_len,
            f"{prefix}_precisions": [round(p, 1) for p in b.precisions],
            f"{prefix}_bleu_signature": str(bleu.get_signature()),
            f"{prefix}_chrf_signature": str(chrf.get_signature())}


def moses(python: str, mode: str, lang: str, lines: list[str]) -> list[str]:
    """Moses-tokenise ("tok") or detokenise ("detok") `lines` with sacremoses in `python`."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    r = subprocess.run([python, "-c", MOSES, mode, lang], input="".join(x + "\n" for x in lines),
                       capture_output=True, text=True, encoding="utf-8", env=env)
    if r.returncode != 0:
        raise SystemExit(f"sacremoses failed with {python} (set --moses-python):\n{r.stderr}")
    out = r.stdout.split("\n")[:-1]
    assert len(out) == len(lines), (len(out), len(lines))
    return out


# ------------------------------------------------------------------------ machine idleness
def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, as the peer harness's common.sh counts."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return busy, busy + v[3] + v[4]


def busy_pct(seconds: float = 3.0) -> float:
    b0, t0 = cpu_jiffies()
    time.sleep(seconds)
    b1, t1 = cpu_jiffies()
    return 100.0 * (b1 - b0) / max(t1 - t0, 1)


def wait_idle(max_wait: float) -> dict[str, Any]:
    """Wait until other processes use < IDLE_MAX_BUSY % of the machine (at most max_wait s)."""
    start = time.monotonic()
    while True:
        busy = busy_pct()
        waited = time.monotonic() - start
        if busy <= IDLE_MAX_BUSY or waited >= max_wait:
            break
        if waited < 1:
            log(f"machine {busy:.0f}% busy with other processes; waiting (at most "
                f"{max_wait:.0f} s)")
        time.sleep(10)
    if busy > IDLE_MAX_BUSY:
        log(f"WARNING: still {busy:.0f}% busy after {waited:.0f} s; measuring anyway")
    return {"busy_pct_before": round(busy, 1), "waited_s": round(waited, 1)}


def canary(bench: Path) -> float | None:
    """GFLOPS of a 1-s GEMM probe (the peer harness's cpu_canary.py) with this python's torch."""
    r = subprocess.run([sys.executable, str(bench / "cpu_canary.py"), "2", "1.0"],
                       capture_output=True, text=True)
    try:
        return json.loads(r.stdout)["gflops"]
    except (ValueError, KeyError):
        return None


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a running process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


LOG_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")   # a bahdanau log line's time


def run_measured(cmd: list[str], log_path: Path, mark: str, bench: Path,
                 idle_wait_max: float) -> dict[str, Any]:
    """Run `cmd` (streaming its output to the console and `log_path`) on an idle machine.

    Returns its return code, the seconds from starting it to the first output line that starts
    with `mark` (the end of training), and what the machine did meanwhile: load averages, a GEMM
    canary before and after, and the share of the machine's CPU time that other processes used
    between the start and `mark` (machine-wide busy time minus the process's own CPU time)."""
    idle = wait_idle(idle_wait_max)
    idle["canary_gflops_before"] = canary(bench)
    idle["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    clk = os.sysconf("SC_CLK_TCK")
    b0, t0 = cpu_jiffies()
    start = time.perf_counter()
    mark_s, other = None, None
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "w", encoding="utf-8") as logf:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, encoding="utf-8", env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            if mark_s is None and LOG_TIME.sub("", line).startswith(mark):
                mark_s = time.perf_counter() - start
                b1, t1 = cpu_jiffies()
                own = process_cpu_s(proc.pid)
                other = 100.0 * ((b1 - b0) / clk - own) / max((t1 - t0) / clk, 1e-9)
                idle["own_cpu_s"] = round(own, 1)
                idle["own_cpu_pct"] = round(100.0 * own / mark_s, 1)
            logf.write(line)
            sys.stdout.write(line)
        rc = proc.wait()
    total_s = time.perf_counter() - start
    idle["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    idle["canary_gflops_after"] = canary(bench)
    idle["other_procs_cpu_pct"] = None if other is None else round(max(other, 0.0), 1)
    return {"rc": rc, "mark_s": mark_s, "process_wall_s": round(total_s, 2), "idle": idle,
            "contended": other is not None and other > CONTENTION_PCT}


# --------------------------------------------------------------------------- results table
def load_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    log(f"WARNING: {path}:{n} is not JSON (a cut-off write?); ignored")
    return records


def find(records: list[dict[str, Any]], side: str, setting: str, seed: int,
         budget: str) -> dict[str, Any] | None:
    """The latest record of this measurement, if any."""
    hits = [r for r in records if (r["side"], r["setting"], r["seed"], r["budget"])
            == (side, setting, seed, budget)]
    return hits[-1] if hits else None


def portable(value: Any, args: argparse.Namespace) -> Any:
    """`value` (a record, recursively) with this machine's paths made relative: the interpreter
    becomes ``python``, the repository ``.``, the peers folder ``$PEERS_DIR``, and the folder
    beside the repository ``..``; `local_path` turns such a path back into a local one."""
    if isinstance(value, dict):
        return {key: portable(item, args) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item, args) for item in value]
    if not isinstance(value, str):
        return value
    for prefix, name in ((sys.executable, "python"), (str(REPO), "."),
                         (str(args.peers_dir), "$PEERS_DIR"), (str(REPO.parent), "..")):
        value = value.replace(prefix, name)
    return value


def local_path(text: str, args: argparse.Namespace) -> Path:
    """A path from a record (see `portable`) on this machine."""
    path = Path(text.replace("$PEERS_DIR", str(args.peers_dir)))
    return path if path.is_absolute() else REPO / path


def append_record(path: Path, record: dict[str, Any], args: argparse.Namespace) -> None:
    """Append one JSON line, its paths made portable, and make it durable before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(portable(record, args), ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    log(f"recorded in {path}")


def base_record(args: argparse.Namespace, side: str, budget: str) -> dict[str, Any]:
    setting = SETTINGS[args.setting]
    return {"side": side, "setting": args.setting, "seed": args.seed, "budget": budget,
            "decode_only": "base" in setting, "base_setting": setting.get("base"),
            "note": setting.get("note"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "invocation": shlex.join([sys.executable, *sys.argv]),
            **git_info()}


def summary_line(rec: dict[str, Any]) -> str:
    dev = f"dev BLEU {rec['dev_bleu']:.2f}" if rec.get("dev_bleu") is not None else "no dev"
    return (f"{rec['side']} {rec['setting']} seed {rec['seed']} {rec['budget']}: "
            f"{rec['updates']} updates, training wall {rec['train_wall_s']:.1f} s; {dev}; "
            f"test BLEU {rec['test_bleu']:.2f} chrF {rec['test_chrf']:.2f} "
            f"BP {rec['test_bp']:.3f} len ratio {rec['test_len_ratio']:.3f}"
            + ("  [CONTENDED]" if rec.get("contended") else ""))


# ----------------------------------------------------------------------------------- ours
def checkpoint_of(run_dir: Path) -> Path:
    """The run's final checkpoint (the model the training run's test decoding used)."""
    found = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    if not found:
        raise SystemExit(f"no checkpoint in {run_dir / 'checkpoints'}")
    return found[-1]


def evaluate(args: argparse.Namespace, run_dir: Path, split: str, name: str, flags: list[str],
             commands: list[str], tokenised: bool) -> list[str]:
    """Decode `split` of Multi30k with `bahdanau evaluate`; returns the detokenised hypotheses.
    `tokenised`: the model was trained on the Moses-tokenised text (setting "moses"), so it reads
    the Moses-tokenised source and its output is Moses-detokenised."""
    out = run_dir / f"{name}.{split}.hyp.txt"
    src = (args.onmt_data / MOSES_FILES[split] if tokenised
           else args.raw_data / f"{split}.en.gz")
    cmd = [sys.executable, "-m", "bahdanau", "evaluate", "--checkpoint",
           str(checkpoint_of(run_dir)), "--src", str(src),
           "--ref", str(args.raw_data / f"{split}.fr.gz"), "--output", str(out),
           "--json", str(run_dir / f"{name}.{split}.json"), *flags]
    commands.append(shlex.join(cmd))
    if out.exists():
        out.unlink()
    subprocess.run(cmd, cwd=REPO, check=True)
    return detokenised(args, read_text_lines(out), tokenised)


def detokenised(args: argparse.Namespace, hyps: list[str], tokenised: bool) -> list[str]:
    return moses(args.moses_python, "detok", "fr", hyps) if tokenised else hyps


def cmd_ours(args: argparse.Namespace) -> None:
    setting = SETTINGS[args.setting]
    records = load_records(args.results)
    budget = f"u{args.match_opennmt}" if args.match_opennmt else f"m{args.minutes:g}"
    old = find(records, "ours", args.setting, args.seed, budget)
    if old and not args.force:
        log(f"already in the table (--force to redo): {summary_line(old)}")
        return
    raw = args.raw_data
    dev_refs = read_text_lines(raw / "val.fr.gz")
    test_refs = read_text_lines(raw / "test_2016_flickr.fr.gz")
    rec = base_record(args, "ours", budget)
    commands: list[str] = []
    decode = [*setting.get("decode", []), *shlex.split(args.extra_decode_flags)]

    if "base" in setting:                           # decode only: re-decode the base run
        base = find(records, "ours", setting["base"], args.seed, budget)
        if base is None:
            raise SystemExit(f"no '{setting['base']}' run of seed {args.seed} at {budget} in "
                             f"{args.results}: run `ours --setting {setting['base']}` first")
        run_dir = local_path(base["run_dir"], args)
        for key in ("updates", "train_wall_s", "train_loop_s", "wall_target_s",
                    "wall_vs_opennmt_pct", "contended", "idle"):
            rec[key] = base.get(key)
        rec["run_dir"] = str(run_dir)
        tokenised = bool(SETTINGS[setting["base"]].get("moses"))
        rec.update(score(evaluate(args, run_dir, "val", args.setting, decode, commands,
                                  tokenised), dev_refs, "dev"))
        rec.update(score(evaluate(args, run_dir, "test_2016_flickr", args.setting, decode,
                                  commands, tokenised), test_refs, "test"))
        rec["commands"] = commands
        append_record(args.results, rec, args)
        log(summary_line(rec))
        return

    # the target training wall time: OpenNMT-py's (mean of its runs at this budget) or --minutes
    onmt_wall = None
    if args.match_opennmt:
        onmt = [r for r in records if r["side"] == "opennmt" and r["setting"] == "default"
                and r["budget"] == budget]
        clean = [r for r in onmt if not r.get("contended")]
        if not onmt:
            raise SystemExit(f"no OpenNMT-py run with {args.match_opennmt} updates in "
                             f"{args.results}: run `opennmt --updates {args.match_opennmt}` first")
        if not clean:
            log("WARNING: every OpenNMT-py run at this budget was contended; matching anyway")
        use = clean or onmt
        onmt_wall = statistics.mean(r["train_wall_s"] for r in use)
        log(f"OpenNMT-py training wall time at {args.match_opennmt} updates: "
            f"{onmt_wall:.1f} s (mean of seeds {sorted(r['seed'] for r in use)})")
        target = onmt_wall
    else:
        target = args.minutes * 60
    if args.overhead_s is not None:
        overhead, how = args.overhead_s, "--overhead-s"
    else:
        past = [r["train_wall_s"] - r["train_loop_s"] for r in records
                if r["side"] == "ours" and not r.get("decode_only") and not r.get("contended")
                and r.get("train_loop_s") is not None]
        overhead, how = ((statistics.median(past), f"median of {len(past)} earlier runs")
                         if past else (DEFAULT_OVERHEAD_S, "default"))
    time_budget = max(target - overhead, 1.0) / 60
    log(f"target training wall time {target:.1f} s = --time-budget {time_budget:.4f} min + "
        f"{overhead:.1f} s start-up overhead ({how})")

    run_dir = args.runs / "ours" / budget / f"{args.setting}-seed{args.seed}"
    saved = run_dir / "equal_budget.train.json"  # the training measurement, once it is done
    if saved.exists() and not args.force:
        log(f"reusing the training run measured in {saved} (--force to train again)")
        rec.update(json.loads(saved.read_text(encoding="utf-8")))
        commands.append(rec.pop("train_command"))
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        saved.unlink(missing_ok=True)
        data = []
        if setting.get("moses"):
            prepare_onmt_data(args)
            d = args.onmt_data
            data = ["--train-src", str(d / "train.src"), "--train-tgt", str(d / "train.tgt"),
                    "--test-src", str(d / "test.src"), "--test-tgt", str(d / "test.tgt")]
        cmd = [sys.executable, "-m", "bahdanau", "train", "--seed", str(args.seed),
               "--time-budget", f"{time_budget:.4f}", "--out", str(run_dir), "--overwrite",
               *data, *AS_RECORDED, *setting["train"], *setting.get("decode", []),
               *shlex.split(args.extra_flags)]
        commands.append(shlex.join(cmd))
        log(f"running: {commands[0]}")
        output = run_dir / "equal_budget.log"   # stdout and stderr; not the run's own train.log,
        m = run_measured(cmd, output, "trained ", args.peers_bench,   # which --overwrite deletes
                         args.idle_wait_max)
        if m["rc"] != 0 or m["mark_s"] is None:
            raise SystemExit(f"bahdanau train failed (rc {m['rc']}); log: {output}")
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        rates = [float(x) for x in re.findall(r"\| (\d+) tgt tok/s",
                                              output.read_text("utf-8"))]
        measured = dict(
            updates=metrics["updates"], train_wall_s=round(m["mark_s"], 2),
            train_loop_s=round(metrics["train_minutes"] * 60, 1),
            process_wall_s=m["process_wall_s"], time_budget_min=round(time_budget, 4),
            overhead_s=round(overhead, 2), wall_target_s=round(target, 2),
            wall_vs_opennmt_pct=None if onmt_wall is None
            else round(100 * (m["mark_s"] / onmt_wall - 1), 2),
            contended=m["contended"], idle=m["idle"], run_dir=str(run_dir),
            train_tgt_tokens_per_s=round(statistics.median(rates)) if rates else None,
            test_bleu_reported=metrics["bleu"], test_chrf_reported=metrics["chrf"])
        saved.write_text(json.dumps({**measured, "train_command": commands[0]}, indent=1) + "\n",
                         encoding="utf-8")
        rec.update(measured)
    tokenised = bool(setting.get("moses"))
    rec.update(score(evaluate(args, run_dir, "val", args.setting, decode, commands, tokenised),
                     dev_refs, "dev"))
    rec.update(score(detokenised(args, read_text_lines(run_dir / "test.hyp.txt"), tokenised),
                     test_refs, "test"))
    rec["commands"] = commands
    append_record(args.results, rec, args)
    log(summary_line(rec))
    msg = f"training wall time: ours {rec['train_wall_s']:.1f} s, target {target:.1f} s"
    if onmt_wall is not None:
        pct = rec["wall_vs_opennmt_pct"]
        verdict = ("within +-3%" if abs(pct) <= 3 else
                   "OUTSIDE +-3%: rerun with --force, adjusting --overhead-s")
        msg += f", OpenNMT-py {onmt_wall:.1f} s: {pct:+.1f}% ({verdict})"
    log(msg)


# -------------------------------------------------------------------------------- OpenNMT-py
def onmt_decode_flags(extra: list[str] | None) -> list[str]:
    """run_opennmt.sh's beam decoding flags; `extra` replaces the length penalty and alpha."""
    return ["-gpu", "-1", "-batch_type", "sents", "-batch_size", os.environ.get("DEC_BATCH", "32"),
            "-beam_size", os.environ.get("BEAM", "5"), "-n_best", "1",
            "-max_length", os.environ.get("MAX_OUT_LEN", "100"), "-max_length_ratio", "0",
            "-min_length", "1", "-coverage_penalty", "none", "-block_ngram_repeat", "0",
            *(extra or ["-length_penalty", "none", "-alpha", "0.0"])]


def onmt_translate(args: argparse.Namespace, ckpt: Path, src: Path, out: Path, flags: list[str],
                   seed: int, commands: list[str]) -> list[str]:
    cmd = [str(args.onmt_venv / "bin" / "onmt_translate"), "-model", str(ckpt), "-src", str(src),
           "-output", str(out), "-seed", str(seed), *flags]
    commands.append(shlex.join(cmd))
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS="2",
               MKL_NUM_THREADS="2", PYTHONWARNINGS="ignore")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"onmt_translate failed:\n{r.stderr[-3000:]}")
    return read_text_lines(out)


def prepare_onmt_data(args: argparse.Namespace) -> None:
    """Moses-tokenised train/test (the peer harness's prepare_multi30k.py) and val, once."""
    d = args.onmt_data
    if not all((d / f).is_file() for f in ("train.src", "train.tgt", "test.src", "test.tgt")):
        log(f"preparing Moses-tokenised Multi30k en->fr in {d}")
        subprocess.run([args.moses_python, str(args.peers_bench / "prepare_multi30k.py"),
                        str(args.raw_data), str(d), "en", "fr"], check=True)
    if not (d / "val.src").is_file():
        write_lines(d / "val.src", moses(args.moses_python, "tok", "en",
                                         read_text_lines(args.raw_data / "val.en.gz")))


def run_harness(args: argparse.Namespace, out: Path) -> tuple[str, Path]:
    """run_opennmt.sh into `out` (or reuse a finished run there); its command and checkpoint."""
    env = dict(os.environ, PEERS_DIR=str(args.peers_dir), ONMT_VENV=str(args.onmt_venv),
               WARMUP=str(args.warmup), MEASURE=str(args.updates - args.warmup),
               SEED=str(args.seed), FIXED_OUT_LEN="0", DECODE_REPEATS="1")
    if args.idle_wait_max is not None:
        env["IDLE_WAIT_MAX"] = str(int(args.idle_wait_max))
    if args.attempts is not None:
        env["ATTEMPTS"] = str(args.attempts)
    knobs = ["WARMUP", "MEASURE", "SEED", "FIXED_OUT_LEN", "DECODE_REPEATS", "IDLE_WAIT_MAX",
             "ATTEMPTS", "THREADS", "BATCH_SENTS", "MAX_TRAIN_LEN", "VOCAB", "MAX_OUT_LEN",
             "BEAM", "LR", "CLIP"]
    cmd = ["bash", str(args.peers_bench / "run_opennmt.sh"), str(args.onmt_data), str(out)]
    command = " ".join(f"{k}={env[k]}" for k in knobs if k in env) + " " + shlex.join(cmd)
    ckpt = out / "model" / f"model_step_{args.updates}.pt"
    summary, saved = out / "summary.json", out / "equal_budget.command"
    if (not args.force and summary.exists() and ckpt.exists() and saved.exists()
            and summary.stat().st_mtime >= (out / "train.yaml").stat().st_mtime):
        log(f"reusing the finished harness run in {out} (--force to run it again)")
        return saved.read_text(encoding="utf-8").strip(), ckpt
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(command + "\n", encoding="utf-8")
    log(f"running: {command}")
    r = subprocess.run(cmd, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"run_opennmt.sh failed (rc {r.returncode}); see {out}")
    if not ckpt.exists():
        raise SystemExit(f"{ckpt} missing: OpenNMT-py did not reach {args.updates} updates")
    return command, ckpt


def harness_training(out: Path, ckpt: Path) -> dict[str, Any]:
    """The training measurement of a finished run_opennmt.sh run in `out`."""
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    build_vocab_s = ((out / "model" / "vocab.tgt").stat().st_mtime
                     - (out / "train.yaml").stat().st_mtime)   # written before onmt_build_vocab
    return dict(
        updates=int(ckpt.stem.rsplit("_", 1)[1]), train_wall_s=summary["process_wall_s_train"],
        train_loop_s=summary["train_seconds_measured"],
        train_loop_updates=summary["train_updates_measured"],
        train_tgt_tokens_per_s=summary["train_tgt_tokens_per_s"],
        build_vocab_s=round(build_vocab_s, 1),
        contended="train" in (summary.get("contended_phases") or []),
        idle={"other_procs_cpu_pct": summary.get("other_procs_cpu_pct_train"),
              "cpu_pct": summary.get("cpu_pct_train"),
              "canary_gflops": summary.get("canary_gflops_train"),
              "contended_phases": summary.get("contended_phases"),
              **json.loads((out / "train.idle.json").read_text(encoding="utf-8"))},
        peer_version=summary.get("peer_version"), run_dir=str(out), checkpoint=str(ckpt))


def cmd_opennmt(args: argparse.Namespace) -> None:
    setting = SETTINGS[args.setting]
    if setting.get("train"):
        raise SystemExit(f"setting {args.setting} changes our training; the peer harness runs "
                         "OpenNMT-py's fixed configuration only ('default')")
    if "base" in setting and setting.get("opennmt") is None:
        raise SystemExit(f"setting {args.setting} has no OpenNMT-py equivalent")
    if args.updates % args.warmup or args.updates <= args.warmup:
        raise SystemExit("--updates must be a multiple of --warmup and larger than it "
                         "(the harness reports every WARMUP updates)")
    if not (args.onmt_venv / "bin" / "onmt_translate").exists():
        raise SystemExit(f"no OpenNMT-py venv at {args.onmt_venv}: run "
                         f"PEERS_DIR=... bash {args.peers_bench / 'setup.sh'}")
    records = load_records(args.results)
    budget = f"u{args.updates}"
    old = find(records, "opennmt", args.setting, args.seed, budget)
    if old and not args.force:
        log(f"already in the table (--force to redo): {summary_line(old)}")
        return
    prepare_onmt_data(args)
    dev_refs = read_text_lines(args.raw_data / "val.fr.gz")
    test_refs = read_text_lines(args.raw_data / "test_2016_flickr.fr.gz")
    rec = base_record(args, "opennmt", budget)
    commands: list[str] = []
    out = args.runs / "opennmt" / budget / f"seed{args.seed}"

    if "base" in setting:                        # decode only: the base run's checkpoint
        base = find(records, "opennmt", setting["base"], args.seed, budget)
        if base is None:
            raise SystemExit(f"no OpenNMT-py '{setting['base']}' run of seed {args.seed} at "
                             f"{budget}: run `opennmt --seed {args.seed} --updates "
                             f"{args.updates}` first")
        for key in ("updates", "train_wall_s", "train_loop_s", "build_vocab_s", "contended",
                    "idle"):
            rec[key] = base.get(key)
        out = local_path(base["run_dir"], args)
        ckpt = local_path(base["checkpoint"], args)
        flags = onmt_decode_flags(setting["opennmt"])
        test_tok = onmt_translate(args, ckpt, out / "data" / "test.src",
                                  out / f"{args.setting}.test.hyp.tok", flags, args.seed, commands)
    else:
        command, ckpt = run_harness(args, out)
        commands.append(command)
        rec.update(harness_training(out, ckpt))
        rec.update(score(moses(args.moses_python, "detok", "fr",
                               read_text_lines(out / "hyp.greedy")), test_refs, "greedy_test"))
        flags = onmt_decode_flags(None)
        test_tok = read_text_lines(out / "hyp.beam5")
    # dev (val) with the same flags, then scores of detokenised output against raw references
    dev_tok = onmt_translate(args, ckpt, args.onmt_data / "val.src",
                             out / f"{args.setting}.val.hyp.tok", flags, args.seed, commands)
    dev = moses(args.moses_python, "detok", "fr", dev_tok)
    test = moses(args.moses_python, "detok", "fr", test_tok)
    write_lines(out / f"{args.setting}.val.hyp.txt", dev)
    write_lines(out / f"{args.setting}.test_2016_flickr.hyp.txt", test)
    rec.update(score(dev, dev_refs, "dev"))
    rec.update(score(test, test_refs, "test"))
    rec["commands"] = commands
    append_record(args.results, rec, args)
    log(summary_line(rec))


# ------------------------------------------------------------------------------------ table
def mean_std(values: list[float], digits: int = 2) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def cmd_table(args: argparse.Namespace) -> None:
    records = load_records(args.results)
    latest: dict[tuple, dict[str, Any]] = {}
    for r in records:                                 # a redone measurement replaces the old
        latest[(r["budget"], r["side"], r["setting"], r["seed"])] = r
    kept = [r for r in latest.values() if args.include_contended or not r.get("contended")]
    left_out = [r for r in latest.values() if r not in kept]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in sorted(kept, key=lambda r: (r["budget"], r["side"] != "opennmt",
                                         list(SETTINGS).index(r["setting"])
                                         if r["setting"] in SETTINGS else 99, r["seed"])):
        groups.setdefault((r["budget"], r["side"], r["setting"]), []).append(r)
    print("| budget | side | setting | seeds | updates | train wall s | dev BLEU | test BLEU "
          "| test chrF | BP | hyp/ref len |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (budget, side, setting), rs in groups.items():
        def col(key: str, digits: int = 2, rs: list[dict[str, Any]] = rs) -> str:
            return mean_std([r[key] for r in rs if r.get(key) is not None], digits)
        print(f"| {budget} | {side} | {setting} | {','.join(str(r['seed']) for r in rs)} | "
              f"{col('updates', 0)} | {col('train_wall_s', 1)} | {col('dev_bleu')} | "
              f"{col('test_bleu')} | {col('test_chrf')} | {col('test_bp', 3)} | "
              f"{col('test_len_ratio', 3)} |")
    print("\nmean ± sample standard deviation over seeds; scores: sacrebleu 13a BLEU / chrF on "
          "detokenised output against the raw references; decode-only settings reuse the "
          "training run of their base setting.")
    for budget in sorted({k[0] for k in groups}):
        walls = {side: [r["train_wall_s"] for r in kept if r["budget"] == budget
                        and r["side"] == side and not r.get("decode_only")]
                 for side in ("ours", "opennmt")}
        if walls["ours"] and walls["opennmt"]:
            o = statistics.mean(walls["opennmt"])
            worst = max(abs(100 * (w / o - 1)) for w in walls["ours"])
            print(f"{budget}: OpenNMT-py training wall {o:.1f} s; ours {min(walls['ours']):.1f}"
                  f"-{max(walls['ours']):.1f} s (worst {worst:.1f}% off"
                  f"{'' if worst <= 3 else ', OUTSIDE +-3%'})")
    notes = {r["setting"]: r["note"] for r in kept if r.get("note")}
    for name, note in notes.items():
        print(f"{name}: {note}")
    if left_out:
        print("left out (contended; rerun with --force, or --include-contended): "
              + "; ".join(f"{r['side']} {r['setting']} seed {r['seed']} {r['budget']}"
                          for r in left_out))


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    peers_dir = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "bahdanau-peers"))
    p = argparse.ArgumentParser(
        description="Equal-wall-time quality comparison of our default training job with "
                    "OpenNMT-py. One measurement per call, appended to a table; "
                    "a measurement already there is skipped. The module docstring gives the "
                    "protocol and the whole sequence of commands.")
    p.add_argument("--results", type=Path,
                   default=REPO / "examples" / "reproduce" / "results" / "equal_budget.jsonl",
                   help="the results table, JSON lines (default: %(default)s)")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "equal_budget",
                   help="run folders of both sides (default: %(default)s)")
    p.add_argument("--peers-bench", type=Path, default=REPO.parent / "shared" / "peers-bench",
                   help="the peer benchmark harness: run_opennmt.sh, cpu_canary.py, "
                        "prepare_multi30k.py (default: %(default)s)")
    p.add_argument("--peers-dir", type=Path, default=peers_dir,
                   help="where its setup.sh put the peer venvs; $PEERS_DIR "
                        "(default: %(default)s)")
    p.add_argument("--raw-data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k",
                   help="raw Multi30k *.gz: the references, the sources we decode, OpenNMT-py's "
                        "data before Moses (default: %(default)s)")
    p.add_argument("--onmt-data", type=Path,
                   help="Moses-tokenised data for OpenNMT-py, prepared on first use "
                        "(default: PEERS_DIR/data/multi30k-en-fr)")
    p.add_argument("--onmt-venv", type=Path,
                   help="OpenNMT-py's venv (default: PEERS_DIR/opennmt-venv)")
    p.add_argument("--moses-python",
                   help="a python with sacremoses (default: PEERS_DIR/joeynmt-venv/bin/python)")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--setting", default="default", choices=list(SETTINGS),
                        help="a named setting, from SETTINGS in this script (default: "
                             "%(default)s)")
        sp.add_argument("--seed", type=int, required=True, choices=SEEDS,
                        help="one of the seeds fixed in SEEDS")
        sp.add_argument("--force", action="store_true",
                        help="run even if this measurement is in the table (the new line is "
                             "appended; `table` uses the latest)")
        sp.add_argument("--idle-wait-max", type=float,
                        help="seconds to wait for an idle machine before measuring anyway "
                             "(default: 900; for opennmt, the harness's IDLE_WAIT_MAX)")

    o = sub.add_parser("ours", help="train (or re-decode) our model: one setting, one seed",
                       description="Train `bahdanau train` with a setting's flags for a target "
                                   "training wall time, or re-decode a trained run (decode-only "
                                   "settings); score dev and test; append a record.")
    common(o)
    budget = o.add_mutually_exclusive_group(required=True)
    budget.add_argument("--match-opennmt", type=int, metavar="UPDATES",
                        help="train as long as OpenNMT-py's runs with UPDATES updates did (the "
                             "mean training wall time of its 'default' runs in the table); "
                             "budget label uUPDATES")
    budget.add_argument("--minutes", type=float,
                        help="target training wall time in minutes; budget label mMINUTES")
    o.add_argument("--overhead-s", type=float,
                   help="seconds from start to where --time-budget starts counting (default: "
                        "the median of our earlier runs in the table, else "
                        f"{DEFAULT_OVERHEAD_S:g})")
    o.add_argument("--extra-flags", default="",
                   help="more `bahdanau train` flags, for testing (e.g. '--max-steps 20')")
    o.add_argument("--extra-decode-flags", default="",
                   help="more `bahdanau evaluate` flags for the dev/test decodes, for testing")
    o.set_defaults(func=cmd_ours)

    n = sub.add_parser("opennmt", help="train (or re-decode) OpenNMT-py via the peer harness: "
                                       "one seed",
                       description="Run the peer harness's run_opennmt.sh for --updates "
                                   "updates with SEED=--seed, or re-decode its checkpoint "
                                   "(decode-only settings); score dev and test; append a "
                                   "record.")
    common(n)
    n.add_argument("--updates", type=int, default=300,
                   help="training updates: 300 ~ 3.3 min of training, 920 ~ 9.4 min on the "
                        "idle 2-core box (default: %(default)s)")
    n.add_argument("--warmup", type=int, default=20,
                   help="the harness's WARMUP, its report interval; --updates must be a "
                        "multiple (default: %(default)s)")
    n.add_argument("--attempts", type=int,
                   help="the harness's ATTEMPTS: runs of a contended phase (default: 2)")
    n.set_defaults(func=cmd_opennmt)

    t = sub.add_parser("table", help="print the table: mean ± std per budget, side, setting")
    t.add_argument("--include-contended", action="store_true",
                   help="also average the runs flagged as contended")
    t.set_defaults(func=cmd_table)

    args = p.parse_args(argv)
    args.onmt_data = args.onmt_data or args.peers_dir / "data" / "multi30k-en-fr"
    args.onmt_venv = args.onmt_venv or args.peers_dir / "opennmt-venv"
    args.moses_python = args.moses_python or str(args.peers_dir / "joeynmt-venv" / "bin" /
                                                 "python")
    if args.command == "table":
        args.func(args)
        return
    if args.command == "ours" and args.idle_wait_max is None:
        args.idle_wait_max = 900.0
    args.results = args.results.resolve()
    args.runs = args.runs.resolve()
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    with open(args.runs / ".equal_budget.lock", "w") as lock:
        try:                                      # one measurement at a time
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"another measurement is running in {args.runs}; runs must go "
                             "one at a time") from None
        args.func(args)


if __name__ == "__main__":
    main()
