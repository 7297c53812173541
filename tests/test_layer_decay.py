import numpy as np
import pytest
import torch

from distilembed.errors import UserError
from training.config import TrainConfig
from training.layer_decay import depth_lr_scales, layerwise_param_groups
from training.student import build_student
from training.trainer import LoopConfig, Trainer


def test_scales_by_hand() -> None:
    # 2 layers, decay 0.5: embeddings 0.5^3, layer 0 0.5^2, layer 1 0.5, head 1.
    assert depth_lr_scales(2, 0.5) == [0.125, 0.25, 0.5, 1.0]
    assert depth_lr_scales(6, 1.0) == [1.0] * 8


def test_groups_cover_every_trainable_parameter_once(tiny_bert) -> None:
    student = build_student(str(tiny_bert), dim=4, max_seq_len=24)
    head_extra = torch.nn.Parameter(torch.zeros(3))
    groups = layerwise_param_groups(student, [head_extra], lr=1e-3, decay=0.5)
    assert [g["lr"] for g in groups] == pytest.approx([1.25e-4, 2.5e-4, 5e-4, 1e-3])
    grouped = [id(p) for g in groups for p in g["params"]]
    trainable = [p for p in student.parameters() if p.requires_grad] + [head_extra]
    assert sorted(grouped) == sorted(id(p) for p in trainable)
    auto_model = student[0].auto_model
    assert {id(p) for p in auto_model.embeddings.parameters()} <= {id(p) for p in groups[0]["params"]}
    assert {id(p) for p in auto_model.encoder.layer[1].parameters()} == {id(p) for p in groups[2]["params"]}
    assert id(head_extra) in {id(p) for p in groups[3]["params"]}
    assert len(layerwise_param_groups(student, [], lr=1e-3, decay=1.0)) == 1


def test_trainer_schedules_each_group_from_its_own_rate(tiny_bert, tmp_path) -> None:
    student = build_student(str(tiny_bert), dim=4, max_seq_len=24)
    cfg = LoopConfig(batch_size=4, lr=1e-3, layer_lr_decay=0.5, epochs=1, eval_every=100, save_every=100)
    trainer = Trainer(student, lambda idx: torch.tensor(0.0), lengths=np.ones(8), cfg=cfg, workdir=tmp_path)
    peaks = [g["initial_lr"] for g in trainer.optimizer.param_groups]
    assert peaks == pytest.approx([1.25e-4, 2.5e-4, 5e-4, 1e-3])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"layer_lr_decay": 0.0}, "must be in"),
        ({"layer_lr_decay": 1.5}, "must be in"),
        ({"layer_lr_decay": 0.8, "method": "simtde"}, "transformer student"),
    ],
)
def test_config_rejects_bad_decay(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        TrainConfig(**overrides).validate()  # type: ignore[arg-type]
