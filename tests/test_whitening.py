"""Partial whitening folded into the last Dense layer: the math on hand-computed cases, then a tiny
student end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from distilembed.errors import UserError
from tests.tiny_models import make_tiny_sentence_model, tiny_sentences
from training.whitening import dense_outputs, fold_into_linear, whiten_checkpoint, whitening_transform

# Five points on the axes: mean 0, sample variances 2 (x) and 1/2 (y), no covariance.
AXES = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, -1.0], [0.0, 0.0]])


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0])
def test_transform_scales_each_component_by_its_variance_to_the_minus_p_over_2(power: float) -> None:
    mean, transform = whitening_transform(AXES, power)
    variances = np.array([8 / 4, 2 / 4])  # sums of squares 8 and 2, over n - 1 = 4
    assert mean == pytest.approx([0.0, 0.0])
    assert transform == pytest.approx(np.diag(variances ** (-power / 2)))
    # Component variances v become v^(1 - p): p = 1 whitens fully.
    whitened = (AXES - mean) @ transform
    assert np.var(whitened, axis=0, ddof=1) == pytest.approx(variances ** (1 - power))


def test_transform_is_symmetric_and_whitens_correlated_data() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3)) @ np.array([[2.0, 0.5, 0.0], [0.0, 1.0, 0.3], [0.0, 0.0, 0.2]]) + 5.0
    mean, transform = whitening_transform(x, 1.0)
    assert transform == pytest.approx(transform.T)
    assert np.cov((x - mean) @ transform, rowvar=False) == pytest.approx(np.eye(3), abs=1e-9)


def test_folded_linear_layer_equals_the_layer_then_the_transform() -> None:
    rng = np.random.default_rng(1)
    weight, bias, x = rng.normal(size=(4, 6)), rng.normal(size=4), rng.normal(size=(10, 6))
    mean, transform = whitening_transform(rng.normal(size=(50, 4)), 0.25)
    new_weight, new_bias = fold_into_linear(weight, bias, mean, transform)
    assert x @ new_weight.T + new_bias == pytest.approx(((x @ weight.T + bias) - mean) @ transform)


@pytest.mark.parametrize(
    ("vectors", "power", "message"),
    [(AXES, 1.5, r"power must be in \[0, 1\]"), (AXES[:2], 0.5, "needs more than 2 sentences")],
)
def test_bad_fits_are_user_errors(vectors: np.ndarray, power: float, message: str) -> None:
    with pytest.raises(UserError, match=message):
        whitening_transform(vectors, power)


def test_whitened_checkpoint_serves_the_normalised_transform_of_the_source(
    tiny_dense_student: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    texts, probe = tiny_sentences(200, seed=7), tiny_sentences(5, seed=8)
    out = tmp_path / "white"
    manifest = whiten_checkpoint(tiny_dense_student, out, texts, [1.0], corpus="tiny")
    source = SentenceTransformer(str(tiny_dense_student), device="cpu")
    mean, transform = whitening_transform(dense_outputs(source, texts), 1.0)
    expected = (dense_outputs(source, probe) - mean) @ transform
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    white = SentenceTransformer(str(out), device="cpu")
    assert [type(m).__name__ for m in white] == [type(m).__name__ for m in source]
    assert white.encode(probe) == pytest.approx(expected, abs=1e-4)
    # Power 1: the Dense outputs of the fitting text are decorrelated with unit variance.
    assert np.cov(dense_outputs(white, texts), rowvar=False) == pytest.approx(np.eye(8), abs=1e-3)
    assert manifest["whiten"]["power"] == 1.0
    assert manifest["whiten"]["sentences"] == 200
    assert manifest["whiten"]["source"]["path"] == str(tiny_dense_student)


def test_several_powers_keep_the_best_scoring_one(tiny_dense_student: Path, tmp_path: Path) -> None:
    # Score: the mean absolute correlation between output dimensions, negated; stronger whitening
    # decorrelates more, so the largest power wins and every candidate is recorded.
    probe = tiny_sentences(300, seed=9)

    def score(model: object) -> float:
        corr = np.corrcoef(model.encode(probe), rowvar=False)  # type: ignore[attr-defined]
        return -float(np.abs(corr - np.diag(np.diag(corr))).mean())

    manifest = whiten_checkpoint(
        tiny_dense_student, tmp_path / "w", tiny_sentences(300, seed=9), [0.0, 0.5, 1.0], score=score
    )
    info = manifest["whiten"]
    assert info["power"] == 1.0
    assert [c["power"] for c in info["candidates"]] == [0.0, 0.5, 1.0]
    devs = [c["dev_spearman"] for c in info["candidates"]]
    assert devs == sorted(devs) and info["dev_spearman"] == devs[-1]


def test_matryoshka_and_dense_free_students_are_refused(tiny_dense_student: Path, tmp_path: Path) -> None:
    texts = tiny_sentences(50)
    with pytest.raises(UserError, match="final Dense layer"):
        whiten_checkpoint(make_tiny_sentence_model(tmp_path / "plain"), tmp_path / "a", texts, [0.5])
    nested = tmp_path / "nested"
    nested.mkdir()
    for item in tiny_dense_student.iterdir():
        target = nested / item.name
        target.symlink_to(item, target_is_directory=item.is_dir())
    (nested / "manifest.json").write_text(json.dumps({"matryoshka": {"widths": [8, 4]}}))
    with pytest.raises(UserError, match="Matryoshka student"):
        whiten_checkpoint(nested, tmp_path / "b", texts, [0.5])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_bad_power_is_one_line(
    tiny_dense_student: Path, tiny_data: Path, tmp_path: Path, run_cli
) -> None:
    args = ("whiten", str(tiny_dense_student), "--out", str(tmp_path / "o"), "--corpus", "corpus.txt")
    for power, message in (("2", "power must be in [0, 1]"), ("x", "--power takes comma-separated floats")):
        result = run_cli(
            *args, "--power", power, "--skip-sentences", "0", env={"DISTILEMBED_DATA_DIR": str(tiny_data)}
        )
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()
