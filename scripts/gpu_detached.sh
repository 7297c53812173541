#!/usr/bin/env bash
# The last call of a lent-GPU session: run a scripts/gpu_*_job.sh detached from the call, wait for
# it up to SECONDS, then hand back what it wrote, finished or not.
#   bash scripts/gpu_detached.sh 540 scripts/gpu_sweep_job.sh [ARGS...]
# The job runs with OUT unset (it writes into $W/result) so that it can outlive the call; the wait
# ends at $W/DONE, at the deadline, or as soon as the job has died without DONE (a failed launch
# must not spend the device budget). Then `JOB collect` (every gpu_*_job.sh has it) packs what
# exists into $W/result, which is copied to $OUT with the job's console log.
set -uo pipefail
seconds=$1
job=$2
shift 2
W=${W:-/tmp/w}
mkdir -p "$W"
rm -f "$W/DONE"
env -u OUT setsid -w nohup bash "$job" "$@" > "$W/job.console.log" 2>&1 &
pid=$!
start=$(date +%s)
while [ ! -f "$W/DONE" ] && [ $(($(date +%s) - start)) -lt "$seconds" ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "job exited without $W/DONE after $(($(date +%s) - start)) s"
    break
  fi
  sleep 2
done
echo "waited $(($(date +%s) - start)) s; done: $([ -f "$W/DONE" ] && echo yes || echo no)"
if [ -n "${OUT:-}" ]; then
  OUT=$W/result W=$W bash "$job" collect > /dev/null 2>&1
  cp -r "$W/result/." "$OUT/" 2>/dev/null
  cp "$W/job.console.log" "$OUT/"
fi
tail -5 "$W/job.console.log"
