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


def test_entry_point_keeps_exit_codes_and_real_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """typer.Exit keeps its code; an unexpected error propagates as itself (the handler once raised
    AttributeError on every unexpected error, hiding it)."""
    import typer

    from distilembed import cli

    def raising(error: BaseException):
        def fake_app(**_: object) -> None:
            raise error

        return fake_app

    monkeypatch.setattr(cli, "_register", lambda: None)
    monkeypatch.setattr(cli, "app", raising(typer.Exit(3)))
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 3
    monkeypatch.setattr(cli, "app", raising(KeyError("bundle")))
    with pytest.raises(KeyError, match="bundle"):
        cli.main()
