"""``BuildConfig``: the settings of one ``index build``. Both engines read them: index/build.py (the
local engine, and the caller of the Ray one) and index/ray_build.py, which so never imports build."""

from __future__ import annotations

from dataclasses import dataclass

from index.rescore import DEFAULT_RESCORE_K
from index.splits import LINES_PER_SPLIT

ENGINES = ("local", "ray")


@dataclass(frozen=True)
class BuildConfig:
    bundle: str
    out: str
    variant: str = "int8"
    nlist: int = 1024
    nprobe: int | None = None  # default: 5, or 8 for pq and binary lists (vectors.default_nprobe)
    storage: str = "float32"
    pq_m: int | None = None  # pq storage: codes per vector (default: one per 8 dimensions)
    pq_bits: int = 8  # pq storage: bits per code
    rescore_k: int = DEFAULT_RESCORE_K  # pq and binary storage: candidates rescored exactly
    flat_below: int = 10_000
    shard_size: int = LINES_PER_SPLIT  # corpus lines per split: encoded in one call, checkpointed
    batch_size: int = 64
    threads: int | None = None  # onnxruntime threads (ray: per actor)
    engine: str = "local"
    on_disk: bool = False  # IVF lists in a memory-mapped .ivfdata file
    ray_address: str | None = None  # None: RAY_ADDRESS, else a local cluster
    actors: int | None = None  # ray: encoder actors (default: cluster CPUs / threads per actor)
