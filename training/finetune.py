"""``distilembed finetune``: the two-stage methods' supervised stage 2
(:func:`training.methods.nli_finetune_stage`) alone, on any finished checkpoint, so a one-stage
student (ConGen, HPD) takes the same supervised signal. A Matryoshka student is fine-tuned at each trained
width with its weights. STS-B dev selects, step 0 included, so the result never scores below its source on
dev; the run resumes (``--resume``).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformer

from distilembed.artifacts import read_manifest, require_checkpoint, sha256_tree
from distilembed.errors import UserError
from distilembed.paths import resolve_data_path
from training.checkpoint import source_manifest, write_checkpoint
from training.config import TrainConfig
from training.data.sts import load_stsb_split
from training.evaluation import dev_scorer, final_scores
from training.methods import nli_finetune_stage
from training.pipeline import StageClock, run_stages, stage_report, started_run
from training.trainer import resolve_device

# What ``finetune`` may set: the stage-2 fields and the run's seed, device, data and Matryoshka weights.
SHARED_FIELDS = {"seed", "device", "amp", "sts_dir", "exclude_text", "matryoshka_weights"}
FINETUNE_FIELDS = {f.name for f in fields(TrainConfig) if f.name.startswith("finetune_")} | SHARED_FIELDS


def source_config(source: Path, manifest: dict[str, Any]) -> TrainConfig:
    """The source's training configuration (its width and trained widths); fields unknown here are dropped."""
    saved = manifest.get("config")
    if not isinstance(saved, dict):
        raise UserError(
            f"{source} has no training configuration in its manifest; finetune needs a "
            "checkpoint written by `distilembed train`, `whiten` or `average`"
        )
    known = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in saved.items() if k in known})


def start_dev(curve: list[dict[str, float]]) -> float | None:
    """The source's STS-B dev: the score the stage's loop takes at step 0."""
    scores = [p["dev_spearman"] for p in curve if p["step"] == 0 and "dev_spearman" in p]
    return round(scores[0], 2) if scores else None


def finetune_checkpoint(
    source: Path,
    out: Path,
    overrides: dict[str, Any],
    *,
    data_dir: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Fine-tune ``source`` on NLI triplets into ``out``, return its manifest. ``overrides`` sets
    :data:`FINETUNE_FIELDS` of the source's ``TrainConfig``; its ``exclude_text`` adds to the source's."""
    overrides = {k: v for k, v in overrides.items() if k != "matryoshka_weights" or v is not None}
    unknown = set(overrides) - set(FINETUNE_FIELDS)
    if unknown:
        raise ValueError(f"not fine-tuning settings: {sorted(unknown)}")
    require_checkpoint(source)
    first = source_manifest(source)
    base = source_config(source, first)
    # The source's exclusions always hold; --exclude-text adds to them.
    excluded = tuple(dict.fromkeys([*base.exclude_text, *overrides.pop("exclude_text", ())]))
    if "matryoshka_weights" in overrides:
        overrides["matryoshka_weights"] = tuple(overrides["matryoshka_weights"])
        if not base.matryoshka:
            raise UserError(
                f"{source} was trained at one width; --matryoshka-weights needs a Matryoshka student"
            )
    cfg = replace(base, **overrides, exclude_text=excluded).validate()
    sts_dir = resolve_data_path(cfg.sts_dir, data_dir)
    clock, device, widths = StageClock(), resolve_device(cfg.device), cfg.widths()
    with started_run(cfg, out, resume, overwrite) as workdir:
        with clock.stage("data"):
            student = SentenceTransformer(str(source), device=device)
            stage = nli_finetune_stage(cfg, student, data_dir, with_hsic=False)
            dev_pairs = load_stsb_split(sts_dir, "dev")
        dev_score = dev_scorer(dev_pairs, widths)
        done = run_stages([stage], student, workdir=workdir, dev_score=dev_score, clock=clock, resume=resume)
    _, trainer, state = done[0]
    with clock.stage("evaluate"):
        _, scores = final_scores(trainer.best_dir, device, sts_dir, widths)
    report = stage_report(stage, state)
    manifest = {
        **{key: first[key] for key in ("teacher", "student", "data", "training", "whiten") if key in first},
        "method": first.get("method", "unknown"),
        "config": asdict(cfg),
        "stages": [*(first.get("stages") or []), report],
        "finetune": {
            "source": {"path": str(source), "files": sha256_tree(source)},
            "source_dev_spearman": start_dev(state.curve),
            **report,
        },
        **scores,
        "seconds": {**(first.get("seconds") or {}), **{f"finetune_{k}": v for k, v in clock.seconds.items()}},
    }
    curve = [{**point, "stage": stage.name} for point in state.curve]
    write_checkpoint(trainer.best_dir, out, manifest, curve, overwrite=overwrite)
    shutil.rmtree(workdir, ignore_errors=True)
    return read_manifest(out)
