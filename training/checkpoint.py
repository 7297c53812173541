"""Checkpoint writing: a sentence-transformers folder + manifest.json + the training curve."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from distilembed.artifacts import (
    atomic_directory,
    atomic_write_json,
    git_commit,
    now_iso,
    read_manifest,
    sha256_tree,
    tool_versions,
)

CURVE_PNG = "training_curve.png"
CURVE_JSON = "training_curve.json"
VERSIONED = ("torch", "transformers", "sentence-transformers", "scikit-learn", "numpy", "distilembed")


def plot_curve(curve: list[dict[str, float]], path: Path, title: str) -> None:
    """Loss per logged step and STS-B dev Spearman per evaluation, on twin axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = [(p["step"], p["loss"]) for p in curve if "loss" in p]
    devs = [(p["step"], p["dev_spearman"]) for p in curve if "dev_spearman" in p]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if losses:
        ax.plot(*zip(*losses, strict=True), color="tab:blue", lw=1.2, label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss", color="tab:blue")
    if losses and min(loss for _, loss in losses) > 0:  # rotate's loss is a negated correlation
        ax.set_yscale("log")
    if devs:
        ax2 = ax.twinx()
        ax2.plot(*zip(*devs, strict=True), color="tab:orange", marker="o", ms=3, label="STS-B dev")
        ax2.set_ylabel("STS-B dev Spearman x100", color="tab:orange")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_checkpoint(
    model_dir: Path,
    out: Path,
    manifest: dict[str, Any],
    curve: list[dict[str, float]],
    overwrite: bool = False,
) -> Path:
    """Copy the chosen student folder to ``out`` atomically, with manifest and curve beside it."""
    with atomic_directory(out, overwrite=overwrite) as tmp:
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
        atomic_write_json(tmp / CURVE_JSON, curve)
        plot_curve(curve, tmp / CURVE_PNG, f"{manifest.get('method', '')} -> {out.name}")
        full = {
            "kind": "checkpoint",
            "format": "sentence-transformers",
            "created": now_iso(),
            "git_commit": git_commit(),
            "versions": tool_versions(*VERSIONED),
            **manifest,
            "training_curve": CURVE_JSON,
            "files": sha256_tree(tmp),
        }
        atomic_write_json(tmp / "manifest.json", full)
    return out


def source_manifest(path: Path) -> dict[str, Any]:
    """A checkpoint's manifest, or {} for a sentence-transformers folder without one."""
    return read_manifest(path) if (path / "manifest.json").is_file() else {}


def save_checkpoint(
    model: Any, out: Path, manifest: dict[str, Any], curve: list[dict[str, float]], overwrite: bool = False
) -> dict[str, Any]:
    """:func:`write_checkpoint` of a model in memory (saved beside ``out`` first); the full manifest."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as scratch:
        model.save(str(Path(scratch) / "model"))
        write_checkpoint(Path(scratch) / "model", out, manifest, curve, overwrite=overwrite)
    return read_manifest(out)
