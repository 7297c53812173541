"""Usage errors from the CLI are a short message and exit 2, never a traceback (typer raises its
vendored click's exceptions, which the entry point must recognise too)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["index", "build"], "Missing option '--bundle'"),
        (["index"], "Usage: "),
        (["nosuch"], "No such command"),
    ],
)
def test_usage_errors_exit_2_without_a_traceback(args: list[str], expected: str) -> None:
    command = [sys.executable, "-m", "distilembed.cli", *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2
    assert expected in output and "Traceback" not in output
