#!/usr/bin/env bash
# One lent GPU session's question for issues 23 and 24: which NLI fine-tunings of a finished CPU
# student are worth this CPU's 5-11 minutes each? Every run is `distilembed finetune` in float32
# (`--no-amp`, so the GPU differs from the CPU by kernels only), from the same two sources:
#  - models/mrl: the Matryoshka student `mrl-ts05-tt07` (99.2% / 97.0% of its 128-d, 128-d 0.45
#    short of issue 23's floor): which weights, rates and losses lift 32-d along with 128-d?
#  - models/white: the default's source `ens-hpd1-white` (issue 24): rates, batches, temperatures,
#    and uniform soups of one recipe's seeds (the default is a soup of two rates).
# Inputs: the parts of `python scripts/gpu_pack.py pack --teacher none --student none --n-sentences 0
# --model mrl=runs/mrl-ts05-tt07 --model white=runs/ens-hpd1-white` in /tmp/parts (scripts/gpu_setup.sh).
# Launch, in the last of the calls that copy those parts: bash scripts/gpu_detached.sh 420 scripts/gpu_finetune_job.sh
# Results: $OUT (or /tmp/w/result): every run's manifest and log; `bash scripts/gpu_finetune_job.sh
# collect` packs what exists. FINETUNE_ARGS goes to every run, JOBS runs at once, ONLY (a regex) picks
# runs by name (a CPU dry run: PY=.venv/bin/python DEVICE=cpu FINETUNE_ARGS="--max-steps 2"
# ONLY='^(m-118|w-base|w-s4[345])$' JOBS=2 W=/tmp/wdry bash scripts/gpu_finetune_job.sh).
set -uo pipefail
source scripts/gpu_setup.sh
gpu_runs finetune "$@"  # the runs' folder; `collect` packs it
read -r -a EXTRA <<< "${FINETUNE_ARGS:-}"  # finetune's flags for every run
JOBS=${JOBS:-10}
DEVICE=${DEVICE:-cuda}
MRL=$W/models/mrl
WHITE=$W/models/white

ft() {  # NAME SOURCE FLAGS...: one fine-tuning into $RUNS/NAME (decision 48's recipe, then FLAGS)
  local name=$1 source=$2
  shift 2
  [ -f "$RUNS/$name/manifest.json" ] || [[ ! $name =~ ${ONLY:-.} ]] && return 0
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  ( "$PY" -m distilembed.cli finetune "$source" --out "$RUNS/$name" --device "$DEVICE" --no-amp --epochs 2 \
      --lr 1e-5 --eval-every 10 --exclude-text sts/stsbenchmark/sts-dev.csv "$@" "${EXTRA[@]}" \
      > "$RUNS/logs/$name.log" 2>&1
    echo "$name exit $?" >> "$RUNS/logs/exits.txt" ) &
}

soup() {  # NAME RUN...: a uniform soup of finished runs into $RUNS/NAME, with its STS-B dev and test
  local name=$1
  shift
  "$PY" -m distilembed.cli average "${@/#/$RUNS/}" --out "$RUNS/$name" > "$RUNS/logs/$name.log" 2>&1 &&
    "$PY" -m distilembed.cli eval --model "$RUNS/$name" --device "$DEVICE" --json "$RUNS/$name/eval.json" \
      >> "$RUNS/logs/$name.log" 2>&1
  echo "$name exit $?" >> "$RUNS/logs/exits.txt"
}

# The CPU's own recipes first: how far the GPU's float32 is from the CPU's runs of the same command.
ft m-118 "$MRL" --matryoshka-weights 1,1,8
ft m-001 "$MRL" --matryoshka-weights 0,0,1
ft w-base "$WHITE"
ft w-b128 "$WHITE" --batch-size 128 --lr 2e-5 --epochs 3
# Issue 23: can the 32-d prefix gain more than the 0.1 that 1e-5 gave it?
ft m-001-lr2 "$MRL" --matryoshka-weights 0,0,1 --lr 2e-5
ft m-001-lr5 "$MRL" --matryoshka-weights 0,0,1 --lr 5e-5
ft m-001-lr2-e4 "$MRL" --matryoshka-weights 0,0,1 --lr 2e-5 --epochs 4
ft m-018-lr2 "$MRL" --matryoshka-weights 0,1,8 --lr 2e-5
ft m-011-lr2 "$MRL" --matryoshka-weights 0,1,1 --lr 2e-5
ft m-1216-lr2 "$MRL" --matryoshka-weights 1,2,16 --lr 2e-5
ft m-118-lr2 "$MRL" --matryoshka-weights 1,1,8 --lr 2e-5
ft m-118-lr5-e3 "$MRL" --matryoshka-weights 1,1,8 --lr 5e-5 --epochs 3
ft m-001-t10-lr2 "$MRL" --matryoshka-weights 0,0,1 --temperature 0.1 --lr 2e-5
ft m-001-t02-lr2 "$MRL" --matryoshka-weights 0,0,1 --temperature 0.02 --lr 2e-5
ft m-001-b128-lr2-e3 "$MRL" --matryoshka-weights 0,0,1 --batch-size 128 --lr 2e-5 --epochs 3
ft m-118-ibkd "$MRL" --matryoshka-weights 1,1,8 --loss ibkd
ft m-001-ibkd-lr2 "$MRL" --matryoshka-weights 0,0,1 --loss ibkd --lr 2e-5
# Issue 24: the default's source under other rates, batches and temperatures, and seeds to soup.
for seed in 43 44 45 46 47 48 49; do ft "w-s$seed" "$WHITE" --seed "$seed"; done
for seed in 43 44 45; do ft "w-b128-s$seed" "$WHITE" --batch-size 128 --lr 2e-5 --epochs 3 --seed "$seed"; done
ft w-lr05 "$WHITE" --lr 5e-6
ft w-lr3 "$WHITE" --lr 3e-5
ft w-e4 "$WHITE" --epochs 4
ft w-b256 "$WHITE" --batch-size 256 --lr 4e-5 --epochs 4
ft w-t10 "$WHITE" --temperature 0.1
ft w-t03 "$WHITE" --temperature 0.03
ft w-ibkd "$WHITE" --loss ibkd
wait

soup w-soup8 w-base w-s43 w-s44 w-s45 w-s46 w-s47 w-s48 w-s49
soup w-soup4 w-base w-s43 w-s44 w-s45
soup w-b128-soup4 w-b128 w-b128-s43 w-b128-s44 w-b128-s45
gpu_collect finetune
touch "$W/DONE"
