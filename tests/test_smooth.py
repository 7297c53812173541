"""SmoothQuant (export/smooth.py): the scales on a hand-computed case, exactness in float32, and
less int8 error where one input channel dwarfs the others."""

import json
from typing import Any

import numpy as np
import pytest

from export.bundle import ParityGate, build_bundle, quantize_graph
from export.smooth import (
    activation_maxima,
    calibrate_smoothing,
    smooth_model,
    smooth_targets,
    smoothing_scales,
)
from tests.tiny_models import tiny_sentences
from training.student import build_student


def test_scales_by_hand() -> None:
    # s_j = max|X_j|^a / max|W_j|^(1-a): activations (4, 1), weights (1, 4)
    act, weight = np.array([4.0, 1.0]), np.array([1.0, 4.0])
    assert np.allclose(smoothing_scales(act, weight, 0.5), [2.0, 0.5])
    assert np.allclose(smoothing_scales(act, weight, 1.0), [4.0, 1.0])
    assert np.allclose(smoothing_scales(act, weight, 0.0), [1.0, 0.25])
    assert np.all(np.isfinite(smoothing_scales(np.zeros(2), np.zeros(2), 0.9)))
    with pytest.raises(ValueError, match="alpha"):
        smoothing_scales(act, weight, 1.5)


def _matmul_graph(weight: np.ndarray) -> Any:  # an onnx.ModelProto
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, weight.shape[1]])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: Any, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture
def outlier_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 32)).astype(np.float32)
    x[:, 5] *= 60.0  # one outlier channel, as BERT's LayerNorm outputs have
    return x, rng.normal(size=(32, 16)).astype(np.float32)


def test_smoothing_is_exact_in_float32(outlier_data) -> None:
    x, weight = outlier_data
    model = _matmul_graph(weight)
    assert [t.node for t in smooth_targets(model)] == ["proj"]
    maxima = activation_maxima(model, smooth_targets(model), [{"x": x[:128]}, {"x": x[128:]}])
    assert np.allclose(maxima["x"], np.abs(x).max(axis=0))
    before = _run(model, x)
    record = smooth_model(model, maxima, 0.9)
    assert record["nodes"] == 1 and record["max_over_median_after"] < record["max_over_median_before"]
    assert np.allclose(_run(model, x), before, rtol=1e-4, atol=1e-4)


def test_inputs_without_outliers_are_left_alone() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 32)).astype(np.float32)  # max over median of the channels: about 1.3
    model = _matmul_graph(rng.normal(size=(32, 16)))
    maxima = activation_maxima(model, smooth_targets(model), [{"x": x}])
    record = smooth_model(model, maxima)  # the default threshold, 6
    assert record["nodes"] == 0 and record["of_nodes"] == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    assert smooth_model(model, maxima, min_spread=0.0)["nodes"] == 1


def test_a_graph_without_smoothable_inputs_is_left_alone() -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(  # x + x: no weight initializer, nothing to smooth
        [helper.make_node("Add", ["x", "x"], ["y"], name="add")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    maxima = activation_maxima(model, smooth_targets(model), [{"x": np.ones((2, 4), np.float32)}])
    assert maxima == {}
    assert smooth_model(model, maxima)["nodes"] == 0 and len(model.graph.node) == 1


def test_smoothing_lowers_int8_error_on_an_outlier_channel(outlier_data, tmp_path) -> None:
    import onnx

    x, weight = outlier_data
    exact = x @ weight
    fp32 = tmp_path / "model.onnx"
    onnx.save(_matmul_graph(weight), str(fp32))
    errors = {}
    for name, smoothing in (("plain", None), ("smoothed", calibrate_smoothing(fp32, [{"x": x}], 0.9))):
        out = tmp_path / f"{name}.int8.onnx"
        record = quantize_graph(fp32, out, smoothing=smoothing)
        assert (record is None) == (smoothing is None)
        errors[name] = float(np.abs(_run(onnx.load(str(out)), x) - exact).mean())
    assert errors["smoothed"] < 0.5 * errors["plain"]


def test_bundle_records_its_smoothing(tiny_bert, tmp_path) -> None:
    checkpoint = tmp_path / "student"
    build_student(str(tiny_bert), dim=8, max_seq_len=16).save(str(checkpoint))
    out = tmp_path / "bundle"
    gate = ParityGate(int8_mean_cosine=0.0)
    build_bundle(checkpoint, out, parity_texts=tiny_sentences(20), gate=gate, smooth_texts=tiny_sentences(30))
    manifest = json.loads((out / "manifest.json").read_text())
    smoothing = manifest["int8_weights"]["smoothing"]
    assert smoothing["alpha"] == 0.9 and smoothing["texts"] == 30 and smoothing["of_nodes"] > 0
    assert smoothing["min_spread"] == 6.0 and smoothing["nodes"] <= smoothing["of_nodes"]
    assert manifest["parity"]["fp32_min_cosine"] >= 0.9999  # the float32 graph is left as it was
