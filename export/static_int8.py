"""Static int8 activations: the dynamic graph's per-batch scales replaced by calibrated constants.

``quantize_dynamic`` puts a ``DynamicQuantizeLinear`` before every quantised MatMul: one uint8 scale
per input tensor, taken over the whole batch (padding rows included), so a text's vector depends
on the texts that share its batch (cosine 0.987 at worst to itself alone on STS-B test). Here each
of those nodes becomes a ``QuantizeLinear`` with a constant scale and zero point from the minimum
and maximum the tensor reaches on calibration text (real tokens only), computed exactly as the
dynamic node would over that range: ``scale = (max - min) / 255``, ``zero_point = round(-min /
scale)``, the range widened to include 0. Every MatMulInteger -> Cast -> Mul(scale) chain whose
scales are now constant is fused into onnxruntime's ``MatMulIntegerToFloat`` (its own fusion needs
the scale product as a node, which constant folding removes). Integer products are exact and the
float operators do not see the padding, so a text's vector is bit-identical alone and in any batch,
and the graph is faster than the dynamic one (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

DYNAMIC_OP = "DynamicQuantizeLinear"
Ranges = dict[str, tuple[float, float]]


def quantized_inputs(model: onnx.ModelProto) -> list[str]:
    """The float tensors the graph quantises per batch (the inputs of its dynamic nodes)."""
    return [n.input[0] for n in model.graph.node if n.op_type == DYNAMIC_OP]


def activation_ranges(graph: onnx.ModelProto, batches: Iterable[dict[str, np.ndarray]]) -> Ranges:
    """Min and max of every dynamically quantised tensor of ``graph`` (left as it is) over ``batches``
    (the encoder's feeds), counting only rows of real tokens where a tensor is per token."""
    import onnxruntime as ort

    from export.runtime import DISABLED_OPTIMIZERS

    model = onnx.ModelProto()
    model.CopyFrom(graph)
    names = quantized_inputs(model)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        model.SerializeToString(),
        options,
        ["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )
    low, high = dict.fromkeys(names, np.inf), dict.fromkeys(names, -np.inf)
    for feeds in batches:
        mask = feeds["attention_mask"].astype(bool)
        for name, value in zip(names, session.run(names, feeds), strict=True):
            real = value[mask] if value.shape[:2] == mask.shape else value
            low[name], high[name] = min(low[name], float(real.min())), max(high[name], float(real.max()))
    if not names or not np.isfinite(low[names[0]]):
        raise ValueError("no dynamically quantised tensors, or no calibration batches")
    return {name: (low[name], high[name]) for name in names}


def scale_and_zero_point(low: float, high: float) -> tuple[np.float32, np.uint8]:
    """DynamicQuantizeLinear's uint8 parameters for the range [low, high] widened to include 0."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = np.float32((high - low) / 255.0) if high > low else np.float32(1.0)
    return scale, np.uint8(np.clip(round(-low / float(scale)), 0, 255))


def make_static(model: onnx.ModelProto, ranges: Ranges) -> int:
    """Rewrite ``model`` in place (module docstring); returns how many nodes became static."""
    graph, count = model.graph, 0
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type != DYNAMIC_OP:
            nodes.append(node)
            continue
        quantized, scale_name, zero_name = node.output
        scale, zero = scale_and_zero_point(*ranges[node.input[0]])
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array(scale), scale_name),
                numpy_helper.from_array(np.array(zero), zero_name),
            ]
        )
        inputs = [node.input[0], scale_name, zero_name]
        nodes.append(helper.make_node("QuantizeLinear", inputs, [quantized], name=node.name))
        count += 1
    del graph.node[:]
    graph.node.extend(_fuse_integer_matmuls(nodes, {i.name for i in graph.initializer}))
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return count


def calibrate_static(model: onnx.ModelProto, batches: Iterable[dict[str, np.ndarray]]) -> int:
    """``make_static`` with ranges measured on ``batches``; 0 (``model`` untouched) if it quantises no
    activations dynamically."""
    if not quantized_inputs(model):
        return 0
    return make_static(model, activation_ranges(model, batches))


def static_graph(dynamic: str | Path, out: str | Path, batches: Iterable[dict[str, np.ndarray]]) -> int:
    """Write the static version of the dynamic int8 graph ``dynamic`` to ``out``, calibrated on
    ``batches``; returns the number of nodes made static (0: nothing to do, ``out`` not written)."""
    model = onnx.load(str(dynamic))
    count = calibrate_static(model, batches)
    if count:
        onnx.save(model, str(out))
    return count


def _fuse_integer_matmuls(nodes: list[onnx.NodeProto], constants: set[str]) -> list[onnx.NodeProto]:
    """MatMulInteger(a, b, a_zp, b_zp) -> Cast -> Mul(Mul(a_scale, b_scale)) as one
    MatMulIntegerToFloat(a, b, a_scale, b_scale, a_zp, b_zp) where both scales are constants."""
    made = {out: n for n in nodes for out in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    replaced: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for node in nodes:
        if node.op_type != "MatMulInteger" or len(readers.get(node.output[0], [])) != 1:
            continue
        cast = readers[node.output[0]][0]
        mul = next(iter(readers.get(cast.output[0], [])), None)
        if cast.op_type != "Cast" or mul is None or mul.op_type != "Mul":
            continue
        scales = made.get(next(i for i in mul.input if i != cast.output[0]))
        if scales is None or scales.op_type != "Mul" or not set(scales.input) <= constants:
            continue
        a, b, a_zero, b_zero = [*node.input, "", ""][:4]
        inputs = [a, b, *scales.input, a_zero, b_zero]
        fused = helper.make_node(
            "MatMulIntegerToFloat", inputs, [mul.output[0]], name=node.name, domain="com.microsoft"
        )
        replaced[id(node)] = fused
        dropped |= {id(cast), id(mul)} | ({id(scales)} if len(readers[scales.output[0]]) == 1 else set())
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped]
