#!/usr/bin/env bash
# Issue 2's CPU HPD run, one resumable chain: mpnet targets for 200k Wikipedia sentences (50 min
# on 2 cores with the ONNX teacher), the hpd-mpnet-cpu training (77 min), STS
# evaluation, then the Quora retrieval benchmark with the same 200k sentences as distractors
# (their mpnet vectors are the cache the first step fills). Rerun the same command after an
# interruption: every step continues where it stopped. Logs: runs/logs/cpu-hpd-*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export DISTILEMBED_DATA_DIR="${DISTILEMBED_DATA_DIR:-../shared/data}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT="${1:-runs/hpd-cpu}"
PY=.venv/bin/python
mkdir -p runs/logs
CORPUS=unlabeled/enwiki2015_1m_sentences.txt.gz

"$PY" -m distilembed.cli targets --teacher all-mpnet-base-v2 --corpus "$CORPUS" \
  --n-sentences 200000 --batch-size 16 --device cpu 2>&1 | tee -a runs/logs/cpu-hpd-targets.log
resume=()
[[ -e "$OUT" ]] && resume=(--resume)
"$PY" -m distilembed.cli train --preset hpd-mpnet-cpu --device cpu --out "$OUT" "${resume[@]}" \
  2>&1 | tee -a runs/logs/cpu-hpd-train.log
"$PY" -m distilembed.cli eval --model "$OUT" 2>&1 | tee runs/logs/cpu-hpd-eval.log
"$PY" -m distilembed.cli export --model "$OUT" --out "$OUT-bundle" --overwrite \
  2>&1 | tee runs/logs/cpu-hpd-export.log
"$PY" bench/quora_sr.py --bundle "$OUT-bundle" --distractors 200000 \
  --out "bench/results/quora_sr_$(basename "$OUT")_d200k.json" 2>&1 | tee runs/logs/cpu-hpd-quora.log
