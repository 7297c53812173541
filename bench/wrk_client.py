"""A native load generator for bench/serve.py: wrk (C, epoll) replays JSON bodies from a Lua script.

On a 2-core machine the Python (httpx) client competes with the server for the same cores; wrk
spends far less CPU per request, so its figures are closer to what the server itself costs. wrk
reports latency percentiles 50/75/90/99 (no p95) and runs for a fixed duration.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def lua_script(path: str, bodies: list[str]) -> str:
    """Round-robin POSTs of ``bodies`` (JSON) to ``path``."""
    items = ",\n".join(f"[==[{b}]==]" for b in bodies)
    return (
        f"local bodies = {{\n{items}\n}}\nlocal i = 0\n"
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        "request = function()\n  i = i % #bodies + 1\n"
        f'  return wrk.format(nil, "{path}", nil, bodies[i])\nend\n'
    )


def _ms(value: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value)
    if match is None:
        raise ValueError(f"cannot read wrk latency {value!r}")
    return float(match.group(1)) * UNITS_MS[match.group(2)]


@dataclass
class WrkPhase:
    output: str
    seconds: float

    def summary(self, items_per_request: int = 1) -> dict[str, Any]:
        text = self.output
        total = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
        errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
        bad = int(non2xx.group(1)) if non2xx else 0
        transport = sum(int(g) for g in errors.groups()) if errors else 0
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
        pct = {int(p): _ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", text, re.MULTILINE)}
        ok_share = (total - bad) / total if total else 0.0
        return {
            "requests": total,
            "ok": total - bad,
            "rps": round(rps, 1),
            "items_per_s": round(rps * ok_share * items_per_request, 1),
            "p50_ms": round(pct[50], 2),
            "p90_ms": round(pct[90], 2),
            "p99_ms": round(pct[99], 2),
            "statuses": {"non-2xx": bad} if bad else {"2xx": total},
            "transport_errors": transport,
            "seconds": self.seconds,
            "client": "wrk",
        }


def run(base: str, path: str, bodies: list[dict[str, Any]], concurrency: int, seconds: float) -> WrkPhase:
    """``concurrency`` connections on one wrk thread for ``seconds``, cycling through ``bodies``."""
    with tempfile.TemporaryDirectory(prefix="wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(lua_script(path, [json.dumps(b) for b in bodies]))
        duration = max(1, round(seconds))
        cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{duration}s", "--latency", "-s", str(script), base]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=duration + 60)
    return WrkPhase(done.stdout, float(duration))
