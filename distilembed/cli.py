"""The ``distilembed`` command: one Typer app that assembles each stage's subcommands.

Stage modules are imported lazily inside their commands, so ``distilembed serve`` never
imports torch.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import typer

from distilembed.errors import UserError

app = typer.Typer(
    name="distilembed",
    help="Distil, export, index and serve compact sentence embeddings.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    if app.registered_commands or app.registered_groups:  # once per process: tests call main() again
        return
    from export.cli import register as register_export
    from index.cli import register as register_index
    from service.cli import register as register_service
    from training.cli import register as register_training

    register_training(app)
    register_export(app)
    register_index(app)
    register_service(app)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "urllib3", "filelock", "huggingface_hub", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _register()
    try:
        app(standalone_mode=False)
    except UserError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors carry their own exit code
        modules = _click_exception_modules()
        for exceptions in modules:
            if isinstance(exc, exceptions.ClickException):
                exc.show()
                sys.exit(exc.exit_code)
        exits = (typer.Exit, *(m.Exit for m in modules if hasattr(m, "Exit")))
        if isinstance(exc, exits):
            sys.exit(exc.exit_code)
        raise


def _click_exception_modules() -> list[Any]:
    """click's exception module, and typer's vendored copy of click where it has one (typer 0.29
    raises its own ``typer._click`` classes, which click's ``isinstance`` checks do not catch)."""
    import click

    modules: list[Any] = [click.exceptions]
    try:
        from typer import _click  # type: ignore[attr-defined, unused-ignore]  # absent before typer 0.29

        modules.append(_click.exceptions)
    except ImportError:
        pass
    return modules


if __name__ == "__main__":
    main()
