"""Ray Serve (``distilembed serve --engine ray``) against plain ``distilembed serve`` on this machine.

Each setup is started through the CLI on a free 127.0.0.1 port with a fresh index (``--create-index``,
then ``--docs`` STS-B sentences upserted through the API) and measured with the httpx closed-loop
client of bench/http_harness.py, every phase bounded by --requests and --duration:
  * /v1/embeddings, one sentence per request: p50/p95/p99 at concurrency 1, req/s at concurrency 8;
  * /search (a query text, top 10): p50 at concurrency 1;
  * Ray with 2 replicas only: --writes upserts, each followed at once by searches for it on new
    connections (so either replica may answer): how many found it.
Setups: plain; Ray with 1 replica (2 CPUs, 2 threads); Ray with 2 replicas (1 CPU, 1 thread each);
in --rounds rounds, one server up at a time, the order rotating each round (this machine's speed
drifts: each Ray figure is compared with the plain run of its own round, and the median of those
ratios is reported). Once, in the first round: Ray with 1 replica behind Ray's Python proxy instead
of HAProxy (--no-python-proxy skips it).
Then, in-process on a --reload-vectors index: what a read-only copy's refresh costs (nothing new;
one new write; a reload after a checkpoint). A table is printed; JSON goes to runs/.

    python bench/ray_serve.py                                   # ~8 minutes on 2 cores
    python bench/ray_serve.py --rounds 1 --requests 100 --duration 3 --docs 200 --no-python-proxy  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_harness import Request, closed_loop, free_port, server  # noqa: E402
from serve import sts_sentences  # noqa: E402

SETUPS: dict[str, tuple[list[str], dict[str, str]]] = {
    "plain": ([], {}),
    "ray 1 replica": (["--engine", "ray", "--replicas", "1", "--replica-cpus", "2"], {}),
    "ray 2 replicas": (["--engine", "ray", "--replicas", "2", "--replica-cpus", "1"], {}),
    "ray 1 replica, Python proxy": (
        ["--engine", "ray", "--replicas", "1", "--replica-cpus", "2"],
        {"DISTILEMBED_RAY_HAPROXY": "false"},
    ),
}


def serve_cmd(args: argparse.Namespace, port: int, index: Path, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "distilembed.cli", "serve", "--bundle", str(args.bundle)]
    cmd += ["--index", str(index), "--create-index", "--host", "127.0.0.1", "--port", str(port)]
    return [*cmd, "--log-level", "warning", *extra]


def phase(
    base: str, make: Callable[[int], tuple[str, Request]], concurrency: int, args: argparse.Namespace
) -> dict:
    return asyncio.run(closed_loop(base, make, concurrency, args.requests, args.duration)).summary()


def fill(base: str, sentences: list[str], n: int) -> None:
    with httpx.Client(base_url=base, timeout=120) as client:
        for lo in range(0, n, 64):
            docs = [{"id": f"s{i}", "text": sentences[i]} for i in range(lo, min(n, lo + 64))]
            client.post("/documents", json={"documents": docs}).raise_for_status()


def propagation(base: str, writes: int, reads: int) -> dict[str, Any]:
    """Upsert a new document, then search for it right away on fresh connections, ``writes`` times."""
    found = total = 0
    started = time.perf_counter()
    for w in range(writes):
        text = f"Write number {w} of the propagation check, about the number {w * 7919}."
        doc = {"id": f"prop-{w}", "text": text, "metadata": {"prop": w}}
        httpx.post(f"{base}/documents", json={"documents": [doc]}, timeout=60).raise_for_status()
        for _ in range(reads):  # a new connection each time: HAProxy may pick either replica
            body = {"query": text, "top_k": 1, "filter": {"prop": w}}
            hits = httpx.post(f"{base}/search", json=body, timeout=60).json()["results"]
            found += bool(hits) and hits[0]["id"] == doc["id"]
            total += 1
    return {
        "writes": writes,
        "searches": total,
        "found_at_once": found,
        "seconds": round(time.perf_counter() - started, 2),
    }


def measure(name: str, args: argparse.Namespace, sentences: list[str]) -> dict[str, Any]:
    extra, env = SETUPS[name]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the server inherits it
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            started = time.perf_counter()
            log = args.log_dir / f"{name.replace(' ', '_').replace(',', '')}.log"
            with server(serve_cmd(args, port, Path(tmp) / "index", extra), f"{base}/ready", log):
                out: dict[str, Any] = {"ready_s": round(time.perf_counter() - started, 1)}
                fill(base, sentences, args.docs)

                def embed(i: int) -> tuple[str, Request]:
                    return "embed", ("POST", "/v1/embeddings", {"input": [sentences[i % len(sentences)]]})

                def search(i: int) -> tuple[str, Request]:
                    return "search", (
                        "POST",
                        "/search",
                        {"query": sentences[-1 - i % len(sentences)], "top_k": 10},
                    )

                asyncio.run(closed_loop(base, embed, 8, 200, 10))  # warm-up: arenas, connections, caches
                out["embed_c1"] = phase(base, embed, 1, args)
                out["embed_c8"] = phase(base, embed, 8, args)
                out["search_c1"] = phase(base, search, 1, args)
                if name == "ray 2 replicas" and args.writes:
                    out["propagation"] = propagation(base, args.writes, 4)
                    args.writes = 0  # once is enough
            return out
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def refresh_costs(n: int, dim: int = 128) -> dict[str, Any]:
    """A writer and a read-only copy of an n-vector flat index in this process: refresh() costs."""
    from distilembed.artifacts import atomic_write_json
    from index.live import INDEX_FILE, STORE_FILE, LiveIndex
    from index.store import Document, DocumentStore
    from index.vectors import IndexPlan, add, build_index, save_index

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with tempfile.TemporaryDirectory(prefix="bench-refresh-") as tmp:
        directory = Path(tmp)
        store = DocumentStore(directory / STORE_FILE)
        ids, _ = store.upsert([Document(f"d{i}", "t") for i in range(n)])
        store.close()
        index = build_index(vectors[:1], IndexPlan("flat", 0, "bench"))
        add(index, vectors, np.asarray(ids, dtype=np.int64))
        save_index(index, directory / INDEX_FILE)
        atomic_write_json(
            directory / "manifest.json",
            {"kind": "index", "dim": dim, "index_type": "flat", "nlist": 0, "nprobe": 1},
        )
        writer, reader = LiveIndex(directory), LiveIndex(directory, writable=False)

        def timed(fn: Callable[[], Any], repeat: int) -> float:
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return float(np.median(times))

        nothing_us = timed(reader.refresh, 2000) * 1e6
        one = []
        for i in range(200):
            writer.upsert([Document(f"new{i}", "t")], vectors[i : i + 1])
            start = time.perf_counter()
            reader.refresh()
            one.append(time.perf_counter() - start)
        reloads = []
        for i in range(5):
            writer.upsert([Document(f"ck{i}", "t")], vectors[i : i + 1])
            writer.checkpoint()
            start = time.perf_counter()
            reader.refresh()
            reloads.append(time.perf_counter() - start)
        assert reader.ntotal == writer.ntotal
        reader.close()
        writer.close()
    return {
        "vectors": n,
        "refresh_nothing_new_us": round(nothing_us, 1),
        "refresh_one_write_us": round(float(np.median(one)) * 1e6, 1),
        "refresh_after_checkpoint_ms": round(float(np.median(reloads)) * 1e3, 1),
    }


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per setup: the median over rounds of each figure, and of the ratio to plain in the same round."""

    def median(values: list[float]) -> float:
        return round(float(np.median(values)), 2)

    out: dict[str, Any] = {}
    for name in rounds[0]:
        runs = [(r[name], r["plain"]) for r in rounds if name in r]
        out[name] = {
            "rounds": len(runs),
            "c1_p50_ms": median([m["embed_c1"]["p50_ms"] for m, _ in runs]),
            "c1_p99_ms": median([m["embed_c1"]["p99_ms"] for m, _ in runs]),
            "c1_p50_vs_plain": median([m["embed_c1"]["p50_ms"] / p["embed_c1"]["p50_ms"] for m, p in runs]),
            "c8_rps": median([m["embed_c8"]["rps"] for m, _ in runs]),
            "c8_rps_vs_plain": median([m["embed_c8"]["rps"] / p["embed_c8"]["rps"] for m, p in runs]),
            "search_c1_p50_ms": median([m["search_c1"]["p50_ms"] for m, _ in runs]),
            "ready_s": median([m["ready_s"] for m, _ in runs]),
            "non_2xx": sum(
                n
                for m, _ in runs
                for ph in ("embed_c1", "embed_c8", "search_c1")
                for k, n in m[ph]["statuses"].items()
                if not k.startswith("2")
            ),
        }
    return out


def report(results: dict[str, Any]) -> None:
    table = Table(title="Ray Serve vs plain serve (models/default, 127.0.0.1; medians over rounds)")
    cols = (
        "setup",
        "rounds",
        "ready s",
        "c1 p50 ms",
        "c1 p99 ms",
        "c1 p50 / plain",
        "c8 req/s",
        "c8 / plain",
    )
    for col in (*cols, "search c1 p50 ms", "non-2xx"):
        table.add_column(col, justify="left" if col == "setup" else "right")
    for name, r in results["summary"].items():
        table.add_row(
            name, str(r["rounds"]), str(r["ready_s"]), str(r["c1_p50_ms"]), str(r["c1_p99_ms"]),
            f"{r['c1_p50_vs_plain']:.2f}x", str(r["c8_rps"]), f"{r['c8_rps_vs_plain']:.2f}x",
            str(r["search_c1_p50_ms"]), str(r["non_2xx"]),
        )  # fmt: skip
    Console(width=170).print(table)
    Console().print({"refresh": results["refresh"], "propagation (ray 2 replicas)": results["propagation"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "models" / "default")
    parser.add_argument("--requests", type=int, default=2000, help="most requests per phase")
    parser.add_argument("--duration", type=float, default=15.0, help="most seconds per phase")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of plain, ray 1 and ray 2 replicas")
    parser.add_argument("--docs", type=int, default=1000, help="documents upserted before the phases")
    parser.add_argument("--writes", type=int, default=25, help="propagation check: writes, 4 searches each")
    parser.add_argument("--reload-vectors", type=int, default=100_000, help="refresh costs: index size")
    parser.add_argument("--no-python-proxy", action="store_true", help="skip Ray with its Python proxy")
    data = Path(os.environ.get("DISTILEMBED_DATA_DIR", ROOT.parent / "shared" / "data"))
    parser.add_argument("--sts-file", type=Path, default=data / "sts" / "stsbenchmark" / "sts-test.csv")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "ray_serve.json")
    args = parser.parse_args()
    os.environ.pop("RAY_ADDRESS", None)  # only ever a cluster this benchmark starts
    args.log_dir = Path(tempfile.mkdtemp(prefix="bench-ray-serve-logs-"))
    sentences = sts_sentences(args.sts_file)
    results: dict[str, Any] = {
        "meta": {
            "bundle": str(args.bundle), "cores": os.cpu_count(), "requests_cap": args.requests,
            "duration_cap_s": args.duration, "docs": args.docs, "client": "httpx closed loop",
            "rounds": args.rounds,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "rounds": [],
    }  # fmt: skip
    main_setups = [n for n in SETUPS if "Python" not in n]
    for r in range(args.rounds):
        names = main_setups[r % 3 :] + main_setups[: r % 3]  # rotate the order
        if r == 0 and not args.no_python_proxy:
            names.append("ray 1 replica, Python proxy")
        measured: dict[str, Any] = {}
        for name in names:
            print(f"-- round {r + 1}: {name}", flush=True)
            measured[name] = measure(name, args, sentences)
            if "propagation" in measured[name]:
                results["propagation"] = measured[name].pop("propagation")
        results["rounds"].append(measured)
    results["summary"] = summarise(results["rounds"])
    results["refresh"] = refresh_costs(args.reload_vectors)
    report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out} (server logs in {args.log_dir})")


if __name__ == "__main__":
    main()
