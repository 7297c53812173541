#!/usr/bin/env bash
# Issue 23's compressed-index tables (docs/results.md, "Compressed indexes with rescoring") from a
# fresh machine, one resumable chain on 2 cores, about 2.5 hours cold:
#   1. the Matryoshka student (--preset congen-ens-mrl-cpu: the two teachers' targets, about
#      17 minutes cold, then about 25 minutes of training) and its int8 bundle (2 minutes);
#   2. bench/compression.py over it and models/default: the teacher's vectors of the Quora questions
#      (17 minutes) and of the 100,000 Wikipedia distractors (about 83 minutes) go through the
#      target cache, then 24 minutes of measuring;
#   3. bench/rescore_k.py, with the teacher's figures from step 2's JSON (4 minutes), and
#      bench/binary_lists.py on the questions alone (2 minutes).
# Rerun the same command after an interruption: a finished student or bundle is kept, training
# resumes from its last checkpoint, and the teacher's vectors already cached are not encoded again.
# Each bench rewrites its own block of docs/results.md. Logs: runs/logs/compression-*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export DISTILEMBED_DATA_DIR="${DISTILEMBED_DATA_DIR:-../shared/data}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
STUDENT="${1:-runs/congen-ens-mrl}"
BUNDLE="runs/bundles/$(basename "$STUDENT")"
PY=.venv/bin/python
mkdir -p runs/logs

if [[ ! -e "$STUDENT/manifest.json" ]]; then
  resume=()
  [[ -e "$STUDENT.partial" ]] && resume=(--resume)
  "$PY" -m distilembed.cli train --preset congen-ens-mrl-cpu --device cpu --out "$STUDENT" "${resume[@]}" \
    2>&1 | tee -a runs/logs/compression-train.log
fi
[[ -e "$BUNDLE/manifest.json" ]] || "$PY" -m distilembed.cli export --model "$STUDENT" --out "$BUNDLE" \
  --calibration-corpus unlabeled/enwiki2015_1m_sentences.txt.gz --calibration-sentences 10000 \
  2>&1 | tee -a runs/logs/compression-export.log

"$PY" bench/compression.py --bundles "default=models/default,matryoshka=$BUNDLE" \
  2>&1 | tee -a runs/logs/compression-bench.log
"$PY" bench/rescore_k.py --threads 2 2>&1 | tee -a runs/logs/compression-rescore-k.log
"$PY" bench/binary_lists.py --threads 2 --distractors 0 \
  --configs 191/8,191/8/50,191/8,191/8/50,191/8,191/8/50,1024/8,256/5,191/6,128/4 \
  --out bench/results/binary_lists_small.json 2>&1 | tee -a runs/logs/compression-binary-lists.log
