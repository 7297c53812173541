#!/usr/bin/env bash
# The medium-budget methods table on a lent GPU machine: scripts/cpu_methods_job.sh itself, with
# --device cuda, this machine's folders and all rows trained at once.
# Inputs: the parts of `python scripts/gpu_pack.py pack` copied to /tmp/parts (one folder per call).
# Launch, in the last of those calls: bash scripts/gpu_detached.sh 540 scripts/gpu_methods_job.sh [ARGS]
# Results: $OUT (or /tmp/w/result): the JSON, the rendered table, the logs, every checkpoint's
# manifest and curve, and the hpd / ibkd int8 bundles in 15 MB pieces. Extra arguments go to
# bench/methods.py (a dry run on the CPU: PY=.venv/bin/python ... --device cpu --n-sentences 512).
set -euo pipefail
source scripts/gpu_setup.sh

collect() {  # what exists so far into $RESULT (`bash scripts/gpu_methods_job.sh collect`: that alone)
  cp "$W/methods-100k.json" "$W/methods.md" "$W/methods.log" "$RESULT/" 2>/dev/null || true
  (cd "$W/methods" && tar -czf "$RESULT/runs-meta.tar.gz" logs ./*/manifest.json ./*/training_curve.json \
    bundles/*/manifest.json) 2>/dev/null || true
  for name in hpd ibkd; do
    b="$W/methods/bundles/$name"
    if [ -f "$b/manifest.json" ]; then
      # The int8 bundle as models/default ships it (the fp32 graph stays behind).
      (cd "$b/.." && tar -cf - "$name"/{manifest.json,model.int8.onnx,tokenizer.json}) |
        split -b 15M - "$RESULT/bundle-$name.tar."
    fi
  done
  ls -la "$RESULT"
}
if [ "${1:-}" = collect ]; then
  collect
  exit 0
fi

rc=0
gpu_methods --jobs 10 --threads 2 --runs-dir "$W/methods" \
  --reference-bundle "$W/methods/bundles/all-MiniLM-L6-v2" \
  --out "$W/methods-100k.json" --doc "$W/methods.md" "$@" > "$W/methods.log" 2>&1 || rc=$?
echo "methods.py exit $rc" >> "$W/methods.log"
collect
touch "$W/DONE"
