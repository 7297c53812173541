"""A teacher loaded once, whose embeddings of any corpus go through the on-disk target cache."""

from __future__ import annotations

import logging
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from distilembed.errors import UserError
from training.data.text import content_hash
from training.target_cache import CacheKey, TargetCache, model_fingerprint
from training.teachers import embedding_dimension, load_sentence_encoder, resolve_model

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from export.runtime import Encoder

log = logging.getLogger(__name__)
TEACHER_BACKENDS: tuple[str, ...] = ("auto", "torch", "onnx")


def _on_gpu(device: str) -> bool:
    return not device.startswith("cpu")


class Teacher:
    """Resolves, loads (lazily, once) and fingerprints a teacher; caches its targets per corpus."""

    def __init__(
        self,
        name: str,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        chunk: int = 2048,
        backend: str = "auto",
    ) -> None:
        """``backend``: "torch", "onnx" (CPU only; falls back to torch if parity fails) or "auto"
        (onnx on a CPU, torch on a GPU)."""
        if backend not in TEACHER_BACKENDS:
            raise UserError(f"unknown teacher backend {backend!r} (one of {', '.join(TEACHER_BACKENDS)})")
        if backend == "onnx" and _on_gpu(device):
            raise UserError("the onnx teacher backend runs on the CPU only; use --device cpu or torch")
        self.name, self.device, self.batch_size, self.chunk = name, device, batch_size, chunk
        self.backend = backend
        self.path = resolve_model(name)
        self._onnx: Encoder | None = None
        self._onnx_tried = backend == "torch" or _on_gpu(device)

    @cached_property
    def model(self) -> SentenceTransformer:
        return load_sentence_encoder(self.path, device=self.device)

    @cached_property
    def fingerprint(self) -> str:
        return model_fingerprint(self.path)

    @property
    def dim(self) -> int:
        return embedding_dimension(self.model)

    def use_onnx(self, probe: list[str]) -> bool:
        """Switch encoding to the ONNX copy when the backend allows and parity on ``probe`` holds."""
        if not self._onnx_tried and probe:
            from training.onnx_teacher import onnx_teacher

            self._onnx_tried = True
            self._onnx = onnx_teacher(self.model, self.fingerprint, probe)
        return self._onnx is not None

    def encode(self, texts: list[str]) -> np.ndarray:
        if self._onnx is not None:
            return self._onnx.encode(texts, batch_size=self.batch_size)
        import torch

        # On a GPU, fp16 autocast: targets are stored as float16 anyway.
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.device.startswith("cuda")):
            out = self.model.encode(
                texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
            )
        return np.asarray(out, dtype=np.float32)

    def targets(self, texts: list[str]) -> tuple[np.ndarray, dict[str, object]]:
        """(n, d_teacher) float16 embeddings of ``texts``, computed once and cached on disk."""
        key = CacheKey(self.fingerprint, content_hash(texts), int(self.model.max_seq_length))
        cache = TargetCache(key, n=len(texts), dim=self.dim, chunk=self.chunk)
        reused = cache.done_rows()
        if not cache.complete:
            self.use_onnx(texts)
        targets = cache.fill(texts, self.encode, desc=f"teacher {self.name}")
        info = {
            "teacher": self.name,
            "cache_dir": str(cache.dir),
            "n": len(texts),
            "dim": self.dim,
            "reused_rows": reused,
            "backend": "cached" if reused == len(texts) else ("onnx" if self._onnx is not None else "torch"),
            "encode_seconds": round(cache.seconds, 1),
        }
        log.info("teacher targets: %s", info)
        return targets, info
