"""Beyond one machine, on this machine: the Ray engine against the local one, in one run, one table.

    python bench/scale.py                        # ~25 minutes on 2 cores; JSON to docs/results/scale.json
    python bench/scale.py --docs 20000 --rounds 1 --requests 200 --duration 3 --queries 200   # smoke

Three parts, all through the CLI a user runs, on 127.0.0.1 and a Ray cluster this script starts:
  * build: ``index build`` of the first --docs Wikipedia sentences with ``--engine local``, then
    ``--engine ray``: docs/s and their ratio; ntotal, ids, vectors and top-10 of --queries queries
    compared (bench/scale_build.py);
  * serve: plain ``serve`` against ``serve --engine ray`` with 1 and 2 replicas, one sentence per
    request: p50 at concurrency 1 and req/s at 8, in --rounds rotating rounds (bench/ray_serve.py);
  * shards: the local build's index cut into 2 shards (``index shard``) against the whole index:
    in-process searches of --queries held-out sentences (one at a time, and as one batch; QPS in
    interleaved rounds, top-10 compared), then over HTTP, plain ``serve`` of the whole index against
    ``serve --engine ray`` of the shards (one IndexShard deployment each): search p50 and top-10.

Rewrites the block ``scale`` of docs/results.md (--no-doc: not); ``--render-from JSON`` rewrites it
from an earlier run's JSON, measuring nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ray_serve as serve_bench  # noqa: E402
import scale_build  # noqa: E402
from harness import (  # noqa: E402
    add_doc_args,
    interleaved_seconds,
    markdown_table,
    publish,
    publish_saved,
    run_info,
)
from http_harness import closed_loop, free_port, server  # noqa: E402
from serve import sts_sentences  # noqa: E402

CLI = [sys.executable, "-m", "distilembed.cli"]


def build_part(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    corpus = scale_build.write_corpus(Path(args.source), args.docs, work / f"wiki-{args.docs}.txt")
    ns = argparse.Namespace(bundle=args.bundle, local_threads=os.cpu_count() or 1)
    out: dict[str, Any] = {}
    for engine in ("local", "ray"):
        print(f"-- build: {engine}", flush=True)
        wall, manifest = scale_build.run_build(
            scale_build.build_cmd(ns, corpus, work / engine, engine), work / f"{engine}.log"
        )
        out[engine] = {"wall_seconds": round(wall, 1), "docs_per_s": round(manifest["ntotal"] / wall, 1)}
    out["ray_over_local"] = round(out["ray"]["docs_per_s"] / out["local"]["docs_per_s"], 3)
    out["equality"] = scale_build.compare(work / "local", work / "ray", args.queries)
    return out


def serve_part(args: argparse.Namespace, sentences: list[str]) -> dict[str, Any]:
    ns = argparse.Namespace(
        bundle=Path(args.bundle), docs=1000, requests=args.requests, duration=args.duration, writes=0,
        log_dir=args.log_dir,
    )  # fmt: skip
    names = ["plain", "ray 1 replica", "ray 2 replicas"]
    rounds = []
    for r in range(args.rounds):
        measured = {}
        for name in names[r % 3 :] + names[: r % 3]:
            print(f"-- serve, round {r + 1}: {name}", flush=True)
            measured[name] = serve_bench.measure(name, ns, sentences)
        rounds.append(measured)
    return {"rounds": rounds, "summary": serve_bench.summarise(rounds)}


def held_out_queries(source: Path, skip: int, n: int) -> list[str]:
    """Sentences from past the built corpus: queries that are not documents of the index."""
    with gzip.open(source, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in itertools.islice(handle, skip, skip + n)]


def top10(hits: list[list[Any]]) -> list[list[tuple[str, float]]]:
    return [[(h.id, round(h.score, 4)) for h in row] for row in hits]


def shard_part(args: argparse.Namespace, whole: Path, work: Path) -> dict[str, Any]:
    from export.runtime import Encoder
    from index.live import LiveIndex
    from index.shards import open_sharded

    sharded_dir = work / "sharded-2"
    cmd = [*CLI, "index", "shard", "--index", str(whole), "--shards", "2", "--out", str(sharded_dir)]
    subprocess.run([*cmd, "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    texts = held_out_queries(Path(args.source), args.docs + 10_000, args.queries)
    queries = Encoder(args.bundle, threads=os.cpu_count()).encode(texts)
    indexes = {
        "unsharded": LiveIndex(whole, writable=False),
        "2 shards": open_sharded(sharded_dir, queries.shape[1]),
    }
    answers = {name: top10(ix.search(queries, 10)) for name, ix in indexes.items()}
    calls = {}
    for name, ix in indexes.items():
        calls[f"{name}, one query a call"] = lambda ix=ix: [
            ix.search(queries[i : i + 1], 10) for i in range(len(queries))
        ]
        calls[f"{name}, one batch"] = lambda ix=ix: ix.search(queries, 10)
    seconds = interleaved_seconds(calls, args.timing_rounds, desc="shard timing")
    out: dict[str, Any] = {
        "queries": len(queries),
        "same_top10": sum(a == b for a, b in zip(answers["unsharded"], answers["2 shards"], strict=True)),
        "qps": {name: round(len(queries) / float(np.median(s)), 1) for name, s in seconds.items()},
    }
    for ix in indexes.values():
        ix.close()
    out["http"] = http_shards(args, whole, sharded_dir, texts[: args.http_queries])
    return out


def http_shards(args: argparse.Namespace, whole: Path, sharded: Path, texts: list[str]) -> dict[str, Any]:
    """Plain serve of the whole index against Ray Serve of its shards: the same top-10, p50."""
    setups = {
        "plain, whole index": (whole, []),
        "ray, 2 shard deployments": (sharded, ["--engine", "ray", "--replicas", "1", "--replica-cpus", "1"]),
    }
    out: dict[str, Any] = {}
    answers = {}
    for name, (index_dir, extra) in setups.items():
        print(f"-- shards over HTTP: {name}", flush=True)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        cmd = [*CLI, "serve", "--bundle", str(args.bundle), "--index", str(index_dir), "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--log-level", "warning", *extra]
        with server(cmd, f"{base}/ready", args.log_dir / f"{name.replace(' ', '_').replace(',', '')}.log"):
            with httpx.Client(base_url=base, timeout=60) as client:
                answers[name] = [
                    [
                        (h["id"], round(h["score"], 4))
                        for h in client.post("/search", json={"query": t}).json()["results"]
                    ]
                    for t in texts
                ]

            def search(i: int) -> tuple[str, tuple[str, str, dict[str, Any]]]:
                return "search", ("POST", "/search", {"query": texts[i % len(texts)], "top_k": 10})

            asyncio.run(closed_loop(base, search, 1, 100, 5))  # warm-up
            out[name] = asyncio.run(closed_loop(base, search, 1, args.requests, args.duration)).summary()
    first, second = answers.values()
    out["same_top10"] = sum(a == b for a, b in zip(first, second, strict=True))
    out["queries"] = len(texts)
    return out


def table(result: dict[str, Any]) -> Table:
    t = Table(title=f"Ray against local on {result['meta']['cores']} cores (bench/scale.py)")
    for col in ("part", "setup", "figure", "value", "vs baseline", "same results"):
        t.add_column(col, justify="left" if col in ("part", "setup", "figure") else "right")
    b = result["build"]
    same = b["equality"]
    same_s = f"ids {same['same_ids']}, top-10 {same['same_top10']}/{same['queries']}"
    for engine in ("local", "ray"):
        ratio = b[engine]["docs_per_s"] / b["local"]["docs_per_s"]
        t.add_row(f"build {result['meta']['docs']:,}", engine, "docs/s", f"{b[engine]['docs_per_s']:.0f}",
                  f"{ratio:.3f}", same_s if engine == "ray" else "")  # fmt: skip
    for name, s in result["serve"]["summary"].items():
        base = name == "plain"
        t.add_row(
            "serve",
            name,
            "c1 p50 ms",
            f"{s['c1_p50_ms']:.2f}",
            "1" if base else f"{s['c1_p50_vs_plain']:.2f}",
            "",
        )
        t.add_row(
            "serve",
            name,
            "c8 req/s",
            f"{s['c8_rps']:.0f}",
            "1" if base else f"{s['c8_rps_vs_plain']:.2f}",
            "",
        )
    sh = result["shards"]
    for what in ("one query a call", "one batch"):
        whole = sh["qps"][f"unsharded, {what}"]
        for name in ("unsharded", "2 shards"):
            qps = sh["qps"][f"{name}, {what}"]
            same_s = f"top-10 {sh['same_top10']}/{sh['queries']}" if name != "unsharded" else ""
            t.add_row(
                "shards (in-process)", f"{name}, {what}", "QPS", f"{qps:.0f}", f"{qps / whole:.2f}", same_s
            )
    http = sh["http"]
    p50 = http["plain, whole index"]["p50_ms"]
    for name in ("plain, whole index", "ray, 2 shard deployments"):
        same_s = f"top-10 {http['same_top10']}/{http['queries']}" if name.startswith("ray") else ""
        t.add_row("shards (HTTP)", name, "search c1 p50 ms", f"{http[name]['p50_ms']:.2f}",
                  f"{http[name]['p50_ms'] / p50:.2f}", same_s)  # fmt: skip
    return t


def render(result: dict[str, Any]) -> str:
    meta, b, sh = result["meta"], result["build"], result["shards"]
    same = b["equality"]
    kept = [name for name in ("ids", "vectors") if same.get(f"same_{name}")]
    build = f"build {meta['docs']:,}"
    rows = [
        [build, "local", "docs/s", f"{b['local']['docs_per_s']:,.0f}", "1.000", ""],
        [build, "ray", "docs/s", f"{b['ray']['docs_per_s']:,.0f}", f"**{b['ray_over_local']:.3f}**",
         f"{', '.join(kept)}; top-10 {same['same_top10']:,}/{same['queries']:,}"],
    ]  # fmt: skip
    for name, s in result["serve"]["summary"].items():
        vs = "1 / 1" if name == "plain" else f"**{s['c1_p50_vs_plain']:.2f}** / {s['c8_rps_vs_plain']:.2f}"
        rows.append(
            ["serve", name, "c1 p50 ms / c8 req/s", f"{s['c1_p50_ms']:.2f} / {s['c8_rps']:.0f}", vs, ""]
        )
    for what in ("one query a call", "one batch"):
        whole, cut = sh["qps"][f"unsharded, {what}"], sh["qps"][f"2 shards, {what}"]
        qps, same_top = f"{whole:,.0f} / {cut:,.0f}", f"top-10 {sh['same_top10']:,}/{sh['queries']:,}"
        label = f"unsharded / 2 shards, {what}"
        rows.append(["shards (in-process)", label, "QPS", qps, f"{cut / whole:.2f}", same_top])
    http = sh["http"]
    plain, ray = (http[k]["p50_ms"] for k in ("plain, whole index", "ray, 2 shard deployments"))
    same_top = f"top-10 {http['same_top10']}/{http['queries']}"
    label, p50 = "plain whole index / Ray, 2 shard deployments", f"{plain:.2f} / {ray:.2f}"
    rows.append(["shards (HTTP)", label, "search c1 p50 ms", p50, f"{ray / plain:.2f}", same_top])
    setup = (
        f"{meta['cores']} cores; `vs baseline` is against local / plain `serve` / the unsharded index. Serve "
        f"figures are medians over {meta['rounds']} rotating rounds of one sentence per request (each Ray "
        "figure divided by the plain run of its own round)."
    )
    header = ("part", "setup", "figure", "value", "vs baseline", "same results")
    return f"{setup}\n\n{markdown_table(header, rows, 'lllrrl')}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = Path(os.environ.get("DISTILEMBED_DATA_DIR", ROOT.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "models" / "default"))
    parser.add_argument("--source", default=str(data / "unlabeled" / "enwiki2015_1m_sentences.txt.gz"))
    parser.add_argument("--sts-file", type=Path, default=data / "sts" / "stsbenchmark" / "sts-test.csv")
    parser.add_argument("--docs", type=int, default=200_000, help="Wikipedia sentences to build")
    parser.add_argument("--queries", type=int, default=1000, help="queries compared (build, shards)")
    parser.add_argument("--http-queries", type=int, default=200, help="shards over HTTP: queries compared")
    parser.add_argument("--rounds", type=int, default=3, help="serve: rotating rounds of the three setups")
    parser.add_argument("--requests", type=int, default=2000, help="most requests per serve phase")
    parser.add_argument("--duration", type=float, default=15.0, help="most seconds per serve phase")
    parser.add_argument("--timing-rounds", type=int, default=5, help="shards: interleaved timing rounds")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "scale")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "scale.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "scale", render):
        return
    os.environ.pop("RAY_ADDRESS", None)  # only ever a cluster this benchmark starts
    args.work.mkdir(parents=True, exist_ok=True)
    args.log_dir = Path(tempfile.mkdtemp(prefix="bench-scale-logs-"))
    sentences = sts_sentences(args.sts_file)
    result: dict[str, Any] = {
        "meta": {"docs": args.docs, "bundle": args.bundle, "cores": os.cpu_count(), "rounds": args.rounds,
                 "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
    }  # fmt: skip
    result["build"] = build_part(args, args.work)
    result["serve"] = serve_part(args, sentences)
    result["shards"] = shard_part(args, args.work / "local", args.work)
    result["run"] = run_info("bench/scale.py", argv)
    Console(width=150).print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} (server logs in {args.log_dir})")
    publish(args, result, args.out, "scale", render)


if __name__ == "__main__":
    main()
