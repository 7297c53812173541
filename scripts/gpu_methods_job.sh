#!/usr/bin/env bash
# The method comparison on a lent GPU machine (docs/methods.md): same inputs as
# scripts/gpu_hpd_job.sh (tar parts in /tmp/parts, wheels installed in /tmp/site), every method at
# one budget, trained 6 at a time, then exported. Results land in /tmp/w/result.
set -euo pipefail
W=/tmp/w
mkdir -p "$W"
[ -d "$W/mpnet-fp16" ] || cat /tmp/parts/part_* | tar -x -C "$W"
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench DISTILEMBED_DATA_DIR=$W/data HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 bench/methods.py --preset hpd-mpnet --teacher "$W/mpnet-fp16" --student "$W/minilm-fp16" \
  --corpus unlabeled/wiki500k.txt.gz --n-sentences "${N_SENTENCES:-200000}" --epochs 1 --batch-size 128 \
  --lr 2e-4 --teacher-batch-size 256 --device cuda --jobs 6 --runs-dir "$W/methods" \
  > "$W/methods.log" 2>&1 || echo "methods.py exited $?" >> "$W/methods.log"
mkdir -p "$W/result/pack/bundles"
cp bench/results/methods.json docs/methods.md "$W/methods.log" "$W/result/pack/" 2>/dev/null || true
cp -r "$W/methods/logs" "$W/result/pack/" 2>/dev/null || true
for m in "$W"/methods/*/; do
  name=$(basename "$m")
  if [ -f "$m/manifest.json" ]; then cp "$m/manifest.json" "$W/result/pack/$name.manifest.json"; fi
done
for b in "$W"/methods/bundles/*/; do
  name=$(basename "$b")
  if [ -f "$b/manifest.json" ]; then cp "$b/manifest.json" "$W/result/pack/bundles/$name.manifest.json"; fi
done
if [ -f "$W/methods/bundles/simtde/model.int8.onnx" ]; then
  mkdir -p "$W/result/pack/simtde-bundle"
  cp "$W"/methods/bundles/simtde/{manifest.json,model.int8.onnx,tokenizer.json} "$W/result/pack/simtde-bundle/"
fi
cd "$W/result" && tar -cf - pack | split -b 15M - r_
ls -la "$W/result"
touch "$W/DONE"
