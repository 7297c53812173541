"""An index cut into N read-only shards by ``crc32(id) % N``, each a complete index directory with
the source's int ids and centroids, so merging their top-k gives the unsharded one
(docs/decisions.md, 22).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from distilembed.artifacts import atomic_directory, atomic_write_json, now_iso, read_manifest
from distilembed.errors import BusyError, UserError
from index.fusion import fuse
from index.hits import HYBRID_CANDIDATES, Hit, HybridHit, check_fusion, hybrid_hits
from index.integrity import RESCORE_FILE, refuse_existing, seal
from index.live import INDEX_FILE, STORE_FILE, LiveIndex, open_for_bundle
from index.rescore import exact_vectors, write_rows
from index.searcher import Searcher
from index.store import Document, DocumentStore
from index.vectors import add, copy_index, save_index

SHARDS_KIND = "index_shards"


def shard_of(ext_id: str, count: int) -> int:
    return zlib.crc32(ext_id.encode("utf-8")) % count


def _in_shard(number: int, count: int) -> Callable[[str], bool]:
    return lambda ext_id: shard_of(ext_id, count) == number


def shard_index(source: Path, count: int, out: Path, overwrite: bool = False) -> dict[str, Any]:
    """Cut the index at ``source`` into ``count`` shard directories under ``out``."""
    if count < 2:
        raise UserError(f"--shards must be at least 2, not {count}")
    refuse_existing(out, overwrite)
    whole = LiveIndex(source, writable=False)
    try:
        ids, vectors = exact_vectors(whole.index, whole.rescorer)
        owners = _owners(whole.store, ids, count)
        with atomic_directory(out, overwrite=overwrite) as tmp:
            names = []
            for number in tqdm(range(count), desc="shards", unit="shard"):
                names.append(name := f"shard-{number:05d}-of-{count:05d}")
                mine = owners == number
                _write_shard(whole, tmp / name, ids[mine], vectors[mine])
                with closing(DocumentStore(tmp / name / STORE_FILE)) as kept:
                    kept.copy_documents_from(source / STORE_FILE, _in_shard(number, count))
                shard = {"number": number, "count": count, "key": "crc32(id) % count"}
                seal(tmp / name, whole.manifest | {"ntotal": int(mine.sum()), "shard": shard})
            manifest = {
                "kind": SHARDS_KIND,
                "created": now_iso(),
                "source": {"path": str(source.resolve()), "ntotal": whole.ntotal},
                "count": count,
                "shards": names,
                "dim": whole.dim,
                "ntotal": whole.ntotal,
            }
            atomic_write_json(tmp / "manifest.json", manifest)
    finally:
        whole.close(checkpoint=False)
    return manifest


def _owners(store: DocumentStore, ids: np.ndarray, count: int) -> np.ndarray:
    owners = np.empty(len(ids), dtype=np.int64)
    for lo in range(0, len(ids), 100_000):
        chunk = ids[lo : lo + 100_000]
        docs = store.get_many(chunk.tolist())
        owners[lo : lo + len(chunk)] = [shard_of(docs[int(i)].id, count) for i in chunk]
    return owners


def _write_shard(whole: LiveIndex, directory: Path, ids: np.ndarray, vectors: np.ndarray) -> None:
    directory.mkdir()
    index = copy_index(whole.index)
    index.reset()  # the same trained centroids, no vectors
    add(index, vectors, ids)
    save_index(index, directory / INDEX_FILE)
    if whole.rescorer is not None:
        write_rows(directory / RESCORE_FILE, ids, vectors, whole.dim)


def merge_hits(per_shard: Sequence[list[list[Hit]]], k: int) -> list[list[Hit]]:
    """Per query, the k best hits of all shards (highest score first)."""
    return [
        sorted((hit for shard in rows for hit in shard), key=lambda h: -h.score)[:k]
        for rows in zip(*per_shard, strict=True)
    ]


def fuse_hits(
    dense: list[Hit], lexical: list[Hit], k: int, fusion: str, weights: Sequence[float]
) -> list[HybridHit]:
    """The top-k of two ranked hit lists fused, as ``LiveIndex.search_hybrid`` fuses its candidates."""
    docs = dict(enumerate({h.id: h for h in [*lexical, *dense]}.values()))
    number = {hit.id: n for n, hit in docs.items()}
    by_dense, by_lexical = ([(number[h.id], h.score) for h in hits] for hits in (dense, lexical))
    return hybrid_hits(fuse(by_dense, by_lexical, fusion, weights)[:k], docs, by_dense, by_lexical)


def hybrid_by_sides(
    index: Searcher,
    query_vector: np.ndarray,
    text: str,
    k: int = 10,
    where: dict[str, Any] | None = None,
    *,
    fusion: str = "weighted",
    weights: Sequence[float] = (1.0, 1.0),
    candidates: int | None = None,
    nprobe: int | None = None,
) -> list[HybridHit]:
    """``search_hybrid`` from an index's own dense ``search`` and ``search_lexical``: each side's top
    candidates fused, the options as LiveIndex takes them (a method of ShardedIndex as it is)."""
    check_fusion(k, fusion, weights)
    window = max(k, candidates or HYBRID_CANDIDATES)
    lexical = index.search_lexical(text, window, where)
    queries = np.asarray(query_vector, dtype=np.float32).reshape(1, -1)
    return fuse_hits(index.search(queries, window, nprobe, where)[0], lexical, k, fusion, weights)


class ShardedIndex:
    """The service's index over shards: each search runs on every shard and their top-k are merged."""

    def __init__(
        self, shards: Sequence[Searcher], manifest: dict[str, Any], close: Callable[[], None]
    ) -> None:
        self.shards = list(shards)
        self.manifest = manifest
        self.dim = int(manifest["dim"])
        first = manifest.get("first_shard", {})
        self.kind = f"{first.get('index_type', 'ivf')}_sharded"
        self.nlist = int(first.get("nlist", 0))
        self.nprobe = int(first.get("nprobe", 1))
        self._pool = ThreadPoolExecutor(max_workers=len(self.shards), thread_name_prefix="shard")
        self._close = close

    @property
    def ntotal(self) -> int:
        return int(self.manifest["ntotal"])

    def search(
        self,
        queries: np.ndarray,
        k: int = 10,
        nprobe: int | None = None,
        where: dict[str, Any] | None = None,
        rescore_k: int | None = None,
    ) -> list[list[Hit]]:
        futures = [self._pool.submit(s.search, queries, k, nprobe, where, rescore_k) for s in self.shards]
        return merge_hits([f.result() for f in futures], k)

    def search_lexical(self, text: str, k: int = 10, where: dict[str, Any] | None = None) -> list[Hit]:
        """Each shard's BM25 top-k merged by score. BM25's IDF is each shard's own (its documents'
        counts), so the scores, and near ties, may differ a little from the whole index's."""
        futures = [self._pool.submit(s.search_lexical, text, k, where) for s in self.shards]
        return merge_hits([[f.result()] for f in futures], k)[0]

    # the merged dense and lexical candidates of every shard, fused as one index fuses its own
    search_hybrid = hybrid_by_sides

    def get(self, ext_id: str) -> Document | None:
        return self.shards[shard_of(ext_id, len(self.shards))].get(ext_id)

    def vectors(self, ext_ids: Sequence[str]) -> dict[str, np.ndarray]:
        owned: list[list[str]] = [[] for _ in self.shards]
        for ext_id in dict.fromkeys(ext_ids):
            owned[shard_of(ext_id, len(self.shards))].append(ext_id)
        futures = [
            self._pool.submit(s.vectors, ids) for s, ids in zip(self.shards, owned, strict=True) if ids
        ]
        return {ext_id: row for f in futures for ext_id, row in f.result().items()}

    def list_documents(self, after: int = 0, limit: int = 10) -> list[tuple[int, Document]]:
        """Each shard's next page merged by int id (the source index's: unique across shards)."""
        futures = [self._pool.submit(s.list_documents, after, limit) for s in self.shards]
        return sorted((row for f in futures for row in f.result()), key=lambda row: row[0])[:limit]

    def count(self, where: dict[str, Any] | None = None) -> int:
        return sum(f.result() for f in [self._pool.submit(s.count, where) for s in self.shards])

    @property
    def indexed_fields(self) -> tuple[str, ...]:
        return tuple(self.manifest.get("first_shard", {}).get("indexed_fields", ()))

    @property
    def lexical(self) -> bool:
        return bool(self.manifest.get("first_shard", {}).get("lexical"))

    def _read_only(self, *_: object, **__: object) -> Any:
        raise BusyError("a sharded index is read-only: write to its source index and shard it again")

    upsert = delete = retrain = add_field_index = _read_only

    def snapshot(self, out: str | Path, overwrite: bool = False) -> dict[str, Any]:  # noqa: ARG002
        raise BusyError("a sharded index is snapshot shard by shard, or snapshot its source index")

    def checkpoint(self) -> None:
        return

    def close(self, checkpoint: bool = True) -> None:  # noqa: ARG002 (read-only: nothing to checkpoint)
        self._pool.shutdown()
        self._close()


def is_sharded(directory: Path) -> bool:
    return (directory / "manifest.json").is_file() and read_manifest(directory).get("kind") == SHARDS_KIND


def open_sharded(
    directory: Path,
    dim: int,
    bundle_sha256: str | None = None,
    nprobe: int | None = None,
    *,
    rescore_k: int | None = None,
) -> ShardedIndex:
    """All shards of ``directory`` here, read-only, each checked against the bundle."""
    manifest = read_manifest(directory)
    shards: list[LiveIndex] = []

    def close() -> None:
        for shard in shards:
            shard.close(checkpoint=False)

    try:
        for name in manifest["shards"]:
            shards.append(
                open_for_bundle(directory / name, dim, bundle_sha256, nprobe, False, rescore_k=rescore_k)
            )
    except BaseException:
        close()
        raise
    first = shards[0].manifest | {"nprobe": shards[0].nprobe, "lexical": shards[0].lexical}
    return ShardedIndex(shards, manifest | {"first_shard": first}, close)


def open_index(
    directory: str | Path,
    dim: int,
    bundle_sha256: str | None = None,
    nprobe: int | None = None,
    *,
    writable: bool = True,
    rescore_k: int | None = None,
) -> LiveIndex | ShardedIndex:
    """The index at ``directory`` for a bundle's encoder, whole or sharded (always read-only)."""
    if is_sharded(Path(directory)):
        return open_sharded(Path(directory), dim, bundle_sha256, nprobe, rescore_k=rescore_k)
    return open_for_bundle(directory, dim, bundle_sha256, nprobe, writable, rescore_k=rescore_k)
