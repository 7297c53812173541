"""Matryoshka (training/losses/matryoshka.py): eq. 1 on hand-computed cases, and each method's
loss with nested widths equal to the sum of its plain loss on the cut tensors."""

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.evaluation import memoised, truncated
from training.losses.congen import ConGenLoss, congen_loss
from training.losses.distilcse import DistilCSELoss, ckd_loss, kd_loss
from training.losses.hpd import hpd_loss
from training.losses.ibkd import IBKDLoss, ibkd_distill_loss
from training.losses.matryoshka import Widths, matryoshka_loss, prefix, prefix_linear
from training.losses.simtde import SimTDELoss, masked_token_mse


def test_eq1_weighted_sum_by_hand() -> None:
    """loss_at(m) = m: 1*4 + 0.5*2 + 2*1 = 7; a weight of 0 is never computed."""
    called = []

    def loss_at(m: int) -> torch.Tensor:
        called.append(m)
        return torch.tensor(float(m))

    assert matryoshka_loss(loss_at, Widths((4, 2, 1), (1.0, 0.5, 2.0))).item() == pytest.approx(7.0)
    called.clear()
    assert matryoshka_loss(loss_at, Widths((4, 2, 1), (1.0, 0.0, 1.0))).item() == pytest.approx(5.0)
    assert called == [4, 1]


def test_hpd_with_widths_by_hand() -> None:
    """[1, 2, 3, 4] against zeros: 30 at width 4, 1 + 4 = 5 at width 2, so 35 in all."""
    emb, target = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.zeros(1, 4)
    widths = Widths.parse([4, 2], [], 4)
    total = matryoshka_loss(lambda m: hpd_loss(prefix(emb, m), prefix(target, m)), widths)
    assert total.item() == pytest.approx(35.0)


def test_no_widths_is_plain_training() -> None:
    assert Widths.parse([], [], 16) == Widths((16,), (1.0,))
    assert not Widths.parse([], [], 16).nested and Widths.parse([16, 8], [], 16).nested


def test_prefix_linear_is_the_map_of_the_zero_padded_vector() -> None:
    torch.manual_seed(0)
    layer, x = nn.Linear(6, 10), torch.randn(3, 6)
    padded = torch.cat([x[:, :2], torch.zeros(3, 4)], dim=1)
    assert torch.allclose(prefix_linear(x, layer, 2), layer(padded), atol=1e-6)
    assert torch.allclose(prefix_linear(x, layer, 6), layer(x), atol=1e-6)


def test_congen_nested_is_the_sum_over_cut_tensors_and_enqueues_once() -> None:
    torch.manual_seed(1)
    loss = ConGenLoss(8, 8, queue_size=64)
    loss.prefill(torch.randn(20, 8))
    control, general, reference = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    widths = Widths((8, 4), (1.0, 0.5))
    got = loss(control, general, reference, widths)
    queue = loss.bank.vectors()
    assert len(queue) == 24  # the batch went in once, not once per width
    want = sum(
        c * congen_loss(control[:, :m], general[:, :m], reference[:, :m], queue[:, :m])
        for m, c in zip(widths.widths, widths.weights, strict=True)
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_distilcse_nested_is_the_sum_over_cut_tensors_and_enqueues_once() -> None:
    torch.manual_seed(2)
    student, teacher = torch.randn(5, 8), torch.randn(5, 12)
    kd = DistilCSELoss(8, 12, contrastive=False)
    want = kd_loss(prefix_linear(student, kd.project, 8), teacher) + kd_loss(
        prefix_linear(student, kd.project, 2), teacher
    )
    assert kd(student, teacher, Widths((8, 2), (1.0, 1.0))).item() == pytest.approx(want.item(), rel=1e-5)
    ckd = DistilCSELoss(8, 12, contrastive=True, queue_size=32)
    ckd(student, teacher)  # a first batch fills the bank
    queue = ckd.bank.vectors().clone()
    want = ckd_loss(prefix_linear(student, ckd.project, 8), teacher, queue, ckd.tau) + ckd_loss(
        prefix_linear(student, ckd.project, 4), teacher, queue, ckd.tau
    )
    got = ckd(student, teacher, Widths((8, 4), (1.0, 1.0)))
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert len(ckd.bank.vectors()) == 10


def test_ibkd_nested_is_the_sum_over_cut_tensors() -> None:
    torch.manual_seed(3)
    loss = IBKDLoss(8, 12)
    student, teacher, inputs = torch.randn(6, 8), torch.randn(6, 12), torch.randn(6, 5)
    want = sum(
        ibkd_distill_loss(
            prefix_linear(student, loss.align, m), teacher, inputs, student[:, :m],
            tau=loss.tau, beta=loss.beta, gamma=loss.gamma,
        )
        for m in (8, 3)
    )  # fmt: skip
    assert loss(student, teacher, inputs, Widths((8, 3), (1.0, 1.0))).item() == pytest.approx(want.item())
    assert loss(student, teacher, inputs).item() == pytest.approx(
        ibkd_distill_loss(loss.align(student), teacher, inputs, student, tau=loss.tau, beta=loss.beta,
                          gamma=loss.gamma).item()
    )  # fmt: skip


def test_simtde_nested_counts_the_token_term_once() -> None:
    torch.manual_seed(4)
    tokens, teacher_tokens, mask = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.ones(2, 3)
    sentence, target = torch.randn(2, 8), torch.randn(2, 8)
    loss = SimTDELoss(sentence_weight=8.0)
    got = loss(tokens, teacher_tokens, mask, sentence, target, widths=Widths((8, 2), (1.0, 1.0)))
    sentence_terms = F.mse_loss(sentence, target) + F.mse_loss(sentence[:, :2], target[:, :2])
    want = 0.5 * masked_token_mse(tokens, teacher_tokens, mask) + 0.5 * 8.0 * sentence_terms
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_truncated_and_memoised_encoders() -> None:
    calls = []

    def encode(sentences: list[str]):
        calls.append(list(sentences))
        return torch.arange(len(sentences) * 4, dtype=torch.float32).reshape(-1, 4).numpy()

    cached = memoised(encode)
    assert truncated(cached, 2)(["a", "b"]).shape == (2, 2)
    assert truncated(cached, 3)(["b", "a", "c"]).shape == (3, 3)
    assert calls == [["a", "b"], ["c"]]  # each distinct sentence encoded once


def test_cli_comma_lists() -> None:
    from distilembed.errors import UserError
    from training.cli import comma_list

    assert comma_list("128,64, 32", int, "--matryoshka") == [128, 64, 32]
    assert comma_list(None, int, "--matryoshka") is None
    with pytest.raises(UserError, match="--matryoshka-weights takes comma-separated floats"):
        comma_list("1,x", float, "--matryoshka-weights")


def test_congen_teacher_space_takes_the_distribution_from_the_second_queue() -> None:
    torch.manual_seed(4)
    loss = ConGenLoss(8, 8, queue_size=64, space_dim=12)
    pca, space = torch.randn(20, 8), torch.randn(20, 12)
    loss.prefill(pca, space)
    control, general, reference, reference_space = torch.randn(4, 8), torch.randn(4, 8), pca[:4], space[:4]
    widths = Widths((8, 4), (1.0, 0.5))
    got = loss(control, general, reference, widths, reference_space)
    queue, space_queue = loss.bank.vectors(), loss.space_bank.vectors()
    assert len(queue) == len(space_queue) == 24 and torch.equal(space_queue[-4:], reference_space)
    want = sum(
        c
        * congen_loss(
            control[:, :m], general[:, :m], reference_space, space_queue, student_queue=queue[:, :m]
        )
        for m, c in zip(widths.widths, widths.weights, strict=True)
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(ValueError, match="pass teacher_space"):
        loss(control, general, reference, widths)
