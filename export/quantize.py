"""Quantised embeddings, as sentence-transformers' ``quantize_embeddings(embeddings, precision, ranges)``
defines them (numpy only at import: the service imports this module). For vectors ``x`` of width ``w``:

* ``binary`` / ``ubinary``: the sign bits packed 8 to a byte (``np.packbits(x > 0, axis=-1)``), minus
  128 as int8 / as uint8: ``ceil(w / 8)`` bytes, no calibration.
* ``int8`` / ``uint8``: per-dimension calibration ranges ``[mins, maxs]`` (shape ``(2, w)``),
  ``starts = mins``, ``steps = (maxs - mins) / 255``; ``uint8 = ((x - starts) / steps).astype(np.uint8)``
  and ``int8 = ((x - starts) / steps - 128).astype(np.int8)``, clipped to the target range first here
  so that a value outside the calibration range saturates instead of wrapping around.
* ``float`` (float32) and ``base64`` (the same values as little-endian bytes, base64: OpenAI's
  ``encoding_format``) are not quantised.

A bundle's ``manifest.json`` holds the ranges under ``quantization.int8_ranges``, one entry per width
(``{"128": [mins, maxs], "64": ...}``), taken over the vectors cut to that width and re-normalised
(``prefix``), exactly as the service cuts them for ``dimensions: n``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ENCODINGS = ("float", "base64", "int8", "uint8", "binary", "ubinary")
CALIBRATED = ("int8", "uint8")  # the encodings that need ranges
CALIBRATE_HINT = "distilembed export calibrate --bundle DIR --corpus FILE --widths"


def prefix(vectors: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` coordinates of each row, re-normalised to unit length (Matryoshka-style);
    at the rows' own width the vectors are returned as they are."""
    if width == vectors.shape[1]:
        return vectors
    if not 1 <= width <= vectors.shape[1]:
        raise ValueError(f"width {width} is not in 1..{vectors.shape[1]}")
    cut = vectors[:, :width]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)


def _shortest(values: np.ndarray) -> list[float]:
    # float32's shortest decimal form: half the digits of float64's, and the same float32 values
    return [float(str(v)) for v in values.astype(np.float32)]


def calibration_ranges(vectors: np.ndarray, widths: Sequence[int]) -> dict[str, list[list[float]]]:
    """Per width: ``[mins, maxs]`` over the rows of ``vectors`` cut to that width and re-normalised,
    the ``ranges`` of sentence-transformers' ``quantize_embeddings`` (keys are the widths as strings)."""
    if len(vectors) == 0:
        raise ValueError("calibration needs at least one vector")
    out: dict[str, list[list[float]]] = {}
    for width in widths:
        cut = prefix(np.asarray(vectors, dtype=np.float32), int(width))
        out[str(int(width))] = [_shortest(cut.min(axis=0)), _shortest(cut.max(axis=0))]
    return out


def int8_widths(manifest: dict[str, Any]) -> list[int]:
    """The widths a bundle manifest has int8/uint8 ranges for, widest first ([] if none)."""
    ranges = (manifest.get("quantization") or {}).get("int8_ranges") or {}
    return sorted((int(w) for w in ranges), reverse=True)


def int8_ranges(manifest: dict[str, Any], width: int) -> np.ndarray | None:
    """The ``(2, width)`` calibration ranges a bundle manifest holds for ``width``, or None."""
    ranges = ((manifest.get("quantization") or {}).get("int8_ranges") or {}).get(str(width))
    return None if ranges is None else np.asarray(ranges, dtype=np.float64)


def quantize(vectors: np.ndarray, encoding: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """``vectors`` (n, w) in ``encoding``: float32 for ``float``/``base64``, int8 or uint8 codes for
    the others (module docstring). ``int8``/``uint8`` need ``ranges`` of shape (2, w)."""
    if encoding in ("float", "base64"):
        return np.asarray(vectors, dtype=np.float32)
    if encoding in ("binary", "ubinary"):
        bits = np.packbits(np.asarray(vectors) > 0, axis=-1)
        return bits if encoding == "ubinary" else (bits.astype(np.int16) - 128).astype(np.int8)
    if encoding not in CALIBRATED:
        raise ValueError(f"unknown encoding {encoding!r} (one of {', '.join(ENCODINGS)})")
    x = np.asarray(vectors, dtype=np.float64)
    if ranges is None:
        raise ValueError(f"{encoding} needs calibration ranges")
    ranges = np.asarray(ranges, dtype=np.float64)
    if ranges.shape != (2, x.shape[-1]):
        raise ValueError(f"ranges have shape {ranges.shape}, the vectors need (2, {x.shape[-1]})")
    starts, steps = ranges[0], (ranges[1] - ranges[0]) / 255
    steps = np.where(steps > 0, steps, 1.0)  # a coordinate constant over the calibration set: no 0/0
    scaled = (x - starts) / steps
    if encoding == "uint8":
        return np.clip(scaled, 0, 255).astype(np.uint8)
    return np.clip(scaled - 128, -128, 127).astype(np.int8)


def pack_base64(vector: np.ndarray) -> str:
    """One vector as OpenAI's ``encoding_format: base64``: little-endian float32 bytes, base64."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def unpack_base64(text: str) -> np.ndarray:
    """The inverse of ``pack_base64``."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def calibrate(
    encode: Callable[[list[str]], np.ndarray], texts: list[str], widths: Sequence[int], source: str
) -> dict[str, Any]:
    """The manifest's ``quantization`` record: ranges per width from ``encode(texts)``."""
    from distilembed.artifacts import now_iso
    from training.data.text import content_hash

    return {
        "int8_ranges": calibration_ranges(encode(texts), widths),
        "calibration": {
            "source": source,
            "texts": len(texts),
            "texts_sha256": content_hash(texts),
            "variant": "int8",
            "at": now_iso(),
        },
    }


def bundle_widths(manifest: dict[str, Any]) -> list[int]:
    """The widths to calibrate: the manifest's ``trained_widths``, else its ``dim``."""
    return [int(w) for w in manifest.get("trained_widths") or [manifest["dim"]]]


def calibrate_bundle(
    bundle: str | Path,
    corpus: str | Path,
    sentences: int = 10_000,
    data_dir: str | Path | None = None,
    widths: Sequence[int] = (),
) -> dict[str, Any]:
    """Write into the bundle's manifest.json, atomically, the ranges of the first ``sentences`` lines
    of ``corpus`` (.txt / .txt.gz, found relative to ``data_dir`` too) through its int8 graph, for its
    trained widths plus ``widths``; returns the ``quantization`` record. The manifest's ``files``
    hashes do not cover manifest.json, so the bundle still verifies."""
    from distilembed.artifacts import atomic_write_json
    from distilembed.errors import UserError
    from distilembed.paths import resolve_data_path
    from export.runtime import MODEL_FILES, TOKENIZER_FILE, Encoder, verify_bundle
    from training.data.text import read_sentences

    bundle = Path(bundle)
    encoder = Encoder(bundle, variant="int8")  # checks the bundle first
    wanted = sorted(set(bundle_widths(encoder.manifest)) | {int(w) for w in widths}, reverse=True)
    if wanted[-1] < 1 or wanted[0] > encoder.dim:
        raise UserError(f"--widths must be within 1..{encoder.dim}, got {list(widths)}")
    texts = read_sentences(resolve_data_path(corpus, data_dir), limit=sentences)
    record = calibrate(encoder.encode, texts, wanted, str(corpus))
    manifest = {**encoder.manifest, "quantization": record}  # the manifest the encoder verified
    atomic_write_json(bundle / "manifest.json", manifest)
    verify_bundle(bundle, [MODEL_FILES["int8"], TOKENIZER_FILE])
    return record
