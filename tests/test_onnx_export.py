"""The exported graph computes what the PyTorch pipeline computes, on padded mixed-length batches."""

import numpy as np
import pytest

from distilembed.errors import UserError
from export.onnx_graph import OUTPUT, export_onnx
from tests.tiny_models import tiny_sentences
from training.student import build_student


@pytest.fixture(scope="module")
def exported(tiny_bert, tmp_path_factory):
    student = build_student(str(tiny_bert), dim=8, max_seq_len=32).eval()
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    info = export_onnx(student, path)
    return student, path, info


def test_graph_matches_pytorch_on_padded_batches(exported) -> None:
    import onnxruntime as ort

    student, path, info = exported
    assert info.dim == 8 and info.pooling == "mean" and info.normalized
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == [OUTPUT]
    texts = [*tiny_sentences(7, seed=11), "a"]  # mixed lengths -> padding inside the batch
    features = student.tokenize(texts)
    feeds = {name: features[name].numpy() for name in info.input_names}
    (onnx_out,) = session.run([OUTPUT], feeds)
    torch_out = student.encode(texts, convert_to_numpy=True, batch_size=len(texts))
    assert onnx_out.shape == (len(texts), 8)
    cosines = (onnx_out * torch_out).sum(axis=1) / (
        np.linalg.norm(onnx_out, axis=1) * np.linalg.norm(torch_out, axis=1)
    )
    assert cosines.min() > 0.99999
    np.testing.assert_allclose(np.linalg.norm(onnx_out, axis=1), 1.0, atol=1e-5)


def test_unsupported_pipeline_is_refused(tiny_teacher, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_teacher))
    model[1].pooling_mode = "max"
    with pytest.raises(UserError, match="not supported"):
        export_onnx(model, tmp_path / "m.onnx")


def test_model_without_a_length_is_refused(tiny_teacher, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_teacher))
    model[0].max_seq_length = None
    with pytest.raises(UserError, match="max_seq_length"):
        export_onnx(model, tmp_path / "m.onnx")
