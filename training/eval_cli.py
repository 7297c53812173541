"""The ``eval`` command: STS12-16, STS-B and SICK-R scores of a sentence encoder, as a table and JSON.
scipy, torch and sentence-transformers are imported only when the command runs, so registering it costs
the serving image nothing."""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from distilembed.artifacts import atomic_write_json, read_manifest
from distilembed.errors import UserError
from training.data.sts import load_sts_set, locate_sts_sets
from training.teachers import load_sentence_encoder


def _encoder(
    model: str, device: str, variant: str, batch_size: int
) -> tuple[int | None, int | None, Any, str]:
    """(dimension, parameters, encode function, what runs it) of a bundle (the ONNX runtime, as the
    service encodes) or of a PyTorch model."""
    from export.runtime import BUNDLE_KIND, MODEL_FILES, Encoder

    folder = Path(model).expanduser()
    if (folder / "manifest.json").is_file() and read_manifest(folder).get("kind") == BUNDLE_KIND:
        if variant not in MODEL_FILES:
            raise UserError(f"--variant must be int8 or fp32, not {variant!r}")
        runtime = Encoder(folder, variant=variant, threads=os.cpu_count())
        return runtime.dim, None, partial(runtime.encode, batch_size=batch_size), f"onnx {variant}"
    from training.evaluation import sentence_transformer_encoder
    from training.trainer import resolve_device  # imports torch: only when the command runs

    encoder = load_sentence_encoder(model, device=resolve_device(device))
    names = ("get_embedding_dimension", "get_sentence_embedding_dimension")
    getter = next((getattr(encoder, name) for name in names if callable(getattr(encoder, name, None))), None)
    parameters = getattr(encoder, "parameters", None)  # None where the model cannot say
    params = sum(p.numel() for p in parameters()) if callable(parameters) else None
    return getter() if getter else None, params, sentence_transformer_encoder(encoder, batch_size), device


def eval_command(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Sentence-transformers folder, packaged teacher (all-MiniLM-L6-v2, all-mpnet-base-v2), "
            "hub id, or an exported bundle (scored through the ONNX runtime, as the service encodes).",
        ),
    ],
    sts_dir: Annotated[
        Path | None,
        typer.Option(
            "--sts-dir",
            help="Folder holding STS12-16-en-test/, stsbenchmark/, SICK files "
            "(default: $DISTILEMBED_DATA_DIR/sts).",
        ),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Write the results as JSON here ('-': JSON on stdout, table on stderr)."),
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sentences per encode call.")] = 64,
    device: Annotated[str, typer.Option("--device", help="Torch device for the model.")] = "cpu",
    variant: Annotated[str, typer.Option("--variant", help="A bundle's graph: int8 or fp32.")] = "int8",
) -> None:
    """Evaluate a sentence encoder on the STS sets found (Spearman x100 of cosine, SimCSE protocol)."""
    from training.evaluation import evaluate_sts, format_table

    to_stdout = json_out is not None and str(json_out) == "-"
    console = Console(stderr=to_stdout)
    status = Console(stderr=True)

    if sts_dir is None and not os.environ.get("DISTILEMBED_DATA_DIR"):
        raise UserError("no STS directory: pass --sts-dir or set DISTILEMBED_DATA_DIR")
    located = locate_sts_sets(sts_dir or Path(os.environ["DISTILEMBED_DATA_DIR"]).expanduser() / "sts")
    sets = {name: load_sts_set(name, path) for name, path in located.items()}
    with status.status(f"loading model {model}"):
        dim, params, encode, runs_on = _encoder(model, device, variant, batch_size)

    started = time.perf_counter()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=status,
        transient=True,
    ) as progress:
        names = [*sets, ""]  # the set each step starts on; "" once all are done
        task = progress.add_task(f"STS: {names[0]}", total=len(sets))

        def advance(done: str) -> None:
            following = names[names.index(done) + 1]
            progress.update(task, advance=1, description=f"STS: {following}" if following else "STS")

        results = evaluate_sts(encode, sets, progress=advance)
    seconds = time.perf_counter() - started

    table = format_table(results, model, dim, params)
    # Never squeeze the numbers: a pipe or a narrow terminal gets the table's natural width.
    natural = Measurement.get(console, console.options.update_width(1000), table).maximum
    console.print(table, width=max(console.width, natural))
    report = {
        "model": model,
        "dim": dim,
        "params": params,
        "metric": "spearman x100 of cosine similarity",
        "aggregation": "STS12-16: SentEval 'all' (one Spearman over the year's concatenated subsets); "
        "Avg.: mean over the sets found",
        **results,
        "sources": {name: str(path) for name, path in located.items()},
        "batch_size": batch_size,
        "device": runs_on,
        "seconds": round(seconds, 2),
    }
    # NaN (a constant prediction) becomes null: strict JSON has no NaN.
    report = json.loads(json.dumps(report), parse_constant=lambda _: None)
    if to_stdout:
        typer.echo(json.dumps(report, indent=2))
    elif json_out is not None:
        atomic_write_json(json_out, report)
        status.print(f"wrote {json_out}")
