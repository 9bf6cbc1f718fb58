#!/usr/bin/env bash
# The WMT17 multimodal task's text-only system on the shipped Multi30k en->fr, in one command.
#
#   examples/recipes/multi30k.sh OUT [bahdanau train options...]
#
# A model close to LIUM-CVC's monomodal en-fr system (docs/multi30k.md): joint BPE subwords
# of both sides, a conditional GRU decoder, layer-normalised GRUs, dropout, batches of 32,
# Adam at 4e-4; its options are examples/recipes/multi30k.yaml. Steps, each in OUT:
#
#   1. data/      the joint BPE (one SentencePiece model of 10,000 pieces over both sides of
#                 the train split) and the train split encoded with it (bahdanau prepare);
#   2. run/       training on train alone, a fixed number of updates (--max-steps, not a
#                 time: the result does not depend on the machine's load), greedy BLEU on
#                 the whole val split every --eval-every updates, the 3 best kept;
#   3. select/    the candidates, all of this one run: its best checkpoint on val (best1.pt)
#                 and the average of its 3 best (best3.pt); each translated (beam 5) and
#                 scored on val, and the better one on val copied to OUT/final;
#   4. test_2016_flickr.sacrebleu.json: OUT/final on test_2016_flickr, sacrebleu (cased,
#      detokenised), and test_2016_flickr.moses-lc.json: lowercased and Moses-tokenised, the
#      shared task's scale (`bahdanau evaluate --lowercase --tokenize moses --moses-lang fr`).
#
# The test set is scored once, by OUT/final, and chooses nothing. Options after OUT go to
# `bahdanau train` and override the file's: `--seed 2` for a second seed (into another OUT),
# `--max-steps 300 --eval-every 100` for a quick look. Rerunning the same command resumes
# where it stopped: prepare reuses OUT/data, train resumes OUT/run from its last checkpoint
# (or leaves a finished run alone), and a step whose output is newer than the run's
# metrics.json is skipped. Steps 3 and 4 decode with beam 5 and scores normalised by length
# (--length-penalty average, chosen on val); EVALUATE_OPTIONS (e.g. "--beam-size 1 --max-len
# 20") is added after those to every `bahdanau evaluate` call, so it overrides them; PYTHON is the
# interpreter that runs bahdanau (default python3). Needs the sentencepiece, moses and yaml
# extras: pip install 'bahdanau[sentencepiece,moses,yaml]'.
set -euo pipefail

if [ $# -lt 1 ] || [[ $1 == -* ]]; then
    echo "usage: $0 OUT [bahdanau train options...]" >&2
    exit 2
fi
OUT=$1
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
# Beam search as chosen on val (docs/multi30k.md#decoding): scores normalised by length.
DECODING=(--length-penalty average)
read -r -a EXTRA <<< "${EVALUATE_OPTIONS:-}"
EVALUATE=("${DECODING[@]}" "${EXTRA[@]}")   # EVALUATE_OPTIONS come last, so they win
CANDIDATES=(1 3)             # best.pt alone, and the average of the 3 best (the file's keep_best)

bahdanau() { "$PYTHON" -m bahdanau "$@"; }
shipped() { "$PYTHON" -c "from bahdanau.data import multi30k_files; print(multi30k_files('$1', '$2'))"; }
# FILE exists and was written after the run last finished (its metrics.json): nothing to redo.
fresh() { [ -e "$1" ] && [ "$1" -nt "$OUT/run/metrics.json" ]; }
# the sacrebleu BLEU of an evaluate --json report
bleu_of() { "$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1]))['bleu'])" "$1"; }

mkdir -p "$OUT/select"

echo "== 1. joint BPE subwords of the train split: $OUT/data"
bahdanau prepare --out "$OUT/data" --tokenizer bpe --subword-vocab 10000

echo "== 2. training on train, checkpoints chosen on val: $OUT/run"
bahdanau train --config "$HERE/multi30k.yaml" --data "$OUT/data" --out "$OUT/run" "$@"

echo "== 3. the candidates on val: $OUT/select"
VAL_SRC=$(shipped val en)
VAL_REF=$(shipped val fr)
best=""
best_bleu=""
for k in "${CANDIDATES[@]}"; do
    candidate="$OUT/select/best$k.pt"
    if ! fresh "$candidate"; then
        bahdanau average --checkpoint "$OUT/run" --best "$k" --output "$candidate"
    fi
    if ! fresh "$OUT/select/best$k.val.json" || [ "$candidate" -nt "$OUT/select/best$k.val.json" ]; then
        bahdanau evaluate --checkpoint "$candidate" --src "$VAL_SRC" --ref "$VAL_REF" \
            --json "$OUT/select/best$k.val.json" "${EVALUATE[@]}"
    fi
    bleu=$(bleu_of "$OUT/select/best$k.val.json")
    echo "val BLEU of best$k.pt: $bleu"
    if [ -z "$best" ] || "$PYTHON" -c "import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))" "$bleu" "$best_bleu"; then
        best=$candidate
        best_bleu=$bleu
    fi
done
if ! fresh "$OUT/final" || ! cmp -s "$best" "$OUT/final"; then
    cp "$best" "$OUT/final.tmp"
    mv "$OUT/final.tmp" "$OUT/final"
fi
echo "final: $best (val BLEU $best_bleu) -> $OUT/final"

echo "== 4. OUT/final on test_2016_flickr, both scales"
TEST_SRC=$(shipped test_2016_flickr en)
TEST_REF=$(shipped test_2016_flickr fr)
for scale in sacrebleu moses-lc; do
    report="$OUT/test_2016_flickr.$scale.json"
    if fresh "$report" && [ "$report" -nt "$OUT/final" ]; then
        echo "$report is up to date"
        continue
    fi
    flags=(--output "$OUT/test_2016_flickr.hyp.txt")       # the same translations each time
    if [ "$scale" = moses-lc ]; then
        flags=(--lowercase --tokenize moses --moses-lang fr)
    fi
    bahdanau evaluate --checkpoint "$OUT/final" --src "$TEST_SRC" --ref "$TEST_REF" \
        --json "$report" "${flags[@]}" "${EVALUATE[@]}"
done
