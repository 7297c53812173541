"""An index cut into N shards for replicas that cannot each hold all of it, and the search that
asks every shard and merges their top-k (Faiss ``IndexShards`` semantics).

Each shard is a complete index directory holding the documents whose ``crc32(id) % N`` is its
number, under the source's int ids, in an IVF with the source's centroids: a query probes the
same lists in every shard as in the whole index, so the merged top-k equals the unsharded top-k
(up to the order of equal scores). The parent directory's manifest (kind ``index_shards``) lists
the shards. A sharded index is searched, not written: upsert into the source and shard it again.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from distilembed.artifacts import atomic_directory, atomic_write_json, now_iso, read_manifest
from distilembed.errors import BusyError, UserError
from index.integrity import RESCORE_FILE, with_files
from index.live import INDEX_FILE, STORE_FILE, Hit, LiveIndex, open_for_bundle
from index.rescore import exact_vectors, write_rows
from index.searcher import Searcher
from index.store import Document, DocumentStore
from index.vectors import add, copy_index, save_index

SHARDS_KIND = "index_shards"


def shard_of(ext_id: str, count: int) -> int:
    return zlib.crc32(ext_id.encode("utf-8")) % count


def _in_shard(number: int, count: int) -> Callable[[str], bool]:
    return lambda ext_id: shard_of(ext_id, count) == number


def shard_name(number: int, count: int) -> str:
    return f"shard-{number:05d}-of-{count:05d}"


def shard_index(source: Path, count: int, out: Path, overwrite: bool = False) -> dict[str, Any]:
    """Cut the index at ``source`` into ``count`` shard directories under ``out``."""
    if count < 2:
        raise UserError(f"--shards must be at least 2, not {count}")
    if out.exists() and not overwrite:
        raise UserError(f"output exists: {out} (pass --overwrite to replace it)")
    whole = LiveIndex(source, writable=False)
    try:
        ids, vectors = exact_vectors(whole.index, whole.rescorer)
        owners = _owners(whole.store, ids, count)
        with atomic_directory(out, overwrite=overwrite) as tmp:
            names = []
            for number in tqdm(range(count), desc="shards", unit="shard"):
                name = shard_name(number, count)
                _write_shard(whole, tmp / name, ids[owners == number], vectors[owners == number])
                kept = DocumentStore(tmp / name / STORE_FILE)
                kept.copy_documents_from(source / STORE_FILE, _in_shard(number, count))
                kept.close()
                shard_manifest = with_files(tmp / name, whole.manifest) | {
                    "ntotal": int((owners == number).sum()),
                    "shard": {"number": number, "count": count, "key": "crc32(id) % count"},
                }
                atomic_write_json(tmp / name / "manifest.json", shard_manifest)
                names.append(name)
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


class ShardedIndex:
    """The service's index over shards (local ``LiveIndex``es, or Ray Serve shard deployments):
    every search runs on all shards in parallel and their top-k are merged."""

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

    def get(self, ext_id: str) -> Document | None:
        return self.shards[shard_of(ext_id, len(self.shards))].get(ext_id)

    def count(self, where: dict[str, Any] | None = None) -> int:
        return sum(f.result() for f in [self._pool.submit(s.count, where) for s in self.shards])

    @property
    def indexed_fields(self) -> tuple[str, ...]:
        return tuple(self.manifest.get("first_shard", {}).get("indexed_fields", ()))

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
    path = directory / "manifest.json"
    return path.is_file() and read_manifest(directory).get("kind") == SHARDS_KIND


def open_sharded(
    directory: Path,
    dim: int,
    bundle_sha256: str | None = None,
    nprobe: int | None = None,
    *,
    rescore_k: int | None = None,
) -> ShardedIndex:
    """All shards of ``directory`` in this process, read-only, each checked against the bundle.
    ``rescore_k``: candidates each shard of compressed lists rescores (default: its manifest's)."""
    manifest = read_manifest(directory)
    shards: list[LiveIndex] = []
    try:
        for name in manifest["shards"]:
            shard = open_for_bundle(directory / name, dim, bundle_sha256, nprobe, False, rescore_k=rescore_k)
            shards.append(shard)
    except BaseException:
        for shard in shards:
            shard.close(checkpoint=False)
        raise
    first = shards[0].manifest | {"nprobe": shards[0].nprobe}

    def close() -> None:
        for shard in shards:
            shard.close(checkpoint=False)

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
    """The index at ``directory`` for a bundle's encoder, whole or sharded (``index shard``). A
    sharded index is read-only whatever ``writable`` says: its writes raise BusyError."""
    if is_sharded(Path(directory)):
        return open_sharded(Path(directory), dim, bundle_sha256, nprobe, rescore_k=rescore_k)
    return open_for_bundle(directory, dim, bundle_sha256, nprobe, writable, rescore_k=rescore_k)
