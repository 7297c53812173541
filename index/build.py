"""``distilembed index build``: corpus -> embeddings (resumable shards) -> Faiss index + document store.

Encoded shards are checkpointed in ``OUT.partial/shards``; the finished index is assembled in a temp
dir and renamed to OUT, so OUT is never half-written and a killed build resumes without re-encoding.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from distilembed.artifacts import (
    atomic_directory,
    atomic_write_json,
    git_commit,
    now_iso,
    sha256_file,
    tool_versions,
)
from distilembed.errors import UserError
from export.runtime import Encoder, verify_bundle
from index.corpus import CorpusSpec, CorpusStats, iter_documents
from index.live import INDEX_FILE, STORE_FILE, writer_lock_held
from index.store import Document, DocumentStore
from index.vectors import IndexPlan, add, build_index, check_storage, plan_index, save_index

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildConfig:
    bundle: str
    out: str
    variant: str = "int8"
    nlist: int = 1024
    nprobe: int = 5
    storage: str = "float32"
    flat_below: int = 10_000
    shard_size: int = 8192
    batch_size: int = 64
    threads: int | None = None


def read_corpus(spec: CorpusSpec) -> tuple[list[Document], CorpusStats, int]:
    stats, docs, duplicates = CorpusStats(), {}, 0
    for doc in iter_documents(spec, stats):
        duplicates += doc.id in docs
        docs[doc.id] = doc  # last one wins, first position kept
    if not docs:
        raise UserError(f"corpus has no usable rows: {spec.path} ({stats.skipped} skipped)")
    if duplicates:
        log.warning("%s: %d duplicate ids, the last occurrence of each kept", spec.path, duplicates)
    return list(docs.values()), stats, duplicates


def _encode_shards(encoder: Encoder, docs: list[Document], work: Path, cfg: BuildConfig) -> tuple[float, int]:
    """Encode every shard not on disk yet; return the seconds spent encoding in this call and the
    number of documents it encoded."""
    shards = work / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    n_shards = (len(docs) + cfg.shard_size - 1) // cfg.shard_size
    done = {i for i in range(n_shards) if (shards / f"{i:06d}.npy").exists()}
    reused = sum(len(docs[i * cfg.shard_size : (i + 1) * cfg.shard_size]) for i in done)
    if done:
        log.info("resuming: %d of %d documents already encoded (%d shards)", reused, len(docs), len(done))
    bar = tqdm(
        total=len(docs),
        initial=reused,
        desc="encode",
        unit="doc",
        dynamic_ncols=True,
    )
    seconds = 0.0
    for i in sorted(set(range(n_shards)) - done):
        texts = [d.text for d in docs[i * cfg.shard_size : (i + 1) * cfg.shard_size]]
        start = time.perf_counter()
        vectors = encoder.encode(texts, batch_size=cfg.batch_size)
        seconds += time.perf_counter() - start
        tmp = shards / f".{i:06d}.tmp.npy"
        np.save(tmp, vectors)
        tmp.replace(shards / f"{i:06d}.npy")
        bar.update(len(texts))
    bar.close()
    return seconds, len(docs) - reused


def _check_resume(work: Path, identity: dict[str, Any]) -> None:
    saved = work / "build.json"
    identity = json.loads(json.dumps(identity))  # compare as stored (tuples become lists)
    if saved.exists() and json.loads(saved.read_text()) != identity:
        raise UserError(f"{work} holds a build of other inputs; delete it to start over")
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(saved, identity)


def _index_manifest(
    cfg: BuildConfig,
    bundle_sha: str,
    *,
    dim: int,
    plan: IndexPlan,
    ntotal: int,
    corpus: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "kind": "index",
        "created": now_iso(),
        "git_commit": git_commit(),
        "versions": tool_versions("faiss-cpu", "onnxruntime", "distilembed"),
        "bundle": {
            "path": str(Path(cfg.bundle).resolve()),
            "manifest_sha256": bundle_sha,
            "variant": cfg.variant,
        },
        "corpus": corpus,
        "dim": dim,
        "index_type": plan.index_type,
        "nlist": plan.nlist,
        "nprobe": cfg.nprobe,
        "plan": plan.reason,
        "ntotal": ntotal,
        "metric": "inner_product",
    }


@contextmanager
def _claim_output(out: Path, overwrite: bool, what: str) -> Iterator[None]:
    """Refuse an existing OUT without ``overwrite``. With it, hold OUT's writer lock until OUT has
    been replaced: a service still writing to OUT would later checkpoint its old vectors into the
    new directory, so while one runs this is a one-line error instead."""
    if out.exists() and not overwrite:
        raise UserError(f"output exists: {out} (pass --overwrite to {what})")
    with writer_lock_held(out) if out.is_dir() else nullcontext():
        yield


def create_empty(cfg: BuildConfig, overwrite: bool = False) -> dict[str, Any]:
    """An empty live index for ``cfg.bundle`` (exact search; documents arrive by upsert). IVF needs
    vectors to train on: ``build`` a large corpus instead, or ``index retrain`` this one once it
    has grown."""
    out = Path(cfg.out)
    with _claim_output(out, overwrite, "replace it"):
        return _create_empty(cfg, out, overwrite)


def _create_empty(cfg: BuildConfig, out: Path, overwrite: bool) -> dict[str, Any]:
    bundle = verify_bundle(Path(cfg.bundle), [])
    dim = int(bundle["dim"])
    plan = IndexPlan("flat", 0, "created empty: exact search; run 'index retrain' once it is large")
    with atomic_directory(out, overwrite=overwrite) as tmp:
        DocumentStore(tmp / STORE_FILE).close()
        save_index(build_index(np.zeros((0, dim), dtype=np.float32), plan), tmp / INDEX_FILE)
        manifest = _index_manifest(
            cfg, sha256_file(Path(cfg.bundle) / "manifest.json"), dim=dim, plan=plan, ntotal=0, corpus=None
        )
        atomic_write_json(tmp / "manifest.json", manifest)
    return manifest


def build(cfg: BuildConfig, spec: CorpusSpec, overwrite: bool = False) -> dict[str, Any]:
    out = Path(cfg.out)
    with _claim_output(out, overwrite, "rebuild it"):
        return _build(cfg, spec, out, overwrite)


def _build(cfg: BuildConfig, spec: CorpusSpec, out: Path, overwrite: bool) -> dict[str, Any]:
    check_storage(cfg.storage)  # before the corpus is read and encoded
    start = time.perf_counter()
    docs, stats, duplicates = read_corpus(spec)  # validate the corpus before loading a model
    corpus_sha = sha256_file(spec.path)
    encoder = Encoder(cfg.bundle, variant=cfg.variant, threads=cfg.threads)  # type: ignore[arg-type]
    bundle_sha = sha256_file(Path(cfg.bundle) / "manifest.json")
    work = out.with_name(out.name + ".partial")
    _check_resume(
        work,
        {
            "bundle_sha256": bundle_sha,
            "corpus_sha256": corpus_sha,
            "variant": cfg.variant,
            "shard_size": cfg.shard_size,
            "corpus": asdict(spec) | {"path": str(spec.path)},
        },
    )
    encode_seconds, encoded = _encode_shards(encoder, docs, work, cfg)
    vectors = np.concatenate([np.load(p) for p in sorted((work / "shards").glob("[0-9]*.npy"))])
    plan = plan_index(len(docs), cfg.nlist, cfg.flat_below, cfg.storage)
    log.info("index plan: %s", plan)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        store = DocumentStore(tmp / STORE_FILE)
        ids, _ = store.upsert(docs)
        store.close()
        index = build_index(vectors, plan)
        add(index, vectors, np.asarray(ids, dtype=np.int64))
        save_index(index, tmp / INDEX_FILE)
        total = time.perf_counter() - start
        manifest = _index_manifest(
            cfg,
            bundle_sha,
            dim=int(vectors.shape[1]),
            plan=plan,
            ntotal=int(index.ntotal),
            corpus={
                "path": str(spec.path),
                "sha256": corpus_sha,
                "rows": stats.rows,
                "skipped": stats.skipped,
                "skipped_lines": stats.skipped_lines[:100],
                "duplicates": duplicates,
            },
        ) | {
            "build_seconds": round(total, 2),
            "encode_seconds_this_run": round(encode_seconds, 2),
            "docs_encoded_this_run": encoded,
            "docs_per_s": round(encoded / total, 1),  # this run's work: a resumed build reuses shards
        }
        atomic_write_json(tmp / "manifest.json", manifest)
    shutil.rmtree(work, ignore_errors=True)
    return manifest
