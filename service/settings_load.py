"""Settings from explicit values, their errors as one line: shared by ``distilembed serve``
(service/cli.py) and Ray Serve's ``app_builder`` (service/ray_serve.py), so neither imports the other."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from distilembed.errors import UserError
from service.errors import describe_errors

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def settings_from(cls: type[SettingsT], overrides: dict[str, Any]) -> SettingsT:
    """``cls(**overrides)`` (unset fields from ``DISTILEMBED_*``, then the defaults), or one line
    naming every bad setting: for ``distilembed serve``'s flags and ``serve run``'s args alike."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        errors = exc.errors()
        problems = describe_errors(errors, whole="settings", most=len(errors))
        raise UserError(f"bad settings: {problems}") from exc
