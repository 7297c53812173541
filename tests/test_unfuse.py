"""SkipLayerNormalization -> Add + LayerNormalization: same outputs, no fused node left."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from export.runtime import DISABLED_OPTIMIZERS, Encoder
from export.unfuse import unfuse_skip_layer_norm, upgrade_bundle
from tests.tiny_models import tiny_sentences

H = 8


def skip_layer_norm_graph(with_bias: bool, with_sum: bool) -> onnx.ModelProto:
    """x, s -> SkipLayerNormalization -> Mul(y, 2); optionally bias, and the sum output read by a Neg."""
    rng = np.random.default_rng(0)
    inits = [
        helper.make_tensor("gamma", TensorProto.FLOAT, [H], rng.uniform(0.5, 1.5, H).astype(np.float32)),
        helper.make_tensor("beta", TensorProto.FLOAT, [H], rng.normal(size=H).astype(np.float32)),
        helper.make_tensor("bias", TensorProto.FLOAT, [H], rng.normal(size=H).astype(np.float32)),
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
    ]
    inputs = ["x", "s", "gamma", "beta"] + (["bias"] if with_bias else [])
    outputs = ["y"] + (["", "", "sum"] if with_sum else [])
    nodes = [
        helper.make_node("SkipLayerNormalization", inputs, outputs, domain="com.microsoft", epsilon=1e-5),
        helper.make_node("Mul", ["y", "two"], ["out"]),
    ]
    graph_outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "L", H])]
    if with_sum:
        nodes.append(helper.make_node("Neg", ["sum"], ["neg_sum"]))
        graph_outputs.append(helper.make_tensor_value_info("neg_sum", TensorProto.FLOAT, ["B", "L", H]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "L", H]) for n in ("x", "s")],
        graph_outputs,
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(),
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )
    return session.run(None, feed)


@pytest.mark.parametrize(("with_bias", "with_sum"), [(False, False), (True, False), (True, True)])
def test_unfused_graph_computes_the_same(with_bias: bool, with_sum: bool) -> None:
    rng = np.random.default_rng(1)
    feed = {
        "x": rng.normal(size=(2, 3, H)).astype(np.float32),
        "s": rng.normal(size=(2, 3, H)).astype(np.float32),
    }
    fused = skip_layer_norm_graph(with_bias, with_sum)
    expected = run(fused, feed)
    unfused = skip_layer_norm_graph(with_bias, with_sum)
    assert unfuse_skip_layer_norm(unfused) == 1
    assert [n.op_type for n in unfused.graph.node].count("LayerNormalization") == 1
    assert all(n.op_type != "SkipLayerNormalization" for n in unfused.graph.node)
    onnx.checker.check_model(unfused)
    for got, want in zip(run(unfused, feed), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_hand_computed_layer_norm_of_the_sum() -> None:
    """One row: (x + s + bias) normalised, times gamma plus beta, then doubled by the graph's Mul."""
    model = skip_layer_norm_graph(with_bias=True, with_sum=False)
    unfuse_skip_layer_norm(model)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.arange(H, dtype=np.float32).reshape(1, 1, H)
    s = np.ones((1, 1, H), dtype=np.float32)
    total = x + s + weights["bias"]
    normed = (total - total.mean()) / np.sqrt(total.var() + 1e-5)
    want = 2 * (normed * weights["gamma"] + weights["beta"])
    np.testing.assert_allclose(run(model, {"x": x, "s": s})[0], want, atol=1e-5)


def test_exported_bundle_has_no_skip_layer_norm(tiny_bundle: Path) -> None:
    for name in ("model.onnx", "model.int8.onnx"):
        ops = {n.op_type for n in onnx.load(str(tiny_bundle / name)).graph.node}
        assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops


def test_upgrade_rewrites_an_old_bundle_and_keeps_it_loadable(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle exported as before the rewrite (fused nodes kept) comes out unfused, hashes updated."""
    import export.bundle
    from export.bundle import ParityGate, build_bundle
    from training.student import build_student

    checkpoint = tmp_path / "student"
    build_student(str(tiny_bert), dim=8, max_seq_len=16).save(str(checkpoint))
    with monkeypatch.context() as patch:
        patch.setattr(export.bundle, "unfuse_skip_layer_norm", lambda model: 0)
        old = tmp_path / "old"
        build_bundle(checkpoint, old, parity_texts=tiny_sentences(20), gate=ParityGate(int8_mean_cosine=0.0))
    assert "SkipLayerNormalization" in {n.op_type for n in onnx.load(str(old / "model.onnx")).graph.node}
    texts = tiny_sentences(8)
    before = Encoder(old, variant="fp32").encode(texts)

    record = upgrade_bundle(old, texts)

    assert record["fp32_nodes"] > 0 and record["int8_nodes"] == record["fp32_nodes"]
    assert record["fp32_min_cosine_vs_previous"] > 0.9999
    for name in ("model.onnx", "model.int8.onnx"):
        assert "SkipLayerNormalization" not in {n.op_type for n in onnx.load(str(old / name)).graph.node}
    upgraded = json.loads((old / "manifest.json").read_text())
    assert upgraded["graph_rewrites"][-1]["fp32_nodes"] == record["fp32_nodes"]
    after = Encoder(old, variant="fp32").encode(texts)  # verify=True: the new hashes match
    np.testing.assert_allclose(after, before, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "student"], "no temp dirs left behind"


def test_upgrade_bundle_cli(tiny_bundle: Path, tiny_data: Path, tmp_path: Path) -> None:
    """A current bundle upgrades as a no-op (0 nodes, still loadable); a non-bundle is a one-line error."""
    import os
    import shutil
    import subprocess
    import sys

    env = {**os.environ, "DISTILEMBED_DATA_DIR": str(tiny_data)}
    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, copy)
    cli = [sys.executable, "-m", "distilembed.cli", "upgrade-bundle"]
    done = subprocess.run(
        [*cli, str(copy)], capture_output=True, text=True, env=env, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((copy / "manifest.json").read_text())["graph_rewrites"][-1]
    assert record["fp32_nodes"] == 0 and record["int8_nodes"] == 0
    assert Encoder(copy).encode(tiny_sentences(2)).shape == (2, 8)

    bad = subprocess.run(
        [*cli, str(tmp_path)], capture_output=True, text=True, env=env, check=False, timeout=300
    )
    assert bad.returncode == 2 and "not a bundle" in bad.stderr and "Traceback" not in bad.stderr

    index = tmp_path / "index"  # another artifact: refused, and left as it was
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps({"kind": "index"}))
    other = subprocess.run(
        [*cli, str(index)], capture_output=True, text=True, env=env, check=False, timeout=300
    )
    assert other.returncode == 2 and "not a bundle: its manifest says kind 'index'" in other.stderr
    assert json.loads((index / "manifest.json").read_text()) == {"kind": "index"}
