#!/usr/bin/env bash
# Issue 23's compressed-index tables (docs/results.md, "Compressed indexes with rescoring") from a
# fresh machine, one resumable chain on 2 cores, about 2.8 hours cold:
#   1. the rotated Matryoshka student `mrl-pwt-nli-rot`: --preset congen-ens-mrl-cpu with per-width
#      temperatures (the two teachers' targets, about 17 minutes cold, then about 15 minutes of
#      training), its NLI fine-tuning at the widths 1,1,8 (9 minutes), `distilembed rotate`
#      (2 minutes; decision 57) and its int8 bundle (2 minutes);
#   2. bench/compression.py over it and models/default: the teacher's vectors of the Quora questions
#      (17 minutes) and of the 100,000 Wikipedia distractors (about 83 minutes) go through the
#      target cache, then 6-24 minutes of measuring;
#   3. bench/rescore_k.py, with the teacher's figures from step 2's JSON (4 minutes), and
#      bench/binary_lists.py on the questions alone (2 minutes).
# Rerun the same command after an interruption: a finished student or bundle is kept, training
# resumes from its last checkpoint, and the teacher's vectors already cached are not encoded again.
# Each bench rewrites its own block of docs/results.md. Logs: runs/logs/compression-*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export DISTILEMBED_DATA_DIR="${DISTILEMBED_DATA_DIR:-../shared/data}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
STUDENT="${1:-runs/mrl-pwt-nli-rot}"
FIRST="runs/mrl-pwt" TUNED="runs/mrl-pwt-nli"
BUNDLE="runs/bundles/$(basename "$STUDENT")"
PY=.venv/bin/python
mkdir -p runs/logs

resume_flag() { [[ -e "$1.partial" ]] && echo --resume || true; }
if [[ ! -e "$FIRST/manifest.json" ]]; then
  # shellcheck disable=SC2046
  "$PY" -m distilembed.cli train --preset congen-ens-mrl-cpu --matryoshka-teacher-temperatures 0.05,0.07,0.07 \
    --matryoshka-temperatures 0.07,0.05,0.05 --device cpu --out "$FIRST" $(resume_flag "$FIRST") \
    2>&1 | tee -a runs/logs/compression-train.log
fi
if [[ ! -e "$TUNED/manifest.json" ]]; then
  # shellcheck disable=SC2046
  "$PY" -m distilembed.cli finetune "$FIRST" --out "$TUNED" --matryoshka-weights 1,1,8 --epochs 2 --lr 1e-5 \
    --eval-every 10 --exclude-text sts/stsbenchmark/sts-dev.csv --device cpu $(resume_flag "$TUNED") \
    2>&1 | tee -a runs/logs/compression-finetune.log
fi
[[ -e "$STUDENT/manifest.json" ]] || "$PY" -m distilembed.cli rotate "$TUNED" --out "$STUDENT" \
  2>&1 | tee -a runs/logs/compression-rotate.log
[[ -e "$BUNDLE/manifest.json" ]] || "$PY" -m distilembed.cli export --model "$STUDENT" --out "$BUNDLE" \
  --calibration-corpus unlabeled/enwiki2015_1m_sentences.txt.gz --calibration-sentences 10000 \
  2>&1 | tee -a runs/logs/compression-export.log

"$PY" bench/compression.py --bundles "default=models/default,matryoshka=$BUNDLE" \
  2>&1 | tee -a runs/logs/compression-bench.log
"$PY" bench/rescore_k.py --threads 2 2>&1 | tee -a runs/logs/compression-rescore-k.log
"$PY" bench/binary_lists.py --threads 2 --distractors 0 \
  --configs 191/8,191/8/50,191/8,191/8/50,191/8,191/8/50,1024/8,256/5,191/6,128/4 \
  --out docs/results/binary_lists_small.json 2>&1 | tee -a runs/logs/compression-binary-lists.log
