#!/usr/bin/env bash
# Issue 2's CPU HPD run, one resumable chain on 2 cores:
#   1. mpnet targets for 200k Wikipedia sentences (50 min with the ONNX teacher);
#   2. hpd-mpnet-cpu, one epoch from MiniLM-L6 with a random projection (77 min);
#   3. 1.5 more epochs from step 2's best checkpoint, fresh optimiser at lr 1e-4 (--init-from, ~105 min);
#   4. targets for the next 200k sentences (--skip-sentences 200000, 44 min), and one epoch on them
#      from step 3's best checkpoint (75 min), keeping the student of every dev evaluation;
#   5. a greedy soup of those students, chosen on STS-B dev (distilembed average, 4 min);
#   6. the same once more on sentences 400,001-600,000 (48 + 77 min), from step 5's soup: its step-0
#      snapshot is that soup, so the second greedy soup can only keep or raise the dev score;
#   7. STS evaluation, export, and the Quora retrieval benchmark with the same 200k sentences as
#      distractors (their mpnet vectors are the cache step 1 fills).
# Rerun the same command after an interruption: every step continues where it stopped, and a
# finished checkpoint is not trained again. Logs: runs/logs/cpu-hpd-*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export DISTILEMBED_DATA_DIR="${DISTILEMBED_DATA_DIR:-../shared/data}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT="${1:-runs/hpd-cpu}"
E2="$OUT-e2"
E3="$OUT-e3"
SOUP3="$OUT-e3-soup"
E4="$OUT-e4"
FINAL="$OUT-e4-soup"
PY=.venv/bin/python
mkdir -p runs/logs
CORPUS=unlabeled/enwiki2015_1m_sentences.txt.gz

train() {  # train OUT_DIR LOG_NAME ARGS...: skip a finished checkpoint, resume an unfinished one
  local out="$1" log="$2"
  shift 2
  if [[ -e "$out/manifest.json" ]]; then
    echo "$out is finished; not training it again"
    return
  fi
  local resume=()
  [[ -e "$out.partial" ]] && resume=(--resume)
  "$PY" -m distilembed.cli train --preset hpd-mpnet-cpu --device cpu --out "$out" "${resume[@]}" "$@" \
    2>&1 | tee -a "runs/logs/$log.log"
}

"$PY" -m distilembed.cli targets --teacher all-mpnet-base-v2 --corpus "$CORPUS" \
  --n-sentences 200000 --batch-size 16 --device cpu 2>&1 | tee -a runs/logs/cpu-hpd-targets.log
train "$OUT" cpu-hpd-train
train "$E2" cpu-hpd-e2-train --init-from "$OUT" --seed 43 --lr 1e-4 --epochs 1.5
"$PY" -m distilembed.cli targets --teacher all-mpnet-base-v2 --corpus "$CORPUS" --skip-sentences 200000 \
  --n-sentences 200000 --batch-size 16 --device cpu 2>&1 | tee -a runs/logs/cpu-hpd-targets-slice2.log
train "$E3" cpu-hpd-e3-train --init-from "$E2" --skip-sentences 200000 --seed 44 --lr 1e-4 --epochs 1 \
  --keep-snapshots
[[ -e "$SOUP3/manifest.json" ]] || "$PY" -m distilembed.cli average "$E3".snapshots/train/step-* \
  --greedy --out "$SOUP3" --overwrite 2>&1 | tee -a runs/logs/cpu-hpd-soup.log
"$PY" -m distilembed.cli targets --teacher all-mpnet-base-v2 --corpus "$CORPUS" --skip-sentences 400000 \
  --n-sentences 200000 --batch-size 16 --device cpu 2>&1 | tee -a runs/logs/cpu-hpd-targets-slice3.log
train "$E4" cpu-hpd-e4-train --init-from "$SOUP3" --skip-sentences 400000 --seed 45 --lr 1e-4 --epochs 1 \
  --keep-snapshots
[[ -e "$FINAL/manifest.json" ]] || "$PY" -m distilembed.cli average "$E4".snapshots/train/step-* \
  --greedy --out "$FINAL" --overwrite 2>&1 | tee -a runs/logs/cpu-hpd-soup-e4.log
"$PY" -m distilembed.cli eval --model "$FINAL" 2>&1 | tee runs/logs/cpu-hpd-eval.log
"$PY" -m distilembed.cli export --model "$FINAL" --out "$FINAL-bundle" --overwrite \
  2>&1 | tee runs/logs/cpu-hpd-export.log
"$PY" bench/quora_sr.py --bundle "$FINAL-bundle" --distractors 200000 \
  --out "bench/results/quora_sr_$(basename "$FINAL")_d200k.json" 2>&1 | tee runs/logs/cpu-hpd-quora.log
