"""Neighbourhood preservation: how far a reduced space's similarity distributions are from the full
space's, the loss behind ``--target-reduction neighbourhood`` (training/target_reduction.py).

Stochastic Neighbour Embedding (Hinton and Roweis, *Stochastic Neighbor Embedding*, NeurIPS 2002)
keeps each point's distribution over its neighbours when a space is reduced; here both
distributions are ConGen's (Limkonchotiwat et al., Findings of EMNLP 2022, eq. 1), over a bank B of
other sentences, in the teacher's full space (x) and in the reduced one (y = W^T (x - mu))::

    p_ij = softmax_j(cos(x_i, x_j) / tau),   q_ij = softmax_j(cos(y_i, y_j) / tau),   j in B
    L = (1 / n) sum_i CE(p_i, q_i) = -(1 / n) sum_i sum_j p_ij log q_ij

PCA keeps the directions of largest variance, whatever they do to a sentence's nearest neighbours;
this loss weighs a direction by how much it orders them, as retrieval and STS read a space.
"""

from __future__ import annotations

import torch

from training.losses.congen import similarity_logits, soft_cross_entropy


def neighbourhood_loss(
    full_anchors: torch.Tensor,
    full_bank: torch.Tensor,
    reduced_anchors: torch.Tensor,
    reduced_bank: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """CE of the full space's neighbour distribution against the reduced one's, averaged over the
    anchors. full_*: (n, D) and (K, D); reduced_*: the same rows in the reduced space, (n, d), (K, d)."""
    if len(full_anchors) != len(reduced_anchors) or len(full_bank) != len(reduced_bank):
        raise ValueError("the full and reduced spaces must hold the same anchors and bank rows")
    with torch.no_grad():
        target = torch.softmax(similarity_logits(full_anchors, full_bank, tau), dim=-1)
    return soft_cross_entropy(target, similarity_logits(reduced_anchors, reduced_bank, tau))
