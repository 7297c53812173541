"""What the training subcommands share: the ``--data-dir`` option and comma-separated numbers.

``training/cli.py`` and the subcommands kept in modules of their own (``rotate_cli.py``) import it
from here, so those modules need not import ``training/cli.py``, which registers them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from distilembed.errors import UserError

Opt = typer.Option
DataDir = Annotated[
    str | None,
    Opt("--data-dir", envvar="DISTILEMBED_DATA_DIR", help="Root that relative data paths are read from."),
]


def comma_list(text: str | None, kind: type[int] | type[float], flag: str) -> list[Any] | None:
    """``"128,64,32"`` -> ``[128, 64, 32]``; a bad item is a one-line error naming the flag."""
    if text is None:
        return None
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated {kind.__name__}s, got {text!r}") from None
