import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from tests.test_losses_queue import oldest_first
from training.losses.congen import ConGenLoss, congen_loss, similarity_logits, soft_cross_entropy


def test_cross_entropy_of_identical_distributions_is_their_entropy() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]])
    p = F.softmax(logits, dim=-1)
    entropy = -(p * p.log()).sum(dim=-1).mean()
    assert soft_cross_entropy(p, logits).item() == pytest.approx(entropy.item(), rel=1e-6)
    assert soft_cross_entropy(p[1:], logits[1:]).item() == pytest.approx(math.log(3), rel=1e-6)
    # Gibbs: any other student distribution costs more
    assert soft_cross_entropy(p, logits.flip(-1)).item() > entropy.item()


def test_congen_hand_computed_one_row() -> None:
    queue = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    teacher = torch.tensor([[1.0, 0.0]])  # cosines 1, 0
    control = torch.tensor([[1.0, 1.0]])  # cosines c, c
    general = torch.tensor([[0.0, 2.0]])  # cosines 0, 1
    tt, ts, c = 0.05, 0.07, 1 / math.sqrt(2)
    p = [math.exp(1 / tt), math.exp(0)]
    p = [v / sum(p) for v in p]
    q_con = [0.5, 0.5]
    z = math.exp(0) + math.exp(1 / ts)
    q_gen = [math.exp(0) / z, math.exp(1 / ts) / z]
    ce_con = -sum(pi * math.log(qi) for pi, qi in zip(p, q_con, strict=True))
    ce_gen = -sum(pi * math.log(qi) for pi, qi in zip(p, q_gen, strict=True))
    got = congen_loss(control, general, teacher, queue, teacher_tau=tt, student_tau=ts, alpha=0.25)
    assert got.item() == pytest.approx(0.25 * ce_con + 0.75 * ce_gen, rel=1e-5)
    assert similarity_logits(control, queue, 1.0)[0].tolist() == pytest.approx([c, c])


def test_student_equal_to_teacher_costs_the_teacher_entropy() -> None:
    gen = torch.Generator().manual_seed(0)
    queue, teacher = torch.randn(10, 4, generator=gen), torch.randn(3, 4, generator=gen)
    got = congen_loss(teacher, teacher, teacher, queue, teacher_tau=0.05, student_tau=0.05)
    p = F.softmax(similarity_logits(teacher, queue, 0.05), dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(dim=-1).mean()
    assert got.item() == pytest.approx(entropy.item(), rel=1e-4, abs=1e-6)


def test_module_queue_head_and_gradient() -> None:
    torch.manual_seed(0)
    loss_fn = ConGenLoss(student_dim=3, teacher_dim=6, queue_size=16)
    assert isinstance(loss_fn.head[1], torch.nn.Tanh)  # section 4.1: Linear + Tanh to the teacher width
    with pytest.raises(ValueError, match="empty"):
        loss_fn.eval()(torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 6))
    loss_fn.train()
    loss_fn.prefill(torch.randn(14, 6))
    teacher = torch.randn(4, 6)
    control = torch.randn(4, 3, requires_grad=True)
    general = torch.randn(4, 3, requires_grad=True)
    loss_fn(control, general, teacher)  # enqueued first: the batch joins D before the softmax
    assert len(loss_fn.bank) == 16 and torch.equal(oldest_first(loss_fn.bank)[-4:], teacher)
    loss_fn.eval()
    params = [control, general, *loss_fn.parameters()]
    first = loss_fn(control, general, teacher).item()
    for _ in range(20):
        grads = torch.autograd.grad(loss_fn(control, general, teacher), params)
        with torch.no_grad():
            for param, grad in zip(params, grads, strict=True):
                param.sub_(0.05 * grad)
    assert loss_fn(control, general, teacher).item() < first
    assert isinstance(ConGenLoss(student_dim=6, teacher_dim=6, queue_size=4).head, torch.nn.Identity)


def test_student_queue_hand_computed_teacher_at_full_width() -> None:
    """The student's 1-d prefix against the 1-d queue, the teacher's distribution from 2-d."""
    queue = torch.tensor([[1.0, 1.0], [-1.0, 1.0]])
    teacher = torch.tensor([[1.0, 0.0]])  # full-width cosines c, -c
    control = torch.tensor([[2.0]])  # 1-d cosines with the cut queue (1, -1): 1, -1
    general = torch.tensor([[-1.0]])  # -1, 1
    tt, ts, c = 0.05, 0.07, 1 / math.sqrt(2)
    p = [math.exp(c / tt), math.exp(-c / tt)]
    p = [v / sum(p) for v in p]
    q_con = [math.exp(1 / ts), math.exp(-1 / ts)]
    q_con = [v / sum(q_con) for v in q_con]
    q_gen = q_con[::-1]
    ce_con = -sum(pi * math.log(qi) for pi, qi in zip(p, q_con, strict=True))
    ce_gen = -sum(pi * math.log(qi) for pi, qi in zip(p, q_gen, strict=True))
    got = congen_loss(
        control,
        general,
        teacher,
        queue,
        teacher_tau=tt,
        student_tau=ts,
        alpha=0.5,
        student_queue=queue[:, :1],
    )
    assert got.item() == pytest.approx(0.5 * ce_con + 0.5 * ce_gen, rel=1e-5)


def test_student_queue_must_match_the_student_and_the_queue() -> None:
    queue, teacher, student = torch.randn(5, 4), torch.randn(2, 4), torch.randn(2, 2)
    with pytest.raises(ValueError, match="widths differ"):
        congen_loss(student, student, teacher, queue)
    with pytest.raises(ValueError, match="queues differ"):
        congen_loss(student, student, teacher, queue, student_queue=queue[:3, :2])
