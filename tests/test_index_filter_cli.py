"""``index build --index-field``, ``index field``, ``index count`` and ``index search --filter``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAQ = Path(__file__).resolve().parents[1] / "examples" / "data" / "faq.jsonl"


def test_filters_on_the_command_line(run_cli: Callable[..., Any], tiny_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    sources = [json.loads(line)["source"] for line in FAQ.read_text().splitlines()]
    built = run_cli(
        "index", "build", "--bundle", str(tiny_bundle), "--corpus", str(FAQ),
        "--metadata-column", "source", "--index-field", "source", "--out", str(out),
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    count = run_cli("index", "count", str(out), "--filter", '{"source": "programming"}')
    assert json.loads(count.stdout) == {"count": sources.count("programming")}
    assert json.loads(run_cli("index", "count", str(out)).stdout) == {"count": len(sources)}
    hits = run_cli(
        "index", "search", "--index", str(out), "--query", "python", "-k", "50",
        "--filter", '{"source": {"$ne": "programming"}}',
    )  # fmt: skip
    others = len(sources) - sources.count("programming")
    assert hits.returncode == 0 and len(hits.stdout.splitlines()) == others
    fields = run_cli("index", "field", str(out), "lang", "source")
    assert json.loads(fields.stdout) == {"indexed_fields": ["lang", "source"]}
    refusals = (("{bad", "--filter is not valid JSON"), ('{"a": [1]}', "filter.a: a list is not a value"))
    for bad, says in refusals:
        refused = run_cli("index", "count", str(out), "--filter", bad)
        assert refused.returncode == 2 and says in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
