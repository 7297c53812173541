"""What bench/methods.py makes of its rows: the comparisons between them, several runs' reports
merged into one, the printed table and the "Results" block of docs/methods.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

START, END = "<!-- methods-results:start -->", "<!-- methods-results:end -->"


def add_comparisons(rows: list[dict[str, Any]], speeds: dict[str, Any]) -> None:
    """Per row: int8 speed, its ratio to all-MiniLM-L6-v2's int8 bundle, STS-B test minus HPD's."""
    rates = speeds.get("sent_per_s", {})
    reference = rates.get("all-MiniLM-L6-v2")
    for row in rows:
        rate = rates.get(row["method"])
        row["int8_sent_per_s"] = rate
        row["speedup_vs_minilm"] = round(rate / reference, 2) if rate and reference else None
    compare_to_hpd(rows)


def compare_to_hpd(rows: list[dict[str, Any]]) -> None:
    hpd = next((r.get("stsb_test") for r in rows if r["method"] == "hpd"), None)
    for row in rows:
        if hpd is not None and row.get("stsb_test") is not None:
            row["stsb_test_vs_hpd"] = round(row["stsb_test"] - hpd, 2)


COLUMNS = (
    ("method", "method", "{}"),
    ("STS-B test (PyTorch)", "stsb_test", "{:.2f}"),
    ("vs hpd", "stsb_test_vs_hpd", "{:+.2f}"),
    ("STS-B test (int8 bundle)", "bundle_stsb_test_int8", "{:.2f}"),
    ("params", "params", "{:,}"),
    ("dim", "dim", "{}"),
    ("int8 sent/s", "int8_sent_per_s", "{:,.0f}"),
    ("x MiniLM int8", "speedup_vs_minilm", "{:.2f}"),
    ("train wall-clock (s)", "train_seconds", "{:.0f}"),
    ("stage-1 STS-B dev: step 0 -> best", "stage1_dev", "{}"),
    ("best STS-B dev", "best_dev", "{:.2f}"),
    ("trained on", "device", "{}"),
)


def _cells(row: dict[str, Any]) -> list[str]:
    return ["-" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in COLUMNS]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(name for name, _, _ in COLUMNS) + " |"]
    lines.append("| --- |" + " ---: |" * (len(COLUMNS) - 1))
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def rewrite_doc(doc: Path, table: str, note: str) -> None:
    text = doc.read_text() if doc.exists() else f"# Methods\n\n## Results\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n## Results\n\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{START}\n{note}\n\n{table}\n{END}{tail}")


def doc_note(doc: Path) -> str:
    """The sentence above the doc's current table ('' when there is none)."""
    text = doc.read_text() if doc.exists() else ""
    if START not in text:
        return ""
    return text.split(START, 1)[1].lstrip("\n").split("\n\n", 1)[0].strip()


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several runs': rows by name (a later run's wins), each run kept. A row keeps
    the speeds of its own run: runs on other machines have other speeds and other references."""
    rows: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    for report in reports:
        runs += report.get("runs") or [{"command": report.get("command"), "speed": report.get("speed", {})}]
        rows |= {row["method"]: row for row in report["rows"]}
    merged = list(rows.values())
    compare_to_hpd(merged)
    return {"runs": runs, "rows": merged}


def print_table(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="distillation methods, one budget")
    for name, _, _ in COLUMNS:
        table.add_column(name, justify="left" if name == "method" else "right")
    for row in rows:
        table.add_row(*_cells(row))
    console.print(table)


def publish(report: dict[str, Any], note: str, args: argparse.Namespace, console: Console) -> None:
    """Write the report to --out, its table to the doc's Results, and print it."""
    Path(args.out).write_text(json.dumps(report, indent=2))
    rewrite_doc(Path(args.doc), markdown_table(report["rows"]), note)
    print_table(report["rows"], console)
    console.print(f"wrote {args.out} and the Results of {args.doc}")


def render_only(args: argparse.Namespace, console: Console) -> int:
    report = merge_reports([json.loads(Path(p).read_text()) for p in args.render_from])
    sources = ", ".join(f"`{p}`" for p in args.render_from)
    publish(report, args.note or f"Rendered from {sources}.", args, console)
    return 0
