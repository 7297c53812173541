"""``distilembed export``: checkpoint -> bundle (fp32 fused graph, int8 graph, tokenizer, manifest).

The bundle is built in a temp dir and renamed into place only after the parity gate passes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from distilembed.artifacts import (
    atomic_directory,
    atomic_write_json,
    git_commit,
    now_iso,
    sha256_tree,
    tool_versions,
)
from export.onnx_graph import export_onnx
from export.quantize import calibrate
from export.runtime import BUNDLE_KIND, MODEL_FILES, TOKENIZER_FILE, BundleError, Encoder, cosines
from export.smooth import SMOOTH_ALPHA, SMOOTH_MIN_SPREAD, Smoothing, calibrate_smoothing
from export.static_int8 import static_graph
from export.unfuse import unfuse_skip_layer_norm

if TYPE_CHECKING:
    from export.onnx_graph import TransformerModule

log = logging.getLogger(__name__)
VERSIONED = ("onnx", "onnxruntime", "tokenizers", "torch", "transformers", "sentence-transformers")


@dataclass(frozen=True)
class ParityGate:
    fp32_min_cosine: float = 0.9999
    int8_mean_cosine: float = 0.99
    int8_max_sts_drop: float = 0.5


def optimize_graph(raw: Path, out: Path, config: Any) -> dict[str, int]:
    """onnxruntime's transformer fusions (Attention, BiasGelu, ...) on a portable graph.

    SkipLayerNormalization is fused (the Attention fusion matches on it) and then undone: its CPU
    kernel is the slow one (export/unfuse.py)."""
    from onnxruntime.transformers import optimizer

    # ELECTRA (the SimTDE student) has BERT layers; onnxruntime has no fusions under its own name.
    bert_like = {"bert", "electra", "mpnet", "roberta", "xlm-roberta"}
    kind = "bert" if config.model_type in bert_like else config.model_type
    heads, hidden = config.num_attention_heads, config.hidden_size
    graph = optimizer.optimize_model(str(raw), kind, num_heads=heads, hidden_size=hidden, opt_level=1)
    stats = {k: v for k, v in graph.get_fused_operator_statistics().items() if v}
    unfused = unfuse_skip_layer_norm(graph.model)
    graph.save_model_to_file(str(out))
    if unfused:
        stats.pop("SkipLayerNormalization", None)
        stats["SkipLayerNormalization unfused to LayerNormalization"] = unfused
    return stats


def quantize_graph(
    fp32: Path, out: Path, reduce_range: bool = False, smoothing: Smoothing | None = None
) -> dict[str, Any] | None:
    """Dynamic int8, signed per-channel weights (fastest and most faithful on AVX2 here). With
    ``reduce_range`` the weights use 7 bits: onnxruntime's advice against u8 x s8 saturation on CPUs
    without VNNI, measured further from fp32 on this AVX2 CPU (decision 52). With ``smoothing`` the
    graph is SmoothQuant-ed first (export/smooth.py, decision 55), and its record returned."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    record: dict[str, Any] | None = None
    source = fp32
    if smoothing is not None:
        from export.smooth import smooth_model

        model = onnx.load(str(fp32))
        record = smooth_model(model, smoothing.maxima, smoothing.alpha, smoothing.min_spread)
        source = out.with_name(out.name + ".smooth.onnx")
        onnx.save(model, str(source))
    logging.disable(logging.INFO)  # the quantizer logs one INFO line per fused MatMul on the root logger
    try:
        # Fused ops (SkipLayerNormalization, ...) live in the com.microsoft domain, where onnx shape
        # inference gives up; their outputs are float32.
        quantize_dynamic(
            str(source),
            str(out),
            per_channel=True,
            reduce_range=reduce_range,
            weight_type=QuantType.QInt8,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        logging.disable(logging.NOTSET)
        if source != fp32:
            source.unlink(missing_ok=True)
    return record


def _parity(model: Any, encoders: dict[str, Encoder], texts: list[str]) -> dict[str, float]:
    reference = model.encode(
        texts, convert_to_numpy=True, batch_size=32, normalize_embeddings=True, show_progress_bar=False
    )
    figures: dict[str, float] = {"parity_sentences": len(texts)}
    for variant, encoder in encoders.items():
        cos = cosines(encoder.encode(texts), reference)
        figures[f"{variant}_min_cosine"] = round(float(cos.min()), 6)
        figures[f"{variant}_mean_cosine"] = round(float(cos.mean()), 6)
    return figures


def trained_widths(checkpoint: Path, dim: int) -> list[int]:
    """The widths the student was trained at (``train --matryoshka``; its manifest records them),
    widest first; a checkpoint without a training manifest was trained at ``dim`` only."""
    manifest = checkpoint / "manifest.json"
    if not manifest.is_file():
        return [dim]
    widths = (json.loads(manifest.read_text()).get("matryoshka") or {}).get("widths") or [dim]
    return [int(w) for w in widths]


def write_bundle_manifest(tmp: Path, extra: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "kind": BUNDLE_KIND,
        "created": now_iso(),
        "git_commit": git_commit(),
        "versions": tool_versions(*VERSIONED, "distilembed"),
        **extra,
        "files": sha256_tree(tmp),
    }
    atomic_write_json(tmp / "manifest.json", manifest)
    return manifest


def build_bundle(
    checkpoint: str | Path,
    out: Path,
    *,
    parity_texts: list[str],
    sts_scores: Any = None,
    gate: ParityGate | None = None,
    overwrite: bool = False,
    calibration_texts: list[str] | None = None,
    calibration_source: str = "",
    reduce_range: bool = False,
    smooth_texts: list[str] | None = None,
    smooth_alpha: float = SMOOTH_ALPHA,
    smooth_min_spread: float = SMOOTH_MIN_SPREAD,
    static_texts: list[str] | None = None,
) -> dict[str, Any]:
    """Export, fuse, quantise, check parity and write a bundle; raise BundleError if the gate fails.

    ``sts_scores`` (``encode_fn -> STS-B test Spearman``) bounds the int8 loss against PyTorch;
    ``calibration_texts`` give the manifest int8/uint8 embedding ranges (export/quantize.py);
    ``smooth_texts`` calibrate SmoothQuant before quantising (export/smooth.py, decision 55);
    ``static_texts`` calibrate constant activation scales (export/static_int8.py), else they stay
    dynamic (per batch)."""
    from training.teachers import load_sentence_encoder, resolve_model

    gate = gate or ParityGate()
    source = resolve_model(str(checkpoint))
    model = load_sentence_encoder(source, device="cpu").eval()
    transformer = cast("TransformerModule", model[0])  # export_onnx checks it is one
    with atomic_directory(out, overwrite=overwrite) as tmp:
        raw, fp32 = tmp / "model.raw.onnx", tmp / MODEL_FILES["fp32"]
        info = export_onnx(model, raw)
        fused = optimize_graph(raw, fp32, transformer.auto_model.config)
        raw.unlink()
        transformer.tokenizer.backend_tokenizer.save(str(tmp / TOKENIZER_FILE))
        pad_id = int(transformer.tokenizer.pad_token_id or 0)
        atomic_write_json(
            tmp / "manifest.json",
            {"kind": BUNDLE_KIND, "dim": info.dim, "max_seq_len": info.max_seq_len, "pad_token_id": pad_id},
        )
        smoothing: Smoothing | None = None
        if smooth_texts:
            batches = Encoder(tmp, variant="fp32", verify=False).feed_batches(smooth_texts)
            smoothing = calibrate_smoothing(fp32, batches, smooth_alpha, smooth_min_spread)
        smoothed = quantize_graph(fp32, tmp / MODEL_FILES["int8"], reduce_range, smoothing)
        activations: dict[str, Any] = {"scheme": "dynamic"}
        if static_texts:
            int8 = tmp / MODEL_FILES["int8"]
            batches = Encoder(tmp, variant="fp32", verify=False).feed_batches(static_texts)
            activations = {
                "scheme": "static",
                "nodes": static_graph(int8, int8, batches),
                "texts": len(static_texts),
            }
        encoders = {variant: Encoder(tmp, variant=variant, verify=False) for variant in ("fp32", "int8")}
        figures = _parity(model, encoders, parity_texts)
        if sts_scores is not None:
            figures["stsb_test_pytorch"] = round(
                sts_scores(lambda t: model.encode(t, batch_size=64, show_progress_bar=False)), 2
            )
            for variant, encoder in encoders.items():
                figures[f"stsb_test_{variant}"] = round(sts_scores(encoder.encode), 2)
        if failures := _gate_failures(figures, gate):
            raise BundleError(f"parity gate failed: {'; '.join(failures)} (figures: {figures})")
        widths = trained_widths(Path(source), info.dim)
        quantization = {}
        if calibration_texts:
            record = calibrate(encoders["int8"].encode, calibration_texts, widths, calibration_source)
            quantization = {"quantization": record}
        manifest = write_bundle_manifest(
            tmp,
            {
                **asdict(info),
                "input_names": list(info.input_names),
                "pad_token_id": pad_id,
                "trained_widths": widths,
                "source": {"checkpoint": str(source), "files": sha256_tree(Path(source))},
                "fused_operators": fused,
                "int8_weights": {
                    "per_channel": True,
                    "bits": 7 if reduce_range else 8,
                    "smoothing": None if smoothed is None else {**smoothed, "texts": len(smooth_texts or [])},
                },
                "int8_activations": activations,
                "parity": figures,
                "gate": asdict(gate),
                **quantization,
            },
        )
    log.info("bundle written to %s: %s", out, figures)
    return manifest


def _gate_failures(figures: dict[str, float], gate: ParityGate) -> list[str]:
    failures = []
    if figures["fp32_min_cosine"] < gate.fp32_min_cosine:
        failures.append(f"fp32 min cosine {figures['fp32_min_cosine']} < {gate.fp32_min_cosine}")
    if figures["int8_mean_cosine"] < gate.int8_mean_cosine:
        failures.append(f"int8 mean cosine {figures['int8_mean_cosine']} < {gate.int8_mean_cosine}")
    if "stsb_test_int8" in figures:
        drop = figures["stsb_test_pytorch"] - figures["stsb_test_int8"]
        if drop > gate.int8_max_sts_drop:
            failures.append(f"int8 STS-B drop {drop:.2f} > {gate.int8_max_sts_drop}")
    return failures
