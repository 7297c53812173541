"""Human-readable summaries printed at the end of a training run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def print_training_summary(manifest: dict[str, Any], out: Path) -> None:
    console = Console()
    table = Table(title=f"{manifest['method']} student -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in manifest.get("scores", {}).items():
        if isinstance(value, int | float):
            table.add_row(name, f"{value:.2f}")
    table.add_row("best STS-B dev", f"{manifest['training']['best_dev_spearman']:.2f}")
    for name, value in manifest["teacher"].get("reference", {}).items():
        table.add_row(f"teacher {name}", f"{value:.2f}")
    table.add_row("params", f"{manifest['student']['params']:,}")
    for stage, seconds in manifest["seconds"].items():
        table.add_row(f"wall-clock {stage}", f"{seconds:.1f} s")
    console.print(table)
