"""SmoothQuant for the dynamic int8 graph: activation outliers moved into the weights.

Xiao et al., *SmoothQuant*, ICML 2023, eq. 4. Dynamic int8 gives each MatMul input one scale per
tensor, and a few input channels of BERT-family encoders set it for every other (the student's
LayerNorm outputs reach 28-30 on one channel, 1.8 on the median one). Each input channel j is rescaled::

    Y = X W = (X diag(s)^-1) (diag(s) W),     s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

exact in float32 (max|W_j| over row j of W, the weights channel j meets). diag(s)^-1 is a Mul on the
MatMul's input edge only (a residual branch reading the same tensor keeps it whole), diag(s) W is
folded into the weight initializer; the bundle's float32 graph is left as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SMOOTH_ALPHA = 0.9  # the paper uses 0.5; 0.9 keeps int8 closest to float32 here (decision 55)
# Smooth an input only where its largest channel passes this many times its median channel: the
# outliers SmoothQuant is for. Each smoothed input costs a Mul; the student's ten such inputs keep
# most of the fidelity that all 24 give, at 1-3% of the speed instead of 3-5% (decision 55).
SMOOTH_MIN_SPREAD = 6.0
SMOOTH_TEXTS = 1024  # calibration sentences the channel maxima are taken over (export's default)
SMOOTHED_OPS = ("MatMul", "Attention")  # Attention: onnxruntime's fused QKV, weight (hidden, 3 hidden)


def smoothing_scales(act_max: np.ndarray, weight_max: np.ndarray, alpha: float = SMOOTH_ALPHA) -> np.ndarray:
    """Eq. 4: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), both maxima floored at 1e-5 (a channel
    that never fires gets a finite scale)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    act = np.maximum(np.asarray(act_max, np.float64), 1e-5)
    weight = np.maximum(np.asarray(weight_max, np.float64), 1e-5)
    return (act**alpha / weight ** (1.0 - alpha)).astype(np.float32)


@dataclass(frozen=True)
class Smoothing:
    """What :func:`smooth_model` needs: each activation's channel maxima, and alpha."""

    maxima: dict[str, np.ndarray]
    alpha: float = SMOOTH_ALPHA
    min_spread: float = SMOOTH_MIN_SPREAD


def calibrate_smoothing(
    fp32: str | Path,
    batches: Iterable[dict[str, np.ndarray]],
    alpha: float = SMOOTH_ALPHA,
    min_spread: float = SMOOTH_MIN_SPREAD,
) -> Smoothing:
    """The channel maxima of every smoothable node's input in the float32 graph ``fp32`` (alpha is
    checked where it is used, :func:`smoothing_scales`)."""
    import onnx

    model = onnx.load(str(fp32))
    return Smoothing(activation_maxima(model, smooth_targets(model), batches), alpha, min_spread)


@dataclass(frozen=True)
class SmoothTarget:
    """A node whose first input is an activation and second a 2-D weight initializer (in, out)."""

    node: str
    activation: str
    weight: str


def smooth_targets(model: Any) -> list[SmoothTarget]:
    import onnx

    weights = {t.name: t for t in model.graph.initializer}
    targets = []
    for node in model.graph.node:
        weight = weights.get(node.input[1]) if node.op_type in SMOOTHED_OPS and len(node.input) > 1 else None
        if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT:
            continue
        if node.input[0] not in weights:
            targets.append(SmoothTarget(node.name, node.input[0], node.input[1]))
    return targets


def activation_maxima(
    model: Any, targets: list[SmoothTarget], batches: Iterable[dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """max|X_j| per input channel of every target's activation, over every row of ``batches``
    (the graph's feeds), from the float32 graph with those activations exposed as outputs."""
    import onnx
    import onnxruntime as ort

    names = sorted({t.activation for t in targets})
    if not names:  # nothing to smooth: no pass over the graph
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in (n for n in names if n not in known):
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    maxima: dict[str, np.ndarray] = {}
    for feeds in batches:
        for name, value in zip(names, session.run(names, feeds), strict=True):
            top = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[name] = np.maximum(maxima[name], top) if name in maxima else top
    if not maxima:
        raise ValueError("no calibration batches to smooth on")
    return maxima


def spread(channel_maxima: np.ndarray) -> float:
    """The largest channel maximum over the median one: how far one channel sets the int8 step."""
    return float(channel_maxima.max() / max(float(np.median(channel_maxima)), 1e-12))


def smooth_model(
    model: Any,
    maxima: dict[str, np.ndarray],
    alpha: float = SMOOTH_ALPHA,
    min_spread: float = SMOOTH_MIN_SPREAD,
) -> dict[str, Any]:
    """Rewrite ``model`` in place (eq. 4 at every target whose input's largest channel maximum is at
    least ``min_spread`` times its median one); returns what the manifest records: alpha, the
    threshold, the nodes smoothed, and the largest max-over-median of the inputs before and after."""
    from onnx import helper, numpy_helper

    targets = smooth_targets(model)
    initializers = {t.name: t for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    before: list[float] = []
    after: list[float] = []
    count = 0
    for index, target in enumerate(targets):
        weight = numpy_helper.to_array(initializers[target.weight]).astype(np.float32)
        act = maxima[target.activation]
        if act.shape[0] != weight.shape[0]:
            raise ValueError(f"{target.node}: {act.shape[0]} input channels against weight {weight.shape}")
        before.append(spread(act))
        if before[-1] < min_spread:
            after.append(before[-1])
            continue
        scales = smoothing_scales(act, np.abs(weight).max(axis=1), alpha)
        after.append(spread(act / scales))
        count += 1
        initializers[target.weight].CopyFrom(numpy_helper.from_array(weight * scales[:, None], target.weight))
        inverse = f"{target.node}_smooth_inverse_{index}"
        smoothed = f"{target.activation}_smoothed_{index}"
        model.graph.initializer.append(numpy_helper.from_array((1.0 / scales).astype(np.float32), inverse))
        mul = helper.make_node("Mul", [target.activation, inverse], [smoothed], name=f"{target.node}_smooth")
        node = nodes[target.node]
        node.input[0] = smoothed
        model.graph.node.insert(list(model.graph.node).index(node), mul)
    return {
        "method": "SmoothQuant (Xiao et al., 2023, eq. 4)",
        "alpha": alpha,
        "min_spread": min_spread,
        "nodes": count,
        "of_nodes": len(targets),
        "max_over_median_before": round(max(before, default=0.0), 2),
        "max_over_median_after": round(max(after, default=0.0), 2),
    }
