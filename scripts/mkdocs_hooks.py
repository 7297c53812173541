"""MkDocs hooks (mkdocs.yml ``hooks``): before each build, write the CLI reference from the Typer app
and the HTTP reference from the service's OpenAPI document, so neither is written by hand.

The pages go to docs/reference/ (git-ignored), which ``mkdocs build --strict`` then checks like any
other page.
"""

from __future__ import annotations

import json
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


def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    """Every command under ``command`` (click's, as vendored by Typer: duck-typed), depth first."""
    found = [(path, command)]
    if hasattr(command, "commands"):
        for name in sorted(command.commands):
            found += _commands(command.commands[name], [*path, name])
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option_row(param: Any, ctx: Any) -> str:
    """One table row from the parameter's own help record (names, type, help, default, env var)."""
    record = param.get_help_record(ctx)
    if record is None:  # hidden
        return ""
    names, help_text = record
    return f"| `{names}` | {_cell(help_text)} |"


def cli_reference() -> str:
    from distilembed.cli import _register, app

    _register()
    root = typer.main.get_command(app)
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
            lines += [row for row in (_option_row(p, ctx) for p in params) if row]
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
            description = operation.get("description", "").strip()
            if description:
                lines += [description, ""]
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                ref = content.get("schema", {}).get("$ref", "")
                lines += [
                    f"Request body: `{media}`" + (f", schema `{ref.rsplit('/', 1)[-1]}`" if ref else ""),
                    "",
                ]
            lines += ["| status | meaning |", "| --- | --- |"]
            for status, response in operation.get("responses", {}).items():
                lines.append(f"| {status} | {_cell(response.get('description', ''))} |")
            lines.append("")
    return "\n".join(lines)
