"""bench/retrieval.py seeds' pure parts (the per-seed summary and its paired difference, by hand),
the IVF it trains, and the distractor slices the Quora corpus asks the teacher for."""

from __future__ import annotations

import argparse
import gzip
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import harness
from retrieval import make_index, summarise


def test_summarise_pairs_the_seeds() -> None:
    # seed by seed: 1 - 2 = -1, 3 - 2 = +1, 5 - 2 = +3 -> mean +1, sample sd 2
    got = summarise([1.0, 3.0, 5.0], [2.0, 2.0, 2.0])
    assert (got["mean"], got["low"], got["high"]) == (3.0, 1.0, 5.0)
    assert got["sd"] == pytest.approx(2.0)
    assert got["diff_mean"] == pytest.approx(1.0)
    assert got["diff_sd"] == pytest.approx(2.0)


def test_summarise_of_the_reference_itself_is_zero_difference() -> None:
    got = summarise([66.2, 66.4], [66.2, 66.4])
    assert got["diff_mean"] == 0.0 and got["diff_sd"] == 0.0
    assert got["sd"] == pytest.approx(math.sqrt(0.02))


def test_summarise_one_seed_has_no_spread() -> None:
    got = summarise([66.0], [65.5])
    assert (got["sd"], got["diff_sd"], got["diff_mean"]) == (0.0, 0.0, 0.5)


def test_summarise_wants_one_value_per_seed() -> None:
    with pytest.raises(ValueError, match="one value per seed"):
        summarise([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="one value per seed"):
        summarise([], [])


def test_bundle_names_keep_their_order_and_may_not_repeat() -> None:
    assert list(harness.named_bundles([("b", "x"), ("a", "y")])) == ["b", "a"]
    with pytest.raises(SystemExit, match="given twice"):
        harness.named_bundles([("a", "x"), ("a", "y")])


def test_distractors_come_from_whole_cache_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The teacher embeds the distractors in whole DISTRACTOR_CHUNK slices (its cache's keys, so runs
    with other counts share them), and the corpus gets the vectors of the first N it kept."""
    (tmp_path / "quora").mkdir()
    (tmp_path / "quora" / "quora_pairs_dev.tsv").write_text("1\tq1?\tq2?\t1\n0\tq3?\tq4?\t2\n")
    (tmp_path / "quora" / "quora_pairs_test.tsv").write_text("0\tq5?\tq6?\t3\n")
    wiki = tmp_path / harness.WIKIPEDIA
    wiki.parent.mkdir()
    with gzip.open(wiki, "wt") as handle:
        handle.write("".join(f"sentence {i}\n" for i in range(5)))
    asked: list[list[str]] = []

    class Teacher:  # each text's vector: (its position in its list + 1, 1)
        def __init__(self, name: str, batch_size: int) -> None:
            pass

        def targets(self, texts: list[str]) -> tuple[np.ndarray, dict]:
            asked.append(texts)
            return np.array([[i + 1.0, 1.0] for i in range(len(texts))], dtype=np.float16), {}

    monkeypatch.setattr("training.teacher_targets.Teacher", Teacher)
    monkeypatch.setattr(harness, "DISTRACTOR_CHUNK", 2)
    args = argparse.Namespace(data_dir=str(tmp_path), distractors=3, teacher="t")
    questions, data, vectors = harness.quora_corpus(args)
    assert data.corpus == [*questions.corpus, "sentence 0", "sentence 1", "sentence 2"]
    assert asked[1:] == [["sentence 0", "sentence 1"], ["sentence 2", "sentence 3"]]  # two whole slices
    np.testing.assert_allclose(vectors[-3:], harness.unit_rows(np.array([[1, 1], [2, 1], [1, 1]])))
    assert (data.queries, data.relevant) == ([0], [1])


def test_make_index_trains_with_the_asked_iterations() -> None:
    vectors = harness.unit_rows(np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32))
    args = argparse.Namespace(nlist=4, train_sample=200, kmeans_niter=10)
    default = make_index(vectors, "float32", args, seed=0)
    longer = make_index(vectors, "float32", argparse.Namespace(**vars(args) | {"kmeans_niter": 25}), seed=0)
    assert (default.cp.niter, longer.cp.niter) == (10, 25)  # Faiss's IVF default, and the asked one
    assert default.ntotal == longer.ntotal == 200
