#!/usr/bin/env bash
# One lent GPU session's exploration for issues 23 and 24, every run at once on the one GPU:
#  - the InfoNCE rows of the methods table (ibkd, distilcse-kd, distilcse-ckd) at 3x its budget
#    (3 epochs of the 100k sentences): does a longer stage 1 cross its step 0?
#  - Matryoshka variants on the default's recipe (ConGen, mpnet 0.7 + MiniLM 0.3, 450 steps): which
#    widths and weights move the 64-d and 32-d shares of the 128-d score?
#  - two combinations of what lifted STS-B dev alone (ensemble + HPD term, + 32k sentences).
# Inputs: the parts of `python scripts/gpu_pack.py pack` in /tmp/parts (scripts/gpu_setup.sh).
# Launch, in the last of the calls that copy those parts: bash scripts/gpu_detached.sh 540 scripts/gpu_sweep_job.sh
# Results: $OUT (or /tmp/w/result): every run's manifest (STS-B dev and test at each width), the
# logs and the methods rows' JSON and curves; `bash scripts/gpu_sweep_job.sh collect` packs what
# exists so far (the last call runs it when its time is up). SWEEP_ARGS goes to every sweep run and
# NO_METHODS=1 skips the methods rows (a CPU dry run: PY=.venv/bin/python NO_METHODS=1
# SWEEP_ARGS="--device cpu --n-sentences 256 --max-steps 2 --pca-fit corpus --no-train-on-pca-texts"
# W=/tmp/wdry bash scripts/gpu_sweep_job.sh).
set -uo pipefail
source scripts/gpu_setup.sh
RUNS=$W/sweep  # gpu_train's runs folder
mkdir -p "$RUNS/logs"

collect() {
  (cd "$W" && tar -czf "$RESULT/sweep.tar.gz" --ignore-failed-read sweep/logs sweep/*/manifest.json \
    sweep/*/training_curve.json methods3x/logs methods3x/*/manifest.json methods3x/*/training_curve.json \
    methods3x.log methods-3x.json methods-3x.md 2>/dev/null)
  ls -la "$RESULT"
}
if [ "${1:-}" = collect ]; then
  collect
  exit 0
fi
read -r -a EXTRA <<< "${SWEEP_ARGS:-}"  # gpu_train's flags for every run

[ "${NO_METHODS:-0}" = 1 ] || gpu_methods --jobs 3 --threads 2 --runs-dir "$W/methods3x" \
  --rows ibkd distilcse-kd distilcse-ckd --epochs 3 --eval-every 500 --save-every 500 --no-export \
  --out "$W/methods-3x.json" --doc "$W/methods-3x.md" > "$W/methods3x.log" 2>&1 &

# The first run fills the teacher-target cache (sentences and ConGen's views) for the others.
gpu_train_first mrl-111 --matryoshka 128,64,32
gpu_train mrl-1-4-16 --matryoshka 128,64,32 --matryoshka-weights 1,4,16 &
gpu_train mrl-1-8-64 --matryoshka 128,64,32 --matryoshka-weights 1,8,64 &
gpu_train mrl-5w --matryoshka 128,96,64,48,32 &
gpu_train mrl-5w-rising --matryoshka 128,96,64,48,32 --matryoshka-weights 1,1,2,4,8 &
gpu_train mrl-1-4-16-hpd1 --matryoshka 128,64,32 --matryoshka-weights 1,4,16 --hpd-weight 1 &
gpu_train mrl-1-4-16-e6 --matryoshka 128,64,32 --matryoshka-weights 1,4,16 --epochs 6 --eval-every 150 \
  --save-every 150 &
gpu_train mrl-1-4-16-lr1e-4 --matryoshka 128,64,32 --matryoshka-weights 1,4,16 --lr 1e-4 &
gpu_train ens-hpd1 --hpd-weight 1 &
gpu_train ens-hpd1-32k --hpd-weight 1 --n-sentences 32768 --eval-every 100 --save-every 100 &
wait

collect
touch "$W/DONE"
