"""Assemble an index directory from encoded shards, for both build engines: the document store, an
IVF trained on a sample, its lists filled shard by shard (in memory, or on disk). Duplicate ids:
the last occurrence's text and vector win, the first one's int id is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
from faiss.contrib.ondisk import merge_ondisk
from tqdm.auto import tqdm

from distilembed.errors import UserError
from index.corpus import CorpusSpec, CorpusStats
from index.integrity import INDEX_FILE, IVFDATA_FILE, RESCORE_FILE, STORE_FILE
from index.rescore import write_batches
from index.splits import CorpusPlan, Split, iter_split_documents
from index.store import DocumentStore
from index.vectors import RESCORED, IndexPlan, add, build_index, c_stdout_to_stderr, plan_index, save_index

log = logging.getLogger(__name__)
BLOCK_ROWS = 1 << 20  # vectors per temporary IVF block of an on-disk build (~0.5 GB at 128-d)


@dataclass
class Assembled:
    ntotal: int
    plan: IndexPlan
    stats: CorpusStats
    duplicates: int


def shard_path(work: Path, split: Split) -> Path:
    return work / "shards" / f"{split.key}.npy"


def save_shard(work: Path, split: Split, vectors: np.ndarray) -> None:
    path = shard_path(work, split)
    tmp = path.with_name(f".{path.name}.tmp.npy")
    np.save(tmp, np.ascontiguousarray(vectors, dtype=np.float32))
    tmp.replace(path)


def _load(work: Path, split: Split) -> np.ndarray:
    return np.load(shard_path(work, split), mmap_mode="r")


def _store_documents(
    spec: CorpusSpec, plan: CorpusPlan, work: Path, store: DocumentStore, stats: CorpusStats
) -> tuple[list[np.ndarray], set[int]]:
    """Write every document to the store; returns each split's int ids and the ids seen twice."""
    ids_per_split: list[np.ndarray] = []
    repeated: set[int] = set()
    with tqdm(total=plan.lines, desc="store", unit="row", dynamic_ncols=True) as bar:
        for split, docs in iter_split_documents(spec, plan, stats):
            held = _load(work, split).shape[0]
            if held != len(docs):
                raise UserError(
                    f"shard {split.key} holds {held} vectors for {len(docs)} documents: the corpus "
                    f"changed under the build; delete {work} and build again"
                )
            ids, replaced = store.upsert(docs) if docs else ([], [])
            arr = np.asarray(ids, dtype=np.int64)
            unique, counts = np.unique(arr, return_counts=True)
            repeated.update(replaced, unique[counts > 1].tolist())
            ids_per_split.append(arr)
            bar.update(split.lines)
    return ids_per_split, repeated


def _live_masks(ids_per_split: list[np.ndarray], repeated: set[int]) -> list[np.ndarray]:
    """Per split, which rows hold the last occurrence of their id (the others are superseded)."""
    masks = [np.ones(len(ids), dtype=bool) for ids in ids_per_split]
    if not repeated:
        return masks
    pending, remaining = np.fromiter(repeated, dtype=np.int64), set(repeated)
    for ids, mask in zip(reversed(ids_per_split), reversed(masks), strict=True):
        for row in np.flatnonzero(np.isin(ids, pending))[::-1]:
            if int(ids[row]) in remaining:
                remaining.discard(int(ids[row]))  # met first from the end: the last occurrence
            else:
                mask[row] = False
    return masks


def _training_sample(work: Path, plan: CorpusPlan, sizes: list[int], size: int, seed: int) -> np.ndarray:
    """Vectors at ``size`` random rows of all shards (read through memory maps)."""
    total = sum(sizes)
    rows = np.sort(np.random.default_rng(seed).choice(total, size=min(size, total), replace=False))
    starts = np.cumsum([0, *sizes])
    parts = []
    for i, split in enumerate(plan.splits):
        lo, hi = np.searchsorted(rows, [starts[i], starts[i + 1]])
        if hi > lo:
            parts.append(np.asarray(_load(work, split)[rows[lo:hi] - starts[i]]))
    return np.concatenate(parts)


def assemble(
    spec: CorpusSpec,
    plan: CorpusPlan,
    work: Path,
    out: Path,
    *,
    dim: int,
    index_plan: tuple[int, int, str, tuple[int, int]],
    on_disk: bool,
) -> Assembled:
    """Write the store, Faiss index (and rescoring file) of ``plan``'s shards into ``out``."""
    stats = CorpusStats()
    with closing(DocumentStore(out / STORE_FILE)) as store:
        ids_per_split, repeated = _store_documents(spec, plan, work, store, stats)
        ntotal = store.count()
    if ntotal == 0:
        raise UserError(f"corpus has no usable rows: {spec.path} ({stats.skipped} skipped)")
    if duplicates := sum(len(ids) for ids in ids_per_split) - ntotal:
        log.warning("%s: %d duplicate ids, the last occurrence of each kept", spec.path, duplicates)
    masks = _live_masks(ids_per_split, repeated)
    plan_ = plan_index(ntotal, *index_plan)
    if on_disk and plan_.kind != "ivf":
        raise UserError(f"--on-disk needs an IVF index, and {ntotal} vectors plan {plan_.reason}")
    log.info("index plan: %s", plan_)
    sizes = [len(ids) for ids in ids_per_split]
    train_rows = 64 * plan_.nlist if plan_.kind == "ivf" else 0
    sample = _training_sample(work, plan, sizes, train_rows, seed=0) if train_rows else np.zeros((0, dim))
    index = build_index(sample.astype(np.float32), plan_, train_size=len(sample))

    def batches() -> Iterator[tuple[Split, np.ndarray, np.ndarray]]:
        for split, ids, mask in zip(plan.splits, ids_per_split, masks, strict=True):
            yield split, ids[mask], _load(work, split)[mask]

    if on_disk:
        _fill_on_disk(index, batches(), work, out / INDEX_FILE, ntotal)
    else:
        with tqdm(total=ntotal, desc="index", unit="vec", dynamic_ncols=True) as bar:
            for _, ids, vectors in batches():
                add(index, vectors, ids)
                bar.update(len(ids))
        save_index(index, out / INDEX_FILE)
    if plan_.kind == "ivf" and plan_.storage in RESCORED:
        rows = max(int(ids.max()) + 1 for ids in ids_per_split if len(ids))
        write_batches(out / RESCORE_FILE, ((ids, vectors) for _, ids, vectors in batches()), rows, dim)
    return Assembled(ntotal, plan_, stats, duplicates)


def _fill_on_disk(index: faiss.Index, batches: object, work: Path, path: Path, ntotal: int) -> None:
    """Faiss's recipe for indexes bigger than RAM: IVF blocks, merged into a memory-mapped ``.ivfdata``."""
    blocks_dir = work / "blocks"
    blocks_dir.mkdir(exist_ok=True)
    names: list[str] = []
    block, held = faiss.clone_index(index), 0

    def flush() -> None:
        nonlocal block, held
        names.append(str(blocks_dir / f"{len(names):05d}.index"))
        faiss.write_index(block, names[-1])
        block, held = faiss.clone_index(index), 0

    with tqdm(total=ntotal, desc="index", unit="vec", dynamic_ncols=True) as bar:
        for _, ids, vectors in batches:  # type: ignore[attr-defined]
            add(block, vectors, ids)
            held += len(ids)
            bar.update(len(ids))
            if held >= BLOCK_ROWS:
                flush()
    if held:
        flush()
    with c_stdout_to_stderr():
        merge_ondisk(index, names, str(path.parent / IVFDATA_FILE))
    save_index(index, path)  # refers to the .ivfdata by name: read with IO_FLAG_ONDISK_SAME_DIR
    for name in names:
        Path(name).unlink()
