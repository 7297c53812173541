"""The ``distilembed`` command: one Typer app that assembles each stage's subcommands.

Stage modules are imported lazily inside their commands, so ``distilembed serve`` never
imports torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
from typing import Any, NoReturn

import typer

from distilembed.errors import UserError

# The top-level modules each extra of pyproject.toml installs beyond the core install.
MODULES_OF_EXTRA = {
    "train": "torch transformers sentence_transformers sklearn scipy nltk matplotlib datasets",
    "export": "onnx",
    "serve": "fastapi uvicorn onnxruntime tokenizers faiss pydantic_settings prometheus_client orjson",
    "ray": "ray pyarrow",
}
EXTRA_OF_MODULE = {module: extra for extra, names in MODULES_OF_EXTRA.items() for module in names.split()}
# A command whose own extra includes the others it needs is named by it: one install fixes it.
COMMAND_EXTRA_COVERS = {"export": ("train", "serve", "export")}

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
    for handler in logging.getLogger().handlers:
        handler.addFilter(LibraryInfo("onnx", "onnxruntime", "optimum"))
    _register()
    try:
        app(standalone_mode=False)
    except UserError as exc:
        _fail(str(exc))
    except ModuleNotFoundError as exc:  # e.g. `train` after the serving-only install
        hint = missing_extra(exc, sys.argv[1:])
        if hint is None:
            raise
        _fail(hint)
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


class LibraryInfo(logging.Filter):
    """Drops INFO and below logged from inside these packages. onnxruntime's graph optimiser logs
    through loggers named after its bare module names (``fusion_base``, ``onnx_model``: about 65 of
    them), so setting levels by logger name cannot reach them; their file paths can."""

    def __init__(self, *packages: str) -> None:
        super().__init__()
        self.dirs = tuple(
            location
            for name in packages
            if (spec := importlib.util.find_spec(name)) is not None and spec.submodule_search_locations
            for location in spec.submodule_search_locations
        )  # find_spec imports nothing: `serve` stays torch-free

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not record.pathname.startswith(self.dirs)


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    sys.exit(2)


def missing_extra(exc: ModuleNotFoundError, args: list[str]) -> str | None:
    """One line naming the extra that installs the module a command missed, or None for a module no
    extra installs (a real error). Stage modules import their stack inside the command, so every
    command's missing module ends here, whichever import reached it first."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    words = _command_words(args)
    if words and extra in COMMAND_EXTRA_COVERS.get(words[0], ()):
        extra = words[0]
    command = " ".join(["distilembed", *words])
    install = f"pip install 'distilembed[{extra}]'"
    return f"{command} needs the '{extra}' extra ({module} is not installed): {install}"


def _command_words(args: list[str]) -> list[str]:
    """The words of ``args`` that name the (sub)command run, e.g. ``["index", "build"]``."""
    words: list[str] = []
    group: typer.Typer | None = app
    for arg in args:
        if group is None:
            break
        groups = {info.name: info.typer_instance for info in group.registered_groups}
        if arg not in groups and arg not in {info.name for info in group.registered_commands}:
            break
        words.append(arg)
        group = groups.get(arg)
    return words


def _click_exception_modules() -> list[Any]:
    """click's exception module, and typer's vendored copy of click where it has one (typer 0.29
    raises its own ``typer._click`` classes, which click's ``isinstance`` checks do not catch)."""
    import click

    modules: list[Any] = [click.exceptions]
    with contextlib.suppress(ImportError):  # typer's vendored click is absent before typer 0.29
        from typer import _click  # type: ignore[attr-defined, unused-ignore]

        modules.append(_click.exceptions)
    return modules


if __name__ == "__main__":
    main()
