"""Partial whitening of a student's output, folded into its last Dense layer.

BERT-whitening (Su et al., *Whitening Sentence Representations for Better Semantics and Faster
Retrieval*, 2021, eq. 3-6) maps each vector x to ``(x - mu) W`` with ``W = U Lambda^(-1/2)`` from
the covariance ``Sigma = U Lambda U^T`` of unlabeled sentences' vectors, so that the components are
decorrelated and of equal variance. Full whitening of an already well-trained encoder also
amplifies its noisiest directions, so the power is a knob::

    x' = (x - mu) T,    T = U diag(lambda_i^(-p / 2)) U^T,    p in [0, 1]

Component variances lambda_i become lambda_i^(1 - p): p = 0 only centres, p = 1 whitens fully. The
symmetric (ZCA) form keeps the vector as close as possible to the original, and because the map is
affine it folds into the pipeline's last Dense layer, ``y = x A^T + b``::

    A' = T A,    b' = T (b - mu)

so the whitened student is an ordinary checkpoint with the same modules and the same speed. The
mean and covariance are taken from the Dense layer's output before the pipeline's Normalize.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from distilembed.artifacts import require_checkpoint, sha256_tree
from distilembed.errors import UserError
from training.checkpoint import save_checkpoint, source_manifest
from training.data.text import content_hash
from training.student import last_dense

log = logging.getLogger(__name__)
EIGEN_FLOOR = 1e-6  # relative to the largest eigenvalue: a degenerate direction is not blown up
ScoreFn = Callable[[Any], float]


def _check_power(power: float) -> None:
    if not 0.0 <= power <= 1.0:
        raise UserError(f"whitening power must be in [0, 1], got {power}")


def whitening_transform(vectors: np.ndarray, power: float) -> tuple[np.ndarray, np.ndarray]:
    """The mean ``mu`` (d,) and the symmetric transform ``T`` (d, d) of the docstring's equation."""
    _check_power(power)
    x = np.asarray(vectors, dtype=np.float64)
    if x.ndim != 2 or len(x) <= x.shape[1]:
        width = x.shape[-1]
        raise UserError(f"whitening a {width}-d output needs more than {width} sentences, got {len(x)}")
    mean = x.mean(axis=0)
    values, vectors_ = np.linalg.eigh(np.cov(x - mean, rowvar=False))
    values = np.maximum(values, values.max() * EIGEN_FLOOR)
    transform = (vectors_ * values ** (-power / 2)) @ vectors_.T
    return mean, transform


def fold_into_linear(
    weight: np.ndarray, bias: np.ndarray, mean: np.ndarray, transform: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The weight (out, in) and bias (out,) of ``x -> ((x A^T + b) - mu) T`` as one linear layer."""
    return transform.T @ weight, transform.T @ (bias - mean)


def dense_outputs(
    model: Any, texts: Sequence[str], batch_size: int = 64, progress: bool = False
) -> np.ndarray:
    """The final Dense layer's output for ``texts``, before any Normalize."""
    head = SentenceTransformer(modules=list(model)[: last_dense(model) + 1], device=str(model.device))
    return head.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=progress)


def apply_whitening(model: Any, mean: np.ndarray, transform: np.ndarray) -> None:
    """Fold the transform into ``model``'s final Dense layer, in place."""
    linear = model[last_dense(model)].linear
    weight = linear.weight.detach().cpu().double().numpy()
    bias = linear.bias.detach().cpu().double().numpy() if linear.bias is not None else np.zeros(len(weight))
    new_weight, new_bias = fold_into_linear(weight, bias, mean, transform)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(new_weight).to(linear.weight.dtype))
        linear.bias = torch.nn.Parameter(
            torch.from_numpy(new_bias).to(linear.weight)
        )  # a new one if it had none


def whiten_checkpoint(
    source: Path,
    out: Path,
    texts: Sequence[str],
    powers: Sequence[float],
    *,
    score: ScoreFn | None = None,
    final_scores: Callable[[Any], dict[str, float]] | None = None,
    corpus: str = "",
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Write ``out``: ``source`` whitened at the power that scores best (the only one if one is given). Every
    candidate is fitted on the same ``texts``; ``score`` (STS-B dev) ranks them, and power 0 is not a
    candidate unless asked for, so a whitening that does not help is visible in the log. ``final_scores`` (the
    STS sets found, as ``train`` reports them) replaces the source's scores."""
    require_checkpoint(source)
    for power in powers:  # before the slow load and encoding, not after
        _check_power(power)
    if len(powers) > 1 and score is None:
        raise UserError("choosing between several powers needs a dev score")
    first = source_manifest(source)
    widths = list((first.get("matryoshka") or {}).get("widths") or [])
    if len(widths) > 1:
        raise UserError(
            f"{source} is a Matryoshka student ({widths}): whitening mixes its dimensions, "
            "so its shorter prefixes would no longer be the trained ones"
        )
    model = SentenceTransformer(str(source), device="cpu")
    outputs = dense_outputs(model, texts, progress=progress)
    baseline = score(model) if score is not None else None
    dense = model[last_dense(model)]
    unwhitened = copy.deepcopy(dense.linear)

    def whiten(mean: np.ndarray, transform: np.ndarray) -> None:
        dense.linear = copy.deepcopy(unwhitened)
        apply_whitening(model, mean, transform)

    fits = [(power, whitening_transform(outputs, power)) for power in powers]
    candidates, values = [], []
    for power, (mean, transform) in fits:
        whiten(mean, transform)
        value = score(model) if score is not None else None
        values.append(float("-inf") if value is None else value)
        candidates.append({"power": power, "dev_spearman": None if value is None else round(value, 2)})
        log.info("whitening power %s: STS-B dev %s", power, value)
    chosen = max(range(len(fits)), key=values.__getitem__)  # the first best; the first one if unscored
    power, (mean, transform) = fits[chosen]
    whiten(mean, transform)
    manifest = {
        **{key: first.get(key) for key in ("teacher", "student", "config", "seconds")},
        "scores": final_scores(model) if final_scores is not None else {},
        "method": first.get("method", "unknown"),
        "whiten": {
            "source": {"path": str(source), "files": sha256_tree(source)},
            "power": power,
            "corpus": corpus,
            "sentences": len(texts),
            "texts_sha256": content_hash(list(texts)),
            "source_dev_spearman": None if baseline is None else round(baseline, 2),
            "candidates": candidates,
            "dev_spearman": candidates[chosen]["dev_spearman"],
        },
    }
    if "training" in first:
        manifest["training"] = first["training"]
    return save_checkpoint(model, out, manifest, curve=[], overwrite=overwrite)
