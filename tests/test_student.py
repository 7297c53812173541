import pytest
import torch

from distilembed.errors import UserError
from training.student import build_student, projected, spread_layers, tokenize
from training.teachers import embedding_dimension


def test_spread_layers_keeps_last() -> None:
    assert spread_layers(6, 3) == [1, 3, 5]
    assert spread_layers(6, 6) == list(range(6))
    assert spread_layers(12, 4) == [2, 5, 8, 11]
    assert spread_layers(4, 1) == [3]


def test_build_student_shapes(tiny_bert) -> None:
    student = build_student(str(tiny_bert), dim=8, layers=1, max_seq_len=32)
    assert student[0].auto_model.config.num_hidden_layers == 1
    assert len(student[0].auto_model.encoder.layer) == 1
    out = student.encode(["a man is playing", "a dog ."], convert_to_numpy=True)
    assert out.shape == (2, 8)
    assert torch.allclose(torch.from_numpy(out).norm(dim=1), torch.ones(2), atol=1e-5)
    raw = projected(student, tokenize(student, ["a man is playing"]))
    assert raw.shape == (1, 8) and raw.requires_grad


def test_kept_layer_is_the_original_last(tiny_bert) -> None:
    from transformers import AutoModel

    original = AutoModel.from_pretrained(str(tiny_bert))
    student = build_student(str(tiny_bert), dim=8, layers=1)
    kept = student[0].auto_model.encoder.layer[0].state_dict()
    last = original.encoder.layer[1].state_dict()
    assert all(torch.equal(kept[k], last[k]) for k in last)


def test_dim_must_not_exceed_hidden(tiny_bert) -> None:
    with pytest.raises(UserError, match="at most the student's hidden size 32"):
        build_student(str(tiny_bert), dim=33)
    assert embedding_dimension(build_student(str(tiny_bert), dim=32)) == 32


def test_unknown_student() -> None:
    with pytest.raises(UserError, match="model not found"):
        build_student("no-such-model-anywhere")
