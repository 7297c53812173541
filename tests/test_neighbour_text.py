"""scripts/neighbour_text.py: each training sentence's nearest pool sentence (the near-pair
``--extra-text`` of stop 59's Quora try), on vectors placed by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "neighbour_text", Path(__file__).resolve().parents[1] / "scripts" / "neighbour_text.py"
)
assert _SPEC is not None and _SPEC.loader is not None
neighbour_text = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(neighbour_text)


def at(degrees: list[float], scale: float = 1.0) -> np.ndarray:
    radians = np.deg2rad(np.asarray(degrees))
    return scale * np.stack([np.cos(radians), np.sin(radians)], axis=1)


def test_closest_pairs_first_and_each_pool_sentence_once() -> None:
    pool = at([0, 90, 180])
    # Nearest pool rows: anchor 0 (60 degrees) "north" at 30, anchor 1 (80) "north" at 10, anchor 2
    # (20) "east" at 20. Rows are unnormalised: only the angle counts.
    anchors = at([60, 80, 20], scale=3.0)
    chosen = neighbour_text.closest_neighbours(anchors, pool, ["east", "north", "west"], n=3)
    assert list(chosen) == ["north", "east"]  # "north" twice, kept once at its closer pair (10)
    assert chosen["north"] == pytest.approx(np.cos(np.deg2rad(10)))
    assert chosen["east"] == pytest.approx(np.cos(np.deg2rad(20)))


def test_stops_at_n() -> None:
    chosen = neighbour_text.closest_neighbours(at([5, 100]), at([0, 90]), ["east", "north"], n=1)
    assert list(chosen) == ["east"]
