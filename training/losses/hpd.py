"""Homomorphic Projective Distillation (HPD).

Zhao, Yu, Wu, Li. *Compressing Sentence Representation for Semantic Retrieval via Homomorphic Projective
Distillation.* Findings of ACL 2022.

The teacher's mean-pooled embedding is reduced by a fixed PCA, ``h_t = W_t^T (e_t - mean)`` (Algorithm 1); the
student gets a learnable projection ``h_s = W_s^T e_s + b_s``; the loss is eq. 2::

    L = 1/M * sum_i || h_s_i - h_t_i ||_2^2
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from training.losses import check_shapes


def hpd_loss(student: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. 2: squared L2 distance summed over dimensions, averaged over the batch."""
    check_shapes(student, target)
    return (student - target).pow(2).sum(dim=-1).mean()


@dataclass(frozen=True)
class PCATargets:
    """The teacher's fixed PCA: ``h = (e - mean) @ components.T`` (components: d x d_teacher)."""

    mean: np.ndarray
    components: np.ndarray
    explained_variance_ratio: np.ndarray

    @classmethod
    def fit(cls, embeddings: np.ndarray, dim: int, seed: int = 0) -> PCATargets:
        from sklearn.decomposition import PCA

        if dim > min(embeddings.shape):
            raise ValueError(f"cannot fit {dim} components on {embeddings.shape} embeddings")
        pca = PCA(n_components=dim, random_state=seed, svd_solver="auto")
        pca.fit(np.asarray(embeddings, dtype=np.float32))
        ratio = pca.explained_variance_ratio_.astype(np.float32)
        return cls(pca.mean_.astype(np.float32), pca.components_.astype(np.float32), ratio)

    def transform(self, embeddings: np.ndarray, batch: int = 65536) -> np.ndarray:
        out = np.empty((len(embeddings), len(self.components)), dtype=np.float32)
        for lo in range(0, len(embeddings), batch):
            chunk = np.asarray(embeddings[lo : lo + batch], dtype=np.float32)
            out[lo : lo + batch] = (chunk - self.mean) @ self.components.T
        return out
