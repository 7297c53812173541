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
