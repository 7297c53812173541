#!/usr/bin/env bash
# One lent GPU session's question for issue 23: is the Matryoshka student's 32-d (and 64-d) prefix
# short of 97% (99%) of its 128-d score because of the Matryoshka loss, or because 32 (64)
# coordinates of this student hold no more? Kusupati et al.'s fixed-feature baseline answers it:
# students trained at one width alone, on the default's recipe (ConGen, mpnet 0.7 + MiniLM 0.3, 450
# steps), beside the Matryoshka run of the same recipe on the same machine. Each narrow width twice:
# with the teacher's PCA cut to that width as the target, and with the teacher's distribution from
# its own full space (`--congen-teacher-space full`), the most a narrow student can be shown.
# ROUND=2 asks the next two questions: does the Matryoshka student gain what the 32-d student gained
# from the teacher's own space, and do three times the steps (6 epochs) raise the 32-d student
# against the 128-d one of the same budget? ROUND=3 varies the weights, steps, learning rate and
# widths of that Matryoshka run.
# Inputs: the parts of `python scripts/gpu_pack.py pack` in /tmp/parts (scripts/gpu_setup.sh).
# Launch, in the last of the calls that copy those parts: bash scripts/gpu_detached.sh 420 scripts/gpu_widths_job.sh
# Results: $OUT (or /tmp/w/result): every run's manifest (STS-B dev and test) and log;
# `bash scripts/gpu_widths_job.sh collect` packs what exists. WIDTHS_ARGS goes to every run (a CPU
# dry run: PY=.venv/bin/python WIDTHS_ARGS="--device cpu --n-sentences 256 --max-steps 2
# --pca-fit corpus --no-train-on-pca-texts" W=/tmp/wdry bash scripts/gpu_widths_job.sh).
set -uo pipefail
source scripts/gpu_setup.sh
gpu_runs widths "$@"  # gpu_train's runs folder; `collect` packs it
read -r -a EXTRA <<< "${WIDTHS_ARGS:-}"  # gpu_train's flags for every run

FULL=(--congen-teacher-space full)  # ConGen's teacher distribution from the teacher's own space
MRL=(--matryoshka 128,64,32)
LONG=(--epochs 6 --eval-every 150 --save-every 150)
# The first run fills the teacher-target cache (sentences and ConGen's views) for the others.
if [ "${ROUND:-1}" = 1 ]; then
  gpu_train_first mrl-111 "${MRL[@]}"
  gpu_train dim128 &
  gpu_train dim64 --dim 64 &
  gpu_train dim32 --dim 32 &
  gpu_train dim64-full --dim 64 "${FULL[@]}" &
  gpu_train dim32-full --dim 32 "${FULL[@]}" &
else
  gpu_train_first mrl-space "${MRL[@]}" "${FULL[@]}"
fi
if [ "${ROUND:-1}" = 2 ]; then
  gpu_train mrl-space-124 "${MRL[@]}" --matryoshka-weights 1,2,4 "${FULL[@]}" &
  gpu_train mrl-space-e6 "${MRL[@]}" "${FULL[@]}" "${LONG[@]}" &
  gpu_train dim128-e6 "${LONG[@]}" &
  gpu_train dim32-full-e6 --dim 32 "${FULL[@]}" "${LONG[@]}" &
elif [ "${ROUND:-1}" = 3 ]; then
  gpu_train mrl-space-1-4-16 "${MRL[@]}" "${FULL[@]}" --matryoshka-weights 1,4,16 &
  gpu_train mrl-space-124-e6 "${MRL[@]}" "${FULL[@]}" --matryoshka-weights 1,2,4 "${LONG[@]}" &
  gpu_train mrl-space-124-lr1e-4 "${MRL[@]}" "${FULL[@]}" --matryoshka-weights 1,2,4 --lr 1e-4 &
  gpu_train mrl-space-5w --matryoshka 128,96,64,48,32 --matryoshka-weights 1,1,2,2,4 "${FULL[@]}" &
  gpu_train dim64-full-e6 --dim 64 "${FULL[@]}" "${LONG[@]}" &
fi
wait

gpu_collect widths
touch "$W/DONE"
