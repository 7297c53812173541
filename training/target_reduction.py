"""``--target-reduction neighbourhood``: the teacher's targets cut to the student's width by a
linear map fitted to keep each sentence's neighbours (training/losses/neighbourhood.py), starting
from the PCA and kept at the step whose reduced teacher scores best on STS-B dev (decision 58).

The map stays linear and is applied as the PCA is (``h = (e - mean) @ W``), so everything that reads
``PCATargets`` (HPD's MSE, ConGen's queue, the ridge warm start) takes it unchanged. W is rescaled
so the training targets keep the PCA's total variance: HPD's squared errors stay on their scale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from training.data.sts import distinct_sentences, load_stsb_split
from training.evaluation import evaluate_vectors
from training.losses.hpd import PCATargets
from training.losses.neighbourhood import neighbourhood_loss

if TYPE_CHECKING:
    from training.config import TrainConfig
    from training.teacher_ensemble import AnyTeacher


def fit_neighbourhood_reduction(
    pca: PCATargets,
    embeddings: np.ndarray,
    dev_score: Callable[[PCATargets], float],
    *,
    steps: int = 600,
    tau: float = 0.05,
    lr: float = 1e-3,
    batch: int = 512,
    bank: int = 8192,
    eval_every: int = 50,
    seed: int = 0,
) -> tuple[PCATargets, dict[str, Any]]:
    """Adam on W (from the PCA's components) over ``embeddings`` (the training text's full-width
    teacher vectors); every ``eval_every`` steps ``dev_score`` rates the reduction, and the best one
    (the PCA itself at step 0 included) is returned with a report of the curve."""
    if pca.scale is not None:
        raise ValueError("a neighbourhood reduction starts from a plain PCA (no --pca-whiten)")
    x = torch.from_numpy(np.asarray(embeddings, dtype=np.float32))
    mean = torch.from_numpy(pca.mean)
    centred, unit = x - mean, F.normalize(x, dim=-1)
    w = torch.nn.Parameter(torch.from_numpy(pca.components.T.copy()))
    optimiser = torch.optim.Adam([w], lr=lr)
    generator = torch.Generator().manual_seed(seed)

    def as_targets(matrix: torch.Tensor) -> PCATargets:
        return replace(pca, components=np.ascontiguousarray(matrix.detach().numpy().T))

    best_score, best_step, best_w = dev_score(pca), 0, w.detach().clone()
    curve = [{"step": 0, "dev_spearman": round(best_score, 4)}]
    for step in range(1, steps + 1):
        anchors = torch.randint(len(x), (min(batch, len(x)),), generator=generator)
        others = torch.randint(len(x), (min(bank, len(x)),), generator=generator)
        loss = neighbourhood_loss(unit[anchors], unit[others], centred[anchors] @ w, centred[others] @ w, tau)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % eval_every == 0 or step == steps:
            score = dev_score(as_targets(w))
            curve.append({"step": step, "dev_spearman": round(score, 4), "loss": round(loss.item(), 4)})
            if score > best_score:
                best_score, best_step, best_w = score, step, w.detach().clone()
    with torch.no_grad():  # the PCA's total variance of the training targets, kept
        pca_variance = float((centred @ torch.from_numpy(pca.components.T)).var(dim=0).sum())
        best_w *= (pca_variance / float((centred @ best_w).var(dim=0).sum())) ** 0.5
    report = {
        "method": "neighbourhood",
        "sentences": len(x),
        "steps": steps,
        "tau": tau,
        "lr": lr,
        "best_step": best_step,
        "dev_pca": curve[0]["dev_spearman"],
        "dev": round(best_score, 4),
        "curve": curve,
    }
    return as_targets(best_w), report


def fit_targets(
    cfg: TrainConfig, fit: np.ndarray, corpus: np.ndarray | None, teacher: AnyTeacher, sts_dir: str | Path
) -> tuple[PCATargets, dict[str, Any]]:
    """The PCA to ``cfg.dim`` fitted on ``fit`` and, with ``--target-reduction neighbourhood``, refitted
    on ``fit`` and the ``corpus`` (None: ``fit`` is a sample of it) at the step whose reduced teacher
    scores best on the STS-B dev pairs under ``sts_dir`` (read only then)."""
    pca = PCATargets.fit(np.asarray(fit, dtype=np.float32), cfg.dim, cfg.seed, cfg.pca_whiten)
    if cfg.target_reduction == "pca":
        return pca, {"method": "pca"}
    pairs = load_stsb_split(sts_dir, "dev")
    sentences = distinct_sentences(pairs)
    vectors = np.asarray(teacher.targets(sentences)[0], dtype=np.float32)
    embeddings = [np.asarray(fit)] + ([] if corpus is None else [np.asarray(corpus)])
    return fit_neighbourhood_reduction(
        pca,
        np.concatenate(embeddings).astype(np.float32),
        lambda r: evaluate_vectors(sentences, r.transform(vectors), pairs),
        seed=cfg.seed,
    )
