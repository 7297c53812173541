"""A teacher loaded once, whose embeddings of any corpus go through the on-disk target cache.

The cache encodes a corpus once into a float16 memmap keyed by (teacher fingerprint, corpus content hash,
max_seq_len). Work is split into chunks in corpus order; a chunk's rows are flushed before its ``done`` byte
is, so a kill -9 at any point loses at most the chunk in flight and a rerun continues.

On a CPU an ONNX Runtime copy encodes (its fused fp32 graph is faster than PyTorch there): it is
exported once per teacher fingerprint into the cache and checked against PyTorch on the first texts
of every corpus it encodes; any doubt falls back to PyTorch.

Several teachers act as one (``--ensemble-teacher NAME[:WEIGHT]``): each member's unit-normalised
embedding is scaled by the square root of its weight and the scaled embeddings are concatenated, so
for weights summing to 1 the target is a unit vector and

    cos(t(a), t(b)) = sum_k w_k cos(t_k(a), t_k(b))

the weighted mean of the members' cosines. HPD's PCA then reduces the concatenation to ``dim``;
the contrastive methods read the concatenated targets as they read one teacher's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from distilembed.artifacts import atomic_directory, atomic_write_json, sha256_file
from distilembed.errors import UserError
from distilembed.paths import cache_dir
from training.data.text import content_hash
from training.teachers import embedding_dimension, load_sentence_encoder, resolve_model

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from export.runtime import Encoder

log = logging.getLogger(__name__)
TEACHER_BACKENDS: tuple[str, ...] = ("auto", "torch", "onnx")
PARITY_MIN_COSINE = 0.9999
PARITY_TEXTS = 64
DEFAULT_MEMBER_WEIGHT = 0.3
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
        meta = {**asdict(key), "n": n, "dim": dim, "chunk": chunk}
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
        return sum(self._chunk_len(i) for i, d in enumerate(self._done) if d)

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
            total=self.n, initial=self.done_rows(), desc=desc, unit="sent", smoothing=0.05, dynamic_ncols=True
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
        on_gpu = not device.startswith("cpu")
        if backend == "onnx" and on_gpu:
            raise UserError("the onnx teacher backend runs on the CPU only; use --device cpu or torch")
        self.name, self.device, self.batch_size, self.chunk = name, device, batch_size, chunk
        self.path = resolve_model(name)
        self._onnx: Encoder | None = None
        self._onnx_tried = backend == "torch" or on_gpu

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


def onnx_teacher(model: SentenceTransformer, fingerprint: str, probe: list[str]) -> Encoder | None:
    """The ONNX encoder of ``model``, or None (with the reason logged) when PyTorch must be used. Only
    teachers whose pipeline ends in Normalize qualify: the runtime encoder always normalises, so an
    unnormalised teacher's targets would change scale."""
    from export.runtime import Encoder

    if any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime")):
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
    probe = probe[:PARITY_TEXTS]  # the smallest cosine between the ONNX and PyTorch embeddings:
    reference = model.encode(probe, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
    cosine = float(np.min(np.sum(encoder.encode(probe) * reference, axis=1)))
    if cosine < PARITY_MIN_COSINE:
        log.warning("onnx teacher: parity min cosine %.6f < %s, using PyTorch", cosine, PARITY_MIN_COSINE)
        return None
    log.info("onnx teacher: %s (parity min cosine %.6f on %d texts)", folder, cosine, len(probe))
    return encoder


def parse_member(spec: str) -> tuple[str, float]:
    """``NAME[:WEIGHT]`` -> (name, weight); the weight defaults to 0.3 and lies in (0, 1)."""
    name, sep, weight = spec.rpartition(":")
    if not sep or not weight.replace(".", "", 1).isdigit():
        name, weight = spec, str(DEFAULT_MEMBER_WEIGHT)
    if not name.strip():
        raise UserError(f"--ensemble-teacher {spec!r}: no teacher name")
    value = float(weight)
    if not 0 < value < 1:
        raise UserError(f"--ensemble-teacher {spec!r}: the weight must lie strictly between 0 and 1")
    return name.strip(), value


def ensemble_weights(specs: Sequence[str]) -> list[tuple[str, float]]:
    """The added members with their weights; what is left of 1 goes to the main teacher."""
    members = [parse_member(spec) for spec in specs]
    if sum(w for _, w in members) >= 1:
        raise UserError("--ensemble-teacher weights must sum to less than 1 (the rest is --teacher's)")
    return members


def combine(parts: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """Concatenate row-normalised ``parts``, each scaled by sqrt(weight), as float16."""
    rows = [np.asarray(part, dtype=np.float32) for part in parts]
    norms = [np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12) for r in rows]
    scaled = [np.sqrt(w) * r / n for r, n, w in zip(rows, norms, weights, strict=True)]
    return np.concatenate(scaled, axis=1).astype(np.float16)


class EnsembleTeacher:
    """The same ``targets`` / ``path`` / ``fingerprint`` as one ``Teacher``, over several."""

    def __init__(self, members: Sequence[tuple[Teacher, float]]) -> None:
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two teachers")
        self.members = list(members)
        self.name = " + ".join(f"{t.name}:{w:g}" for t, w in self.members)

    @property
    def path(self) -> str:
        return " + ".join(str(t.path) for t, _ in self.members)

    @property
    def fingerprint(self) -> str:
        blob = "|".join(f"{t.fingerprint}:{w!r}" for t, w in self.members)
        return hashlib.sha256(blob.encode()).hexdigest()

    def targets(self, texts: list[str]) -> tuple[np.ndarray, dict[str, object]]:
        """Each member's cached targets, combined (computed per call: members are cached, the
        combination is a concatenation)."""
        results = [teacher.targets(texts) for teacher, _ in self.members]
        combined = combine([r[0] for r in results], [w for _, w in self.members])
        info: dict[str, object] = {"teacher": self.name, "n": len(texts), "dim": combined.shape[1]}
        info["members"] = [r[1] for r in results]
        return combined, info


AnyTeacher = Teacher | EnsembleTeacher


def build_teacher(
    name: str, ensemble: Sequence[str], *, device: str, batch_size: int, backend: str
) -> AnyTeacher:
    main = Teacher(name, device=device, batch_size=batch_size, backend=backend)
    added = ensemble_weights(ensemble)
    if not added:
        return main
    members = [(Teacher(n, device=device, batch_size=batch_size, backend=backend), w) for n, w in added]
    return EnsembleTeacher([(main, 1 - sum(w for _, w in added)), *members])
