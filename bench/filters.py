"""Filtered search against unfiltered search, in one run, at up to a million documents.

    python bench/filters.py                      # 1,000,000 documents, ~6 minutes on 2 cores
    python bench/filters.py --docs 20000 --queries 50 --no-doc   # smoke

The vectors are random unit vectors in the bundle's 128 dimensions (what a filter costs does not
depend on what the vectors mean), in an IVF of ``--nlist`` lists searched at the default nprobe;
every document has ``{"group": i % 100, "half": i % 2}``. Per query (k = 10, one query a call,
``LiveIndex.search``: the index, the filter and the document fetch the service runs), the p50 of:
no filter; a filter that 1% and one that 50% of documents pass, on indexed fields; the same two on
fields without a payload index. The candidates take turns on every query, so a slow moment of the
machine costs all alike.
Rewrites the block ``filters`` of docs/results.md (--no-doc: not; --json: where the figures go).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from harness import markdown_table, rewrite_block, run_info  # noqa: E402
from http_harness import free_port, server  # noqa: E402

from distilembed.artifacts import atomic_write_json  # noqa: E402
from index.filter_cache import MatchCache  # noqa: E402
from index.live import INDEX_FILE, STORE_FILE, LiveIndex  # noqa: E402
from index.store import Document, DocumentStore  # noqa: E402
from index.vectors import add, build_index, plan_index, save_index  # noqa: E402

DIM = 128
CANDIDATES = {
    "no filter": None,
    "1%, indexed": {"group": 7},
    "50%, indexed": {"half": 1},
    "1%, not indexed": {"group_copy": 7},
    "50%, not indexed": {"half_copy": 1},
}


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.standard_normal((n, DIM), dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def build(directory: Path, docs: int, nlist: int, seed: int = 0) -> None:
    """An index directory of ``docs`` random vectors with the bench's metadata, fields indexed."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    plan = plan_index(docs, nlist=nlist, flat_below=1000, storage="float32")
    index = build_index(unit_rows(rng, min(docs, 100 * nlist)), plan)
    store = DocumentStore(directory / STORE_FILE)
    step = 50_000
    for lo in tqdm(range(0, docs, step), desc="documents", unit="batch"):
        meta = [{"group": i % 100, "half": i % 2} for i in range(lo, min(docs, lo + step))]
        batch = [Document(f"d{lo + j}", "text", m | {"group_copy": m["group"], "half_copy": m["half"]})
                 for j, m in enumerate(meta)]  # fmt: skip
        ids, _ = store.upsert(batch)
        add(index, unit_rows(rng, len(batch)), np.asarray(ids, dtype=np.int64))
    for field in ("group", "half"):
        store.add_field_index(field)
    store.close()
    save_index(index, directory / INDEX_FILE)
    manifest = {"kind": "index", "dim": DIM, "index_type": plan.index_type, "nlist": plan.nlist, "nprobe": 5}
    atomic_write_json(directory / "manifest.json", manifest | {"bundle": {}})


def measure(index: LiveIndex, queries: np.ndarray, rounds: int) -> dict[str, dict[str, float]]:
    """p50 and p95 milliseconds per query of each candidate, and hits returned (k = 10); the
    candidates take turns on every query, in an order that rotates."""
    seconds: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    hits: dict[str, list[int]] = {name: [] for name in CANDIDATES}
    names = list(CANDIDATES)
    first: dict[str, float] = {}
    for name in names:  # with no match set cached: what the first search after a write costs
        index.store.matches = MatchCache()
        start = time.perf_counter()
        index.search(queries[:1], 10, where=CANDIDATES[name])
        first[name] = time.perf_counter() - start
    for q, query in enumerate(tqdm(queries, desc="queries", unit="q")):
        for r in range(rounds):
            shift = (q + r) % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                found = index.search(query[None], 10, where=CANDIDATES[name])[0]
                seconds[name].append(time.perf_counter() - start)
                hits[name].append(len(found))
    base = statistics.median(seconds["no filter"])
    return {
        name: {
            "p50_ms": 1000 * statistics.median(times),
            "p95_ms": 1000 * float(np.percentile(times, 95)),
            "ratio": statistics.median(times) / base,
            "first_ms": 1000 * first[name],
            "mean_hits": float(np.mean(hits[name])),
        }
        for name, times in seconds.items()
    }


def measure_http(directory: Path, queries: np.ndarray, log: Path) -> dict[str, dict[str, dict[str, float]]]:
    """The same candidates through ``POST /search`` of ``distilembed serve`` on the same index: by
    vector (the index's share of a request) and by text (what a user's search costs)."""
    port = free_port()
    cmd = [str(ROOT / ".venv" / "bin" / "distilembed"), "serve", "--bundle", str(ROOT / "models" / "default"),
           "--index", str(directory), "--port", str(port)]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    out: dict[str, dict[str, dict[str, float]]] = {}
    with server(cmd, f"{base}/ready", log), httpx.Client(base_url=base, timeout=30) as client:
        for mode in ("vector", "text"):
            seconds: dict[str, list[float]] = {name: [] for name in CANDIDATES}
            names = list(CANDIDATES)
            for q, vector in enumerate(tqdm(queries, desc=f"http {mode}", unit="q")):
                shift = q % len(names)
                for name in names[shift:] + names[:shift]:
                    body: dict[str, Any] = {"top_k": 10, "filter": CANDIDATES[name]}
                    body |= (
                        {"vector": vector.tolist()} if mode == "vector" else {"query": TEXTS[q % len(TEXTS)]}
                    )
                    start = time.perf_counter()
                    answer = client.post("/search", json=body)
                    seconds[name].append(time.perf_counter() - start)
                    answer.raise_for_status()
            unfiltered = statistics.median(seconds["no filter"])
            out[mode] = {
                name: {"p50_ms": 1000 * statistics.median(t), "ratio": statistics.median(t) / unfiltered}
                for name, t in seconds.items()
            }
    return out


TEXTS = ["how do plants grow", "the history of rome", "a kitten naps on the sofa", "rules of chess"]


def render(
    figures: dict[str, dict[str, float]],
    http: dict[str, dict[str, dict[str, float]]],
    args: argparse.Namespace,
) -> str:
    rows = [
        (
            name,
            f"{f['p50_ms']:.2f} / **{f['ratio']:.2f}x**",
            f"{f['p95_ms']:.2f}",
            *(f"{http[m][name]['p50_ms']:.2f} / **{http[m][name]['ratio']:.2f}x**" for m in http),
            f"{f['first_ms']:.1f}",
            f"{f['mean_hits']:.1f}",
        )
        for name, f in figures.items()
    ]
    over_http = tuple(f"`POST /search` by {mode}: p50 ms / ratio" for mode in http)
    header = (
        "filter",
        "in-process p50 ms / ratio",
        "p95 ms",
        *over_http,
        "first search after a write, ms",
        "hits",
    )
    table = markdown_table(header, rows, "l" + "r" * (len(header) - 1))
    command = f"python bench/filters.py --docs {args.docs} --nlist {args.nlist} --queries {args.queries}"
    return (
        f"`{command}`: {args.docs:,} random 128-d vectors, IVF {args.nlist} lists at nprobe 5, one query "
        "a call through `LiveIndex.search` (filter, vector search and document fetch). A filter's match "
        "set is cached until the next write (index/filter_cache.py): the p50 columns are searches with "
        "it warm, the next column the first search after a write. Over HTTP: `distilembed serve` on the "
        "same index, one keep-alive client, by vector and by a short text (the encoder's share).\n\n" + table
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="Timed calls of each candidate per query.")
    parser.add_argument("--no-http", action="store_true", help="Skip the phase through distilembed serve.")
    parser.add_argument("--dir", type=Path, help="Keep the built index here (reused when it exists).")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "filters.json")
    parser.add_argument("--no-doc", action="store_true", help="Neither docs/results.md nor the JSON.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-filters-") as tmp:
        directory = args.dir or Path(tmp) / "index"
        if not directory.exists():
            build(directory, args.docs, args.nlist)
        index = LiveIndex(directory, writable=False)
        try:
            queries = unit_rows(np.random.default_rng(1), args.queries)
            figures = measure(index, queries, args.rounds)
        finally:
            index.close(checkpoint=False)
        http = {} if args.no_http else measure_http(directory, queries, Path(tmp) / "serve.log")
    body = render(figures, http, args)
    print(body)
    if not args.no_doc:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"run": run_info(__file__, sys.argv[1:]), "figures": figures}, indent=2)
        )
        rewrite_block(ROOT / "docs" / "results.md", "filters", body)


if __name__ == "__main__":
    main()
