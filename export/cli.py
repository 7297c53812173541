"""Export-stage subcommand: ``distilembed export``. Heavy imports happen inside the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from export.smooth import SMOOTH_ALPHA, SMOOTH_MIN_SPREAD, SMOOTH_TEXTS

STATIC_TEXTS = 2048  # calibration sentences for the static int8 activation scales

Opt = typer.Option


def _stsb(sts_dir: str | None, data_dir: str | None, split: str = "test") -> tuple[list[Any], list[str]]:
    """STS-B pairs of ``split`` and their distinct sentences (the parity and STS-B figures' texts)."""
    from distilembed.paths import resolve_data_path
    from training.data.sts import distinct_sentences, load_stsb_split

    pairs = load_stsb_split(resolve_data_path(sts_dir or "sts", data_dir), split)
    return pairs, distinct_sentences(pairs)


def _corpus_texts(corpus: str, limit: int, data_dir: str | None) -> list[str]:
    """The first ``limit`` sentences of a corpus (also found relative to ``data_dir``)."""
    from distilembed.paths import resolve_data_path
    from training.data.text import read_sentences

    return read_sentences(resolve_data_path(corpus, data_dir), limit=limit)


export_app = typer.Typer(invoke_without_command=True)


@export_app.callback()
def export_command(
    ctx: typer.Context,
    model: Annotated[
        str | None, Opt("--model", help="Checkpoint folder (or packaged name / hub id) to export (required).")
    ] = None,
    out: Annotated[Path | None, Opt("--out", help="Bundle directory to write (required).")] = None,
    sts_dir: Annotated[
        str | None, Opt(help="STS data for the parity gate and STS-B figures (default: <data-dir>/sts).")
    ] = None,
    data_dir: Annotated[str | None, Opt("--data-dir", envvar="DISTILEMBED_DATA_DIR")] = None,
    fp32_min_cosine: Annotated[float, Opt(help="Gate: fp32 vs PyTorch, minimum cosine.")] = 0.9999,
    int8_mean_cosine: Annotated[float, Opt(help="Gate: int8 vs PyTorch, mean cosine.")] = 0.99,
    int8_max_sts_drop: Annotated[float, Opt(help="Gate: largest STS-B test drop of int8, points.")] = 0.5,
    overwrite: Annotated[bool, Opt(help="Replace an existing --out.")] = False,
    calibration_corpus: Annotated[
        str | None,
        Opt(help="Corpus (.txt / .txt.gz, one sentence a line) for the int8/uint8 embedding ranges."),
    ] = None,
    calibration_sentences: Annotated[
        int, Opt(min=1, help="Sentences of --calibration-corpus to calibrate on (its first N).")
    ] = 10_000,
    reduce_range: Annotated[
        bool,
        Opt(
            "--reduce-range/--full-range",
            help="int8 graph weights in 7 bits (onnxruntime's advice without VNNI) or 8 (decision 52).",
        ),
    ] = False,
    smooth: Annotated[
        bool,
        Opt(
            "--smooth/--no-smooth",
            help="SmoothQuant the int8 graph: activation outliers moved into the weights (decision 55), "
            "calibrated on the first 1,024 --calibration-corpus sentences, else STS-B train's.",
        ),
    ] = True,
    smooth_alpha: Annotated[
        float, Opt(min=0.0, max=1.0, help="SmoothQuant's migration strength alpha (eq. 4).")
    ] = SMOOTH_ALPHA,
    smooth_min_spread: Annotated[
        float,
        Opt(min=0.0, help="Smooth only inputs whose largest channel max is this many times the median's."),
    ] = SMOOTH_MIN_SPREAD,
    static: Annotated[
        bool,
        Opt(
            "--static/--dynamic",
            help="int8 activation scales: calibrated constants (a vector does not depend on its batch) "
            "or per batch, from the first 2,048 --calibration-corpus sentences, else STS-B train's.",
        ),
    ] = True,
) -> None:
    """Export a student to an ONNX bundle (fp32 fused + int8), gated on parity with PyTorch; \
`export calibrate` adds int8/uint8 embedding ranges to a bundle."""
    if ctx.invoked_subcommand is not None:
        return
    from distilembed.errors import UserError
    from export.bundle import ParityGate, build_bundle
    from training.evaluation import evaluate_pairs

    if model is None or out is None:
        raise UserError("export needs --model and --out, or a subcommand (see distilembed export --help)")
    if out.exists() and not overwrite:
        raise UserError(f"output exists: {out} (pass --overwrite to replace it)")
    calibration_texts = None
    if calibration_corpus is not None:
        calibration_texts = _corpus_texts(calibration_corpus, calibration_sentences, data_dir)
    pairs, sentences = _stsb(sts_dir, data_dir)
    own_texts = calibration_texts or _stsb(sts_dir, data_dir, "train")[1]
    smooth_texts = own_texts[:SMOOTH_TEXTS] if smooth else None
    manifest = build_bundle(
        model,
        out,
        parity_texts=sentences,
        sts_scores=lambda encode: evaluate_pairs(encode, pairs),
        gate=ParityGate(fp32_min_cosine, int8_mean_cosine, int8_max_sts_drop),
        overwrite=overwrite,
        calibration_texts=calibration_texts,
        calibration_source=calibration_corpus or "",
        reduce_range=reduce_range,
        smooth_texts=smooth_texts,
        smooth_alpha=smooth_alpha,
        smooth_min_spread=smooth_min_spread,
        static_texts=own_texts[:STATIC_TEXTS] if static else None,
    )
    calibrated = manifest.get("quantization", {}).get("int8_ranges", {})
    typer.echo(
        f"bundle {out}: dim {manifest['dim']}, parity {manifest['parity']}"
        + (f", int8 ranges for widths {', '.join(calibrated)}" if calibrated else "")
    )


@export_app.command("calibrate")
def calibrate_command(
    bundle: Annotated[Path, Opt("--bundle", help="Bundle directory whose manifest.json gets the ranges.")],
    corpus: Annotated[
        str, Opt("--corpus", help="Corpus (.txt / .txt.gz, one sentence a line), or relative to --data-dir.")
    ],
    sentences: Annotated[int, Opt(min=1, help="Calibrate on the corpus's first N sentences.")] = 10_000,
    widths: Annotated[
        str | None, Opt(help="Widths to calibrate besides the trained ones, comma-separated (e.g. 96,48).")
    ] = None,
    data_dir: Annotated[str | None, Opt("--data-dir", envvar="DISTILEMBED_DATA_DIR")] = None,
) -> None:
    """Record int8/uint8 embedding ranges in a bundle's manifest (per trained width), atomically.

    They are the per-dimension min and max of the corpus's vectors from the bundle's int8 graph,
    cut to each width and re-normalised; the service needs them for `encoding_format` int8/uint8.
    """
    from distilembed.errors import UserError
    from export.quantize import calibrate_bundle

    try:
        extra = [int(w) for w in (widths or "").split(",") if w.strip()]
    except ValueError:
        raise UserError(f"--widths takes comma-separated ints, got {widths!r}") from None
    record = calibrate_bundle(bundle, corpus, sentences, data_dir, extra)
    widths, texts = ", ".join(record["int8_ranges"]), record["calibration"]["texts"]
    typer.echo(f"bundle {bundle}: int8 ranges for widths {widths} from {texts} texts")


def upgrade_bundle_command(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory to rewrite in place (atomically).")],
    sts_dir: Annotated[str | None, Opt(help="STS data for the figures (default: <data-dir>/sts).")] = None,
    data_dir: Annotated[str | None, Opt("--data-dir", envvar="DISTILEMBED_DATA_DIR")] = None,
    max_sts_drop: Annotated[float, Opt(help="Refuse the rewrite if int8 STS-B test drops more.")] = 0.5,
    calibration_corpus: Annotated[
        str | None,
        Opt(help="Corpus whose first 2,048 sentences calibrate static int8 activations (else STS-B train)."),
    ] = None,
    static: Annotated[
        bool, Opt("--static/--keep-dynamic", help="Make a dynamic int8 graph's activation scales static.")
    ] = True,
) -> None:
    """Apply this version's graph rewrites to an existing bundle (no checkpoint needed)."""
    from distilembed.errors import UserError
    from export.unfuse import upgrade_bundle
    from training.evaluation import evaluate_pairs

    if not (bundle / "manifest.json").is_file():
        raise UserError(f"not a bundle (no manifest.json): {bundle}")
    pairs, sentences = _stsb(sts_dir, data_dir)
    static_texts = None
    if static and calibration_corpus is not None:
        static_texts = _corpus_texts(calibration_corpus, STATIC_TEXTS, data_dir)
    elif static:
        static_texts = _stsb(sts_dir, data_dir, "train")[1][:STATIC_TEXTS]
    record = upgrade_bundle(
        bundle,
        sentences,
        sts_scores=lambda encode: evaluate_pairs(encode, pairs),
        max_sts_drop=max_sts_drop,
        static_texts=static_texts,
    )
    typer.echo(f"bundle {bundle}: {record}")


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
    app.command("upgrade-bundle")(upgrade_bundle_command)
