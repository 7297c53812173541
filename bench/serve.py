"""Serving benchmark: starts ``distilembed serve`` on 127.0.0.1 (a free port) and measures it over HTTP.

Default run, every phase bounded by --requests and --duration:
  * /v1/embeddings, one sentence per request: latency p50/p95/p99 at concurrency 1, 8 and 32;
  * sentences/s at concurrency 32 with 16-sentence requests, against the in-process encoder on the
    same texts (the serving overhead ratio);
  * /search QPS at concurrency 8 (with --index);
  * --infinity: infinity-emb serving all-MiniLM-L6-v2 ONNX int8 vs this server, requests/s with
    8 clients sending one sentence each, in --peer-rounds alternating rounds (median ratio);
    skipped with a note when infinity_emb is not installed.
--load: --duration seconds (default 120) at concurrency 32 mixing embed, search and upsert (on a
temporary copy of --index), counting 5xx and the server's RSS at start and end; then the server is
killed with SIGKILL, restarted on the same index, and every document it held is looked up again.

    python bench/serve.py --bundle models/default --requests 50 --duration 5        # smoke
    python bench/serve.py --bundle models/default --index runs/index --name default
    python bench/serve.py --bundle models/default --index runs/index --load --name default

Each run rewrites its block of docs/results.md (``serve``, or ``serve-load`` with --load; --no-doc:
not); ``--render-from JSON`` rewrites it from an earlier run's JSON, measuring nothing. JSON goes to
--json (default docs/results/serve-NAME.json, or serve-NAME-load.json; with --no-doc nowhere unless
--json says).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import wrk_client  # noqa: E402
from harness import add_doc_args, publish, publish_saved, run_info  # noqa: E402
from http_harness import Phase, Request, closed_loop, free_port, rss_bytes, server  # noqa: E402
from serve_report import block_name, render, report  # noqa: E402

RESULTS_DIR = ROOT / "docs" / "results"


def sts_sentences(path: Path) -> list[str]:
    """Both sentences of every STS-B test row (tab separated, columns 6 and 7), first occurrence order."""
    if not path.is_file():
        sys.exit(f"STS-B test file not found: {path} (set DISTILEMBED_DATA_DIR or pass --sts-file)")
    seen: dict[str, None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) >= 7:
            seen.update(dict.fromkeys(c.strip() for c in cols[5:7] if c.strip()))
    return list(seen)


def run_phase(
    base: str, make: Callable[[int], tuple[str, Request]], concurrency: int, args: argparse.Namespace
) -> Phase | wrk_client.WrkPhase:
    if args.client == "wrk":  # same bodies, replayed by wrk for --duration seconds
        requests = [make(i)[1] for i in range(min(args.requests, 2000))]
        assert {(m, p) for m, p, _ in requests} == {("POST", requests[0][1])}, "wrk phases: one POST route"
        bodies = [body or {} for _, _, body in requests]
        return wrk_client.run(base, requests[0][1], bodies, concurrency, args.duration)
    return asyncio.run(closed_loop(base, make, concurrency, args.requests, args.duration))


def embed_one(sentences: list[str], path: str = "/v1/embeddings", model: str | None = None) -> Callable:
    def make(i: int) -> tuple[str, Request]:
        body: dict[str, Any] = {"input": [sentences[i % len(sentences)]]}
        if model:
            body["model"] = model
        return "embed", ("POST", path, body)

    return make


def in_process_rate(args: argparse.Namespace, texts: list[str]) -> float:
    from export.runtime import Encoder

    encoder = Encoder(args.bundle, variant=args.variant, threads=args.threads)
    encoder.encode(texts[:64])  # warm-up
    start = time.perf_counter()
    encoder.encode(texts, batch_size=args.run_batch)
    return len(texts) / (time.perf_counter() - start)


def serve_cmd(args: argparse.Namespace, port: int, index: Path | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "distilembed.cli",
        "serve",
        "--bundle",
        str(args.bundle),
        "--variant",
        args.variant,
    ]
    cmd += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-batch",
        str(args.max_batch),
        "--run-batch",
        str(args.run_batch),
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.max_wait_ms is not None:
        cmd += ["--max-wait-ms", str(args.max_wait_ms)]
    return cmd + (["--index", str(index)] if index else [])


def standard(args: argparse.Namespace, sentences: list[str], results: dict[str, Any]) -> None:
    n_texts = min(len(sentences), args.requests * 16)
    results["in_process_sent_per_s"] = round(in_process_rate(args, sentences[:n_texts]), 1)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with server(serve_cmd(args, port, args.index), f"{base}/ready", args.log_dir / "serve.log"):
        for c in args.concurrency:
            results[f"embed_1_sentence_c{c}"] = run_phase(base, embed_one(sentences), c, args).summary()

        def batch16(i: int) -> tuple[str, Request]:
            lo = (i * 16) % max(1, n_texts - 16)
            return "embed16", ("POST", "/v1/embeddings", {"input": sentences[lo : lo + 16]})

        served = run_phase(base, batch16, 32, args).summary(items_per_request=16)
        results["embed_16_sentences_c32"] = served
        results["serving_overhead_ratio"] = round(
            results["in_process_sent_per_s"] / max(served["items_per_s"], 1e-9), 2
        )
        if args.index:

            def search(i: int) -> tuple[str, Request]:
                return "search", ("POST", "/search", {"query": sentences[i % len(sentences)], "top_k": 10})

            results["search_c8"] = run_phase(base, search, 8, args).summary()
        if args.infinity:
            results["infinity"] = infinity(args, sentences, base)


def infinity(args: argparse.Namespace, sentences: list[str], ours: str) -> dict[str, Any]:
    """infinity-emb against this server (``ours``, still up), c8 one sentence per request, in
    ``--peer-rounds`` rounds whose order alternates (ours first, then theirs first, ...), so a drift
    of the machine's speed during the run falls on both; the figure is the median per-round ratio."""
    # infinity pins its own dependency set: it may live in another virtual environment.
    exe = args.infinity_exe or shutil.which("infinity_emb", path=str(Path(sys.executable).parent))
    if exe is None or not Path(exe).exists():
        return {"skipped": "infinity_emb not found (pip install 'infinity-emb[optimum,server]')"}
    port = free_port()
    # A local folder is served from inside it as ".": infinity 0.0.78 hands optimum the ONNX file's
    # path relative to --model-id, and optimum matches it against bare file names.
    local = Path(args.infinity_model).is_dir()
    model_id, cwd = (".", Path(args.infinity_model)) if local else (args.infinity_model, ROOT)
    cmd = [exe, "v2", "--model-id", model_id, "--engine", args.infinity_engine, "--device", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--batch-size", str(args.max_batch)]
    theirs = f"http://127.0.0.1:{port}"
    targets = {
        "distilembed": (ours, embed_one(sentences)),
        "infinity": (theirs, embed_one(sentences, "/embeddings", model_id)),
    }
    rounds = []
    with server(cmd, f"{theirs}/health", args.log_dir / "infinity.log", cwd=cwd):
        for r in range(args.peer_rounds):
            order = ("distilembed", "infinity") if r % 2 == 0 else ("infinity", "distilembed")
            measured = {name: run_phase(*targets[name], 8, args).summary() for name in order}
            ratio = measured["distilembed"]["rps"] / max(measured["infinity"]["rps"], 1e-9)
            rounds.append({"first": order[0], **measured, "ratio": round(ratio, 3)})
    return {
        "model": args.infinity_model,
        "engine": args.infinity_engine,
        "rounds": rounds,
        "median_ratio": round(float(np.median([r["ratio"] for r in rounds])), 3),
    }


def load(args: argparse.Namespace, sentences: list[str], results: dict[str, Any]) -> None:
    """Mixed load on a temporary copy of the index (the benchmark's upserts never touch the original)."""
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        index = None
        if args.index:
            index = Path(tmp) / "index"
            shutil.copytree(args.index, index)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        rng = random.Random(0)
        with server(serve_cmd(args, port, index), f"{base}/ready", args.log_dir / "serve-load.log") as proc:
            results["rss_start_bytes"] = rss_bytes(proc.pid)

            def mixed(i: int) -> tuple[str, Request]:
                roll, s = rng.random(), sentences[i % len(sentences)]
                if index is not None and roll < 0.2:
                    return "search", ("POST", "/search", {"query": s, "top_k": 10})
                if index is not None and roll < 0.3:
                    doc = {"id": f"bench-load-{i % 5000}", "text": s, "metadata": {"source": "bench"}}
                    return "upsert", ("POST", "/documents", {"documents": [doc]})
                n = rng.randint(1, 4)
                return "embed", (
                    "POST",
                    "/v1/embeddings",
                    {"input": sentences[i % len(sentences) :][:n] or [s]},
                )

            if args.load_warmup > 0:  # first touches of every route, arena and cache sizes: not growth
                asyncio.run(closed_loop(base, mixed, 32, 10**9, args.load_warmup))
                results["rss_after_warmup_bytes"] = rss_bytes(proc.pid)
            phase = asyncio.run(closed_loop(base, mixed, 32, 10**9, args.duration))
            results["rss_end_bytes"] = rss_bytes(proc.pid)
            metrics = httpx.get(f"{base}/metrics", timeout=10).text
            if index is not None:  # the load is over, so every acknowledged upsert is in `before`
                before = stored_documents(base, [f"bench-load-{k}" for k in range(5000)])
                proc.kill()  # kill -9: no graceful shutdown, no checkpoint
                proc.wait()
        if index is not None:
            with server(serve_cmd(args, port, index), f"{base}/ready", args.log_dir / "serve-restart.log"):
                after = stored_documents(base, list(before))
            results["restart_after_kill9"] = {
                "documents_before": len(before),
                "found_again": sum(after.get(k) == v for k, v in before.items()),
            }
    results["load_c32"] = phase.summary() | {
        "by_kind": {k: {"ok": len(v), "p50_ms": round(float(np.percentile(v, 50)), 2),
                        "p99_ms": round(float(np.percentile(v, 99)), 2)} for k, v in phase.latencies.items()},
        "5xx": sum(n for code, n in phase.statuses.items() if code >= 500),
    }  # fmt: skip
    for line in metrics.splitlines():
        if line.startswith("distilembed_process_resident_memory_bytes "):
            results["rss_end_metrics_bytes"] = float(line.split()[1])
    start, end = results["rss_start_bytes"], results["rss_end_bytes"]
    base_rss = results.get("rss_after_warmup_bytes", start)
    if base_rss and end:
        results["rss_growth_mb"] = round((end - base_rss) / 2**20, 1)
        results["rss_growth_pct"] = round(100 * (end - base_rss) / base_rss, 1)
        results["rss_growth_from_ready_pct"] = round(100 * (end - start) / start, 1)


def stored_documents(base: str, ids: list[str]) -> dict[str, str]:
    """id -> text of the given ids that the server has (404s left out)."""
    found: dict[str, str] = {}
    with httpx.Client(base_url=base, timeout=10) as client:
        for doc_id in ids:
            response = client.get(f"/documents/{doc_id}")
            if response.status_code == 200:
                found[doc_id] = response.json()["text"]
    return found


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "models" / "default")
    parser.add_argument("--variant", default="int8")
    parser.add_argument("--index", type=Path, help="index directory: adds /search (and upserts with --load)")
    parser.add_argument("--name", help="results name (default: the bundle directory name)")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: all cores)")
    parser.add_argument("--max-batch", type=int, default=128, help="texts per encoder call (server)")
    parser.add_argument("--run-batch", type=int, default=32, help="rows per model run (server, in-process)")
    parser.add_argument("--max-wait-ms", type=float)
    parser.add_argument("--requests", type=int, default=2000, help="most requests per phase")
    parser.add_argument("--duration", type=float, help="most seconds per phase (default 20; --load: 120)")
    parser.add_argument("--concurrency", default="1,8,32", help="levels of the single-sentence latency phase")
    parser.add_argument("--load", action="store_true", help="mixed-load stability run instead")
    parser.add_argument(
        "--load-warmup", type=float, default=15.0, help="--load: seconds of load before the RSS baseline"
    )
    parser.add_argument(
        "--client", choices=("httpx", "wrk"), default="httpx", help="load generator (wrk: apt install wrk)"
    )
    parser.add_argument("--infinity", action="store_true", help="also measure infinity-emb, if installed")
    parser.add_argument("--infinity-model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--infinity-exe", help="infinity_emb CLI (e.g. from its own virtual environment)")
    parser.add_argument("--infinity-engine", default="optimum", help="optimum (ONNX) or torch")
    parser.add_argument(
        "--peer-rounds", type=int, default=3, help="alternating c8 rounds of this server and infinity"
    )
    data = Path(os.environ.get("DISTILEMBED_DATA_DIR", ROOT.parent / "shared" / "data"))
    parser.add_argument("--sts-file", type=Path, default=data / "sts" / "stsbenchmark" / "sts-test.csv")
    parser.add_argument(
        "--json", type=Path, help="results JSON (default docs/results/serve-NAME[-load].json)"
    )
    add_doc_args(parser)
    return parser.parse_args(argv)


def json_path(args: argparse.Namespace) -> Path | None:
    """Where the results JSON goes: --json, else (unless --no-doc) docs/results/serve-NAME[-load].json."""
    if args.json or args.no_doc:
        return args.json
    name = args.name or args.bundle.resolve().name
    return RESULTS_DIR / f"serve-{name}{'-load' if args.load else ''}.json"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if publish_saved(args, block_name, render):
        return
    args.duration = args.duration or (120.0 if args.load else 20.0)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.log_dir = Path(tempfile.mkdtemp(prefix="bench-serve-logs-"))
    sentences = sts_sentences(args.sts_file)
    results: dict[str, Any] = {
        "meta": {
            "bundle": str(args.bundle), "variant": args.variant, "index": args.index and str(args.index),
            "threads": args.threads, "max_batch": args.max_batch, "run_batch": args.run_batch,
            "max_wait_ms": args.max_wait_ms,
            "requests_cap": args.requests, "duration_cap_s": args.duration, "sentences": len(sentences),
            "cores": os.cpu_count(), "mode": "load" if args.load else "standard", "client": args.client,
        }
    }  # fmt: skip
    (load if args.load else standard)(args, sentences, results)
    results["run"] = run_info("bench/serve.py", argv)
    report(results)
    print(f"server logs in {args.log_dir}")
    out = json_path(args)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out}")
        publish(args, results, out, block_name(results), render)


if __name__ == "__main__":
    main()
