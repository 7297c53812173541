"""The packages that deploy (service, index, export, distilembed) type-check with mypy, as configured
in pyproject.toml's ``[tool.mypy]``; its cache (.mypy_cache) keeps a rerun to seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_reports_no_errors() -> None:
    pytest.importorskip("mypy")
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],  # the files and options come from pyproject.toml
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"mypy found errors:\n{report}"
    assert "Success: no issues found" in result.stdout, report
