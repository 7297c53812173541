"""bench/serve.py's output decision, without running the benchmark: with --no-doc it writes no JSON
into the repository unless --json names one."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import serve
from harness import RESULTS


def test_no_doc_writes_no_json_unless_told_where(tmp_path: Path) -> None:
    smoke = ["--bundle", "models/default", "--requests", "50", "--duration", "5", "--name", "smoke"]
    assert serve.json_path(serve.parse_args([*smoke, "--no-doc"])) is None
    out = tmp_path / "serve.json"
    assert serve.json_path(serve.parse_args([*smoke, "--no-doc", "--json", str(out)])) == out


def test_a_run_that_rewrites_the_doc_saves_its_json_under_bench_results(tmp_path: Path) -> None:
    assert serve.json_path(serve.parse_args(["--name", "default"])) == RESULTS / "serve-default.json"
    load = serve.parse_args(["--name", "default", "--load"])
    assert serve.json_path(load) == RESULTS / "serve-default-load.json"
    bundle = tmp_path / "congen"
    assert serve.json_path(serve.parse_args(["--bundle", str(bundle)])) == RESULTS / "serve-congen.json"
    out = tmp_path / "elsewhere.json"
    assert serve.json_path(serve.parse_args(["--json", str(out)])) == out
