"""bench/filters.py at a tiny size, through the service too: its table has every candidate with
ten hits each, and with --no-doc it writes nothing into the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_bench_hostile import ROOT, repo_outputs


def test_the_filter_bench_runs_small_and_writes_nothing(tmp_path: Path) -> None:
    before = repo_outputs()
    sizes = ["--docs", "3000", "--nlist", "16", "--queries", "4", "--rounds", "1"]
    cmd = [sys.executable, "bench/filters.py", *sizes, "--no-doc", "--dir", str(tmp_path / "index")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "x**" in line]
    names = ["no filter", "1%, indexed", "50%, indexed", "1%, not indexed", "50%, not indexed"]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == names
    assert all(row.rstrip(" |").endswith("10.0") for row in rows), rows  # k hits for every candidate
    assert all(row.count("x**") == 3 for row in rows)  # in-process, by vector and by text
    assert repo_outputs() == before
