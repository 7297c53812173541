#!/usr/bin/env bash
# The HPD run on a lent GPU machine (see docs/results.md, "HPD student"). Inputs arrive as
# tar parts in /tmp/parts (fp16 copies of the teacher and student init, the data subset and
# pinned wheels; scripts/gpu_pack.sh makes them). Two learning rates train side by side; the
# one with the better STS-B *dev* score is kept. Results land in /tmp/w/result.
set -euo pipefail
W=/tmp/w
mkdir -p "$W"
cat /tmp/parts/part_* | tar -x -C "$W"
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench DISTILEMBED_DATA_DIR=$W/data HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
DE=(python3 -m distilembed.cli)
COMMON=(--preset hpd-mpnet --teacher "$W/mpnet-fp16" --student "$W/minilm-fp16"
        --corpus unlabeled/wiki500k.txt.gz --teacher-batch-size 256 --device cuda)

"${DE[@]}" targets --teacher "$W/mpnet-fp16" --corpus unlabeled/wiki500k.txt.gz \
  --batch-size 256 --device cuda > "$W/targets.log" 2>&1
"${DE[@]}" train "${COMMON[@]}" --lr 1e-4 --out "$W/lr1e-4" > "$W/lr1e-4.log" 2>&1 &
A=$!
# The second run starts once the first has filled the shared target cache for the small sets.
while kill -0 "$A" 2>/dev/null && ! grep -q "stage teacher_reference done" "$W/lr1e-4.log"; do sleep 5; done
"${DE[@]}" train "${COMMON[@]}" --lr 2e-4 --out "$W/lr2e-4" > "$W/lr2e-4.log" 2>&1 &
B=$!
python3 - "$W" <<'PY' > "$W/quora.log" 2>&1 || echo "quora vectors failed" >> "$W/quora.log"
import json, sys
import numpy as np
from harness import load_quora_retrieval
from training.teacher_targets import Teacher
w = sys.argv[1]
q = load_quora_retrieval(f"{w}/data/quora")
vectors = Teacher(f"{w}/mpnet-fp16", device="cuda", batch_size=256).encode(q.corpus)
np.save(f"{w}/quora_teacher.npy", vectors.astype(np.float16))
json.dump({"corpus_sha256": q.corpus_sha256, "n": len(q.corpus), "teacher": "all-mpnet-base-v2 (fp16 weights, fp16 autocast)"}, open(f"{w}/quora_teacher.json", "w"))
PY
wait "$A" || true
wait "$B" || true
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
best = None
for run in ("lr1e-4", "lr2e-4"):
    try:
        m = json.load(open(f"{w}/{run}/manifest.json"))
    except OSError:
        continue
    dev = m["training"]["best_dev_spearman"]
    print(run, "dev", dev, "scores", m["scores"], "seconds", m["seconds"])
    if best is None or dev > best[1]:
        best = (run, dev)
open(f"{w}/BEST", "w").write(best[0] if best else "")
PY
mkdir -p "$W/result"
cd "$W"
# shellcheck disable=SC2046
tar -cf - $(cat BEST) $(ls ./*.log quora_teacher.* 2>/dev/null) | split -b 15M - result/r_
ls -la "$W/result"
touch "$W/DONE"
