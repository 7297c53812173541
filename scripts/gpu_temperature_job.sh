#!/usr/bin/env bash
# One lent GPU session's question for issues 23 and 24: do ConGen's temperatures (teacher 0.05,
# student 0.07: the paper's, set for a 768-d teacher) suit the ensemble teacher? A CPU run with a
# softer teacher (--teacher-temperature 0.1, `mrl-tt10` in docs/results.md) moved capacity from the
# Matryoshka student's 128-d to its narrow widths without adding any at 32-d; this sweep asks the
# same of milder and student-side changes, and of more text, on the Matryoshka recipe
# (`--preset congen-ens-mrl-cpu`'s flags) and on stop 50's default's (`--hpd-weight 1` on the
# ensemble recipe at lr 5e-5), 450 steps.
# Inputs: the parts of `python scripts/gpu_pack.py pack --n-sentences 40000` in /tmp/parts
# (scripts/gpu_setup.sh).
# Launch, in the last of the calls that copy those parts: bash scripts/gpu_detached.sh 420 scripts/gpu_temperature_job.sh
# Results: $OUT (or /tmp/w/result): every run's manifest (STS-B dev and test at each width) and log;
# `bash scripts/gpu_temperature_job.sh collect` packs what exists. TEMPERATURE_ARGS goes to every
# run (a CPU dry run: PY=.venv/bin/python TEMPERATURE_ARGS="--device cpu --n-sentences 256
# --max-steps 2 --pca-fit corpus --no-train-on-pca-texts" W=/tmp/wdry bash scripts/gpu_temperature_job.sh).
set -uo pipefail
source scripts/gpu_setup.sh
gpu_runs temperature "$@"  # gpu_train's runs folder; `collect` packs it
read -r -a EXTRA <<< "${TEMPERATURE_ARGS:-}"  # gpu_train's flags for every run

MRL=(--matryoshka 128,64,32 --matryoshka-weights 1,2,4 --congen-teacher-space full --lr 1e-4)
DEFAULT=(--hpd-weight 1)
# The first run fills the teacher-target cache (sentences and ConGen's views) for the others.
gpu_train_first mrl "${MRL[@]}"
gpu_train mrl-ts05 "${MRL[@]}" --temperature 0.05 &
gpu_train mrl-ts035 "${MRL[@]}" --temperature 0.035 &
gpu_train mrl-tt07 "${MRL[@]}" --teacher-temperature 0.07 &
gpu_train mrl-tt10 "${MRL[@]}" --teacher-temperature 0.1 &
gpu_train mrl-ts05-tt07 "${MRL[@]}" --temperature 0.05 --teacher-temperature 0.07 &
gpu_train mrl-32k "${MRL[@]}" --n-sentences 32768 --eval-every 100 --save-every 100 &
gpu_train ens-hpd1 "${DEFAULT[@]}" &
gpu_train ens-hpd1-ts05 "${DEFAULT[@]}" --temperature 0.05 &
gpu_train ens-hpd1-tt07 "${DEFAULT[@]}" --teacher-temperature 0.07 &
gpu_train ens-hpd1-ts05-tt07 "${DEFAULT[@]}" --temperature 0.05 --teacher-temperature 0.07 &
wait

gpu_collect temperature
touch "$W/DONE"
