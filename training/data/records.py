"""The records the pair and triplet readers return, local files (``pairs.py``) and the Hugging Face
Hub (``hub.py``) alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Triplet:
    """An anchor, a sentence that means the same, and a hard negative."""

    anchor: str
    positive: str
    negative: str


@dataclass(frozen=True, slots=True)
class NLIPair:
    """A premise/hypothesis pair with its gold label (entailment, neutral or contradiction)."""

    premise: str
    hypothesis: str
    label: str


@dataclass(frozen=True, slots=True)
class Pair:
    """Two texts with a score or class label; ``id`` is the source's pair id, when it has one."""

    text1: str
    text2: str
    label: float
    id: str = ""
