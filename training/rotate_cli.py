"""``distilembed rotate``: make a finished student, or an exported bundle, Matryoshka by a fitted rotation
(training/rotation.py; a bundle's graphs take it in export/rotate.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distilembed.artifacts import read_manifest, require_checkpoint
from distilembed.errors import UserError
from training.cli_options import DataDir, Opt, comma_list

NONE = "none"


def rotate_command(
    model: Annotated[
        Path,
        typer.Argument(
            help="Checkpoint (its final Dense layer takes the rotation) or bundle (its graphs do)."
        ),
    ],
    out: Annotated[Path, Opt("--out", help="Checkpoint directory to write.")],
    matryoshka: Annotated[
        str | None, Opt(help="Widths, the student's first then decreasing (default: d, d/2, d/4).")
    ] = None,
    matryoshka_weights: Annotated[
        str | None, Opt(help="Loss weight per width (the full width's is unused: its cosines do not change).")
    ] = None,
    pairs: Annotated[
        str,
        Opt(
            help="Labelled pairs whose correlation is fitted: an STS Benchmark csv, or a csv/tsv with "
            "columns sentence1, sentence2, score; none to skip."
        ),
    ] = "sts/stsbenchmark/sts-train.csv",
    triplets: Annotated[
        str, Opt(help="NLI triplets (as finetune reads them) for the contrastive term; none to skip.")
    ] = "nli/snli_devtest_triplets.csv",
    triplet_weight: Annotated[
        float, Opt(help="Weight of the triplets' InfoNCE against the pairs' term.", min=0)
    ] = 0.1,
    exclude_text: Annotated[
        list[str] | None,
        Opt(help="Drop every pair or triplet with a sentence of this source, besides STS-B dev and test."),
    ] = None,
    steps: Annotated[int, Opt(help="Optimiser steps.", min=1)] = 800,
    lr: Annotated[float, Opt(help="Adam learning rate.")] = 3e-4,
    batch_size: Annotated[int, Opt(help="Triplets per step (the pairs are used whole).", min=2)] = 512,
    eval_every: Annotated[int, Opt(help="Steps between STS-B dev evaluations.", min=1)] = 50,
    seed: Annotated[int, Opt(help="Seed of the triplet batches.")] = 42,
    sts_dir: Annotated[str | None, Opt(help="STS data (default: <data-dir>/sts).")] = None,
    data_dir: DataDir = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing --out.")] = False,
) -> None:
    """Rotate a student's output so its prefixes serve as smaller embeddings; full-width cosines stay."""
    from distilembed.paths import resolve_data_path
    from training.data.extra_text import drop_excluded_triplets, excluded_keys, normalise
    from training.data.pairs import load_triplets
    from training.data.sts import find_sts_sets, load_stsb_split, read_scored_pairs
    from training.rotation import RotationRequest, RotationSettings, rotate_checkpoint

    is_bundle = (model / "manifest.json").is_file() and read_manifest(model).get("kind") == "bundle"
    if not is_bundle:
        require_checkpoint(model)
    widths = comma_list(matryoshka, int, "--matryoshka") or []
    weights = comma_list(matryoshka_weights, float, "--matryoshka-weights") or []
    sts_root = resolve_data_path(sts_dir or "sts", data_dir)
    dev, test = load_stsb_split(sts_root, "dev"), load_stsb_split(sts_root, "test")
    held_out = {normalise(s) for p in dev + test for s in (p.sentence1, p.sentence2)}
    held_out |= excluded_keys(exclude_text or [], data_dir)
    info: dict[str, object] = {"pairs": pairs, "triplets": triplets}
    found_pairs = (
        [] if pairs == NONE else read_scored_pairs(_existing(resolve_data_path(pairs, data_dir), "--pairs"))
    )
    kept_pairs = [p for p in found_pairs if not {normalise(p.sentence1), normalise(p.sentence2)} & held_out]
    info.update(pairs_used=len(kept_pairs), pairs_excluded=len(found_pairs) - len(kept_pairs))
    kept_triplets, dropped = (
        ([], 0) if triplets == NONE else drop_excluded_triplets(load_triplets(triplets, data_dir), held_out)
    )
    info.update(triplets_used=len(kept_triplets), triplets_excluded=dropped)
    request = RotationRequest(
        pairs=kept_pairs,
        triplets=kept_triplets,
        dev_pairs=dev,
        widths=widths,
        weights=weights,
        settings=RotationSettings(
            steps=steps,
            lr=lr,
            triplet_weight=triplet_weight if kept_triplets else 0.0,
            batch_size=batch_size,
            eval_every=eval_every,
            seed=seed,
        ),
        data_info=info,
    )
    if is_bundle:
        from export.rotate import rotate_bundle

        manifest = rotate_bundle(model, out, request, data_dir=data_dir, overwrite=overwrite)
    else:
        manifest = rotate_checkpoint(model, out, request, find_sts_sets(sts_root), overwrite=overwrite)
    record = manifest["rotate"]
    before, after = record["source_dev_by_width"], record["dev_by_width"]
    change = ", ".join(f"{m}: {before[m]} -> {after[m]}" for m in after)
    typer.echo(f"{out}: STS-B dev by width ({change}), step {record['best_step']} of {steps}")
    if record["best_step"] == 0:
        typer.echo(f"warning: no step beat the identity on STS-B dev; {out} is {model} unrotated", err=True)


def _existing(path: Path, flag: str) -> Path:
    if not path.is_file():
        raise UserError(f"{flag}: no such file: {path}")
    return path
