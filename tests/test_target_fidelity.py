"""bench/target_fidelity.py's measures, on small spaces worked by hand."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from target_fidelity import (
    cosine_correlation,
    near_pairs,
    nearest,
    neighbour_agreement,
    random_pairs,
    student_encoder,
)

from tests.tiny_models import tiny_sentences


def circle(angles_deg: list[float]) -> np.ndarray:
    radians = np.deg2rad(np.asarray(angles_deg))
    return np.stack([np.cos(radians), np.sin(radians)], axis=1)


def test_nearest_orders_by_cosine_and_skips_self() -> None:
    points = circle([0, 10, 30, 100])
    assert nearest(points, 2).tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]


def test_neighbour_agreement_counts_shared_neighbours() -> None:
    a = circle([0, 10, 30, 100])
    # Point 3 moves from 100 to 355 degrees, next to point 0.
    b = circle([0, 10, 30, 355])
    assert nearest(b, 2).tolist() == [[3, 1], [0, 3], [1, 0], [0, 1]]
    # Shared with a's [[1, 2], [0, 2], [1, 0], [2, 1]]: {1}, {0}, {1, 0}, {1}: 5 of 8.
    assert neighbour_agreement(a, b, 2) == pytest.approx(62.5)
    assert neighbour_agreement(a, a, 2) == pytest.approx(100.0)


def test_cosine_correlation_is_rank_based() -> None:
    a = circle([0, 10, 30, 100])
    pairs = np.array([[0, 1], [0, 2], [0, 3], [1, 3]])
    # The pairs' cosines in a (angles 10, 30, 100, 90 degrees) rank 4, 3, 1, 2.
    assert cosine_correlation(a, a, pairs) == pytest.approx(100.0)
    # Angles 10, 30, 200, 190: ranks 4, 3, 2, 1; Spearman 1 - 6 x (0 + 0 + 1 + 1) / (4 x 15) = 0.8.
    assert cosine_correlation(a, circle([0, 10, 30, 200]), pairs) == pytest.approx(80.0)
    # Angles 100, 30, 10, 90: ranks 1, 3, 4, 2; 1 - 6 x (9 + 0 + 9 + 0) / 60 = -0.8.
    assert cosine_correlation(a, circle([0, 100, 30, 10]), pairs) == pytest.approx(-80.0)


def test_random_pairs_never_pair_a_row_with_itself() -> None:
    pairs = random_pairs(5, 1000, seed=0)
    assert pairs.shape == (1000, 2)
    assert (pairs[:, 0] != pairs[:, 1]).all()
    assert pairs.min() >= 0 and pairs.max() < 5


def test_near_pairs_lists_each_row_with_its_neighbours() -> None:
    points = circle([0, 10, 30, 100])
    assert near_pairs(points, 1).tolist() == [[0, 1], [1, 0], [2, 1], [3, 2]]


@pytest.mark.parametrize("kind", ["checkpoint", "bundle"])
def test_students_encode_to_unit_rows(kind: str, tiny_teacher: Path, tiny_bundle: Path) -> None:
    path = str(tiny_teacher if kind == "checkpoint" else tiny_bundle)
    args = argparse.Namespace(
        bundle=path if kind == "bundle" else None,
        checkpoint=path if kind == "checkpoint" else None,
        variant="int8",
        threads=1,
    )
    texts = tiny_sentences(6, seed=3)
    vectors = student_encoder(args)(texts, "tiny")
    assert vectors.shape[0] == 6 and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(np.ones(6), abs=1e-5)
    assert neighbour_agreement(vectors, vectors, 2) == pytest.approx(100.0)
