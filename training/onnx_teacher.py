"""An ONNX Runtime copy of a teacher, for encoding targets on a CPU.

The fused fp32 graph encodes faster than PyTorch on a CPU. It is exported once per
teacher fingerprint into the cache and checked against PyTorch on the first texts of every corpus
it encodes; any doubt falls back to PyTorch.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from distilembed.artifacts import atomic_directory, atomic_write_json
from distilembed.paths import cache_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from export.runtime import Encoder

log = logging.getLogger(__name__)
PARITY_MIN_COSINE = 0.9999
PARITY_TEXTS = 64


def onnx_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def _export(model: SentenceTransformer, out: Path) -> Path:
    """Write a minimal fp32 bundle (fused graph, tokenizer, manifest) of ``model`` once."""
    from export.bundle import optimize_graph
    from export.onnx_graph import export_onnx
    from export.runtime import MODEL_FILES, TOKENIZER_FILE

    if (out / "manifest.json").is_file():
        return out
    transformer = model[0]
    with atomic_directory(out, overwrite=True) as tmp:
        raw = tmp / "model.raw.onnx"
        info = export_onnx(model, raw)
        optimize_graph(raw, tmp / MODEL_FILES["fp32"], transformer.auto_model.config)
        raw.unlink()
        transformer.tokenizer.backend_tokenizer.save(str(tmp / TOKENIZER_FILE))
        manifest = {
            "kind": "distilembed-teacher-onnx",
            "dim": info.dim,
            "max_seq_len": info.max_seq_len,
            "pad_token_id": int(transformer.tokenizer.pad_token_id or 0),
            "normalized": info.normalized,
        }
        atomic_write_json(tmp / "manifest.json", manifest)
    return out


def parity_cosine(model: SentenceTransformer, encoder: Encoder, texts: list[str]) -> float:
    """Smallest cosine between the ONNX and PyTorch embeddings of ``texts``."""
    reference = model.encode(texts, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
    ours = encoder.encode(texts)
    return float(np.min(np.sum(ours * reference, axis=1)))


def onnx_teacher(model: SentenceTransformer, fingerprint: str, probe: list[str]) -> Encoder | None:
    """The ONNX encoder of ``model``, or None (with the reason logged) when PyTorch must be used.

    Only teachers whose pipeline ends in Normalize qualify: the runtime encoder always
    normalises, so an unnormalised teacher's targets would change scale.
    """
    from distilembed.errors import UserError
    from export.runtime import Encoder

    if not onnx_available():
        log.info("onnx teacher: onnx / onnxruntime not installed, using PyTorch")
        return None
    if "Normalize" not in [type(m).__name__ for m in model]:
        log.info("onnx teacher: the teacher does not normalise its output, using PyTorch")
        return None
    try:
        folder = _export(model, cache_dir() / "teachers-onnx" / fingerprint[:24])
    except UserError as exc:
        log.warning("onnx teacher: cannot export (%s), using PyTorch", exc)
        return None
    encoder = Encoder(folder, variant="fp32", verify=False)
    probe = probe[:PARITY_TEXTS]
    cosine = parity_cosine(model, encoder, probe)
    if cosine < PARITY_MIN_COSINE:
        log.warning("onnx teacher: parity min cosine %.6f < %s, using PyTorch", cosine, PARITY_MIN_COSINE)
        return None
    log.info("onnx teacher: %s (parity min cosine %.6f on %d texts)", folder, cosine, len(probe))
    return encoder
