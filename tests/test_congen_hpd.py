"""``--hpd-weight``: ConGen's loss plus w times HPD's MSE on the control view (a combined objective)."""

from __future__ import annotations

import pytest
import torch

from distilembed.errors import UserError
from tests.test_losses_queue import oldest_first
from tests.tiny_models import tiny_sentences
from training.config import TrainConfig, make_config
from training.losses.hpd import hpd_loss
from training.methods import MethodInputs, congen_stage, encode_features
from training.student import build_student


def _batch_loss(student, texts: list[str], targets: torch.Tensor, weight: float, indices: list[int]) -> float:
    # "none" as the teacher's view: its targets are the training targets, so no teacher is needed.
    cfg = TrainConfig(method="congen", dim=8, congen_views=("none", "none"), hpd_weight=weight, queue_size=16)
    inputs = MethodInputs(cfg, student, None, texts, [], None, targets, "cpu", None)  # type: ignore[arg-type]
    with torch.no_grad():
        return float(congen_stage(inputs).batch_loss(indices))


def test_hpd_weight_adds_exactly_w_times_the_mse(tiny_bert) -> None:
    student = build_student(str(tiny_bert), dim=8, max_seq_len=16).eval()
    texts = tiny_sentences(24)
    targets = torch.randn(len(texts), 8, generator=torch.Generator().manual_seed(0)) * 0.3
    indices = [0, 3, 5, 7]
    with torch.no_grad():
        _, control = encode_features(student, [texts[i] for i in indices])
        mse = float(hpd_loss(control, targets[indices]))
    plain = _batch_loss(student, texts, targets, 0.0, indices)
    combined = _batch_loss(student, texts, targets, 2.5, indices)
    assert mse > 0
    assert combined - plain == pytest.approx(2.5 * mse, rel=1e-4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "congen", "hpd_weight": -1.0}, "must not be negative"),
        ({"method": "ibkd", "hpd_weight": 1.0}, "not for --method ibkd"),
        ({"method": "congen", "congen_teacher_space": "both"}, "unknown --congen-teacher-space 'both'"),
        ({"method": "ibkd", "congen_teacher_space": "full"}, "not for --method ibkd"),
    ],
)
def test_bad_combined_objective_flags_are_user_errors(overrides, message) -> None:
    with pytest.raises(UserError, match=message):
        make_config(None, overrides)


def test_teacher_space_full_reads_the_full_targets(tiny_bert) -> None:
    """``--congen-teacher-space full``: the queue's teacher side holds the full-width targets of the
    instances its PCA side holds, and each batch adds its own full-width rows."""
    student = build_student(str(tiny_bert), dim=8, max_seq_len=16).eval()
    texts = tiny_sentences(24)
    pca = torch.randn(len(texts), 8, generator=torch.Generator().manual_seed(1))
    wide = torch.randn(len(texts), 20, generator=torch.Generator().manual_seed(2)).half()
    cfg = TrainConfig(
        method="congen", dim=8, congen_views=("none", "none"), congen_teacher_space="full", queue_size=16
    )
    inputs = MethodInputs(cfg, student, None, texts, [wide.numpy()], None, pca, "cpu", None)  # type: ignore[arg-type]
    stage = congen_stage(inputs)
    loss = stage.extra_state
    assert loss is not None and loss.space_bank is not None
    rows = [
        next(i for i, row in enumerate(pca) if torch.equal(row, kept)) for kept in oldest_first(loss.bank)
    ]
    assert torch.equal(oldest_first(loss.space_bank), wide[rows].float())
    with torch.no_grad():
        stage.batch_loss([1, 2])
    assert torch.equal(oldest_first(loss.space_bank)[-2:], wide[[1, 2]].float())
    assert stage.info["teacher_space"] == "full"
