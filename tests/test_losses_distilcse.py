import math

import pytest
import torch

from training.losses.distilcse import (
    ContrastiveFinetuneLoss,
    DistilCSELoss,
    ckd_loss,
    contrastive_finetune_loss,
    kd_loss,
)
from training.losses.ibkd import info_nce


def test_kd_loss_hand_computed() -> None:
    projected = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    teacher = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert kd_loss(projected, teacher).item() == pytest.approx((1 + 4 + 1 + 4) / 4)


def test_ckd_hand_computed_with_queue() -> None:
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    teacher = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    queue = torch.tensor([[-1.0, 0.0]])
    tau, c = 0.05, 1 / math.sqrt(2)
    # eq. 5: denominator = in-batch teacher rows + queued rows
    row0 = -math.log(math.exp(20) / (math.exp(20) + math.exp(20 * c) + math.exp(-20)))
    row1 = -math.log(math.exp(20 * c) / (math.exp(0) + math.exp(20 * c) + math.exp(0)))
    assert ckd_loss(student, teacher, queue, tau).item() == pytest.approx((row0 + row1) / 2, rel=1e-5)
    # no queue: eq. 4, the same in-batch InfoNCE as IBKD's
    assert ckd_loss(student, teacher, None, tau).item() == pytest.approx(
        info_nce(student, teacher, tau).item()
    )
    assert ckd_loss(student, teacher, torch.zeros(0, 2), tau).item() == pytest.approx(
        info_nce(student, teacher, tau).item()
    )


def test_module_enqueues_after_the_loss() -> None:
    torch.manual_seed(0)
    loss_fn = DistilCSELoss(student_dim=3, teacher_dim=5, queue_size=8)
    student, teacher = torch.randn(4, 3), torch.randn(4, 5)
    first = loss_fn(student, teacher)
    expected = ckd_loss(loss_fn.project(student), teacher, None, 0.05)
    assert first.item() == pytest.approx(expected.item())  # the batch is not its own queued negative
    assert len(loss_fn.bank) == 4
    second = loss_fn(student, teacher)
    expected = ckd_loss(loss_fn.project(student), teacher, teacher, 0.05)
    assert second.item() == pytest.approx(expected.item(), rel=1e-6)
    assert len(loss_fn.bank) == 8
    loss_fn.eval()
    loss_fn(student, teacher)
    assert len(loss_fn.bank) == 8  # evaluation does not touch the queue
    kd = DistilCSELoss(student_dim=3, teacher_dim=5, contrastive=False)
    assert kd.bank is None
    assert kd(student, teacher).item() == pytest.approx(kd_loss(kd.project(student), teacher).item())


def test_finetune_loss_hand_computed() -> None:
    anchor = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positive = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    negative = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    c = 1 / math.sqrt(2)
    row0 = -math.log(math.exp(20) / (math.exp(20) + 1 + 1 + math.exp(20 * c)))
    row1 = -math.log(math.exp(20) / (1 + math.exp(20) + math.exp(20) + math.exp(20 * c)))
    got = contrastive_finetune_loss(anchor, positive, negative, 0.05)
    assert got.item() == pytest.approx((row0 + row1) / 2, rel=1e-5)
    assert ContrastiveFinetuneLoss()(anchor, positive, negative).item() == pytest.approx(got.item())


def test_ckd_loss_decreases_as_student_moves_towards_teacher() -> None:
    torch.manual_seed(1)
    loss_fn = DistilCSELoss(student_dim=4, teacher_dim=6, queue_size=32)
    teacher = torch.randn(8, 6)
    loss_fn.bank.enqueue(torch.randn(32, 6))
    loss_fn.eval()  # keep the queue fixed while checking the gradient
    student = torch.randn(8, 4, requires_grad=True)
    params = [student, *loss_fn.parameters()]
    first = loss_fn(student, teacher).item()
    for _ in range(20):
        grads = torch.autograd.grad(loss_fn(student, teacher), params)
        with torch.no_grad():
            for param, grad in zip(params, grads, strict=True):
                param.sub_(0.5 * grad)
    assert loss_fn(student, teacher).item() < 0.5 * first
