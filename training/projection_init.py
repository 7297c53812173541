"""Warm start of the student's projection: a ridge regression onto the teacher's PCA-d targets.

The papers initialise the student's d-dim projection at random, so the first hundreds of steps
spend their gradient on a head that maps pretrained features to nowhere, and that noisy gradient
also flows into the pretrained encoder. Fitting the head first, in closed form, with the encoder
frozen (linear probing, then fine-tuning: Kumar et al., *Fine-Tuning can Distort Pretrained
Features and Underperform Out-of-Distribution*, ICLR 2022) starts distillation from the best linear
map of the student's pooled features onto the targets::

    W, b = argmin_{W, b} 1/n sum_i ||W x_i + b - t_i||^2 + l2 * ||W||_F^2

which costs one forward pass over a sample of the training sentences (``--projection-sample``).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from training.student import tokenize

log = logging.getLogger(__name__)


def ridge_projection(
    features: np.ndarray, targets: np.ndarray, l2: float = 1e-3
) -> tuple[np.ndarray, np.ndarray]:
    """(weight (d, h), bias (d,)) minimising the mean squared error of ``features @ weight.T + bias``
    against ``targets`` plus ``l2 * mean_diag(X^T X) * ||weight||^2`` (the penalty scales with the
    features, so ``l2`` is unit-free)."""
    x = np.asarray(features, dtype=np.float64)
    t = np.asarray(targets, dtype=np.float64)
    if x.ndim != 2 or t.ndim != 2 or len(x) != len(t):
        raise ValueError(f"features {x.shape} and targets {t.shape} must be (n, h) and (n, d)")
    x_mean, t_mean = x.mean(axis=0), t.mean(axis=0)
    xc, tc = x - x_mean, t - t_mean
    gram = xc.T @ xc / len(x)
    penalty = l2 * float(np.trace(gram)) / gram.shape[0]
    weight = np.linalg.solve(gram + penalty * np.eye(gram.shape[0]), xc.T @ tc / len(x)).T
    bias = t_mean - x_mean @ weight.T
    return weight.astype(np.float32), bias.astype(np.float32)


def _dense_index(student: SentenceTransformer) -> int:
    modules = list(student)
    for index in range(len(modules) - 1, -1, -1):
        if type(modules[index]).__name__ == "Dense":
            return index
    raise ValueError("the student has no Dense projection to initialise")


@torch.no_grad()
def pooled_features(student: SentenceTransformer, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """The student's output just before its Dense projection (the pooled hidden states)."""
    stop = _dense_index(student)
    was_training = student.training
    student.eval()
    order = np.argsort([len(t) for t in texts], kind="stable")  # length-sorted batches pad less
    out = np.empty((len(texts), list(student)[stop].linear.in_features), dtype=np.float32)
    for lo in range(0, len(texts), batch_size):
        rows = order[lo : lo + batch_size]
        features = tokenize(student, [texts[i] for i in rows])
        for module in list(student)[:stop]:
            features = module(features)
        out[rows] = features["sentence_embedding"].float().cpu().numpy()
    student.train(was_training)
    return out


def init_projection(
    student: SentenceTransformer, texts: list[str], targets: np.ndarray, l2: float = 1e-3
) -> dict[str, float]:
    """Set the student's Dense to the ridge fit of its pooled features of ``texts`` onto
    ``targets``; returns the fit's mean squared error per example before and after (summed over
    dimensions, the HPD loss's scale) and the explained fraction of the target variance."""
    features = pooled_features(student, texts)
    dense = list(student)[_dense_index(student)].linear
    t = np.asarray(targets, dtype=np.float32)

    def mse(weight: np.ndarray, bias: np.ndarray) -> float:
        return float(np.mean(np.sum((features @ weight.T + bias - t) ** 2, axis=1)))

    before = mse(dense.weight.detach().cpu().numpy(), dense.bias.detach().cpu().numpy())
    weight, bias = ridge_projection(features, t, l2)
    with torch.no_grad():
        dense.weight.copy_(torch.from_numpy(weight))
        dense.bias.copy_(torch.from_numpy(bias))
    after = mse(weight, bias)
    total = float(np.mean(np.sum((t - t.mean(axis=0)) ** 2, axis=1)))
    report = {
        "sample": len(texts),
        "mse_random_init": round(before, 4),
        "mse_ridge": round(after, 4),
        "r2": round(1.0 - after / total, 4) if total > 0 else 0.0,
        "l2": l2,
    }
    log.info("projection warm start: %s", report)
    return report
