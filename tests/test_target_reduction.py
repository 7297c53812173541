"""``--target-reduction neighbourhood``: the neighbourhood loss by hand, the refit's contract, the run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from distilembed.errors import UserError
from tests.test_pipeline import _cfg
from training.config import make_config
from training.losses.hpd import PCATargets
from training.losses.neighbourhood import neighbourhood_loss
from training.pipeline import run_training
from training.target_reduction import fit_neighbourhood_reduction


def test_neighbourhood_loss_hand_computed() -> None:
    # full space: the anchor (1, 0) against the bank (1, 0), (0, 1): cosines 1, 0
    # reduced (1-d): the anchor 1 against the bank 1, -1: cosines 1, -1; tau 1
    p = [math.e / (math.e + 1), 1 / (math.e + 1)]
    q = [math.e / (math.e + math.exp(-1)), math.exp(-1) / (math.e + math.exp(-1))]
    expected = -(p[0] * math.log(q[0]) + p[1] * math.log(q[1]))
    loss = neighbourhood_loss(
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        torch.tensor([[1.0]]),
        torch.tensor([[1.0], [-1.0]]),
        tau=1.0,
    )
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_the_full_space_itself_scores_the_entropy_and_nothing_scores_lower() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=generator)
    p = torch.softmax(
        torch.nn.functional.normalize(x, dim=-1) @ torch.nn.functional.normalize(x, dim=-1).T / 0.1, -1
    )
    entropy = float(-(p * p.log()).sum(-1).mean())
    assert float(neighbourhood_loss(x, x, x, x, 0.1)) == pytest.approx(entropy, rel=1e-5)
    y = x @ torch.randn(6, 3, generator=generator)
    assert float(neighbourhood_loss(x, x, y, y, 0.1)) > entropy


def test_mismatched_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="same anchors and bank rows"):
        neighbourhood_loss(torch.ones(2, 3), torch.ones(4, 3), torch.ones(2, 1), torch.ones(3, 1), 0.1)


def _clusters() -> tuple[np.ndarray, np.ndarray]:
    """Sixteen tight cells: two loud directions (+-3) split them into four groups, two quiet ones
    (+-1) split each group in four. A 2-d PCA keeps the loud pair alone, so a point's nearest
    neighbour there is anyone in its group; a 2-d map that mixes in the quiet pair keeps all 16."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, size=(400, 4))
    x = (2 * bits - 1) * np.array([3.0, 3.0, 1.0, 1.0]) + 0.05 * rng.standard_normal((400, 4))
    return x.astype(np.float32), bits @ np.array([1, 2, 4, 8])


def _same_cluster_share(reduction: PCATargets, x: np.ndarray, labels: np.ndarray) -> float:
    y = reduction.transform(x)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    sims = y @ y.T
    np.fill_diagonal(sims, -np.inf)
    return float(np.mean(labels[sims.argmax(1)] == labels))


def test_the_refit_keeps_neighbourhoods_the_pca_drops_and_the_pca_variance() -> None:
    x, labels = _clusters()
    pca = PCATargets.fit(x, 2, seed=0)
    refit, report = fit_neighbourhood_reduction(
        pca, x, lambda r: _same_cluster_share(r, x, labels), steps=200, tau=0.1, lr=0.05, eval_every=20
    )
    assert _same_cluster_share(pca, x, labels) < 0.6 < 0.95 < _same_cluster_share(refit, x, labels)
    assert report["best_step"] > 0 and report["dev"] > report["dev_pca"]
    assert refit.transform(x).var(axis=0).sum() == pytest.approx(pca.transform(x).var(axis=0).sum(), rel=1e-3)
    np.testing.assert_array_equal(refit.mean, pca.mean)


def test_step_zero_wins_when_nothing_beats_the_pca() -> None:
    x, _ = _clusters()
    pca = PCATargets.fit(x, 2, seed=0)
    calls = iter(range(100))
    refit, report = fit_neighbourhood_reduction(pca, x, lambda _: -next(calls), steps=40, eval_every=10)
    assert report["best_step"] == 0 and [p["step"] for p in report["curve"]] == [0, 10, 20, 30, 40]
    np.testing.assert_allclose(refit.components, pca.components, rtol=1e-5)


def test_a_whitened_pca_is_refused() -> None:
    x, _ = _clusters()
    with pytest.raises(ValueError, match="plain PCA"):
        fit_neighbourhood_reduction(PCATargets.fit(x, 2, whiten=0.5), x, lambda _: 0.0, steps=1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"target_reduction": "umap"}, "unknown --target-reduction 'umap'"),
        ({"target_reduction": "neighbourhood", "pca_whiten": 0.25}, "drop --pca-whiten"),
        ({"target_reduction": "neighbourhood", "matryoshka": (8, 4)}, "not with --matryoshka"),
    ],
)
def test_bad_reduction_flags_are_user_errors(overrides, message) -> None:
    with pytest.raises(UserError, match=message):
        make_config(None, {"dim": 8, **overrides})


def test_a_run_trains_on_the_refitted_targets_and_records_them(
    tiny_teacher, tiny_bert, tiny_data, tmp_path
) -> None:
    cfg = _cfg(tiny_teacher, tiny_bert, max_steps=2, target_reduction="neighbourhood")
    run_training(cfg, tmp_path / "ckpt", data_dir=str(tiny_data))
    reduction = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())["pca"]["reduction"]
    assert reduction["method"] == "neighbourhood" and reduction["curve"][0]["step"] == 0
    assert reduction["dev"] >= reduction["dev_pca"] and reduction["sentences"] == 120
