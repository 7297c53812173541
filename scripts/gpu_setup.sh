# Sourced by the scripts/gpu_*_job.sh scripts on a lent GPU machine: unpacks the parts of
# `python scripts/gpu_pack.py pack` from /tmp/parts into $W once, installs the packed wheels into
# $W/site (not for the job's `collect`), and exports the environment the training CLI needs there.
W=${W:-/tmp/w}
export PY=${PY:-python3}
RESULT=${OUT:-$W/result}
mkdir -p "$W" "$RESULT"
if [ "${1:-}" != collect ]; then  # the job's `collect` only packs what exists
  [ -d "$W/teacher" ] || "$PY" scripts/gpu_pack.py unpack /tmp/parts "$W"
  [ -d "$W/site/transformers" ] ||
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$W"/wheels/*.whl
fi
export PYTHONPATH=$W/site:$PWD:$PWD/bench DISTILEMBED_DATA_DIR=$W/data HF_HUB_OFFLINE=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false

gpu_methods() {  # scripts/cpu_methods_job.sh with this machine's teacher, student and GPU; ARGS follow
  PY=$PY bash scripts/cpu_methods_job.sh --teacher "$W/teacher" --student "$W/student" --device cuda \
    --teacher-batch-size 256 --reference-model "$W/student" "$@"
}

# A run of the default's recipe (ConGen, mpnet 0.7 + MiniLM 0.3, 450 steps) on this GPU. The job
# sets RUNS (its runs' folder, with a logs/ folder) and EXTRA (an array of flags for every run).
gpu_train() {  # NAME FLAGS...: one run into $RUNS/NAME, skipped once its manifest exists
  local name=$1
  shift
  [ -f "$RUNS/$name/manifest.json" ] && return 0
  "$PY" -m distilembed.cli train --teacher "$W/teacher" --student "$W/student" --device cuda \
    --teacher-batch-size 256 --preset congen-mpnet-cpu --exclude-text sts/stsbenchmark/sts-test.csv \
    --ensemble-teacher "$W/student:0.3" "$@" "${EXTRA[@]}" --out "$RUNS/$name" > "$RUNS/logs/$name.log" 2>&1
  echo "$name exit $?" >> "$RUNS/logs/exits.txt"
}

gpu_train_first() {  # NAME FLAGS...: start a run, return once it has filled the teacher-target cache
  gpu_train "$@" &
  local pid=$!
  until grep -q 'stage method_setup done' "$RUNS/logs/$1.log" 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do
    sleep 2
  done
}

gpu_collect() {  # NAME: pack the logs, manifests and curves of the runs in $W/NAME into $RESULT/NAME.tar.gz
  (cd "$W" && tar -czf "$RESULT/$1.tar.gz" --ignore-failed-read "$1/logs" "$1"/*/manifest.json \
    "$1"/*/training_curve.json "$1"/*.partial/training_curve.json "$1"/*/eval.json 2>/dev/null)
  ls -la "$RESULT"
}

gpu_runs() {  # NAME [the job's first argument]: RUNS=$W/NAME with a logs/ folder; `collect` packs it and exits
  RUNS=$W/$1
  mkdir -p "$RUNS/logs"
  if [ "${2:-}" = collect ]; then
    gpu_collect "$1"
    exit 0
  fi
}
