"""What a search returns (``Hit``; ``HybridHit`` with each side's score) and the pieces of a hybrid
search that LiveIndex and the sharded index share: the fused list as hits, and what a hybrid search
refuses."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distilembed.errors import UserError

if TYPE_CHECKING:
    from index.store import Document


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    text: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class HybridHit(Hit):
    """A hybrid search's hit: ``score`` the fused one, then each side's own score (dense: the inner
    product; lexical: BM25), None where its candidates lack it; ``matched``: the sides that hold it."""

    dense_score: float | None
    lexical_score: float | None
    matched: tuple[str, ...]


FUSIONS = ("rrf", "weighted")
# Candidates per side: at the RRF constant 60, a document ranked 50th still adds 1/110, over half a
# first place's 1/61, and the dense side's rescoring and filters already cost per candidate.
HYBRID_CANDIDATES = 50


def hybrid_hits(
    fused: list[tuple[int, float]],
    docs: Mapping[int, Document | Hit],
    dense: list[tuple[int, float]],
    lexical: list[tuple[int, float]],
) -> list[HybridHit]:
    """The fused (id, score) list as hits with each side's score and the sides that found them."""
    sides = {"dense": dict(dense), "lexical": dict(lexical)}
    return [
        HybridHit(
            doc.id,
            score,
            doc.text,
            doc.metadata,
            sides["dense"].get(i),
            sides["lexical"].get(i),
            tuple(name for name, found in sides.items() if i in found),
        )
        for i, score in fused
        if (doc := docs.get(i)) is not None
    ]


def check_fusion(k: int, fusion: str, weights: Sequence[float]) -> None:
    """What a hybrid search refuses: k < 1, another fusion, weights not two finite numbers >= 0."""
    if k < 1:
        raise UserError(f"k must be at least 1, not {k}")
    if fusion not in FUSIONS:
        raise UserError(f"fusion must be one of {', '.join(FUSIONS)}, not {fusion!r}")
    if len(weights) != 2 or not all(math.isfinite(w) and w >= 0 for w in weights) or not any(weights):
        raise UserError(f"weights must be two finite numbers >= 0 (dense, lexical), not both 0: {weights}")
