"""The docs site builds with ``mkdocs build --strict`` (broken links and missing pages fail), and its
CLI and HTTP references are generated from the code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_strict_build_with_generated_references(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert "## `distilembed index build`" in cli and "`--storage <str>`" in cli
    http = (ROOT / "docs" / "reference" / "http.md").read_text()
    assert "## `POST /v1/embeddings`" in http and "| 422 |" in http
    assert (tmp_path / "site" / "reference" / "http" / "index.html").is_file()
