"""Teacher-target cache: encode a corpus once into an on-disk float16 memmap.

Keyed by (teacher fingerprint, corpus content hash, max_seq_len). Work is split into
chunks in corpus order; a chunk's rows are flushed before its ``done`` byte is, so a
kill -9 at any point loses at most the chunk in flight and a rerun continues.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from distilembed.artifacts import atomic_write_json, sha256_file
from distilembed.paths import cache_dir

EncodeFn = Callable[[list[str]], np.ndarray]


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over a model folder's config and weight files (names and bytes)."""
    root = Path(model_dir)
    if not root.is_dir():  # a hub id: the name is all we know
        return hashlib.sha256(str(model_dir).encode()).hexdigest()
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".json", ".safetensors", ".bin", ".txt", ".model"}:
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(sha256_file(path).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class CacheKey:
    teacher: str
    corpus_sha256: str
    max_seq_len: int

    def digest(self) -> str:
        blob = f"{self.teacher}|{self.corpus_sha256}|{self.max_seq_len}".encode()
        return hashlib.sha256(blob).hexdigest()[:24]


class TargetCache:
    """A (n, dim) float16 memmap of teacher embeddings plus a per-chunk done map."""

    def __init__(self, key: CacheKey, n: int, dim: int, chunk: int = 2048, root: Path | None = None) -> None:
        self.key, self.n, self.dim, self.chunk = key, n, dim, chunk
        self.dir = (root or cache_dir() / "targets") / key.digest()
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {
            "teacher": key.teacher,
            "corpus_sha256": key.corpus_sha256,
            "max_seq_len": key.max_seq_len,
            "n": n,
            "dim": dim,
            "chunk": chunk,
        }
        meta_path = self.dir / "meta.json"
        if meta_path.exists():
            old = json.loads(meta_path.read_text())
            if old != meta:
                raise RuntimeError(f"target cache {self.dir} was made with other settings: {old}")
        else:
            atomic_write_json(meta_path, meta)
        self.n_chunks = (n + chunk - 1) // chunk
        self._emb_path = self.dir / "embeddings.f16"
        self._done_path = self.dir / "done.u8"
        mode = "r+" if self._emb_path.exists() else "w+"
        self.embeddings = np.memmap(self._emb_path, dtype=np.float16, mode=mode, shape=(n, dim))
        if not self._done_path.exists():
            self._done_path.write_bytes(bytes(self.n_chunks))
        self._done = bytearray(self._done_path.read_bytes())

    @property
    def complete(self) -> bool:
        return all(self._done)

    def done_rows(self) -> int:
        return sum(min(self.chunk, self.n - i * self.chunk) for i, d in enumerate(self._done) if d)

    def _mark_done(self, index: int) -> None:
        self.embeddings.flush()
        self._done[index] = 1
        with open(self._done_path, "r+b") as handle:
            handle.seek(index)
            handle.write(b"\x01")
            handle.flush()

    def fill(self, texts: list[str], encode: EncodeFn, desc: str = "teacher targets") -> np.ndarray:
        """Encode every chunk not yet done; return the full (n, dim) float16 array."""
        if len(texts) != self.n:
            raise ValueError(f"cache is for {self.n} texts, got {len(texts)}")
        todo = [i for i, d in enumerate(self._done) if not d]
        bar = tqdm(
            total=self.n,
            initial=self.n - sum(self._chunk_len(i) for i in todo),
            desc=desc,
            unit="sent",
            smoothing=0.05,
            dynamic_ncols=True,
        )
        start = time.perf_counter()
        for index in todo:
            lo = index * self.chunk
            rows = texts[lo : lo + self._chunk_len(index)]
            vectors = np.asarray(encode(rows), dtype=np.float32)
            if vectors.shape != (len(rows), self.dim):
                raise RuntimeError(f"encoder returned {vectors.shape}, expected {(len(rows), self.dim)}")
            self.embeddings[lo : lo + len(rows)] = vectors.astype(np.float16)
            self._mark_done(index)
            bar.update(len(rows))
        bar.close()
        self.seconds = time.perf_counter() - start
        return np.asarray(self.embeddings)

    def _chunk_len(self, index: int) -> int:
        return min(self.chunk, self.n - index * self.chunk)
