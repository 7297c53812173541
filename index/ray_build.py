"""``index build --engine ray`` (docs/decisions.md, 20): a Ray Data read task per split, encoder
actors that encode a whole split per call (as locally, so the vectors are identical), and a driver
that saves each split as a shard when it arrives.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from index.store import Document

if TYPE_CHECKING:
    from ray.data.context import DataContext

    from index.build_config import BuildConfig

log = logging.getLogger(__name__)
INSTALL_HINT = "the Ray engine needs the [ray] extra: pip install 'distilembed[ray]'"
# Ray Data runs its executor in the driver, which must be a node of the cluster, not a Ray Client.
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
    """Join the cluster at ``address`` (or RAY_ADDRESS), else start one here; False if joined already."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and is_client(address):
        raise UserError(CLIENT_REFUSED.format(address=address))
    # The core worker logs each actor start as an error (failures still surface as exceptions).
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    common = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
    if address:
        join(address, **common)
    else:
        ray.init(num_cpus=os.cpu_count(), object_store_memory=OBJECT_STORE_BYTES, **common)
    return True


@contextmanager
def cluster(address: str | None) -> Iterator[None]:
    """Ray joined (or started here) for the block, and shut down after it if this call connected."""
    connected = connect(address)
    try:
        yield
    finally:
        if connected:
            import_ray().shutdown()


def _split_encoder(bundle: str, variant: str, threads: int, batch_size: int) -> type:
    """A Ray Data actor class, its settings class attributes (nothing waits in the object store)."""

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


def _datasource(todo: list[Split], docs_of: Callable[[Split], list[Document]]) -> Any:
    import pyarrow as pa
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    def read(number: int, split: Split) -> list[pa.Table]:
        docs = docs_of(split)
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
    """Encode ``todo`` on the cluster, saving each split as a shard; returns (seconds, documents)."""
    if not todo:
        return 0.0, 0
    ray = import_ray()
    staged = stage_decompressed(plan, work / "staged")

    def docs_of(split: Split) -> list[Document]:
        return read_split(spec, plan, split, CorpusStats(quiet=True), staged.get(split.file))

    start = time.perf_counter()
    threads = cfg.threads or 1
    actors = cfg.actors or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ours counts rows saved, as the local build's does
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    dataset = ray.data.read_datasource(
        _datasource(todo, docs_of),
        override_num_blocks=len(todo),
        num_cpus=0,  # reading a split is light; the encoders hold the CPUs
        # uncapped, every zero-CPU read task starts a worker process at once (~100 for 1M documents)
        concurrency=actors + 1,
    ).map_batches(
        _split_encoder(str(Path(cfg.bundle).resolve()), cfg.variant, threads, cfg.batch_size),
        batch_size=None,  # a block, i.e. one split, per call
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=threads,
    )
    dim, saved, encoded = int(read_manifest(cfg.bundle)["dim"]), set(), 0
    done = plan.lines - sum(s.lines for s in todo)
    with tqdm(total=plan.lines, initial=done, desc="encode (ray)", unit="row") as bar:
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
        for split in (s for number, s in enumerate(todo) if number not in saved):
            if count := len(docs_of(split)):  # a split with no usable rows sends no vectors
                raise RuntimeError(f"split {split.key} has {count} documents but no vectors came back")
            save_shard(work, split, np.zeros((0, dim), dtype=np.float32))
            bar.update(split.lines)
    return time.perf_counter() - start, encoded
