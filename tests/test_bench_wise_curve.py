"""bench/wise_curve.py's choice of alpha: on STS-B dev alone, by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from wise_curve import pick, shares


def test_shares_are_of_the_widest() -> None:
    assert shares({128: 80.0, 64: 79.2, 32: 77.6}) == {64: 99.0, 32: 97.0}


def test_pick_takes_the_best_mean_dev_that_meets_every_share() -> None:
    rows = [
        {"alpha": 0.0, "dev_mean": 84.0, "dev_shares": {64: 99.3, 32: 97.2}},
        {"alpha": 0.5, "dev_mean": 85.0, "dev_shares": {64: 99.1, 32: 97.0}},
        {"alpha": 0.7, "dev_mean": 85.5, "dev_shares": {64: 99.2, 32: 96.9}},  # best dev, 32-d short
        {"alpha": 1.0, "dev_mean": 86.0, "dev_shares": {64: 98.9, 32: 97.5}},  # 64-d short
    ]
    assert pick(rows, {64: 99.0, 32: 97.0}) == 0.5
    assert pick(rows, {32: 98.0}) is None
