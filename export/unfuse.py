"""Undo onnxruntime's SkipLayerNormalization fusion: Add (+ bias Add) + LayerNormalization instead.

On AVX2 with onnxruntime 1.32 the contrib kernel costs about 4.6 ns per element, six times the
standard LayerNormalization plus the Adds (decision 16): a quarter of a MiniLM-L6 int8 forward pass.
The rewrite is the same arithmetic in opset-17 operators; the runtime encoder disables
``SkipLayerNormFusion`` so that onnxruntime does not fuse it back.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from distilembed.artifacts import atomic_directory, atomic_write_json, git_commit, now_iso, sha256_file

FUSED_OP = "SkipLayerNormalization"


def _epsilon(node: onnx.NodeProto) -> float:
    return next((float(helper.get_attribute_value(a)) for a in node.attribute if a.name == "epsilon"), 1e-12)


def unfuse_skip_layer_norm(model: onnx.ModelProto) -> int:
    """Replace every com.microsoft SkipLayerNormalization node in place; returns how many.

    Inputs (input, skip, gamma, beta?, bias?) and outputs (output, mean?, inv_std?, sum?) follow the
    contrib operator's schema: output = LayerNorm(input + skip + bias) * gamma + beta, and the
    optional fourth output is the pre-normalisation sum, which later fused nodes may read.
    """
    graph = model.graph
    new_nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        if node.op_type != FUSED_OP or node.domain != "com.microsoft":
            new_nodes.append(node)
            continue
        if any(out for out in list(node.output)[1:3]):
            raise ValueError(f"{node.name}: mean / inv_std outputs are used; cannot unfuse")
        count += 1
        x, skip, gamma, beta, bias = (list(node.input) + [""] * 5)[:5]
        name = node.name or f"skip_layer_norm_{count}"
        outputs = list(node.output) + [""] * (4 - len(node.output))
        summed = f"{name}/skip_sum"
        new_nodes.append(helper.make_node("Add", [x, skip], [summed], name=f"{name}/add_skip"))
        if bias:
            with_bias = f"{name}/bias_sum"
            new_nodes.append(helper.make_node("Add", [summed, bias], [with_bias], name=f"{name}/add_bias"))
            summed = with_bias
        if outputs[3]:
            new_nodes.append(helper.make_node("Identity", [summed], [outputs[3]], name=f"{name}/sum_out"))
        norm_inputs = [summed, gamma] + ([beta] if beta else [])
        layer_norm: dict[str, Any] = {"name": f"{name}/layer_norm", "axis": -1, "epsilon": _epsilon(node)}
        new_nodes.append(helper.make_node("LayerNormalization", norm_inputs, [outputs[0]], **layer_norm))
    if count:
        del graph.node[:]
        graph.node.extend(new_nodes)
        _require_opset(model, 17)
    return count


def _require_opset(model: onnx.ModelProto, version: int) -> None:
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        model.opset_import.append(helper.make_opsetid("", version))
    elif opset.version < version:
        raise ValueError(f"LayerNormalization needs opset >= {version}, the graph has {opset.version}")


def upgrade_bundle(
    bundle: Path,
    texts: list[str],
    sts_scores: Any = None,
    max_sts_drop: float = 0.5,
    static_texts: list[str] | None = None,
) -> dict[str, Any]:
    """Apply ``unfuse_skip_layer_norm`` to every graph of a bundle exported before ``distilembed
    export`` did, and with ``static_texts`` make a dynamic int8 graph's activation scales static
    (export/static_int8.py, calibrated on them), atomically. The manifest records the new graphs'
    cosines to the old ones on ``texts`` and their STS-B test figures (``sts_scores``: encode_fn ->
    Spearman); an STS-B drop of more than ``max_sts_drop`` aborts with nothing changed."""
    from export.runtime import MODEL_FILES, BundleError, Encoder, cosines, verify_bundle
    from export.static_int8 import calibrate_static

    present = [f for f in MODEL_FILES.values() if (bundle / f).is_file()]
    manifest = verify_bundle(bundle, present)  # and that it is a bundle at all
    if not present:
        raise BundleError(f"{bundle} holds no model graph ({', '.join(MODEL_FILES.values())})")
    rewrite = "SkipLayerNormalization -> Add + LayerNormalization"
    record: dict[str, Any] = {
        "rewrite": rewrite + ("; static int8 activations" if static_texts else ""),
        "at": now_iso(),
        "git_commit": git_commit(),
    }
    with atomic_directory(bundle, overwrite=True) as tmp:
        for item in bundle.iterdir():
            # The graphs are written below; the old manifest is copied: Encoder(tmp) reads it.
            if item.is_file() and item.name not in present:
                shutil.copy2(item, tmp / item.name)
        for variant, name in MODEL_FILES.items():
            if name not in present:
                continue
            model = onnx.load(str(bundle / name))  # weights stored inside the .onnx file
            count = unfuse_skip_layer_norm(model)
            static = static_texts if variant == "int8" else None
            old = Encoder(bundle, variant=variant, verify=False) if count or static else None
            if static and old is not None:
                # calibrated on the unfused graph, through the bundle's own tokenizer and padding
                record["int8_static_nodes"] = calibrate_static(model, old.feed_batches(static))
                manifest["int8_activations"] = {"scheme": "static", "texts": len(static)}
                count += record["int8_static_nodes"]
            record[f"{variant}_nodes"] = count
            onnx.save(model, str(tmp / name))
            if not count or old is None:
                continue
            new = Encoder(tmp, variant=variant, verify=False)
            cos = cosines(old.encode(texts), new.encode(texts))
            record[f"{variant}_min_cosine_vs_previous"] = round(float(cos.min()), 6)
            record[f"{variant}_mean_cosine_vs_previous"] = round(float(cos.mean()), 6)
            if sts_scores is not None:
                before, after = float(sts_scores(old.encode)), float(sts_scores(new.encode))
                record[f"stsb_test_{variant}_before"] = round(before, 2)
                record[f"stsb_test_{variant}"] = round(after, 2)
                if before - after > max_sts_drop:
                    raise BundleError(f"{name}: STS-B test {before:.2f} -> {after:.2f} after the rewrite")
            manifest["files"][name] = sha256_file(tmp / name)
        manifest.setdefault("graph_rewrites", []).append(record)
        atomic_write_json(tmp / "manifest.json", manifest)
    return record
