"""Pearson correlation as a loss: the STS score itself, made differentiable.

STS benchmarks score a model by the correlation of its cosines with human judgements over a set of
pairs. With predictions ``x`` (the pairs' cosines) and gold scores ``y`` over one batch::

    L = -r(x, y),    r = sum_i (x_i - mean(x)) (y_i - mean(y)) / (||x - mean(x)|| ||y - mean(y)||)

Spearman's rank correlation, which the benchmarks report, has no gradient; Pearson's is its smooth
stand-in (the same choice as fitting on the pairs' cosines directly, as sentence-transformers'
``CosineSimilarityLoss`` does, but invariant to the cosines' scale and offset, which a rotation of
the output changes at every prefix width). Used by :mod:`training.rotation` over all of a labelled
pair set at once, so the batch is the whole set.
"""

from __future__ import annotations

import torch

EPS = 1e-12


def pearson_loss(predicted: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """``-r(predicted, gold)`` over 1-d tensors of the same length (at least 2)."""
    if predicted.ndim != 1 or predicted.shape != gold.shape or len(predicted) < 2:
        raise ValueError(
            f"want two 1-d tensors of one length >= 2, got {tuple(predicted.shape)}, {tuple(gold.shape)}"
        )
    x = predicted - predicted.mean()
    y = gold.to(predicted.dtype) - gold.to(predicted.dtype).mean()
    return -(x * y).sum() / (x.norm() * y.norm()).clamp_min(EPS)
