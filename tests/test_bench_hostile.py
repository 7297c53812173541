"""bench/hostile.py at tiny sizes against the server it starts on models/default: every row of its
table passes (the two latency ratios under the siege aside: timings), and with --no-doc it writes
nothing into the repository, only the JSON it is told to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DOC = ROOT / "docs" / "results.md"
RESULTS_DIR = ROOT / "docs" / "results"


def repo_outputs() -> tuple[bytes, list[str]]:
    """What a run that wrote into the repository would change: the results doc and the JSON folder."""
    return RESULTS_DOC.read_bytes(), sorted(p.name for p in RESULTS_DIR.iterdir())


def test_every_hostile_case_passes_at_tiny_sizes_and_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    before = repo_outputs()
    sizes = ["--idle", "20", "--slow", "5", "--requests", "10", "--header-timeout-s", "1", "--pace-s", "0.3"]
    cmd = [sys.executable, "bench/hostile.py", *sizes, "--no-doc", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    # p50 under the siege against unloaded is a timing: on a machine shared with other work it can miss.
    timed = [row for row in result["rows"] if row["case"].endswith(": loaded / unloaded")]
    failed = [row for row in result["rows"] if not row["pass"] and row not in timed]
    assert not failed, json.dumps(failed, indent=1)
    assert len(timed) == 2 and done.returncode == (0 if all(row["pass"] for row in timed) else 1)
    phases = {"baseline", "siege", "poison", "filters", "limits", "paths"}
    assert {row["phase"] for row in result["rows"]} == phases
    closes = result["siege"]["closes"]
    assert (closes["idle"]["closed"], closes["slow"]["closed"], result["siege"]["slow_408"]) == (20, 5, 5)
    assert repo_outputs() == before
