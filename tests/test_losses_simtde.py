import pytest
import torch

from training.losses.simtde import SimTDELoss, masked_token_mse, simtde_loss


def test_masked_token_mse_ignores_padding() -> None:
    student = torch.tensor([[[1.0, 1.0], [2.0, 0.0], [9.0, 9.0]]])
    teacher = torch.tensor([[[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # real tokens: (1 + 0) + (4 + 0) = 5 over 2 tokens x 2 dims
    assert masked_token_mse(student, teacher, mask).item() == pytest.approx(5 / 4)


def test_simtde_loss_weights_the_two_terms() -> None:
    student_tokens = torch.ones(2, 2, 3)
    teacher_tokens = torch.zeros(2, 2, 3)
    mask = torch.tensor([[1, 1], [1, 0]])
    student_sentence = torch.tensor([[2.0, 0.0]])
    teacher_sentence = torch.tensor([[0.0, 0.0]])
    # L_TE = 1, L_SE = 4 / 2 = 2
    got = simtde_loss(student_tokens, teacher_tokens, mask, student_sentence, teacher_sentence, alpha=0.25)
    assert got.item() == pytest.approx(0.25 * 1 + 0.75 * 2)
    module = SimTDELoss()
    assert module(student_tokens, teacher_tokens, mask, student_sentence, teacher_sentence).item() == (
        pytest.approx(0.5 * 1 + 0.5 * 2)
    )


def test_shape_checks() -> None:
    with pytest.raises(ValueError, match="differ"):
        masked_token_mse(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.ones(1, 2))
    with pytest.raises(ValueError, match="mask"):
        masked_token_mse(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.ones(1, 3))
    with pytest.raises(ValueError, match="differ"):
        simtde_loss(
            torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 3)
        )
