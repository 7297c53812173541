"""Soak: a long mixed load on one server, sampled over time; then kill -9, a restart, and every
acknowledged write checked. The JSON goes to --out, the plot of the samples beside it (.png), and the
criteria table (the soak row of docs/results.md, Reliability) is printed; ``--render-from JSON``
plots and prints it again from an earlier run's JSON.

    python bench/soak.py                                 # 10 minutes at concurrency 32, models/default
    python bench/soak.py --minutes 1 --out runs/soak-smoke.json               # a smoke run

``distilembed serve`` (a fresh index of --docs STS-B sentences) takes --concurrency closed-loop
clients, each sending embeds (1-4 sentences), searches, upserts and deletes of its own
--ids-per-client ids and keeping a ledger of their last acknowledged state (its writes are
sequential, so that state is exact; every id is written within the warm-up, so memory growth after
it is not data growth). Every --sample seconds: the server's RSS and open descriptors, its document
count and the window's p50/p99 and errors. Then kill -9 (no shutdown, no checkpoint), a restart on
the same index, and every ledger read back: each acknowledged upsert there with its text, each
acknowledged delete gone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h
import httpx
import numpy as np
from http_load import STS_TEST, Phase, fill, memory, percentile, serving, stored_documents, sts_sentences

MIX = {"embed": 0.45, "search": 0.3, "upsert": 0.17, "delete": 0.08}


@dataclass
class Soak:
    sentences: list[str]
    ids_per_client: int
    window: Phase = field(default_factory=Phase)  # the requests since the last sample
    ledgers: list[dict[str, str | None]] = field(default_factory=list)  # id -> text, None: deleted
    totals: Counter = field(default_factory=Counter)


async def client_loop(soak: Soak, client: httpx.AsyncClient, worker: int, deadline: float) -> None:
    rng = random.Random(worker)
    ledger: dict[str, str | None] = {}
    soak.ledgers.append(ledger)
    while time.monotonic() < deadline:
        kind = rng.choices(list(MIX), list(MIX.values()))[0]
        s = soak.sentences[rng.randrange(len(soak.sentences))]
        doc_id, text = f"soak-{worker}-{rng.randrange(soak.ids_per_client)}", None
        if kind == "embed":
            request = ("POST", "/v1/embeddings", {"input": rng.sample(soak.sentences, rng.randint(1, 4))})
        elif kind == "search":
            request = ("POST", "/search", {"query": s, "top_k": 10})
        elif kind == "upsert":
            text = f"{s} [{worker}:{rng.random():.6f}]"
            request = ("POST", "/documents", {"documents": [{"id": doc_id, "text": text}]})
        else:
            request = ("DELETE", f"/documents/{doc_id}", None)
        start = time.perf_counter()
        try:
            response = await client.request(request[0], request[1], json=request[2])
        except httpx.HTTPError as error:  # no response at all: named, so a cause can be found
            soak.window.errors += 1
            soak.totals[f"transport_error:{type(error).__name__}"] += 1
            continue
        soak.window.statuses[response.status_code] += 1
        soak.totals[response.status_code] += 1
        if response.status_code < 300 or (kind == "delete" and response.status_code == 404):
            soak.window.latencies.setdefault(kind, []).append((time.perf_counter() - start) * 1000)
            if kind in ("upsert", "delete"):
                ledger[doc_id] = text


async def sampler(
    soak: Soak, client: httpx.AsyncClient, pid: int, every: float, deadline: float, samples: list[dict]
) -> None:
    started = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))
        window, soak.window = soak.window, Phase()
        documents = (await client.get("/info")).json()["index"]["ntotal"]
        every_ms = [x for v in window.latencies.values() for x in v]
        other = sum(n for code, n in window.statuses.items() if 400 <= code < 500 and code != 404)
        fds = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
        samples.append({
            "t_s": round(time.monotonic() - started, 1), "rss_bytes": memory(pid)["VmRSS"], "open_fds": fds,
            "documents": documents, "requests": sum(window.statuses.values()) + window.errors,
            **{f"p{q}_ms": percentile(every_ms, q) for q in (50, 99)},
            "errors_5xx": sum(n for code, n in window.statuses.items() if code >= 500),
            "errors_other": other, "transport_errors": window.errors,
        })  # fmt: skip
        print(json.dumps(samples[-1]), flush=True)


async def run_load(soak: Soak, base: str, pid: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.minutes * 60
    # Idle connections are closed by the client (30 s) before the server would (keep_alive_s, 75 s).
    n = args.concurrency
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=30.0)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        workers = [client_loop(soak, client, w, deadline) for w in range(n)]
        await asyncio.gather(sampler(soak, client, pid, args.sample, deadline, samples), *workers)
    return samples


def check_ledgers(base: str, ledgers: list[dict[str, str | None]]) -> dict[str, int]:
    """Every id of every ledger read back: an acknowledged upsert there with its text, a delete gone."""
    last = {doc_id: text for ledger in ledgers for doc_id, text in ledger.items()}
    found = stored_documents(base, last)
    deleted = [doc_id for doc_id, text in last.items() if text is None]
    return {
        "upserts_checked": len(last) - len(deleted),
        "lost_or_stale": sum(found.get(k) != text for k, text in last.items() if text is not None),
        "deletes_checked": len(deleted), "deleted_but_present": sum(k in found for k in deleted),
    }  # fmt: skip


def criteria(samples: list[dict[str, Any]], check: dict[str, int], warmup_s: float) -> dict[str, Any]:
    """Each figure with its target, measured from the first sample after --warmup seconds (arenas,
    caches and the first checkpoint settle) to the last. p99 at the start and the end are medians of
    three sample windows each (one 10 s window is noisy at c32). Open descriptors move with the client
    connections open at the sampling instant (up to --concurrency), so "flat" is judged as no growth
    of the peak from the first half of the samples to the second."""
    steady = [s for s in samples if s["t_s"] >= warmup_s] or samples
    growth = steady[-1]["rss_bytes"] / steady[0]["rss_bytes"] - 1
    fds = [s["open_fds"] for s in steady]
    half = max(1, len(fds) // 2)  # a leak is a trend: the later half's peak above the earlier half's
    fd_early, fd_late = max(fds[:half]), max(fds[half:] or fds)
    p99 = [s["p99_ms"] for s in steady if s["p99_ms"] is not None]
    p99_start, p99_end = float(np.median(p99[:3])), float(np.median(p99[-3:]))
    errors_5xx = sum(s["errors_5xx"] for s in samples)
    no_response = sum(s["transport_errors"] for s in samples)
    lost = check.get("lost_or_stale", 0) + check.get("deleted_but_present", 0)
    p99_cell = f"{p99_end:.0f} / {p99_start:.0f} ms = {p99_end / p99_start:.2f}x"
    rows = {
        "5xx responses": (errors_5xx, "0", errors_5xx == 0),
        "requests without a response": (no_response, "0", no_response == 0),
        "RSS growth after warm-up": (f"{growth * 100:+.1f}%", "< 5%", growth < 0.05),
        "open fds, peak 1st / 2nd half": (f"{fd_early} / {fd_late}", "no growth", fd_late <= fd_early + 2),
        "p99 end / start": (p99_cell, "<= 1.5x", p99_end <= 1.5 * p99_start),
        "acknowledged writes lost after kill -9": (lost, "0", lost == 0),
    }
    return {name: {"value": v, "target": t, "met": bool(ok)} for name, (v, t, ok) in rows.items()}


def render(result: dict[str, Any]) -> str:
    meta, met = result["meta"], {True: "yes", False: "**NO**"}
    rows = [(k, c["value"], c["target"], met[c["met"]]) for k, c in result["criteria"].items()]
    title = f"Soak: {meta['minutes']:g} min at c{meta['concurrency']}, {meta['cores']} cores ({meta['at']})."
    return f"{title}\n\n{h.markdown_table(('criterion', 'value', 'target', 'met'), rows, 'llll')}"


def plot(samples: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    errors = [s["errors_5xx"] + s["transport_errors"] for s in samples]
    panels: dict[str, dict[str, list]] = {  # y label: {line label: values}
        "RSS (MiB)": {"": [s["rss_bytes"] / 2**20 for s in samples]},
        "latency (ms)": {q: [s[f"{q}_ms"] for s in samples] for q in ("p50", "p99")},
        "count": {"open fds": [s["open_fds"] for s in samples], "5xx + transport errors": errors},
        "documents": {"": [s["documents"] for s in samples]},
    }
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 10), sharex=True)
    for ax, (ylabel, lines) in zip(axes, panels.items(), strict=True):
        for label, values in lines.items():
            ax.plot([s["t_s"] for s in samples], values, label=label or None)
        ax.set_ylabel(ylabel)
        if len(lines) > 1:
            ax.legend()
    axes[-1].set_xlabel("seconds")
    fig.suptitle("bench/soak.py: mixed load at concurrency 32 on 127.0.0.1")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def soak_run(args: argparse.Namespace) -> dict[str, Any]:
    soak = Soak(sts_sentences(args.sts_file), ids_per_client=args.ids_per_client)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    with tempfile.TemporaryDirectory(prefix="soak-index-") as tmp:
        flags = ["--index", f"{tmp}/index", "--create-index"]
        with serving(args.bundle, flags, log_dir / "soak.log") as (base, proc):
            fill(base, soak.sentences, args.docs, "sts-")
            samples = asyncio.run(run_load(soak, base, proc.pid, args))
            proc.kill()  # kill -9: no shutdown, no checkpoint
            proc.wait()
        with serving(args.bundle, flags, log_dir / "soak-restart.log") as (base, _):
            check = check_ledgers(base, soak.ledgers)
    return {
        "meta": {"minutes": args.minutes, "concurrency": args.concurrency, "bundle": args.bundle,
                 "cores": os.cpu_count(), "mix": MIX, "warmup_s": args.warmup,
                 "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "totals": {str(k): v for k, v in soak.totals.items()},
        "after_kill9_restart": check,
        "criteria": criteria(samples, check, args.warmup),
        "samples": samples,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(h.ROOT / "models" / "default"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--ids-per-client", type=int, default=20, help="document ids each client writes")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the steady state")
    parser.add_argument("--docs", type=int, default=2000, help="STS-B sentences indexed before the load")
    parser.add_argument("--sts-file", type=Path, default=STS_TEST)
    parser.add_argument("--out", type=Path, default=h.RESULTS / "soak.json")
    parser.add_argument("--render-from", type=Path, metavar="JSON", help="measure nothing: plot this JSON")
    args = parser.parse_args(argv)
    out = args.render_from or args.out
    result = json.loads(out.read_text()) if args.render_from else soak_run(args)
    if not args.render_from:
        h.write_json(out, result)
    plot(result["samples"], out.with_suffix(".png"))
    print(f"{render(result)}\n\nwrote {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
