"""``index build --engine ray``: encode a corpus's splits on a Ray cluster with Ray Data.

A custom datasource turns each split into one read task (the same parsers as the local build,
seeking to the split's byte offset), ``map_batches`` runs them through a pool of encoder actors
(each loads the bundle once and encodes a whole split in one call, as the local build does, so the
vectors are identical), and the driver writes each split's vectors as a shard the moment it
arrives. Ray restarts a killed actor and retries its task; a split is saved once, whole, so a retry
can neither lose nor duplicate a document. A killed driver leaves the shards written so far, and
the rerun encodes only the rest. Assembly is the local build's (``index/assemble.py``).

The corpus and OUT must be on storage every node of the cluster can read (one machine: any path).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from distilembed.artifacts import read_manifest
from distilembed.errors import UserError
from distilembed.ray_address import is_client, join
from index.assemble import save_shard
from index.corpus import CorpusSpec, CorpusStats
from index.splits import CorpusPlan, Split, read_split, stage_decompressed

if TYPE_CHECKING:
    from ray.data.context import DataContext

    from index.build_config import BuildConfig

log = logging.getLogger(__name__)
INSTALL_HINT = "the Ray engine needs the [ray] extra: pip install 'distilembed[ray]'"
# Ray Data runs its executor in the driver, which needs a node of the cluster: over Ray Client it
# fails ('Worker' object has no attribute 'core_worker').
CLIENT_REFUSED = (
    "index build --engine ray cannot drive a cluster through Ray Client ({address}): run it on a "
    "node of the cluster with --ray-address auto (or the head's host:6379)"
)
OBJECT_STORE_BYTES = 512 * 1024 * 1024  # a local cluster's object store: blocks are ~1 MB each


def import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return ray


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` (or RAY_ADDRESS); without either, start one on this machine.
    False if this process was connected already (its caller then keeps the connection)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and is_client(address):
        raise UserError(CLIENT_REFUSED.format(address=address))
    # Ray Data's actors keep their constructor arguments in the object store, and the core worker
    # logs that as an error on every start; failures still surface as Python exceptions.
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    common = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
    if address:
        join(address, **common)
    else:
        ray.init(num_cpus=os.cpu_count(), object_store_memory=OBJECT_STORE_BYTES, **common)
    return True


def _split_encoder(bundle: str, variant: str, threads: int, batch_size: int) -> type:
    """A Ray Data actor class holding its settings (class attributes travel with the class, so no
    constructor arguments wait in the object store for a restart)."""

    class SplitEncoder:
        """Loads the bundle once, then encodes batches that each hold whole splits."""

        def __init__(self) -> None:
            from export.runtime import Encoder

            self.encoder = Encoder(bundle, variant=variant, threads=threads)  # type: ignore[arg-type]

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            splits, texts = batch["split"], batch["text"]
            out = np.zeros((len(texts), self.encoder.dim), dtype=np.float32)
            for split in np.unique(splits):
                rows = np.flatnonzero(splits == split)
                if len(rows) != int(batch["rows"][rows[0]]):  # one call per whole split, as locally
                    raise RuntimeError(f"split {split} reached an encoder in pieces")
                out[rows] = self.encoder.encode([str(t) for t in texts[rows]], batch_size=batch_size)
            return {"split": splits, "rows": batch["rows"], "vector": out}

    return SplitEncoder


def _datasource(spec: CorpusSpec, plan: CorpusPlan, todo: list[Split], staged: dict[int, Path]) -> Any:
    import pyarrow as pa
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    def read(number: int, split: Split) -> list[pa.Table]:
        docs = read_split(spec, plan, split, CorpusStats(quiet=True), staged.get(split.file))
        n = len(docs)
        return [pa.table({"split": [number] * n, "rows": [n] * n, "text": [d.text for d in docs]})]

    class CorpusSplits(Datasource):
        def estimate_inmemory_data_size(self) -> int:
            return sum(s.lines for s in todo) * 128

        def get_read_tasks(  # a task a split: the limits are not used
            self,
            parallelism: int,  # noqa: ARG002
            per_task_row_limit: int | None = None,  # noqa: ARG002
            data_context: DataContext | None = None,  # noqa: ARG002
            **_: Any,
        ) -> list[ReadTask]:
            return [
                ReadTask(
                    partial(read, i, s),
                    BlockMetadata(num_rows=None, size_bytes=s.lines * 128, input_files=None, exec_stats=None),
                )
                for i, s in enumerate(todo)
            ]

    return CorpusSplits()


def encode_with_ray(
    cfg: BuildConfig, spec: CorpusSpec, plan: CorpusPlan, todo: list[Split], work: Path
) -> tuple[float, int]:
    """Encode the splits in ``todo`` on the cluster, saving each as a shard; returns (seconds,
    documents encoded)."""
    if not todo:
        return 0.0, 0
    ray = import_ray()
    try:
        connected = connect(cfg.ray_address)
    except UserError:
        _discard_unstarted(work)
        raise
    try:
        staged = stage_decompressed(plan, work / "staged")
        start = time.perf_counter()
        threads = cfg.threads or 1
        actors = cfg.actors or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # ours counts rows saved, as the local build's does
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        dataset = ray.data.read_datasource(
            _datasource(spec, plan, todo, staged),
            override_num_blocks=len(todo),
            num_cpus=0,  # reading a split is light; the encoders hold the CPUs
            # Without a cap, zero-CPU read tasks all start at once, each in a new worker process:
            # ~100 Python processes spawned for 1M documents, minutes of startup on 2 cores.
            concurrency=actors + 1,
        ).map_batches(
            _split_encoder(str(Path(cfg.bundle).resolve()), cfg.variant, threads, cfg.batch_size),
            batch_size=None,  # a block, i.e. one split, per call
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=threads,
        )
        dim = int(read_manifest(cfg.bundle)["dim"])
        encoded = _collect(dataset, spec, plan, todo, work, staged, dim)
        return time.perf_counter() - start, encoded
    finally:
        if connected:
            ray.shutdown()


def _discard_unstarted(work: Path) -> None:
    """Remove ``work`` (OUT.partial) when no split was encoded into it yet: a build that could not
    reach its cluster leaves nothing behind, a resumable one keeps its shards."""
    if not any((work / "shards").glob("*.npy")):
        shutil.rmtree(work, ignore_errors=True)


def _collect(  # noqa: PLR0917
    dataset: Any,
    spec: CorpusSpec,
    plan: CorpusPlan,
    todo: list[Split],
    work: Path,
    staged: dict[int, Path],
    dim: int,
) -> int:
    """Save each split's vectors as they arrive; a split with no usable rows sends none."""
    saved, encoded = set(), 0
    done_lines = plan.lines - sum(s.lines for s in todo)
    with tqdm(total=plan.lines, initial=done_lines, desc="encode (ray)", unit="row") as bar:
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            for number in np.unique(batch["split"]):
                rows = batch["split"] == number
                split = todo[int(number)]
                if int(number) in saved or int(rows.sum()) != int(batch["rows"][rows][0]):
                    raise RuntimeError(f"split {split.key} arrived twice or in pieces")
                save_shard(work, split, batch["vector"][rows])
                saved.add(int(number))
                encoded += int(rows.sum())
                bar.update(split.lines)
        for number, split in enumerate(todo):
            if number in saved:
                continue
            docs = read_split(spec, plan, split, CorpusStats(quiet=True), staged.get(split.file))
            if docs:  # an empty split sends nothing; one with documents must have arrived
                raise RuntimeError(f"split {split.key} has {len(docs)} documents but no vectors came back")
            save_shard(work, split, np.zeros((0, dim), dtype=np.float32))
            bar.update(split.lines)
    return encoded
