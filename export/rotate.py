"""A bundle made Matryoshka after export: ``distilembed rotate BUNDLE``.

A checkpoint takes the rotation of :mod:`training.rotation` in its last Dense layer before export; a
bundle whose checkpoint is gone, or whose int8 graph should stay as it is, takes it at the graph's end:
fitted on the bundle's own int8 embeddings, one MatMul turns the normalised embedding e into ``e R``.
R is orthogonal, so every full-width cosine stays the bundle's own (to float32 rounding) and only what
each prefix holds changes; a second rotation composes (``R_1 R_2``, still one MatMul). The manifest
records the trained widths and the fit, the int8 ranges are recalibrated on the source's calibration
text, and STS-B dev through both bundles must give the old embeddings times R before anything is
renamed into place.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from distilembed.artifacts import atomic_directory, atomic_write_json, read_manifest
from export.bundle import write_bundle_manifest
from export.quantize import calibrate_bundle, int8_widths
from export.runtime import MODEL_FILES, TOKENIZER_FILE, BundleError, Encoder, Variant
from training.rotation import RotationRequest, fit_output_rotation, rotation_record

ROTATION = "matryoshka_rotation"
PROVENANCE = "provenance.json"
CHECK_SENTENCES = 500
CHECK_TOLERANCE = 1e-4
NOT_CARRIED = frozenset({"created", "git_commit", "versions", "files", "quantization"})


def append_rotation(model: Any, rotation: np.ndarray) -> Any:
    """``model`` (an onnx ModelProto with one output) with its output multiplied by ``rotation``; a
    graph that already ends in a rotation gets the product instead of a second MatMul."""
    from onnx import helper, numpy_helper

    graph = model.graph
    if len(graph.output) != 1:
        raise BundleError(f"rotate wants a graph with one output, this one has {len(graph.output)}")
    existing = [init for init in graph.initializer if init.name == ROTATION]
    if existing:
        product = numpy_helper.to_array(existing[0]).astype(np.float64) @ rotation
        existing[0].CopyFrom(numpy_helper.from_array(product.astype(np.float32), ROTATION))
        return model
    name = graph.output[0].name
    inner = f"{name}_unrotated"
    for node in graph.node:
        node.output[:] = [inner if item == name else item for item in node.output]
        node.input[:] = [inner if item == name else item for item in node.input]
    graph.initializer.append(numpy_helper.from_array(rotation.astype(np.float32), ROTATION))
    graph.node.append(helper.make_node("MatMul", [inner, ROTATION], [name], name="MatryoshkaRotation"))
    return model


def _check(sources: dict[Variant, Encoder], rotated: Path, rotation: np.ndarray, texts: list[str]) -> float:
    """Largest deviation, over the graphs, of the rotated bundle's embeddings from the source's times R."""
    worst = 0.0
    for variant, source in sources.items():
        got = Encoder(rotated, variant=variant).encode(texts)
        worst = max(worst, float(np.abs(got - source.encode(texts) @ rotation).max()))
    if worst > CHECK_TOLERANCE:
        raise BundleError(f"the rotated graph's embeddings differ from the source's times R by {worst:.2e}")
    return worst


def rotate_bundle(
    source: Path, out: Path, request: RotationRequest, data_dir: str | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Write ``out``: ``source`` with a rotation fitted on its int8 embeddings appended to each graph."""
    import onnx

    encoder = Encoder(source, variant="int8")  # verifies the source's hashes
    fit, widths = fit_output_rotation(encoder.encode, encoder.dim, request)
    variants: list[Variant] = [v for v, name in MODEL_FILES.items() if (source / name).is_file()]
    present = [MODEL_FILES[v] for v in variants]
    original = encoder.manifest
    with atomic_directory(out, overwrite=overwrite) as tmp:
        for name in present:
            onnx.save(append_rotation(onnx.load(str(source / name)), fit.rotation), str(tmp / name))
        shutil.copy2(source / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
        record = {**rotation_record(source, fit, request), "model_files": present}
        carried = {k: v for k, v in original.items() if k not in NOT_CARRIED}
        manifest = write_bundle_manifest(
            tmp, carried | {"trained_widths": list(widths.widths), "rotate": record}
        )
        dev = request.dev_pairs
        texts = sorted({p.sentence1 for p in dev} | {p.sentence2 for p in dev})[:CHECK_SENTENCES]
        sources = {v: encoder if v == "int8" else Encoder(source, variant=v) for v in variants}
        record = {**record, "check_max_abs_diff": _check(sources, tmp, fit.rotation, texts)}
        # The files' hashes do not cover manifest.json: the check's result joins it after the check.
        atomic_write_json(tmp / "manifest.json", {**manifest, "rotate": record})
        # Every prefix's value ranges move: recalibrate on the source's own text.
        if calibration := (original.get("quantization") or {}).get("calibration"):
            calibrate_bundle(
                tmp, calibration["source"], calibration["texts"], data_dir, int8_widths(original)
            )
        if (source / PROVENANCE).is_file():
            provenance = json.loads((source / PROVENANCE).read_text(encoding="utf-8"))
            provenance["rotate"] = {k: record[k] for k in ("source", "best_step", "dev_by_width")}
            provenance.setdefault("made_by", []).append(f"distilembed rotate {source} --out {out}")
            atomic_write_json(tmp / PROVENANCE, provenance)
    return read_manifest(out)
