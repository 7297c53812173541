import pytest
import torch

from distilembed.errors import UserError
from training.student import build_student, projected_embeddings, spread_layers
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
    raw = projected_embeddings(student, ["a man is playing"])
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


def test_mlp_head_starts_as_any_linear_head(tiny_bert) -> None:
    # GELU(x) - GELU(-x) = x: with the last weight [A, -A] the MLP head computes the linear head A x + b.
    torch.manual_seed(0)
    linear = build_student(str(tiny_bert), dim=8, max_seq_len=32)
    mlp = build_student(str(tiny_bert), dim=8, max_seq_len=32, head="mlp")
    assert [type(m).__name__ for m in mlp][2:] == ["Dense", "Dense", "Normalize"]
    assert mlp[2].linear.weight.shape == (64, 32) and mlp[3].linear.weight.shape == (8, 64)
    mlp[0].load_state_dict(linear[0].state_dict())
    a, b = linear[2].linear.weight, linear[2].linear.bias
    with torch.no_grad():
        mlp[3].linear.weight.copy_(torch.cat([a, -a], dim=1))
        mlp[3].linear.bias.copy_(b)
    texts = ["a man is playing", "a dog ."]
    assert torch.allclose(projected_embeddings(mlp, texts), projected_embeddings(linear, texts), atol=1e-5)


def test_mlp_head_saves_and_reloads(tiny_bert, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    student = build_student(str(tiny_bert), dim=8, max_seq_len=32, head="mlp")
    student.save(str(tmp_path / "s"))
    again = SentenceTransformer(str(tmp_path / "s"), device="cpu")
    assert type(again[2].activation_function).__name__ == "GELU"
    texts = ["a man is playing"]
    assert torch.allclose(projected_embeddings(again, texts), projected_embeddings(student, texts), atol=1e-6)
