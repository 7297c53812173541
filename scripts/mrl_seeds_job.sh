#!/usr/bin/env bash
# Issue 23's Matryoshka chain at several training seeds, one resumable job on 2 cores (about 30 min
# per seed; docs/results.md, "Matryoshka widths"). For each seed:
#   1. the first stage, `mrl-pwt` (congen-ens-mrl-cpu with per-width temperatures, 14-17 min);
#   2. its NLI fine-tuning at widths weighted 1,1,8 (9 min);
#   3. the WiSE curve between them, which picks alpha on STS-B dev (2 min).
# Then it prints, over every finished seed, the (seed, alpha) that dev's rule picks: the best mean dev
# over the widths among the points whose dev shares reach 99% (64-d) and 97% (32-d). STS-B test is
# printed beside it and chooses nothing. Rerun the same command after an interruption: finished
# steps are skipped and an unfinished training resumes. Seed 42 is the preset's, `runs/mrl-pwt`.
#   bash scripts/mrl_seeds_job.sh 42 1 2 3
set -euo pipefail
cd "$(dirname "$0")/.."
export DISTILEMBED_DATA_DIR="${DISTILEMBED_DATA_DIR:-../shared/data}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=.venv/bin/python
mkdir -p runs/logs
if [[ $# -gt 0 ]]; then SEEDS=("$@"); else SEEDS=(42 1 2 3); fi

resume_flag() { [[ -e "$1.partial" ]] && echo --resume || true; }

curves=()
for seed in "${SEEDS[@]}"; do
  start="runs/mrl-pwt-s$seed"
  [[ "$seed" == 42 ]] && start=runs/mrl-pwt
  tuned="$start-nli"
  curve="docs/results/wise_curve_$(basename "$tuned").json"
  if [[ ! -e "$start/manifest.json" ]]; then
    # shellcheck disable=SC2046
    "$PY" -m distilembed.cli train --preset congen-ens-mrl-cpu --seed "$seed" \
      --matryoshka-teacher-temperatures 0.05,0.07,0.07 --matryoshka-temperatures 0.07,0.05,0.05 \
      --out "$start" $(resume_flag "$start") 2>&1 | tee -a "runs/logs/mrl-seeds-$seed.log"
  fi
  if [[ ! -e "$tuned/manifest.json" ]]; then
    # shellcheck disable=SC2046
    "$PY" -m distilembed.cli finetune "$start" --out "$tuned" --matryoshka-weights 1,1,8 --epochs 2 \
      --lr 1e-5 --eval-every 10 --exclude-text sts/stsbenchmark/sts-dev.csv $(resume_flag "$tuned") \
      2>&1 | tee -a "runs/logs/mrl-seeds-$seed.log"
  fi
  if [[ ! -e "$curve" ]]; then
    "$PY" bench/wise_curve.py --start "$start" --tuned "$tuned" --alphas 0,0.4,0.5,0.6,0.65,0.7,0.8,1 \
      --out "$curve"
  fi
  curves+=("$curve")
done

"$PY" - "${curves[@]}" <<'EOF'
import json
import sys

sys.path.insert(0, "bench")
from wise_curve import best_row  # the rule each curve picks its alpha by, here over every curve

curves = {path: json.load(open(path)) for path in sys.argv[1:]}
rows = [row | {"curve": path} for path, curve in curves.items() for row in curve["rows"]]
row = best_row(rows, next(iter(curves.values()))["min_shares"])
if row is None:
    print("no seed and alpha meets the dev shares")
else:
    print(f"dev picks {row['curve']} at alpha {row['alpha']}: test {row['test']}, shares {row['test_shares']}")
EOF
