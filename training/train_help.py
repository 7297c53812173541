"""``distilembed train``'s help with the defaults a run gets without ``--preset``. Imported on every
command line (``serve`` too), so it, and ``training.config``, import no torch."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from typer.core import TyperCommand

from training.config import TrainConfig


class PresetDefaultsCommand(TyperCommand):
    """``train``'s options default to None, so that a flag given overrides ``--preset`` and one left
    out keeps the preset's value; click shows no default for None, so the help (``--help`` and the
    generated CLI reference) shows what each comes to without a preset: ``TrainConfig``'s defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        defaults = {field.name: field.default for field in fields(TrainConfig)}
        for param in self.params:
            shown = _default_text(param, defaults.get(param.name or ""))
            if param.default is None and shown:
                param.show_default = shown


def _default_text(param: Any, value: object) -> str:
    """``value`` as the help shows it: a boolean as its flag, a tuple comma-separated, none as ""."""
    if isinstance(value, bool):
        flags = param.opts if value else param.secondary_opts
        return flags[0].lstrip("-") if flags else str(value)
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return str(value) if isinstance(value, (int, float, str)) else ""  # None, or a default_factory's MISSING
