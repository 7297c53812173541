"""Teacher embeddings for a corpus, through the on-disk target cache."""

from __future__ import annotations

import logging

import numpy as np

from training.data.text import content_hash
from training.target_cache import CacheKey, TargetCache, model_fingerprint
from training.teachers import embedding_dimension, load_sentence_encoder, resolve_model

log = logging.getLogger(__name__)


def teacher_targets(
    teacher: str,
    texts: list[str],
    *,
    max_seq_len: int | None = None,
    batch_size: int = 64,
    device: str = "cpu",
    chunk: int = 2048,
) -> tuple[np.ndarray, dict[str, object]]:
    """(n, d_teacher) float16 teacher embeddings, computed once and cached on disk."""
    resolved = resolve_model(teacher)
    model = load_sentence_encoder(resolved, device=device)
    if max_seq_len:
        model.max_seq_length = max_seq_len
    key = CacheKey(model_fingerprint(resolved), content_hash(texts), int(model.max_seq_length))
    dim = embedding_dimension(model)
    cache = TargetCache(key, n=len(texts), dim=int(dim), chunk=chunk)
    done_before = cache.done_rows()

    def encode(rows: list[str]) -> np.ndarray:
        return model.encode(rows, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

    targets = cache.fill(texts, encode, desc=f"teacher {teacher}")
    info = {
        "teacher": teacher,
        "cache_dir": str(cache.dir),
        "n": len(texts),
        "dim": dim,
        "reused_rows": done_before,
        "encode_seconds": round(cache.seconds, 1),
    }
    log.info("teacher targets: %s", info)
    return targets, info
