#!/usr/bin/env bash
# The CPU HPD student (docs/results.md, "Training runs"), one resumable chain on 2 cores:
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
# finished checkpoint is not trained again. Logs: runs/logs/cpu-hpd-*.log and runs/logs/hpd-cpu-e[34]-*.log.
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

fresh_slice_epoch() {  # INIT SKIP SEED RUN SOUP: targets for the 200k sentences after SKIP, one epoch on
  local init="$1" skip="$2" seed="$3" run="$4" soup="$5"  # them from INIT, then a greedy soup of its snapshots
  local tag
  tag="$(basename "$run")"
  "$PY" -m distilembed.cli targets --teacher all-mpnet-base-v2 --corpus "$CORPUS" --skip-sentences "$skip" \
    --n-sentences 200000 --batch-size 16 --device cpu 2>&1 | tee -a "runs/logs/$tag-targets.log"
  train "$run" "$tag-train" --init-from "$init" --skip-sentences "$skip" --seed "$seed" --lr 1e-4 --epochs 1 \
    --keep-snapshots
  [[ -e "$soup/manifest.json" ]] || "$PY" -m distilembed.cli average "$run".snapshots/train/step-* \
    --greedy --out "$soup" --overwrite 2>&1 | tee -a "runs/logs/$tag-soup.log"
}

"$PY" -m distilembed.cli targets --teacher all-mpnet-base-v2 --corpus "$CORPUS" \
  --n-sentences 200000 --batch-size 16 --device cpu 2>&1 | tee -a runs/logs/cpu-hpd-targets.log
train "$OUT" cpu-hpd-train
train "$E2" cpu-hpd-e2-train --init-from "$OUT" --seed 43 --lr 1e-4 --epochs 1.5
fresh_slice_epoch "$E2" 200000 44 "$E3" "$SOUP3"
fresh_slice_epoch "$SOUP3" 400000 45 "$E4" "$FINAL"
"$PY" -m distilembed.cli eval --model "$FINAL" 2>&1 | tee runs/logs/cpu-hpd-eval.log
"$PY" -m distilembed.cli export --model "$FINAL" --out "$FINAL-bundle" --overwrite \
  2>&1 | tee runs/logs/cpu-hpd-export.log
"$PY" bench/quora_sr.py --bundle "$FINAL-bundle" --distractors 200000 \
  --out "docs/results/quora_sr_$(basename "$FINAL")_d200k.json" 2>&1 | tee runs/logs/cpu-hpd-quora.log
