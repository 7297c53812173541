"""Fusing ranked lists (hybrid search: the dense and the lexical top candidates) into one; pure.

Reciprocal rank fusion (Cormack, Clarke and Buettcher, "Reciprocal Rank Fusion outperforms Condorcet
and individual Rank Learning Methods", SIGIR 2009), with a weight per list::

    score(d) = sum over lists i holding d of  w_i / (k + rank_i(d)),   rank_i(d) = 1 for the first

It reads ranks only, so scores on unrelated scales (cosine, BM25) need no calibration. k = 60 is the
paper's, and the default of Elasticsearch's ``rank_constant`` and of Qdrant's RRF ``k``.

Weighted score fusion (the convex combination of min-max normalised scores that Bruch, Gai and
Ingber, "An Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS 2023, compare with RRF;
Weaviate's ``relativeScoreFusion``)::

    norm_i(d) = (s_i(d) - min_i) / (max_i - min_i)   (1.0 when list i holds one distinct score)
    score(d)  = sum over lists i holding d of  w_i * norm_i(d)

Both return (id, score), highest first, equal scores in ascending id order.
"""

from __future__ import annotations

from collections.abc import Sequence

RRF_K = 60


def _ranked(scores: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def _weights(weights: Sequence[float] | None, lists: int) -> Sequence[float]:
    if weights is None:
        return [1.0] * lists
    if len(weights) != lists:
        raise ValueError(f"{len(weights)} weights for {lists} ranked lists")
    return weights


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]], k: int = RRF_K, weights: Sequence[float] | None = None
) -> list[tuple[int, float]]:
    """RRF of ranked id lists (best first; an id repeated in a list counts at its first rank)."""
    if k < 0:
        raise ValueError(f"the RRF constant must be >= 0, not {k}")
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, _weights(weights, len(rankings)), strict=True):
        for rank, item in enumerate(dict.fromkeys(ranking), 1):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return _ranked(fused)


def weighted_score_fusion(
    scored: Sequence[Sequence[tuple[int, float]]], weights: Sequence[float]
) -> list[tuple[int, float]]:
    """The weighted sum of each list's min-max normalised scores (an (id, score) pair per id, any order)."""
    fused: dict[int, float] = {}
    for pairs, weight in zip(scored, _weights(weights, len(scored)), strict=True):
        if not pairs:
            continue
        low, high = min(s for _, s in pairs), max(s for _, s in pairs)
        for item, score in pairs:
            norm = (score - low) / (high - low) if high > low else 1.0
            fused[item] = fused.get(item, 0.0) + weight * norm
    return _ranked(fused)


def fuse(
    dense: Sequence[tuple[int, float]],
    lexical: Sequence[tuple[int, float]],
    fusion: str,
    weights: Sequence[float],
) -> list[tuple[int, float]]:
    """The two sides' (id, score) lists, best first, fused: ``rrf`` by their ranks alone, ``weighted``
    by their min-max scaled scores."""
    if fusion == "rrf":
        return reciprocal_rank_fusion([[i for i, _ in dense], [i for i, _ in lexical]], weights=weights)
    return weighted_score_fusion([dense, lexical], weights)
