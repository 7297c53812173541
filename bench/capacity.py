"""A capacity plan from the measured build: hours to index 10^8 and 10^9 documents on 8, 64 and 512
cores, index memory per 10^8 vectors by storage, and shards per corpus size.

    python bench/capacity.py docs/results/scale_build_1m.json --out docs/results/capacity.json

The model, from one measured ``--engine ray`` build (bench/scale_build.py):
  * encoding scales with cores: the Ray build's docs/s divided by the cluster's CPUs is the
    per-core rate (every actor holds one core; reading and saving are light);
  * assembly does not: the driver fills the document store, trains the IVF on a sample and fills
    the lists on one node, measured here as (build seconds - encode seconds) per 10^6 documents and
    scaled linearly (the store and the lists grow linearly; IVF training on a fixed-size sample
    does not grow with the corpus, though a bigger nlist makes it slower).
Bytes per vector are Faiss's inverted lists: the code (128 x 4 float32, 128 sq8, m PQ bytes) plus
an 8-byte id, checked against the measured file (``--index``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

DIM = 128
STORAGES = {"float32": DIM * 4, "sq8": DIM, "pq m=32": 32, "pq m=16": 16}
ID_BYTES = 8


def plan(build: dict[str, Any], replica_gb: float, store_bytes: float | None) -> dict[str, Any]:
    ray, cpus = build["ray"], build["cpus"]
    per_core = ray["ntotal"] / ray["encode_seconds_this_run"] / cpus
    assembly_s_per_m = (ray["build_seconds"] - ray["encode_seconds_this_run"]) / (ray["ntotal"] / 1e6)
    hours = {
        f"{n:.0e}": {
            str(cores): round((n / (per_core * cores) + assembly_s_per_m * n / 1e6) / 3600, 1)
            for cores in (8, 64, 512)
        }
        for n in (1e8, 1e9)
    }
    memory = {name: round((code + ID_BYTES) * 1e8 / 1e9, 1) for name, code in STORAGES.items()}
    usable = replica_gb * 0.75  # the rest: the model, the page cache for the store, headroom
    shards = {
        f"{n:.0e}": {
            name: max(1, -(-round((code + ID_BYTES) * n / 1e9, 1) // usable))
            for name, code in STORAGES.items()
        }
        for n in (1e6, 1e7, 1e8, 1e9)
    }
    return {
        "per_core_docs_per_s": round(per_core, 1),
        "assembly_seconds_per_million": round(assembly_s_per_m, 1),
        "hours": hours,
        "lists_gb_per_1e8": memory,
        "store_gb_per_1e8": round(store_bytes * 1e8 / 1e9, 1) if store_bytes else None,
        "replica_gb": replica_gb,
        "shards_in_ram": shards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build", type=Path, help="JSON written by bench/scale_build.py")
    parser.add_argument(
        "--index", type=Path, help="an index it built: measured bytes per vector and document"
    )
    parser.add_argument("--replica-gb", type=float, default=64.0, help="RAM of one search replica")
    parser.add_argument("--out", type=Path, default=Path("docs/results/capacity.json"))
    args = parser.parse_args()
    build = json.loads(args.build.read_text())
    store = None
    measured: dict[str, float] = {}
    if args.index is not None:
        n = json.loads((args.index / "manifest.json").read_text())["ntotal"]
        measured = {
            "faiss_bytes_per_vector": round((args.index / "vectors.faiss").stat().st_size / n, 1),
            "store_bytes_per_document": round((args.index / "docs.sqlite").stat().st_size / n, 1),
        }
        store = measured["store_bytes_per_document"]
    result = plan(build, args.replica_gb, store) | {"measured": measured, "from": str(args.build)}

    console = Console(width=130)
    rate, assembly = result["per_core_docs_per_s"], result["assembly_seconds_per_million"]
    t = Table(
        title=f"hours to index ({rate} docs/s per core, {assembly} s per 10^6 to assemble on the driver)"
    )
    t.add_column("documents")
    for cores in (8, 64, 512):
        t.add_column(f"{cores} cores", justify="right")
    for n, row in result["hours"].items():
        t.add_row(n, *(f"{h:,.1f}" for h in row.values()))
    console.print(t)
    m = Table(title=f"memory and shards (replicas of {args.replica_gb:.0f} GB, 75% for the lists)")
    m.add_column("storage")
    m.add_column("B/vector", justify="right")
    m.add_column("GB per 10^8", justify="right")
    for n in result["shards_in_ram"]:
        m.add_column(f"shards at {n}", justify="right")
    for name, code in STORAGES.items():
        shards = [str(int(result["shards_in_ram"][n][name])) for n in result["shards_in_ram"]]
        m.add_row(name, str(code + ID_BYTES), f"{result['lists_gb_per_1e8'][name]}", *shards)
    console.print(m)
    console.print({"measured": measured, "store_gb_per_1e8": result["store_gb_per_1e8"]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
