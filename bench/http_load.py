"""What the serving benchmarks share: ``distilembed serve`` as a subprocess on a free 127.0.0.1 port, the
STS-B sentences they send, request makers, a closed-loop httpx client and its figures, wrk as a native
load generator, held idle or slowloris connections, and where a run's JSON goes. It measures nothing
by itself: bench/serve.py, soak.py, hostile.py, filters.py, index_build.py and scale.py do."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h
import httpx
import numpy as np

STS_TEST = Path(h.data_root()) / "sts" / "stsbenchmark" / "sts-test.csv"
Request = tuple[str, str, dict[str, Any] | None]  # method, path, json body
MakeRequest = Callable[[int], tuple[str, Request]]  # request number -> (kind, request)
Env = dict[str, str] | None  # a server's whole environment (None: this process's)


def sts_sentences(path: str | Path) -> list[str]:
    """Both sentences of every STS-B row of ``path``, each once, in order of first appearance."""
    from training.data.sts import read_stsb

    return list(dict.fromkeys(s for pair in read_stsb(path) for s in (pair.sentence1, pair.sentence2) if s))


def one_each(kind: str, texts: Sequence[str], path: str = "/v1/embeddings", model: str = "") -> MakeRequest:
    """One text of ``texts`` per request, in turn: an ``embed`` (``model`` named in the body: an
    OpenAI-style peer's), or a ``search`` (top 10)."""

    def make(i: int) -> tuple[str, Request]:
        text = texts[i % len(texts)]
        if kind == "search":
            return kind, ("POST", "/search", {"query": text, "top_k": 10})
        return kind, ("POST", path, {"input": [text]} | ({"model": model} if model else {}))

    return make


def fill(base: str, texts: Sequence[str], n: int, prefix: str) -> None:
    """Upsert ``n`` documents, id PREFIX{i} and text ``texts[i]`` (cycling), 64 a request."""
    with httpx.Client(base_url=base, timeout=120) as client:
        for lo in range(0, n, 64):
            docs = [{"id": f"{prefix}{i}", "text": texts[i % len(texts)]} for i in range(lo, min(n, lo + 64))]
            client.post("/documents", json={"documents": docs}).raise_for_status()


def stored_documents(base: str, ids: Iterable[str]) -> dict[str, str]:
    """id -> text of the given ids that the server has (404s left out)."""
    with httpx.Client(base_url=base, timeout=30) as client:
        answers = {doc_id: client.get(f"/documents/{doc_id}") for doc_id in ids}
    return {doc_id: r.json()["text"] for doc_id, r in answers.items() if r.status_code == 200}


def json_out(args: argparse.Namespace, default: Path) -> Path | None:
    """Where a run's JSON goes: --json, else (unless --no-doc) ``default``."""
    return args.json or (None if args.no_doc else default)


def save(args: argparse.Namespace, result: h.Result, out: Path | None, block: str, render: h.Render) -> None:
    """The end of a run: its table printed; its JSON to ``out`` and its block rewritten (None: neither)."""
    args.out = out
    if out is None:
        print(render(result))
    else:
        h.finish(args, result, block, render)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def memory(pid: int, fields: Sequence[str] = ("VmRSS",)) -> dict[str, int]:
    """Bytes of the given /proc/PID/status fields (VmRSS, RssAnon, RssFile, ...)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    values = {line.split(":")[0]: line.split()[1] for line in lines if line.split(":")[0] in fields}
    return {name: int(values[name]) * 1024 for name in fields}


@contextlib.contextmanager
def server(
    cmd: list[str], ready_url: str, log: Path, timeout: float = 180, cwd: Path = h.ROOT, env: Env = None
) -> Iterator[subprocess.Popen]:
    """Run a server subprocess until the block ends (SIGTERM, then kill); yield it once ``ready_url``
    answers 200, its output going to ``log``."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    sys.exit(f"server exited with {proc.returncode}; log: {log}\n{log.read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready_url, timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    sys.exit(f"server not ready after {timeout:.0f} s; log: {log}")
                time.sleep(0.25)  # a benchmark polls a starting server; tests never sleep
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def serving(
    bundle: str | Path, extra: Sequence[str], log: Path, env: Env = None, prefix: Sequence[str] = ()
) -> Iterator[tuple[str, subprocess.Popen]]:
    """``distilembed serve --bundle BUNDLE EXTRA...`` on a free 127.0.0.1 port: (base URL, process)."""
    port = free_port()
    cmd = [*prefix, sys.executable, "-m", "distilembed.cli", "serve", "--bundle", str(bundle)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra]
    base = f"http://127.0.0.1:{port}"
    with server(cmd, f"{base}/ready", log, env=env) as proc:
        yield base, proc


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) each thread of process ``pid`` has used so far, by thread id."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended since the listing
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_per_request(pid: int, before: dict[int, float], requests: int) -> dict[str, float]:
    """Core-milliseconds of process ``pid`` a request since ``before`` (its ``thread_cpu``): all of
    its threads, and its main thread alone (the server's event loop)."""
    after, n = thread_cpu(pid), max(requests, 1)
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    return {
        "server_core_ms": round(1000 * sum(used.values()) / n, 3),
        "loop_core_ms": round(1000 * used.get(pid, 0.0) / n, 3),
    }


def percentile(ms: Sequence[float], q: float, digits: int = 2) -> float | None:
    return round(float(np.percentile(ms, q)), digits) if len(ms) else None


@dataclass
class Phase:
    latencies: dict[str, list[float]] = field(default_factory=dict)  # kind -> ms, successful requests
    statuses: Counter = field(default_factory=Counter)
    errors: int = 0  # transport errors (no HTTP answer)
    seconds: float = 0.0

    def summary(self, items_per_request: int = 1) -> dict[str, Any]:
        every = [x for v in self.latencies.values() for x in v]
        rate = len(every) / self.seconds if self.seconds else 0.0
        return {
            "requests": sum(self.statuses.values()) + self.errors, "ok": len(every), "rps": round(rate, 1),
            "items_per_s": round(rate * items_per_request, 1),
            **({f"p{q}_ms": percentile(every, q) for q in (50, 95, 99)} if every else {}),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "transport_errors": self.errors, "seconds": round(self.seconds, 2),
        }  # fmt: skip


async def closed_loop(
    base: str, make: MakeRequest, concurrency: int, max_requests: int, duration: float
) -> Phase:
    """``concurrency`` clients, each sending its next request when the last one is answered."""
    phase, counter = Phase(), iter(range(max_requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        deadline = time.perf_counter() + duration

        async def worker() -> None:
            for i in counter:
                if time.perf_counter() > deadline:
                    return
                kind, (method, path, body) = make(i)
                start = time.perf_counter()
                try:
                    response = await client.request(method, path, json=body)
                except httpx.HTTPError:
                    phase.errors += 1
                    continue
                phase.statuses[response.status_code] += 1
                if response.status_code < 400:
                    phase.latencies.setdefault(kind, []).append((time.perf_counter() - start) * 1000)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        phase.seconds = time.perf_counter() - start
    return phase


def load(base: str, make: MakeRequest, concurrency: int, max_requests: int, duration: float) -> Phase:
    return asyncio.run(closed_loop(base, make, concurrency, max_requests, duration))


def wrk(
    base: str, path: str, bodies: list[dict[str, Any]], concurrency: int, seconds: float, items: int = 1
) -> dict[str, Any]:
    """``concurrency`` connections on one wrk thread for ``seconds``, POSTing ``bodies`` to ``path`` in
    turn: a :meth:`Phase.summary`. wrk (C, epoll) spends far less CPU per request than a Python client,
    which on 2 cores competes with the server; it reports p50/75/90/99 (no p95), whole seconds."""
    items_lua = ",\n".join(f"[==[{json.dumps(b)}]==]" for b in bodies)
    lua = (
        f"local bodies = {{\n{items_lua}\n}}\nlocal i = 0\n"
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        "request = function()\n  i = i % #bodies + 1\n"
        f'  return wrk.format(nil, "{path}", nil, bodies[i])\nend\n'
    )
    with tempfile.TemporaryDirectory(prefix="wrk-") as tmp:
        (script := Path(tmp) / "post.lua").write_text(lua)
        duration = max(1, round(seconds))
        cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{duration}s", "--latency", "-s", str(script), base]
        text = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=duration + 60).stdout

    def number(pattern: str) -> float:
        match = re.search(pattern, text)
        return float(match.group(1)) if match else 0.0

    total, bad = int(number(r"(\d+) requests in")), int(number(r"Non-2xx or 3xx responses: (\d+)"))
    rps, unit_ms = number(r"Requests/sec:\s+([\d.]+)"), {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    found = re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(\w+)", text, re.M)
    pct = {int(q): float(v) * unit_ms[u] for q, v, u in found}
    return {
        "requests": total, "ok": total - bad, "rps": round(rps, 1),
        "items_per_s": round(rps * ((total - bad) / total if total else 0.0) * items, 1),
        **{f"p{q}_ms": round(pct[q], 2) for q in (50, 90, 99)},
        "statuses": {"non-2xx": bad} if bad else {"2xx": total},
        "transport_errors": sum(int(g) for g in errors.groups()) if errors else 0,
        "seconds": float(duration), "client": "wrk",
    }  # fmt: skip


# Held connections: ``idle`` ones connect and send nothing, ``slow`` ones (slowloris) send a request
# line and Host, then one header line every ``pace_s``, never finishing. Each records the seconds from
# its opening to the server's close and what the server sent.
SLOW_HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"


@dataclass
class Held:
    kind: str  # "idle" or "slow"
    opened: float | None = None  # time.monotonic() as the connect began (None: failed to open)
    closed_after_s: float | None = None  # from its opening to the server's close; None: not seen
    received: bytes = b""
    error: str | None = None  # why it failed to open, or the reset that closed it


async def open_held(held: Held, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    held.opened = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as error:
        held.opened, held.error = None, f"open: {type(error).__name__}"
        return None
    if held.kind == "slow":
        writer.write(SLOW_HEAD)
    return reader, writer


async def watch(
    held: Held, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pace_s: float, give_up_s: float
) -> None:
    """Read until the server closes (a slow one sends a header line each ``pace_s`` meanwhile), for at
    most ``give_up_s`` from the opening."""
    assert held.opened is not None
    try:
        while (left := held.opened + give_up_s - time.monotonic()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), min(pace_s, left))
            except TimeoutError:
                if held.kind == "slow":
                    writer.write(b"X-a: b\r\n")
                continue
            if not chunk:
                held.closed_after_s = time.monotonic() - held.opened
                return
            held.received += chunk
    except ConnectionError as error:  # a reset is a close too
        held.closed_after_s = time.monotonic() - held.opened
        held.error = type(error).__name__
    finally:
        writer.close()


def start_siege(helds: list[Held], port: int, pace_s: float, give_up_s: float) -> threading.Thread:
    """Hold ``helds`` on their own event loop in a daemon thread, returned once every connection is
    open (or has failed to), so that a client in this thread measures while they are held."""
    opened = threading.Event()

    async def siege() -> None:
        connections = await asyncio.gather(*(open_held(x, port) for x in helds))
        opened.set()
        pairs = [(x, c) for x, c in zip(helds, connections, strict=True) if c is not None]
        await asyncio.gather(*(watch(x, *c, pace_s, give_up_s) for x, c in pairs))

    thread = threading.Thread(target=asyncio.run, args=(siege(),), daemon=True)
    thread.start()
    opened.wait(60)
    return thread


def closes(helds: list[Held], limit_s: float) -> dict[str, Any]:
    """How many were closed, their close times' min/median/max, and whether all came within ``limit_s``."""
    times = [x.closed_after_s for x in helds if x.closed_after_s is not None]
    stats: dict[str, Any] = {"n": len(helds), "closed": len(times)}
    if times:
        stats |= {"min_s": min(times), "median_s": float(np.median(times)), "max_s": max(times)}
    stats = {k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()}
    return stats | {"within_limit": len(times) == len(helds) and max(times, default=0.0) <= limit_s}
