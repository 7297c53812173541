"""bench/ivf_seeds.py's pure parts (the per-seed summary and its paired difference, by hand) and the
distractor pool it shares with bench/quora_sr.py."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import quora_sr
from ivf_seeds import parse_bundles, probed_share, summarise

from index.vectors import new_ivf


def test_summarise_pairs_the_seeds() -> None:
    # seed by seed: 1 - 2 = -1, 3 - 2 = +1, 5 - 2 = +3 -> mean +1, sample sd 2
    got = summarise([1.0, 3.0, 5.0], [2.0, 2.0, 2.0])
    assert (got.mean, got.low, got.high) == (3.0, 1.0, 5.0)
    assert got.sd == pytest.approx(2.0)
    assert got.diff_mean == pytest.approx(1.0)
    assert got.diff_sd == pytest.approx(2.0)


def test_summarise_of_the_reference_itself_is_zero_difference() -> None:
    got = summarise([66.2, 66.4], [66.2, 66.4])
    assert got.diff_mean == 0.0 and got.diff_sd == 0.0
    assert got.sd == pytest.approx(math.sqrt(0.02))


def test_summarise_one_seed_has_no_spread() -> None:
    got = summarise([66.0], [65.5])
    assert (got.sd, got.diff_sd, got.diff_mean) == (0.0, 0.0, 0.5)


def test_summarise_wants_one_value_per_seed() -> None:
    with pytest.raises(ValueError, match="one value per seed"):
        summarise([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="one value per seed"):
        summarise([], [])


def test_parse_bundles_keeps_order_and_refuses_a_repeated_name() -> None:
    assert list(parse_bundles([("b", "x"), ("a", "y")])) == ["b", "a"]
    with pytest.raises(SystemExit, match="given twice"):
        parse_bundles([("a", "x"), ("a", "y")])


def test_distractors_come_with_the_whole_cache_slices_that_hold_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(5)))
    monkeypatch.setattr(quora_sr, "DISTRACTOR_CHUNK", 2)
    first, pool = quora_sr.read_distractors(str(corpus), 3)
    assert first == ["sentence 0", "sentence 1", "sentence 2"]
    assert pool == [*first, "sentence 3"]  # two whole slices of 2: the teacher cache's keys
    assert quora_sr.read_distractors(str(corpus), 0) == ([], [])


def test_probed_share_counts_the_duplicates_in_the_lists_searched() -> None:
    """Two lists with centroids on the axes: the first query's duplicate shares its list, the
    second's lies in the other list, which only nprobe 2 searches."""
    index = new_ivf(2, 2)
    index.quantizer.add(np.asarray([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32))
    index.is_trained = True
    queries = np.asarray([[1.0, 0.1], [1.0, 0.0]], dtype=np.float32)
    relevant = np.asarray([[0.9, 0.2], [0.0, 1.0]], dtype=np.float32)
    assert probed_share(index, queries, relevant, nprobe=1) == pytest.approx(50.0)
    assert probed_share(index, queries, relevant, nprobe=2) == pytest.approx(100.0)


def test_make_index_trains_with_the_asked_iterations() -> None:
    vectors = quora_sr.unit_rows(np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32))
    default = quora_sr.make_index(vectors, "float32", 4, seed=0, train_sample=200)
    longer = quora_sr.make_index(vectors, "float32", 4, seed=0, train_sample=200, niter=25)
    assert (default.cp.niter, longer.cp.niter) == (10, 25)  # Faiss's IVF default, and the asked one
    assert default.ntotal == longer.ntotal == 200
    args = argparse.ArgumentParser()
    quora_sr.add_ivf_args(args)
    assert args.parse_args(["--kmeans-niter", "25"]).kmeans_niter == 25
