"""Homomorphic Projective Distillation (HPD).

Zhao, Yu, Wu, Li. *Compressing Sentence Representation for Semantic Retrieval via
Homomorphic Projective Distillation.* Findings of ACL 2022.

The teacher's mean-pooled embedding is reduced by a fixed PCA,
``h_t = W_t^T (e_t - mean)`` (Algorithm 1); the student gets a learnable projection
``h_s = W_s^T e_s + b_s``; the loss is eq. 2::

    L = 1/M * sum_i || h_s_i - h_t_i ||_2^2
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


def hpd_loss(student: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. 2: squared L2 distance summed over dimensions, averaged over the batch."""
    if student.shape != target.shape:
        raise ValueError(f"student {tuple(student.shape)} and target {tuple(target.shape)} differ")
    return (student - target).pow(2).sum(dim=-1).mean()


@dataclass(frozen=True)
class PCATargets:
    """The teacher's fixed PCA: ``h = ((e - mean) @ components.T) * scale`` (components: d x d_teacher).

    ``scale`` is 1, or with ``whiten`` p > 0 the partial whitening ``scale_i = v_i^(-p/2) * c``:
    component i's variance v_i becomes v_i^(1 - p) (p = 1: fully whitened, Su et al., *Whitening
    Sentence Representations*, 2021), and c keeps the total variance, so HPD's squared errors stay
    on the same scale."""

    mean: np.ndarray
    components: np.ndarray
    explained_variance_ratio: np.ndarray
    scale: np.ndarray | None = None

    @classmethod
    def fit(cls, embeddings: np.ndarray, dim: int, seed: int = 0, whiten: float = 0.0) -> PCATargets:
        from sklearn.decomposition import PCA

        if dim > min(embeddings.shape):
            raise ValueError(f"cannot fit {dim} components on {embeddings.shape} embeddings")
        pca = PCA(n_components=dim, random_state=seed, svd_solver="auto")
        pca.fit(np.asarray(embeddings, dtype=np.float32))
        ratio = pca.explained_variance_ratio_.astype(np.float64)
        return cls(
            pca.mean_.astype(np.float32),
            pca.components_.astype(np.float32),
            ratio.astype(np.float32),
            whitening_scale(ratio, whiten) if whiten else None,
        )

    def transform(self, embeddings: np.ndarray, batch: int = 65536) -> np.ndarray:
        out = np.empty((len(embeddings), len(self.components)), dtype=np.float32)
        for lo in range(0, len(embeddings), batch):
            chunk = np.asarray(embeddings[lo : lo + batch], dtype=np.float32)
            out[lo : lo + batch] = (chunk - self.mean) @ self.components.T
        if self.scale is not None:
            out *= self.scale
        return out


def whitening_scale(variance: np.ndarray, power: float) -> np.ndarray:
    """Per-component factors that turn variances v into v^(1 - power), total variance kept."""
    if not 0.0 <= power <= 1.0:
        raise ValueError(f"the whitening power must be in [0, 1], got {power}")
    variance = np.asarray(variance, dtype=np.float64)
    scale = variance ** (-power / 2)
    scale *= np.sqrt(variance.sum() / (variance * scale**2).sum())
    return scale.astype(np.float32)


class HPDLoss(nn.Module):
    """Gathers the student's projected embeddings and compares them with PCA'd teacher targets."""

    def forward(self, student_projected: torch.Tensor, teacher_pca: torch.Tensor) -> torch.Tensor:
        return hpd_loss(student_projected, teacher_pca.to(student_projected.dtype))
