"""Matryoshka Representation Learning (MRL).

Kusupati, Bhatt, Rege, Wallingford, Sinha, Ramanujan, Howard-Snyder, Chen, Kakade, Jain, Farhadi. *Matryoshka
Representation Learning.* NeurIPS 2022. Eq. 1 (here, for any loss L)::

    L_MRL = sum_{m in M} c_m * L(z_{1:m})

``z_{1:m}`` is the first m coordinates of the student's d-dim embedding, M a set of nested widths ending in d
and c_m their weights (1 each in the paper). Cosine losses see the cut vector re-normalised (they normalise
inside); a training-only map from the student's width to the teacher's (IBKD's W, DistilCSE's M) takes the cut
vector through its first m columns, which is the map applied to the vector zero-padded back to d; targets that
are the teacher's PCA coordinates (HPD, ConGen, SimTDE) are cut to the same m, which PCA's ordering by
variance makes the best m-dim target. Each method applies this in its own loss (training/methods/);
sentence-transformers' ``MatryoshkaLoss`` is the same wrapper over its losses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from distilembed.errors import UserError


@dataclass(frozen=True)
class Widths:
    """Nested widths, widest first (``widths[0]`` is the student's d), and their weights."""

    widths: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def full(cls, dim: int) -> Widths:
        """Plain training: the one width ``dim``, weight 1."""
        return cls((dim,), (1.0,))

    @classmethod
    def parse(cls, widths: Sequence[int], weights: Sequence[float], dim: int) -> Widths:
        """Validate ``--matryoshka`` and ``--matryoshka-weights`` against the student's width (a
        UserError); no widths means plain training (the one width d, weight 1)."""
        if not widths:
            return cls.full(dim)
        widths = tuple(int(w) for w in widths)
        if widths[0] != dim:
            raise UserError(f"--matryoshka must start at the student's width {dim}, got {widths[0]}")
        if any(b >= a for a, b in pairwise(widths)) or widths[-1] < 1:
            raise UserError(f"--matryoshka widths must decrease and stay >= 1, got {list(widths)}")
        weights = tuple(float(c) for c in weights) if weights else (1.0,) * len(widths)
        if len(weights) != len(widths):
            raise UserError(f"--matryoshka-weights needs {len(widths)} values, got {len(weights)}")
        if any(c < 0 for c in weights) or sum(weights) == 0:
            raise UserError(f"--matryoshka-weights must be >= 0 and not all 0, got {list(weights)}")
        return cls(widths, weights)

    @property
    def nested(self) -> bool:
        return len(self.widths) > 1


def matryoshka_loss(loss_at: Callable[[int], torch.Tensor], widths: Widths) -> torch.Tensor:
    """Eq. 1: ``sum_m c_m * loss_at(m)``; ``loss_at(m)`` is the method's loss on the first m
    coordinates (widths with weight 0 are skipped, not computed)."""
    terms = [c * loss_at(m) for m, c in zip(widths.widths, widths.weights, strict=True) if c > 0]
    return torch.stack(terms).sum()


def prefix(x: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` coordinates of each row (``z_{1:m}``)."""
    return x[..., :width]


def prefix_linear(x: torch.Tensor, layer: torch.nn.Linear, width: int) -> torch.Tensor:
    """``layer`` applied to the cut vector through its first ``width`` input columns: equal to
    ``layer(zero_pad(x[..., :width]))``, without building the padded copy."""
    return torch.nn.functional.linear(prefix(x, width), layer.weight[:, :width], layer.bias)
