"""``distilembed rotate BUNDLE``: the MatMul appended to a graph, by hand, then a tiny bundle through
the CLI (embeddings times R, full-width cosines kept, widths recorded, ranges recalibrated)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from export.quantize import calibrate_bundle
from export.rotate import ROTATION, append_rotation
from export.runtime import Encoder
from tests.tiny_models import tiny_sentences

QUARTER_TURN = np.array([[0.0, 1.0], [-1.0, 0.0]])


def identity_graph() -> object:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: object, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    return session.run(None, {"x": x.astype(np.float32)})[0]


def test_append_rotation_by_hand_and_a_second_one_composes() -> None:
    model = append_rotation(identity_graph(), QUARTER_TURN)
    # [1, 2] @ [[0, 1], [-1, 0]] = [1 * 0 + 2 * -1, 1 * 1 + 2 * 0] = [-2, 1]
    assert run(model, np.array([[1.0, 2.0]])) == pytest.approx(np.array([[-2.0, 1.0]]))
    model = append_rotation(model, QUARTER_TURN)  # two quarter turns: minus the identity
    assert run(model, np.array([[1.0, 2.0]])) == pytest.approx(np.array([[-1.0, -2.0]]))
    assert [n.op_type for n in model.graph.node] == ["Identity", "MatMul"]  # type: ignore[attr-defined]
    assert [i.name for i in model.graph.initializer] == [ROTATION]  # type: ignore[attr-defined]


def test_cli_rotates_a_bundle(tiny_bundle: Path, nli_data: Path, tmp_path: Path, run_cli) -> None:
    source = tmp_path / "calibrated"
    shutil.copytree(tiny_bundle, source)
    calibrate_bundle(source, "corpus.txt", 50, nli_data, widths=[3])  # 3: an extra width, kept
    out = tmp_path / "rotated"
    args = ("--matryoshka", "8,4,2", "--triplets", "nli/triplets.csv", "--steps", "20", "--eval-every", "5")
    result = run_cli(
        "rotate",
        str(source),
        "--out",
        str(out),
        *args,
        "--lr",
        "0.05",
        env={"DISTILEMBED_DATA_DIR": str(nli_data)},
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["trained_widths"] == [8, 4, 2]
    assert manifest["rotate"]["source"]["path"] == str(source)
    assert manifest["rotate"]["check_max_abs_diff"] < 1e-4
    before, after = (
        json.loads((source / "manifest.json").read_text())["quantization"],
        manifest["quantization"],
    )
    assert set(after["int8_ranges"]) == {"8", "4", "3", "2"} and set(before["int8_ranges"]) == {"8", "3"}

    import onnx
    from onnx import numpy_helper

    (rotation,) = [
        numpy_helper.to_array(i)
        for i in onnx.load(str(out / "model.int8.onnx")).graph.initializer
        if i.name == ROTATION
    ]
    assert rotation @ rotation.T == pytest.approx(np.eye(8), abs=1e-5)
    texts = tiny_sentences(25, seed=5)
    old, new = Encoder(source).encode(texts), Encoder(out).encode(texts)
    assert new == pytest.approx(old @ rotation, abs=1e-5)
    assert new @ new.T == pytest.approx(old @ old.T, abs=1e-5)  # full-width cosines unchanged
    assert not (tmp_path / "rotated-again").exists()
    again = run_cli(
        "rotate", str(out), "--out", str(tmp_path / "rotated-again"), *args, "--lr", "0.05",
        env={"DISTILEMBED_DATA_DIR": str(nli_data)},
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    graph = onnx.load(str(tmp_path / "rotated-again" / "model.int8.onnx")).graph
    assert sum(node.name == "MatryoshkaRotation" for node in graph.node) == 1
