import numpy as np
import pytest
import torch

from training.losses.hpd import PCATargets, hpd_loss


def test_hpd_loss_hand_computed() -> None:
    student = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    target = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    # eq. 2: (1 + 4 + 1 + 4) / 2 = 5
    assert hpd_loss(student, target).item() == pytest.approx(5.0)


def test_hpd_loss_zero_and_gradient() -> None:
    student = torch.tensor([[0.5, -0.5]], requires_grad=True)
    target = torch.tensor([[0.5, -0.5]])
    loss = hpd_loss(student, target)
    assert loss.item() == 0.0
    loss = hpd_loss(student, torch.zeros(1, 2))
    loss.backward()
    assert torch.allclose(student.grad, torch.tensor([[1.0, -1.0]]))  # d/ds ||s||^2 = 2s


def test_hpd_loss_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="differ"):
        hpd_loss(torch.zeros(2, 3), torch.zeros(2, 4))


def test_pca_targets_hand_computed() -> None:
    # Points on the line y = x: one principal direction (1, 1)/sqrt(2), mean (2, 2).
    points = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=np.float32)
    pca = PCATargets.fit(points, dim=1)
    np.testing.assert_allclose(pca.mean, [2.0, 2.0], atol=1e-6)
    projected = pca.transform(points)[:, 0]
    sign = np.sign(projected[-1])
    np.testing.assert_allclose(sign * projected, [-np.sqrt(2), 0.0, np.sqrt(2)], atol=1e-5)
    assert pca.explained_variance_ratio[0] == pytest.approx(1.0)


def test_pca_matches_algorithm_1_svd() -> None:
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(200, 10)).astype(np.float32) * np.arange(1, 11, dtype=np.float32)
    pca = PCATargets.fit(emb, dim=3)
    centred = emb - emb.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)  # Algorithm 1: W_t = V[:, :d]
    expected = centred @ vt[:3].T
    got = pca.transform(emb, batch=7)  # batched transform equals one shot
    np.testing.assert_allclose(np.abs(got), np.abs(expected), rtol=1e-3, atol=1e-3)


def test_pca_too_many_components() -> None:
    with pytest.raises(ValueError, match="cannot fit"):
        PCATargets.fit(np.zeros((5, 3), dtype=np.float32), dim=4)
