#!/usr/bin/env bash
# One lent GPU session's question for issue 24's methods table: do the InfoNCE rows that stayed
# below their step 0 at 1x and 3x (ibkd, distilcse-ckd) cross it at 6x the budget (6 epochs of
# the 100k sentences, 10,362 steps; 10-15 h per row on this CPU)? Same flags as the 3x rows of
# scripts/gpu_sweep_job.sh, two rows at once with more threads each.
# Inputs: the parts of `python scripts/gpu_pack.py pack` in /tmp/parts (scripts/gpu_setup.sh).
# Launch, in the last of the calls that copy those parts: bash scripts/gpu_detached.sh 540 scripts/gpu_long_job.sh
# Results: $OUT (or /tmp/w/result): the rows' JSON, curves and logs, finished or not (each row
# evaluates STS-B dev every 500 steps, so a cut-off row still has its curve so far);
# `bash scripts/gpu_long_job.sh collect` packs what exists.
set -uo pipefail
source scripts/gpu_setup.sh
collect() {
  (cd "$W" && tar -czf "$RESULT/long.tar.gz" --ignore-failed-read methods6x/logs \
    methods6x/*/manifest.json methods6x/*/training_curve.json methods6x/*.partial/training_curve.json \
    methods6x.log methods-6x.json methods-6x.md 2>/dev/null)
  ls -la "$RESULT"
}
if [ "${1:-}" = collect ]; then
  collect
  exit 0
fi
gpu_methods --jobs 2 --threads 6 --runs-dir "$W/methods6x" \
  --rows distilcse-ckd ibkd --epochs 6 --eval-every 500 --save-every 500 --no-export \
  --out "$W/methods-6x.json" --doc "$W/methods-6x.md" > "$W/methods6x.log" 2>&1
collect
touch "$W/DONE"
