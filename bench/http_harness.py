"""The HTTP side of bench/serve.py: server subprocesses, a closed-loop httpx client and its figures."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
Request = tuple[str, str, dict[str, Any] | None]  # method, path, json body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


@contextlib.contextmanager
def server(
    cmd: list[str],
    ready_url: str,
    log_path: Path,
    timeout: float = 180,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen]:
    """Run a server subprocess until the block ends (SIGTERM, then kill); yield it once it is ready.
    ``env``: its whole environment (default: this process's)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    tail = log_path.read_text()[-2000:]
                    sys.exit(f"server exited with {proc.returncode}; log: {log_path}\n{tail}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready_url, timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    sys.exit(f"server not ready after {timeout:.0f} s; log: {log_path}")
                time.sleep(0.25)
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Phase:
    latencies: dict[str, list[float]] = field(default_factory=dict)  # kind -> ms, successful requests
    statuses: Counter = field(default_factory=Counter)
    errors: int = 0  # transport errors (no HTTP answer)
    seconds: float = 0.0

    @property
    def ok(self) -> int:
        return sum(len(v) for v in self.latencies.values())

    def summary(self, items_per_request: int = 1) -> dict[str, Any]:
        every = [x for v in self.latencies.values() for x in v]
        pct = {f"p{q}_ms": round(float(np.percentile(every, q)), 2) for q in (50, 95, 99)} if every else {}
        return {
            "requests": sum(self.statuses.values()) + self.errors,
            "ok": self.ok,
            "rps": round(self.ok / self.seconds, 1) if self.seconds else 0.0,
            "items_per_s": round(self.ok * items_per_request / self.seconds, 1) if self.seconds else 0.0,
            **pct,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "transport_errors": self.errors,
            "seconds": round(self.seconds, 2),
        }


async def closed_loop(
    base: str,
    make: Callable[[int], tuple[str, Request]],
    concurrency: int,
    max_requests: int,
    duration: float,
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
