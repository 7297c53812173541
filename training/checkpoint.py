"""Checkpoints: a sentence-transformers folder + manifest.json + the training curve, written atomically; and
their averages.

Averaging: the element-wise mean of the weights of several checkpoints of one student.

Uniform and greedy "model soups" (Wortsman et al., *Model soups: averaging weights of multiple
fine-tuned models improves accuracy without increasing inference time*, ICML 2022, section 3):

    theta_soup = (1 / |S|) * sum_{i in S} theta_i

With weights w_i (summing to 1) the same mean is weighted; for two checkpoints, a start theta_0 and
its fine-tuning theta_1, it is WiSE-FT's interpolation (Wortsman et al., *Robust fine-tuning of
zero-shot models*, CVPR 2022, eq. 1):

    theta_alpha = (1 - alpha) * theta_0 + alpha * theta_1

The uniform soup takes every ingredient. The greedy soup ranks the ingredients by their own
held-out score (STS-B dev here), starts from the best one and adds each next one only if the
soup's score does not drop. Averaging the snapshots along the tail of one run is Stochastic Weight
Averaging (Izmailov et al., *Averaging Weights Leads to Wider Optima and Better Generalization*,
UAI 2018). Inference costs nothing extra: the result is an ordinary checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from distilembed import artifacts
from distilembed.errors import UserError

log = logging.getLogger(__name__)
CURVE_PNG = "training_curve.png"
CURVE_JSON = "training_curve.json"
VERSIONED = ("torch", "transformers", "sentence-transformers", "scikit-learn", "numpy", "distilembed")
NOT_COPIED = frozenset({"manifest.json", CURVE_JSON, CURVE_PNG})
ScoreFn = Callable[[Path], float]


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
    with artifacts.atomic_directory(out, overwrite=overwrite) as tmp:
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
        artifacts.atomic_write_json(tmp / CURVE_JSON, curve)
        plot_curve(curve, tmp / CURVE_PNG, f"{manifest.get('method', '')} -> {out.name}")
        full = {
            "kind": "checkpoint",
            "format": "sentence-transformers",
            "created": artifacts.now_iso(),
            "git_commit": artifacts.git_commit(),
            "versions": artifacts.tool_versions(*VERSIONED),
            **manifest,
            "training_curve": CURVE_JSON,
            "files": artifacts.sha256_tree(tmp),
        }
        artifacts.atomic_write_json(tmp / "manifest.json", full)
    return out


def source_manifest(path: Path) -> dict[str, Any]:
    """A checkpoint's manifest, or {} for a sentence-transformers folder without one."""
    return artifacts.read_manifest(path) if (path / "manifest.json").is_file() else {}


def save_checkpoint(
    model: Any, out: Path, manifest: dict[str, Any], curve: list[dict[str, float]], overwrite: bool = False
) -> dict[str, Any]:
    """:func:`write_checkpoint` of a model in memory (saved beside ``out`` first); the full manifest."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as scratch:
        model.save(str(Path(scratch) / "model"))
        write_checkpoint(Path(scratch) / "model", out, manifest, curve, overwrite=overwrite)
    return artifacts.read_manifest(out)


def mixing_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    """``weights`` (one per checkpoint, >= 0, not all 0) scaled to sum to 1; None: uniform."""
    if weights is None:
        return [1.0 / n] * n
    if len(weights) != n:
        raise UserError(f"--weights has {len(weights)} values for {n} checkpoints")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise UserError(f"--weights must be >= 0 and not all 0, got {list(weights)}")
    return [w / sum(weights) for w in weights]


def average_state_dicts(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | None = None
) -> dict[str, torch.Tensor]:
    """The mean (weighted by ``weights``, see :func:`mixing_weights`) of each floating-point tensor
    over ``states``; other tensors (integer buffers such as position ids) must agree and are taken
    as they are. Keys and shapes must match."""
    if not states:
        raise UserError("nothing to average")
    mix = mixing_weights(weights, len(states))
    first = states[0]
    for index, state in enumerate(states[1:], 1):
        if state.keys() != first.keys():
            diff = sorted(set(state) ^ set(first))[:3]
            raise UserError(f"checkpoint {index} has different weights than checkpoint 0 (e.g. {diff})")
        for key, tensor in first.items():
            if state[key].shape != tensor.shape:
                shapes = f"{tuple(state[key].shape)} in checkpoint {index}, {tuple(tensor.shape)} in 0"
                raise UserError(f"{key}: shape {shapes}")
            if not tensor.is_floating_point() and not torch.equal(state[key], tensor):
                raise UserError(f"{key}: non-float weights differ between checkpoints")
    out: dict[str, torch.Tensor] = {}
    for key, tensor in first.items():
        if not tensor.is_floating_point():
            out[key] = tensor.clone()
            continue
        total = torch.zeros_like(tensor, dtype=torch.float64)
        for state, w in zip(states, mix, strict=True):
            total += w * state[key].to(torch.float64)
        out[key] = total.to(tensor.dtype)
    return out


def _weight_files(folder: Path) -> list[str]:
    if not (folder / "modules.json").is_file():
        raise UserError(f"not a sentence-transformers checkpoint (no modules.json): {folder}")
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.safetensors"))
    if not files:
        raise UserError(f"no .safetensors weights in {folder}")
    return files


def write_average(sources: Sequence[Path], folder: Path, weights: Sequence[float] | None = None) -> None:
    """Write into ``folder`` the first source's files with every weight file averaged over ``sources``."""
    names = _weight_files(sources[0])
    for source in sources[1:]:
        if _weight_files(source) != names:
            raise UserError(f"{source} has other weight files than {sources[0]}: {names}")
    shutil.copytree(sources[0], folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
    for name in names:
        averaged = average_state_dicts([load_file(str(source / name)) for source in sources], weights)
        save_file(averaged, str(folder / name), metadata={"format": "pt"})


def _source_record(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {"path": str(path), "files": artifacts.sha256_tree(path)}
    if manifest:
        record |= {"method": manifest.get("method"), "best_dev_spearman": own_dev(manifest)}
    return record


def own_dev(manifest: dict[str, Any]) -> float | None:
    """The STS-B dev a checkpoint was kept at: that of its last step after training, else its
    training's best. ``finetune`` keeps its source's ``whiten`` record and ``whiten`` drops a
    ``finetune`` one, so a ``finetune`` record is always the last step."""
    last_steps = (("finetune", "best_dev_spearman"), ("average", "dev_spearman"), ("whiten", "dev_spearman"))
    for stage, key in last_steps:
        if (value := manifest.get(stage, {}).get(key)) is not None:
            return float(value)
    value = manifest.get("training", {}).get("best_dev_spearman")
    return None if value is None else float(value)


def common_matryoshka(manifests: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The Matryoshka widths (and loss weights) every source was trained at, for the soup's manifest,
    where ``export`` and the service read them; None when a source has none or they differ. The
    sources' scores at each width are not carried: the soup has its own."""
    records = [
        {key: (m.get("matryoshka") or {}).get(key) for key in ("widths", "weights")} for m in manifests
    ]
    if not records[0]["widths"] or any(r["widths"] != records[0]["widths"] for r in records):
        return None
    return records[0]


def greedy_soup(
    sources: Sequence[Path], score: ScoreFn, workdir: Path
) -> tuple[list[Path], list[dict[str, Any]], float]:
    """Wortsman et al.'s greedy soup: ingredients by their own score, each kept only if the soup's
    score does not drop. Returns the chosen sources, one log row per step and the soup's score."""
    own = {source: score(source) for source in sources}
    ranked = sorted(sources, key=lambda s: own[s], reverse=True)
    chosen, best, steps = [ranked[0]], own[ranked[0]], []

    def step(candidate: Path, value: float, kept: bool) -> None:
        row = {"added": str(candidate), "own_dev": round(own[candidate], 2), "dev_spearman": round(value, 2)}
        steps.append({**row, "kept": kept})

    step(ranked[0], best, True)
    for candidate in ranked[1:]:
        trial = workdir / f"trial-{len(steps)}"
        write_average([*chosen, candidate], trial)
        value = score(trial)
        kept = value >= best
        step(candidate, value, kept)
        log.info("soup + %s: dev %.2f (%s)", candidate, value, "kept" if kept else "dropped")
        if kept:
            chosen.append(candidate)
            best = value
        shutil.rmtree(trial)
    return chosen, steps, best


def average_checkpoints(
    sources: Sequence[Path],
    out: Path,
    *,
    score: ScoreFn | None = None,
    greedy: bool = False,
    overwrite: bool = False,
    weights: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Average ``sources`` (all of them, weighted by ``weights``, or a greedy soup when ``greedy``)
    into the checkpoint ``out``."""
    if len(sources) < 2:
        raise UserError("give at least two checkpoints to average")
    if greedy and score is None:
        raise UserError("a greedy soup needs a dev score")
    if greedy and weights is not None:
        raise UserError("--weights sets the mix of every checkpoint; a greedy soup chooses its own")
    mix = mixing_weights(weights, len(sources)) if weights is not None else None
    for source in sources:
        artifacts.require_checkpoint(source)
        if "rotate" in source_manifest(source):  # its Dense layer maps to its own rotated frame
            raise UserError(f"{source} was rotated (distilembed rotate): average the sources, then rotate")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".average-", dir=out.parent) as scratch:
        work = Path(scratch)
        chosen, steps, soup_score = list(sources), [], None
        if greedy and score is not None:
            # The greedy pass already scored the soup it kept: no second evaluation of the same weights.
            chosen, steps, soup_score = greedy_soup(sources, score, work)
        soup = work / "soup"
        write_average(chosen, soup, mix)
        if score is not None and soup_score is None:
            soup_score = score(soup)
        manifests = {source: source_manifest(source) for source in sources}
        first = manifests[chosen[0]]
        widths = common_matryoshka([manifests[source] for source in chosen])
        manifest = {
            "method": "average",
            "average": {
                "recipe": "greedy soup" if greedy else "weighted" if mix else "uniform",
                "weights": [round(w, 6) for w in mix] if mix else None,
                "sources": [_source_record(s, manifests[s]) for s in sources],
                "chosen": [str(s) for s in chosen],
                "greedy_steps": steps,
                "dev_spearman": round(soup_score, 2) if soup_score is not None else None,
            },
            **{key: first.get(key) for key in ("teacher", "student", "config")},
        }
        if widths is not None:
            manifest["matryoshka"] = widths
        write_checkpoint(soup, out, manifest, curve=[], overwrite=overwrite)
    return artifacts.read_manifest(out)
