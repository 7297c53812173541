"""scripts/gpu_detached.sh: a detached job's results come back, and a failed launch ends the wait."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = """W=${W:-/tmp/w}; RESULT=${OUT:-$W/result}; mkdir -p "$RESULT"
if [ "${1:-}" = collect ]; then echo packed > "$RESULT/packed.txt"; exit 0; fi
echo "OUT in the job: ${OUT:-unset}"; echo "$1" > "$RESULT/row.txt"; touch "$W/DONE"
"""


def _run(tmp_path: Path, job_text: str, *args: str) -> tuple[str, Path]:
    job, out = tmp_path / "job.sh", tmp_path / "out"
    job.write_text(job_text)
    out.mkdir()
    env = {**os.environ, "W": str(tmp_path / "w"), "OUT": str(out)}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_detached.sh"), "300", str(job), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout, out


def test_results_and_collect_come_back(tmp_path: Path) -> None:
    stdout, out = _run(tmp_path, JOB, "ibkd")
    assert "done: yes" in stdout
    assert (out / "row.txt").read_text() == "ibkd\n"
    assert (out / "packed.txt").read_text() == "packed\n"
    assert "OUT in the job: unset" in (out / "job.console.log").read_text()


def test_a_failed_launch_ends_the_wait(tmp_path: Path) -> None:
    stdout, out = _run(tmp_path, "echo 'no such flag' >&2; exit 3\n")
    assert "job exited without" in stdout and "done: no" in stdout
    assert "no such flag" in (out / "job.console.log").read_text()
