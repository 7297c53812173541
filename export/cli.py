"""Export-stage subcommand: ``distilembed export``. Heavy imports happen inside the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

Opt = typer.Option


def _stsb_test(sts_dir: str | None, data_dir: str | None) -> tuple[list[Any], list[str]]:
    """STS-B test pairs and their distinct sentences (the parity and STS-B figures' texts)."""
    from distilembed.paths import resolve_data_path
    from training.data.sts import distinct_sentences, load_stsb_split

    pairs = load_stsb_split(resolve_data_path(sts_dir or "sts", data_dir), "test")
    return pairs, distinct_sentences(pairs)


def export_command(
    model: Annotated[str, Opt("--model", help="Checkpoint folder (or packaged name / hub id) to export.")],
    out: Annotated[Path, Opt("--out", help="Bundle directory to write.")],
    sts_dir: Annotated[
        str | None, Opt(help="STS data for the parity gate and STS-B figures (default: <data-dir>/sts).")
    ] = None,
    data_dir: Annotated[str | None, Opt("--data-dir", envvar="DISTILEMBED_DATA_DIR")] = None,
    fp32_min_cosine: Annotated[float, Opt(help="Gate: fp32 vs PyTorch, minimum cosine.")] = 0.9999,
    int8_mean_cosine: Annotated[float, Opt(help="Gate: int8 vs PyTorch, mean cosine.")] = 0.99,
    int8_max_sts_drop: Annotated[float, Opt(help="Gate: largest STS-B test drop of int8, points.")] = 0.5,
    overwrite: Annotated[bool, Opt(help="Replace an existing --out.")] = False,
) -> None:
    """Export a student to an ONNX bundle (fp32 fused + int8), gated on parity with PyTorch."""
    from export.bundle import ParityGate, build_bundle
    from training.evaluation import evaluate_pairs

    if out.exists() and not overwrite:
        from distilembed.errors import UserError

        raise UserError(f"output exists: {out} (pass --overwrite to replace it)")
    pairs, sentences = _stsb_test(sts_dir, data_dir)
    gate = ParityGate(fp32_min_cosine, int8_mean_cosine, int8_max_sts_drop)
    manifest = build_bundle(
        model,
        out,
        parity_texts=sentences,
        sts_scores=lambda encode: evaluate_pairs(encode, pairs),
        gate=gate,
        overwrite=overwrite,
    )
    typer.echo(f"bundle {out}: dim {manifest['dim']}, parity {manifest['parity']}")


def upgrade_bundle_command(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory to rewrite in place (atomically).")],
    sts_dir: Annotated[str | None, Opt(help="STS data for the figures (default: <data-dir>/sts).")] = None,
    data_dir: Annotated[str | None, Opt("--data-dir", envvar="DISTILEMBED_DATA_DIR")] = None,
    max_sts_drop: Annotated[float, Opt(help="Refuse the rewrite if int8 STS-B test drops more.")] = 0.5,
) -> None:
    """Apply this version's graph rewrites to an existing bundle (no checkpoint needed)."""
    from distilembed.errors import UserError
    from export.unfuse import upgrade_bundle
    from training.evaluation import evaluate_pairs

    if not (bundle / "manifest.json").is_file():
        raise UserError(f"not a bundle (no manifest.json): {bundle}")
    pairs, sentences = _stsb_test(sts_dir, data_dir)
    record = upgrade_bundle(
        bundle, sentences, sts_scores=lambda encode: evaluate_pairs(encode, pairs), max_sts_drop=max_sts_drop
    )
    typer.echo(f"bundle {bundle}: {record}")


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
    app.command("upgrade-bundle")(upgrade_bundle_command)
