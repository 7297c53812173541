import math

import pytest
import torch

from training.losses.distilcse import contrastive_finetune_loss
from training.losses.ibkd import (
    IBKDFinetuneLoss,
    IBKDLoss,
    hsic,
    ibkd_distill_loss,
    info_nce,
    input_representation,
)


def test_info_nce_2x2_hand_computed() -> None:
    student = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    teacher = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    # cosines: s0.t0 = 1, s0.t1 = 1/sqrt2, s1.t0 = 0, s1.t1 = 1/sqrt2; tau = 0.1
    c = 1 / math.sqrt(2)
    row0 = -math.log(math.exp(10.0) / (math.exp(10.0) + math.exp(10 * c)))
    row1 = -math.log(math.exp(10 * c) / (math.exp(0.0) + math.exp(10 * c)))
    assert info_nce(student, teacher, tau=0.1).item() == pytest.approx((row0 + row1) / 2, rel=1e-5)


def test_info_nce_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="differ"):
        info_nce(torch.zeros(2, 3), torch.zeros(2, 4))


def test_hsic_hand_computed_two_points() -> None:
    # K = (1-b) I + b 11^T with b = exp(-gamma |x0-x1|^2); H 1 = 0, so tr(KHLH) = (1-b)^2 tr(H) = (1-b)^2.
    x = torch.tensor([[0.0], [1.0]])
    expected = (1 - math.exp(-1.0)) ** 2 / (2 - 1) ** 2
    assert hsic(x, x, gamma=1.0, normalize=False).item() == pytest.approx(expected, rel=1e-6)


def test_hsic_independent_near_zero_identical_larger() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=gen)
    y = torch.randn(256, 8, generator=gen)
    independent, identical = hsic(x, y).item(), hsic(x, x).item()  # the biased estimator: O(1/m) > 0
    assert independent < 0.1 * identical
    assert hsic(x, 2 * x + 0.01 * y).item() > 10 * independent  # a function of x is dependent
    assert hsic(x, torch.ones(256, 3)).item() == pytest.approx(0.0, abs=1e-6)  # constant side


def test_hsic_matches_the_trace_formula() -> None:
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(5, 3, generator=gen), torch.randn(5, 2, generator=gen)
    gram = lambda a: torch.exp(-0.5 * torch.cdist(a, a) ** 2)  # noqa: E731
    h = torch.eye(5) - torch.ones(5, 5) / 5
    expected = torch.trace(gram(x) @ h @ gram(y) @ h) / 16  # eq. 6 with (m - 1)^-2
    assert hsic(x, y, gamma=0.5, normalize=False).item() == pytest.approx(expected.item(), rel=1e-5)


def test_hsic_gradient_is_finite_with_duplicate_rows() -> None:
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 1.0]], requires_grad=True)
    hsic(x, x.detach() + 1).backward()
    assert torch.isfinite(x.grad).all()


def test_distill_loss_is_ce_plus_beta_hsic() -> None:
    gen = torch.Generator().manual_seed(1)
    aligned, teacher = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    inputs, student = torch.randn(6, 7, generator=gen), torch.randn(6, 3, generator=gen)
    got = ibkd_distill_loss(aligned, teacher, inputs, student, tau=0.1, beta=1.0, gamma=0.5)
    expected = info_nce(aligned, teacher, 0.1) + hsic(inputs, student, 0.5)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_finetune_module_adds_beta_hsic() -> None:
    gen = torch.Generator().manual_seed(2)
    a, p, n = (torch.randn(4, 6, generator=gen) for _ in range(3))
    x = torch.randn(12, 5, generator=gen)
    s = torch.cat([a, p, n])
    got = IBKDFinetuneLoss(beta=0.5)(a, p, n, x, s)
    expected = contrastive_finetune_loss(a, p, n, 0.05) + 0.5 * hsic(x, s, 0.5)  # eq. 10 is eq. 7
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_stage1_loss_decreases_as_student_moves_towards_teacher() -> None:
    torch.manual_seed(0)
    teacher = torch.randn(16, 12)
    inputs = torch.randn(16, 10)
    student = torch.randn(16, 4, requires_grad=True)
    loss_fn = IBKDLoss(student_dim=4, teacher_dim=12)
    assert [tuple(p.shape) for p in loss_fn.parameters()] == [(12, 4)]  # W, training-only
    params = [student, *loss_fn.parameters()]
    first = loss_fn(student, teacher, inputs).item()
    for _ in range(20):  # plain gradient descent (an optimiser's first import costs seconds)
        loss = loss_fn(student, teacher, inputs)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for param, grad in zip(params, grads, strict=True):
                param.sub_(0.5 * grad)
    assert loss.item() < 0.5 * first


def test_input_representation_is_masked_mean_of_embedding_output(tiny_bert) -> None:
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(tiny_bert).eval()
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    features = tok(["a man plays", "the dog is running in the park"], padding=True, return_tensors="pt")
    x = input_representation(model, dict(features))
    with torch.no_grad():
        hidden0 = model(**features, output_hidden_states=True).hidden_states[0]
    n0 = int(features["attention_mask"][0].sum())
    assert x.shape == (2, 32) and not x.requires_grad
    assert torch.allclose(x[0], hidden0[0, :n0].mean(dim=0), atol=1e-6)
    assert torch.allclose(x[1], hidden0[1].mean(dim=0), atol=1e-6)
