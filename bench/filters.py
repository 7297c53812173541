"""Filtered search against unfiltered search, in one run, at up to a million documents. Block
``filters`` (bench/harness.py: --no-doc, --render-from); JSON to --json (default
docs/results/filters.json; with --no-doc nowhere unless --json says).

    python bench/filters.py --docs 1000000 --nlist 1024 --queries 200    # ~6 minutes on 2 cores

Random 128-d unit vectors (what a filter costs does not depend on what they mean) in an IVF of
--nlist lists at the default nprobe; every document has ``{"group": i % 100, "half": i % 2}``. Per
query (k = 10, one a call through ``LiveIndex.search``: the index, the filter and the document fetch
the service runs), the p50 of: no filter; a filter that 1% and one that 50% of documents pass, on
indexed fields; the same two on fields without a payload index. The candidates take turns on every
query, so a slow moment of the machine costs all alike. Then the same through ``POST /search`` of
``distilembed serve`` on the index, by vector and by text (--no-http: not).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import harness as h
import httpx
import numpy as np
from http_load import json_out, save, serving
from tqdm import tqdm

from distilembed.artifacts import atomic_write_json
from index.filter_cache import MatchCache
from index.live import INDEX_FILE, STORE_FILE, LiveIndex
from index.store import Document, DocumentStore
from index.vectors import add, build_index, plan_index, save_index

DIM = 128
CANDIDATES = {
    "no filter": None,
    "1%, indexed": {"group": 7},
    "50%, indexed": {"half": 1},
    "1%, not indexed": {"group_copy": 7},
    "50%, not indexed": {"half_copy": 1},
}
TEXTS = ["how do plants grow", "the history of rome", "a kitten naps on the sofa", "rules of chess"]


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    return h.unit_rows(rng.standard_normal((n, DIM), dtype=np.float32))


def build(directory: Path, docs: int, nlist: int, seed: int = 0) -> None:
    """An index directory of ``docs`` random vectors with the bench's metadata, fields indexed."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    plan = plan_index(docs, nlist=nlist, flat_below=1000, storage="float32")
    index = build_index(unit_rows(rng, min(docs, 100 * nlist)), plan)
    store = DocumentStore(directory / STORE_FILE)
    for lo in tqdm(range(0, docs, 50_000), desc="documents", unit="batch"):
        meta = [{"group": i % 100, "half": i % 2} for i in range(lo, min(docs, lo + 50_000))]
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


def turns(n_queries: int, rounds: int) -> list[tuple[int, str]]:
    """(query, candidate) in the timed order: every candidate on every query, the order rotating."""
    names = list(CANDIDATES)
    shifts = [(q, (q + r) % len(names)) for q in range(n_queries) for r in range(rounds)]
    return [(q, name) for q, s in shifts for name in names[s:] + names[:s]]


def measure(index: LiveIndex, queries: np.ndarray, rounds: int) -> dict[str, dict[str, float]]:
    """p50 and p95 milliseconds per query of each candidate, and hits returned (k = 10)."""
    seconds: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    hits: dict[str, list[int]] = {name: [] for name in CANDIDATES}
    first: dict[str, float] = {}
    for name, where in CANDIDATES.items():  # with no match set cached: the first search after a write
        index.store.matches = MatchCache()
        start = time.perf_counter()
        index.search(queries[:1], 10, where=where)
        first[name] = time.perf_counter() - start
    for q, name in tqdm(turns(len(queries), rounds), desc="searches"):
        start = time.perf_counter()
        found = index.search(queries[q][None], 10, where=CANDIDATES[name])[0]
        seconds[name].append(time.perf_counter() - start)
        hits[name].append(len(found))
    figures = p50_ratios(seconds)
    for name, f in figures.items():
        f |= {"p95_ms": 1000 * float(np.percentile(seconds[name], 95)), "first_ms": 1000 * first[name]}
        f["mean_hits"] = float(np.mean(hits[name]))
    return figures


def p50_ratios(seconds: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each candidate's p50 milliseconds, and its ratio to the unfiltered one's."""
    base = median(seconds["no filter"])
    return {name: {"p50_ms": 1000 * median(t), "ratio": median(t) / base} for name, t in seconds.items()}


def measure_http(
    directory: Path, queries: np.ndarray, bundle: Path, log: Path
) -> dict[str, dict[str, dict[str, float]]]:
    """The same candidates through ``POST /search`` of ``distilembed serve`` on the same index: by
    vector (the index's share of a request) and by text (what a user's search costs)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    with (
        serving(bundle, ["--index", str(directory)], log) as (base, _),
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        for mode in ("vector", "text"):
            seconds: dict[str, list[float]] = {name: [] for name in CANDIDATES}
            for q, name in tqdm(turns(len(queries), 1), desc=f"http {mode}"):
                body: dict[str, Any] = {"top_k": 10, "filter": CANDIDATES[name]}
                body |= {"vector": queries[q].tolist()} if mode == "vector" else {"query": TEXTS[q % 4]}
                start = time.perf_counter()
                answer = client.post("/search", json=body)
                seconds[name].append(time.perf_counter() - start)
                answer.raise_for_status()
            out[mode] = p50_ratios(seconds)
    return out


def render(result: dict[str, Any]) -> str:
    # A JSON written before the run recorded its sizes: they are read back from its command.
    meta = result.get("meta") or vars(parse_args(shlex.split(result["run"]["command"])[2:]))
    figures, http = result["figures"], result.get("http", {})

    def p50(f: dict[str, float]) -> str:
        return f"{f['p50_ms']:.2f} / **{f['ratio']:.2f}x**"

    rows = []
    for name, f in figures.items():
        cells = [p50(f), f"{f['p95_ms']:.2f}", *(p50(http[mode][name]) for mode in http)]
        rows.append((name, *cells, f"{f['first_ms']:.1f}", f"{f['mean_hits']:.1f}"))
    over_http = tuple(f"`POST /search` by {mode}: p50 ms / ratio" for mode in http)
    header = ("filter", "in-process p50 ms / ratio", "p95 ms", *over_http)
    table = h.markdown_table((*header, "first search after a write, ms", "hits"), rows)
    return (
        f"{meta['docs']:,} random 128-d vectors, IVF {meta['nlist']} lists at nprobe 5, {meta['queries']} "
        "queries, one a call through `LiveIndex.search` (filter, vector search and document fetch). A "
        "filter's match set is cached until the next write (index/filter_cache.py): the p50 columns are "
        "searches with it warm, the next column the first search after a write."
        + (" Over HTTP: `distilembed serve` on the same index, one keep-alive client, by vector and by a "
           "short text (the encoder's share)." if http else "")
        + f"\n\n{table}"
    )  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arg = parser.add_argument
    arg("--docs", type=int, default=1_000_000)
    arg("--nlist", type=int, default=1024)
    arg("--queries", type=int, default=200)
    arg("--rounds", type=int, default=3, help="timed calls of each candidate per query")
    arg("--bundle", type=Path, default=h.ROOT / "models" / "default", help="for the HTTP phase")
    arg("--no-http", action="store_true", help="skip the phase through distilembed serve")
    arg("--dir", type=Path, help="keep the built index here (reused when it exists)")
    arg("--json", type=Path, help="results JSON (default docs/results/filters.json)")
    h.add_doc_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if h.publish_saved(args, "filters", render):
        return
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
        http = {} if args.no_http else measure_http(directory, queries, args.bundle, Path(tmp) / "serve.log")
    meta = {"docs": args.docs, "nlist": args.nlist, "queries": args.queries, "rounds": args.rounds}
    result = {"run": h.run_info("bench/filters.py", argv), "meta": meta, "figures": figures, "http": http}
    save(args, result, json_out(args, h.RESULTS / "filters.json"), "filters", render)


if __name__ == "__main__":
    main()
