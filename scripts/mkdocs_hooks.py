"""MkDocs hooks (mkdocs.yml ``hooks``): before each build, write the CLI reference from the Typer app,
the HTTP reference from the service's OpenAPI document and the settings reference from its
pydantic-settings class into docs/reference/ (git-ignored), which ``mkdocs build --strict`` checks."""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import typer

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"


def on_pre_build(config: Any) -> None:  # noqa: ARG001 (the MkDocs hook signature)
    REFERENCE.mkdir(exist_ok=True)
    (REFERENCE / "cli.md").write_text(cli_reference(), encoding="utf-8")
    schema = openapi_schema()
    (REFERENCE / "openapi.json").write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
    (REFERENCE / "http.md").write_text(http_reference(schema), encoding="utf-8")
    (REFERENCE / "settings.md").write_text(settings_reference(), encoding="utf-8")


def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    """Every command under ``command`` (click's, as vendored by Typer: duck-typed), depth first."""
    found = [(path, command)]
    if hasattr(command, "commands"):
        for name in sorted(command.commands):
            found += _commands(command.commands[name], [*path, name])
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _prose_cell(text: str) -> str:
    """A table cell from free text: ``<`` and ``>`` outside code spans would read as HTML tags."""
    parts = re.split(r"(`[^`]*`)", text)
    escaped = [p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts]
    return _cell("".join(escaped))


@functools.cache
def _cli() -> Any:
    """The `distilembed` command tree (click's, as vendored by Typer), built once per build."""
    from distilembed.cli import _register, app

    _register()
    return typer.main.get_command(app)


def cli_reference() -> str:
    root = _cli()
    lines = ["# CLI reference", "", "Generated from the `distilembed` Typer app at each docs build.", ""]
    for path, command in _commands(root, ["distilembed"]):
        if command.hidden:
            continue
        lines += [f"## `{' '.join(path)}`", "", (command.help or "").strip(), ""]
        params = [p for p in command.params if p.name != "help"]
        group = hasattr(command, "commands")
        if params and not group:
            ctx = command.make_context(path[-1], [], resilient_parsing=True)
            lines += ["| option | what |", "| --- | --- |"]
            # click's own help record per option (names and type, help, default, env var); None: hidden
            records = filter(None, (p.get_help_record(ctx) for p in params))
            lines += [f"| `{names}` | {_cell(help_text)} |" for names, help_text in records]
            lines.append("")
        if group:
            lines += [f"- `{' '.join([*path, name])}`" for name in sorted(command.commands)] + [""]
    return "\n".join(lines)


def openapi_schema() -> dict[str, Any]:
    from service.app import create_app
    from service.settings import Settings
    from service.testing import FakeEncoder, FakeIndex

    settings = Settings(bundle=Path("models/default"), warmup=False)
    return create_app(settings, FakeEncoder(dim=128), FakeIndex()).openapi()


def http_reference(schema: dict[str, Any]) -> str:
    lines = [
        "# HTTP reference",
        "",
        "Generated from the service's OpenAPI document at each docs build "
        "([openapi.json](openapi.json); a running service serves it at `/openapi.json` and `/docs`).",
        "",
    ]
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            lines += [f"## `{method.upper()} {path}`", "", operation.get("summary", ""), ""]
            if description := operation.get("description", "").strip():
                lines += [description, ""]
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                ref = content.get("schema", {}).get("$ref", "")
                schema_name = f", schema `{ref.rsplit('/', 1)[-1]}`" if ref else ""
                lines += [f"Request body: `{media}`{schema_name}", ""]
            lines += ["| status | meaning |", "| --- | --- |"]
            for status, response in operation.get("responses", {}).items():
                lines.append(f"| {status} | {_cell(response.get('description', ''))} |")
            lines.append("")
    return "\n".join(lines)


# `distilembed serve` flags whose name is not the setting's own.
SERVE_FLAG_FIELDS = {"index": "index_dir"}


def _serve_flags(fields: dict[str, Any]) -> dict[str, str]:
    """Setting name -> its ``distilembed serve`` flag, from the Typer command."""
    serve = _cli().commands["serve"]
    flags = {}
    for param in serve.params:
        if param.name == "help":
            continue
        field = SERVE_FLAG_FIELDS.get(param.name, param.name)
        if field not in fields:
            raise ValueError(f"serve flag {param.opts[0]} sets no Settings field (see SERVE_FLAG_FIELDS)")
        flags[field] = " / ".join(param.opts + param.secondary_opts)
    return flags


def _type_name(annotation: Any) -> str:
    """A setting's type in words: ``path``, ``integer``, one of the literal values, a list of ..."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(f"`{value}`" for value in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args if arg is not type(None))
    if origin is list:
        return f"comma-separated {_type_name(args[0])}s"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    if annotation in names:
        return names[annotation]
    return "secret string" if getattr(annotation, "__name__", "") == "SecretStr" else str(annotation)


def _bounds(metadata: list[Any]) -> str:
    """annotated-types bounds (``Field(ge=..., gt=..., le=..., lt=...)``) as ``>= 1``, ``< 10``."""
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join(
        f"{sign} {getattr(m, name)}" for m in metadata for name, sign in signs.items() if hasattr(m, name)
    )


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None or value == []:
        return "unset"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _env_names(name: str, field: Any, prefix: str) -> list[str]:
    """The variables pydantic-settings reads: the prefixed name, or a validation alias's choices."""
    alias = field.validation_alias
    if alias is None:
        return [f"{prefix}{name}".upper()]
    choices = getattr(alias, "choices", [alias])
    return list(dict.fromkeys(c.upper() for c in choices if isinstance(c, str)))


def settings_reference() -> str:
    from service.settings import Settings

    fields = Settings.model_fields
    prefix = Settings.model_config.get("env_prefix", "")
    flags = _serve_flags(fields)
    lines = [
        "# Service settings",
        "",
        "Generated from `service.settings.Settings` at each docs build: every field of the class, in its "
        "order. Each is an environment variable; the ones with a `distilembed serve` flag can also be "
        "given on the command line. A flag beats the variable, which beats the default. An empty variable "
        "means unset for a setting whose default is unset, and an empty list for a list. "
        "[Serving](../serving.md) explains how to use them.",
        "",
        "| setting | variable | flag | type | default | what |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, field in fields.items():
        if not field.description:
            raise ValueError(
                f"setting {name} has no description (Field(description=...), service/settings.py)"
            )
        env = ", ".join(f"`{v}`" for v in _env_names(name, field, prefix))
        kind = _type_name(field.annotation)
        if bounds := _bounds(field.metadata):
            kind += f", {bounds}"
        flag = f"`{flags[name]}`" if name in flags else ""
        cells = [f"`{name}`", env, flag, _cell(kind), _default(field), _prose_cell(field.description)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)
