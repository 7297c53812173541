"""bench/target_space.py rebuilds a student's target space as training does: the PCA is fitted on
the ``--pca-fit`` text's teacher vectors, never on the corpus it is scored on."""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import quora_sr
import target_space
from harness import QuoraRetrieval

from training.losses.hpd import PCATargets


class FakeTeacher:
    """Eight dimensions per text, a fixed function of the text."""

    def targets(self, texts: list[str]) -> tuple[np.ndarray, dict[str, object]]:
        rows = [np.random.default_rng(zlib.crc32(t.encode())).normal(size=8) for t in texts]
        return np.asarray(rows, dtype=np.float16), {}


def test_the_target_pca_is_fitted_on_the_fit_text_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.teacher_ensemble

    monkeypatch.setattr(training.teacher_ensemble, "build_teacher", lambda *a, **k: FakeTeacher())
    fit_file = tmp_path / "fit.txt"
    fit_text = [f"fit sentence {i}" for i in range(20)]
    fit_file.write_text("\n".join(fit_text) + "\n")
    corpus = [f"question {i}" for i in range(30)]
    main = quora_sr.unit_rows(FakeTeacher().targets(corpus)[0])
    args = argparse.Namespace(
        teacher="t",
        ensemble_teacher=["m:0.4"],
        teacher_batch_size=4,
        pca_fit=str(fit_file),
        dim=3,
        pca_seed=42,
        seed=0,
        corpus_pca_sample=10,
        neighbourhood_preset=None,
    )
    spaces = target_space.target_spaces(args, corpus, main)
    assert list(spaces) == [
        "target teacher (t + m:0.4), 8-d",
        f"target PCA-3, fitted on {fit_file}",
        "t PCA-3 fitted on the Quora corpus",
    ]
    full = np.asarray(FakeTeacher().targets(corpus)[0], dtype=np.float32)
    expected = PCATargets.fit(np.asarray(FakeTeacher().targets(sorted(fit_text))[0], dtype=np.float32), 3, 42)
    want = expected.transform(full)
    np.testing.assert_allclose(
        spaces[f"target PCA-3, fitted on {fit_file}"], quora_sr.unit_rows(want), atol=1e-5
    )
    for vectors in spaces.values():
        assert vectors.shape[0] == len(corpus)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_pair_geometry_by_hand() -> None:
    """Cosines of unit rows: the duplicate's, and a random other document's, never the query's own."""
    alone = QuoraRetrieval(["q", "d"], queries=[0], relevant=[1])
    pair = np.asarray([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
    got = target_space.pair_geometry(pair, alone, seed=0)
    assert got == pytest.approx({"duplicate_cosine": 0.6, "random_cosine": 0.6})
    two = QuoraRetrieval(["q1", "q2", "d"], queries=[0, 1], relevant=[2, 2])
    rows = np.asarray([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]], dtype=np.float32)
    assert target_space.pair_geometry(rows, two, seed=0)["duplicate_cosine"] == pytest.approx(0.7)
