"""``--hpd-weight``: ConGen's loss plus w times HPD's MSE on the control view (a combined objective)."""

from __future__ import annotations

import pytest
import torch

from distilembed.errors import UserError
from tests.tiny_models import tiny_sentences
from training.config import TrainConfig, make_config
from training.losses.hpd import hpd_loss
from training.methods.base import MethodInputs, encode_features
from training.methods.congen import congen_stage
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
        ({"method": "congen", "matryoshka_targets": "half"}, "unknown --matryoshka-targets 'half'"),
        ({"method": "hpd", "matryoshka_targets": "full"}, "not for --method hpd"),
        ({"method": "congen", "congen_teacher_space": "both"}, "unknown --congen-teacher-space 'both'"),
        ({"method": "ibkd", "congen_teacher_space": "full"}, "not for --method ibkd"),
        ({"method": "hpd", "pca_whiten": 1.5}, "--pca-whiten must be in"),
    ],
)
def test_bad_combined_objective_flags_are_user_errors(overrides, message) -> None:
    with pytest.raises(UserError, match=message):
        make_config(None, overrides)


def _space_loss(student, texts: list[str], pca: torch.Tensor, full: torch.Tensor, space: str) -> float:
    cfg = TrainConfig(
        method="congen", dim=8, congen_views=("none", "none"), congen_teacher_space=space, queue_size=16
    )
    inputs = MethodInputs(cfg, student, None, texts, [full.numpy()], None, pca, "cpu", None)  # type: ignore[arg-type]
    with torch.no_grad():
        return float(congen_stage(inputs).batch_loss([1, 2, 4, 8]))


def test_teacher_space_full_reads_the_full_targets(tiny_bert) -> None:
    student = build_student(str(tiny_bert), dim=8, max_seq_len=16).eval()
    texts = tiny_sentences(24)
    pca = (
        torch.randn(len(texts), 8, generator=torch.Generator().manual_seed(1)).half().float()
    )  # kept as float16
    wide = torch.randn(len(texts), 20, generator=torch.Generator().manual_seed(2))
    # the teacher's own space equal to its PCA coordinates: the same loss as from the PCA queue
    plain = _space_loss(student, texts, pca, pca, "pca")
    assert _space_loss(student, texts, pca, pca, "full") == pytest.approx(plain, rel=1e-6)
    assert abs(_space_loss(student, texts, pca, wide, "full") - plain) > 1e-5 * plain
