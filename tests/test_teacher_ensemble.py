"""``--ensemble-teacher``: several teachers' cosines averaged by weight through one concatenation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distilembed.errors import UserError
from tests.test_pipeline import _cfg
from training.config import make_config
from training.pipeline import run_training
from training.teacher_targets import EnsembleTeacher, combine, ensemble_weights, parse_member


def test_combine_on_a_hand_computed_case() -> None:
    # [3, 4] normalises to [0.6, 0.8]; [2, 0] to [1, 0]; scaled by sqrt(0.64) = 0.8 and sqrt(0.36) = 0.6.
    out = combine([np.array([[3.0, 4.0]]), np.array([[2.0, 0.0]])], [0.64, 0.36])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), [[0.48, 0.64, 0.6, 0.0]], atol=1e-3)
    assert float(np.linalg.norm(out.astype(np.float32))) == pytest.approx(1.0, abs=1e-3)


def test_combined_cosine_is_the_weighted_mean_of_member_cosines() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 12)), rng.normal(size=(2, 5))

    def cos(x: np.ndarray) -> float:
        return float(x[0] @ x[1] / np.linalg.norm(x[0]) / np.linalg.norm(x[1]))

    out = combine([a, b], [0.7, 0.3]).astype(np.float32)
    assert float(out[0] @ out[1]) == pytest.approx(0.7 * cos(a) + 0.3 * cos(b), abs=2e-3)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all-MiniLM-L6-v2:0.25", ("all-MiniLM-L6-v2", 0.25)),
        ("all-MiniLM-L6-v2", ("all-MiniLM-L6-v2", 0.3)),
        ("/models/a:b", ("/models/a:b", 0.3)),
    ],
)
def test_parse_member(spec: str, expected: tuple[str, float]) -> None:
    assert parse_member(spec) == expected


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (["x:1.5"], "strictly between 0 and 1"),
        (["x:0"], "strictly between 0 and 1"),
        ([":0.2"], "no teacher name"),
        (["x:0.6", "y:0.5"], "sum to less than 1"),
    ],
)
def test_bad_members_are_user_errors(members: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        make_config(None, {"ensemble_teachers": members})
    with pytest.raises(UserError, match=message):
        ensemble_weights(members)


class _FakeTeacher:
    def __init__(self, name: str, table: dict[str, list[float]]) -> None:
        self.name, self.path, self.fingerprint, self.table = name, f"/m/{name}", name * 4, table

    def targets(self, texts: list[str]) -> tuple[np.ndarray, dict[str, object]]:
        return np.array([self.table[t] for t in texts], dtype=np.float16), {"teacher": self.name}


def test_ensemble_teacher_combines_members_in_order() -> None:
    one = _FakeTeacher("one", {"a": [1.0, 0.0], "b": [0.0, 1.0]})
    two = _FakeTeacher("two", {"a": [0.0, 0.0, 1.0], "b": [0.0, 0.0, 1.0]})
    ensemble = EnsembleTeacher([(one, 0.75), (two, 0.25)])  # type: ignore[list-item]
    targets, info = ensemble.targets(["a", "b"])
    assert targets.shape == (2, 5) and info["dim"] == 5 and len(info["members"]) == 2
    # members disagree on a/b (cosine 0 and 1): the ensemble's cosine is 0.75 * 0 + 0.25 * 1
    rows = targets.astype(np.float32)
    assert float(rows[0] @ rows[1]) == pytest.approx(0.25, abs=1e-3)
    assert targets[0, 0] == pytest.approx(math.sqrt(0.75), abs=1e-3)
    assert ensemble.name == "one:0.75 + two:0.25"
    assert ensemble.fingerprint != EnsembleTeacher([(one, 0.5), (two, 0.5)]).fingerprint  # type: ignore[list-item]


def test_training_with_an_ensemble_records_it(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_teacher, tiny_bert, max_steps=2, ensemble_teachers=[f"{tiny_bert}:0.4"])
    manifest = run_training(cfg, tmp_path / "ens", data_dir=str(tiny_data))
    plain = _cfg(tiny_teacher, tiny_bert, max_steps=1)
    single = run_training(plain, tmp_path / "one", data_dir=str(tiny_data))
    assert manifest["teacher"]["dim"] == single["teacher"]["dim"] + 32  # tiny-bert's hidden size
    assert manifest["teacher"]["name"] == f"{tiny_teacher}:0.6 + {tiny_bert}:0.4"
    assert list(manifest["config"]["ensemble_teachers"]) == [f"{tiny_bert}:0.4"]
    assert "STS-B" in manifest["scores"]
