#!/usr/bin/env bash
# The methods table at the medium CPU budget (docs/methods.md; issue 24), one resumable command:
# the six methods, the SimTDE-student variant and ConGen plus HPD's MSE (--hpd-weight 1), each on
# the first 100,000 Wikipedia sentences plus the STS-B train sentences, one epoch of 64 (1,727
# steps), projection from the ridge warm start.
# About 2-2.5 h of the 2 cores per row. bench/methods.py skips a finished row and resumes an
# unfinished one, so rerun the same command after an interruption; pause it (kill -STOP) while
# benchmarking. The mpnet targets of the 100,000 sentences are the ones bench/compression.py and
# bench/quora_sr.py use as distractors (the same text, one cache entry), so either fills them.
#   bash scripts/cpu_methods_job.sh          # logs: runs/methods-100k/logs, table: docs/methods.md
# Later arguments override these (the last value wins): scripts/gpu_methods_job.sh runs this same
# command with --device cuda and its own folders, PY naming the Python there.
set -euo pipefail
cd "$(dirname "$0")/.."
export DISTILEMBED_DATA_DIR="${DISTILEMBED_DATA_DIR:-../shared/data}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "${PY:-.venv/bin/python}" bench/methods.py --preset hpd-mpnet-cpu --teacher all-mpnet-base-v2 \
  --student all-MiniLM-L6-v2 --corpus unlabeled/enwiki2015_1m_sentences.txt.gz \
  --n-sentences 100000 --epochs 1 --batch-size 64 --lr 5e-5 --eval-every 250 --save-every 250 \
  --device cpu --finetune-epochs 1 --train-arg "--init-projection ridge" \
  --variant "congen-simtde=congen --student-arch simtde --lr 1.5e-4" \
  --variant "congen-hpd=congen --hpd-weight 1" \
  --variant "ibkd-random=ibkd --init-projection random" \
  --variant "distilcse-ckd-random=distilcse-ckd --init-projection random" \
  --runs-dir runs/methods-100k --out docs/results/methods-100k.json "$@"
