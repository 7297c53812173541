"""Hostile clients against ``distilembed serve`` on 127.0.0.1, bounded in time and count. Block
``hostile`` (bench/harness.py: --no-doc, --render-from); JSON to --json (default
docs/results/hostile.json; with --no-doc nowhere unless --json says); exit status 1 when a row fails.

    python bench/hostile.py        # under a minute

The server (a fresh index, every ``DISTILEMBED_*`` variable cleared but DISTILEMBED_HEADER_TIMEOUT_S,
--header-timeout-s: by default the service's own) meets six phases, a line each, then one table:
  1. baseline: p50/p95 of GET /health and of a one-sentence POST /v1/embeddings, --requests each,
     interleaved and sequential on one keep-alive connection;
  2. siege: --idle connections that send nothing and --slow ones that trickle a request head (a
     header line every --pace-s) are held, this process's open-file limit raised to the hard one;
     meanwhile (until 0.8 x the timeout after the first opening) another client measures the same
     figures: all 200, p50 at most 2x the unloaded one (the baseline's samples pooled with as many
     measured after the siege, so that a drift of a shared machine falls on both). Each held
     connection must be closed within the timeout + --slack-s of its connect, a slow one after a
     JSON 408; waiting stops 10 s past the timeout;
  3. poison documents: each a 4xx JSON error, not stored, after which /health, GET /documents/{id}
     of a normal document and /search answer 200;
  4. crafted filters on POST /search: a 4xx JSON error, or a 200 with exactly the right documents;
  5. a body over max_payload_bytes (a JSON 413) and malformed JSON (a JSON 400);
  6. every response body of the run (GET /info, POST /index/snapshot and the 408s too) scanned for
     the server's temporary directory and the repository's absolute path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h
import httpx
import numpy as np
from http_load import Held, closes, json_out, save, serving, start_siege

from service.connections import raise_open_file_limit
from service.settings import Settings

BLOCK = "hostile"
GIVE_UP_S = 10.0  # a held connection still open this long past its timeout: stop waiting (a fail)
ERROR_KEYS = {"error", "type", "took_ms"}
COLUMNS = ("phase", "case", "result", "target", "pass")
NORMAL = {"id": "normal", "text": "A cat sleeps on the sofa.", "metadata": {"lang": "en"}}
FILTER_DOCS = [
    {"id": "int-max", "text": "A dog runs in the park.", "metadata": {"a": 2**63 - 1}},
    {"id": "int-min", "text": "A bird sings in a tree.", "metadata": {"a": -(2**63)}},
    {"id": "quote", "text": "A man plays a guitar.", "metadata": {'a"b': 1}},
    {"id": "nested", "text": "A child reads a book.", "metadata": {"c": {"d": 3}}},
]


@dataclass
class Run:
    """What the phases share: the server, a client, the table's rows and every response body seen."""

    args: argparse.Namespace
    base: str
    tmp: Path
    client: httpx.Client
    rows: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)  # the baseline's ms, by kind

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> httpx.Response:
        """One request; ``raw`` goes as it is (JSON that ``json.dumps`` would not write)."""
        content = raw if raw is not None else None if body is None else json.dumps(body).encode()
        headers = {} if content is None else {"content-type": "application/json"}
        response = self.client.request(method, path, content=content, headers=headers)
        self.bodies.append(response.content)
        return response

    def row(self, phase: str, case: str, result: str, target: str, passed: bool) -> None:
        self.rows.append(dict(zip(COLUMNS, (phase, case, result, target, bool(passed)), strict=True)))


def json_error(status: int, content: bytes) -> str | None:
    """The ``type`` of a 4xx whose body is JSON ``{error, type, took_ms}``; None for anything else."""
    try:
        body = json.loads(content)
    except ValueError:
        return None
    shaped = 400 <= status < 500 and isinstance(body, dict) and set(body) == ERROR_KEYS
    return str(body["type"]) if shaped else None


def error_of(response: httpx.Response) -> str:
    return json_error(response.status_code, response.content) or "not a JSON error"


def latencies(base: str, n: int, deadline: float) -> tuple[dict[str, list[float]], dict[str, int]]:
    """ms of up to ``n`` GET /health and ``n`` one-sentence embeddings, interleaved, sequential on one
    keep-alive connection (opened by an untimed first pair), until ``deadline`` (monotonic); and how
    many of each kind were not a 200 (transport errors included)."""
    embed = ("embed", "POST", "/v1/embeddings", {"input": "a short sentence"})
    calls = [("health", "GET", "/health", None), embed]
    ms: dict[str, list[float]] = {kind: [] for kind, *_ in calls}
    not_200 = dict.fromkeys(ms, 0)
    with httpx.Client(base_url=base, timeout=30) as client:
        for i in range(2 * n + 2):
            if time.monotonic() > deadline:
                break
            kind, method, path, body = calls[i % 2]
            start = time.perf_counter()
            try:
                status = client.request(method, path, json=body).status_code
            except httpx.HTTPError:
                status = 0
            if i >= 2:
                ms[kind].append((time.perf_counter() - start) * 1000)
                not_200[kind] += status != 200
    return ms, not_200


def pct(ms: list[float], q: int) -> float:
    return round(float(np.percentile(ms, q)), 3) if ms else float("nan")


def summary(ms: dict[str, list[float]], not_200: dict[str, int]) -> dict[str, Any]:
    return {
        k: {"n": len(v), "p50_ms": pct(v, 50), "p95_ms": pct(v, 95), "not_200": not_200[k]}
        for k, v in ms.items()
    }


def all_200(ms: dict[str, list[float]], not_200: dict[str, int]) -> tuple[str, bool]:
    n, bad = sum(len(v) for v in ms.values()), sum(not_200.values())
    return f"{n - bad:,}/{n:,} 200", bad == 0 and n > 0


def baseline(run: Run) -> None:
    run.samples, not_200 = latencies(run.base, run.args.requests, float("inf"))
    run.figures["baseline"] = summary(run.samples, not_200)
    for kind, ms in run.samples.items():
        cell, ok = all_200({kind: ms}, {kind: not_200[kind]})
        run.row(
            "baseline", kind, f"p50 {pct(ms, 50):.2f} ms, p95 {pct(ms, 95):.2f} ms; {cell}", "all 200", ok
        )


def siege(run: Run) -> None:
    args, timeout = run.args, run.args.header_timeout_s
    raise_open_file_limit(args.idle + args.slow + 64)
    helds = [Held("idle") for _ in range(args.idle)] + [Held("slow") for _ in range(args.slow)]
    thread = start_siege(helds, int(run.base.rsplit(":", 1)[1]), args.pace_s, timeout + GIVE_UP_S)
    first = min((x.opened for x in helds if x.opened is not None), default=time.monotonic())
    loaded, loaded_bad = latencies(run.base, args.requests, first + 0.8 * timeout)
    measured_until = time.monotonic()  # before any held connection's timeout
    thread.join(timeout + GIVE_UP_S + 30)
    after, after_bad = latencies(run.base, args.requests, float("inf"))  # unloaded again
    n_open = sum(x.opened is not None for x in helds)
    case = f"open {args.idle:,} idle + {args.slow:,} slow"
    run.row("siege", case, f"{n_open:,}/{len(helds):,} opened", "all", n_open == len(helds))
    ratios = {}
    for kind, ms in loaded.items():  # unloaded: the baseline's and the after's samples, pooled
        before, unloaded = run.samples[kind], run.samples[kind] + after[kind]
        ratios[kind] = round(pct(ms, 50) / pct(unloaded, 50), 3)
        drift = f"before {pct(before, 50):.2f}, after {pct(after[kind], 50):.2f}"
        result = f"p50 {pct(ms, 50):.2f} / {pct(unloaded, 50):.2f} ms ({drift}) = {ratios[kind]:.2f}x"
        result += f"; p95 {pct(ms, 95):.2f} / {pct(unloaded, 95):.2f}"
        run.row("siege", f"{kind}: loaded / unloaded", result, "p50 <= 2x", ratios[kind] <= 2)
    early = sum(x.opened + x.closed_after_s < measured_until for x in helds if x.opened and x.closed_after_s)
    cell, ok = all_200(loaded, loaded_bad)
    cell += f"; {early} held closed meanwhile"
    run.row("siege", "requests while held", cell, "all 200, none closed", ok and not early)
    cell, ok = all_200(after, after_bad)
    run.row("siege", "requests after the siege", cell, "all 200", ok)
    closed = {k: closes([x for x in helds if x.kind == k], timeout + args.slack_s) for k in ("idle", "slow")}
    for kind, c in closed.items():
        cell = f"{c['closed']:,}/{c['n']:,} closed"
        if c["closed"]:
            cell += f"; min {c['min_s']:.2f}, median {c['median_s']:.2f}, max {c['max_s']:.2f} s"
        limit = f"<= {timeout:g} + {args.slack_s:g} s"
        run.row("siege", f"{kind}: connect to close", cell, limit, c["within_limit"])
    slow = [x for x in helds if x.kind == "slow"]
    run.bodies += [x.received for x in slow]
    got_408 = sum(
        x.received.startswith(b"HTTP/1.1 408 ")
        and json_error(408, x.received.partition(b"\r\n\r\n")[2]) == "request_timeout"
        for x in slow
    )
    run.row("siege", "slow: JSON 408, then closed", f"{got_408:,}/{len(slow):,}", "all", got_408 == len(slow))
    run.figures["siege"] = {
        "loaded": summary(loaded, loaded_bad), "after": summary(after, after_bad),
        "p50_loaded_over_unloaded": ratios, "closes": closed, "slow_408": got_408,
        "errors": [x.error for x in helds if x.error],
    }  # fmt: skip


def still_serving(run: Run) -> list[str]:
    """What fails of /health, GET /documents/normal and /search, and "stored" if the poison was."""
    probes = {"health": run.call("GET", "/health"), "doc": run.call("GET", "/documents/normal")}
    probes["search"] = run.call("POST", "/search", {"query": "a cat", "top_k": 5})
    problems = [f"{what} {r.status_code}" for what, r in probes.items() if r.status_code != 200]
    return problems + (["stored"] if run.call("GET", "/documents/poison").status_code != 404 else [])


def poison(run: Run) -> None:
    def doc(metadata: str) -> bytes:
        return f'{{"documents": [{{"id": "poison", "text": "poison", "metadata": {metadata}}}]}}'.encode()

    cases = {
        "metadata nested 300 levels (objects)": doc('{"a":' * 300 + "1" + "}" * 300),
        "metadata nested 100,000 levels (lists)": doc('{"a":' + "[" * 99_999 + "]" * 99_999 + "}"),
        "10,000 keys": doc(json.dumps({f"k{i}": i for i in range(10_000)})),
        "a 10,000-char key": doc(json.dumps({"k" * 10_000: 1})),
        "a 1 MB string": doc(json.dumps({"s": "x" * 1_000_000})),
        "an integer 2^63": doc(json.dumps({"a": 2**63})),
        "NaN (raw body)": doc('{"x": NaN}'),
        "a lone surrogate \\ud800": doc('{"x": "\\ud800"}'),
    }
    for case, raw in cases.items():
        response = run.call("POST", "/documents", raw=raw)
        problems = still_serving(run)
        result = f"{response.status_code} {error_of(response)}; {', '.join(problems) or 'still serving'}"
        refused = json_error(response.status_code, response.content) is not None
        run.row("poison", case, result, "4xx JSON; still serving", refused and not problems)


def filters(run: Run) -> None:
    not_50: dict[str, Any] = {"lang": "en"}
    for _ in range(50):
        not_50 = {"$not": not_50}
    cases = [
        ("a = 2^63", {"a": 2**63}, set()),
        ("a = -2^63 - 1", {"a": -(2**63) - 1}, set()),
        ("1,000 keys", {f"k{i}": i for i in range(1000)}, set()),
        ('key a"b', {'a"b': 1}, {"quote"}),
        ('key c"."d (a doc has {"c": {"d": 3}})', {'c"."d': 3}, set()),
        ("$where", {"$where": "1"}, set()),
        ("$not nested 50 levels", not_50, {"normal"}),
        ("$in of 10,000 values", {"a": {"$in": [*range(9_999), 2**63 - 1]}}, {"int-max"}),
    ]
    for case, where, expected in cases:
        response = run.call("POST", "/search", {"query": "a document", "top_k": 10, "filter": where})
        if response.status_code == 200:
            got = {r["id"] for r in response.json()["results"]}
            ok, result = got == expected, f"200, {'right' if got == expected else 'WRONG'}: {sorted(got)}"
        else:
            ok = json_error(response.status_code, response.content) is not None
            result = f"{response.status_code} {error_of(response)}"
        run.row("filters", case, result, f"4xx JSON, or 200 {sorted(expected)}", ok)


def limits(run: Run) -> None:
    limit = run.call("GET", "/info").json()["limits"]["max_payload_bytes"]
    over = json.dumps({"input": "x" * limit})
    cases = [
        (f"body over max_payload_bytes ({limit:,} B)", over, 413, "payload_too_large"),
        ("malformed JSON", '{"input": "unfinished', 400, "invalid_json"),
    ]
    for case, raw, status, kind in cases:
        response = run.call("POST", "/v1/embeddings", raw=raw.encode())
        got = f"{response.status_code} {error_of(response)}"
        run.row("limits", case, got, f"JSON {status} {kind}", got == f"{status} {kind}")


def paths(run: Run) -> None:
    statuses = [run.call("GET", "/info").status_code, run.call("POST", "/index/snapshot").status_code]
    named = {str(run.tmp).encode(), str(run.tmp.resolve()).encode(), str(h.ROOT).encode()}
    leaks = sum(any(p in body for p in named) for body in run.bodies)
    result = f"{len(run.bodies):,} bodies (info {statuses[0]}, snapshot {statuses[1]}); {leaks} name a path"
    case, ok = "server temp dir or repo path in an answer", not leaks and statuses == [200, 200]
    run.row("paths", case, result, "0", ok)


PHASES: tuple[Callable[[Run], None], ...] = (baseline, siege, poison, filters, limits, paths)  # by name


def attack(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTILEMBED_")}
    env["DISTILEMBED_HEADER_TIMEOUT_S"] = str(args.header_timeout_s)
    log, flags = tmp / "serve.log", ["--index", str(tmp / "index"), "--create-index"]
    with (
        serving(args.bundle.resolve(), flags, log, env=env) as (base, _),
        httpx.Client(base_url=base, timeout=60) as client,
    ):
        run = Run(args, base, tmp, client)
        run.call("POST", "/documents", {"documents": [NORMAL, *FILTER_DOCS]}).raise_for_status()
        for i, phase in enumerate(PHASES, 1):
            phase(run)
            rows = [r for r in run.rows if r["phase"] == phase.__name__]
            failed = ", ".join(r["case"] for r in rows if not r["pass"])
            line = f"[{i}/{len(PHASES)}] {phase.__name__}: {sum(r['pass'] for r in rows)}/{len(rows)} pass"
            print(line + (f"; failed: {failed}" if failed else ""), flush=True)
    if not all(r["pass"] for r in run.rows):
        print(f"server log, last 3,000 characters:\n{log.read_text()[-3000:]}")
    return {**run.figures, "rows": run.rows}


def render(result: dict[str, Any]) -> str:
    m = result["meta"]
    intro = (
        f"`distilembed serve --bundle {m['bundle']}` on a fresh index, every setting at its default, "
        f"`header_timeout_s` {m['header_timeout_s']:g}; {m['idle']:,} idle and {m['slow']:,} slowloris "
        f"connections (a header line every {m['pace_s']:g} s); {m['requests']} requests per latency "
        f"figure; {m['cores']} cores, 1-minute load average {m['load_average']:.2f} as it began."
    )
    rows = [[*(r[c] for c in COLUMNS[:-1]), "yes" if r["pass"] else "**NO**"] for r in result["rows"]]
    return f"{intro}\n\n{h.markdown_table(COLUMNS, rows, align='lllll')}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=h.ROOT / "models" / "default")
    parser.add_argument("--requests", type=int, default=300, help="requests per latency figure")
    parser.add_argument("--idle", type=int, default=1000, help="connections that send nothing")
    parser.add_argument("--slow", type=int, default=200, help="connections that trickle a request head")
    parser.add_argument("--pace-s", type=float, default=5.0, help="seconds between a slow one's header lines")
    default_timeout = Settings.model_fields["header_timeout_s"].default
    parser.add_argument("--header-timeout-s", type=float, default=default_timeout, help="the server's")
    parser.add_argument("--slack-s", type=float, default=1.0, help="how late past its timeout a close may be")
    parser.add_argument("--json", type=Path, help="results JSON (default docs/results/hostile.json)")
    h.add_doc_args(parser)
    args = parser.parse_args(argv)
    if h.publish_saved(args, BLOCK, render):
        return 0
    sizes = {k: vars(args)[k] for k in ("requests", "idle", "slow", "pace_s", "header_timeout_s", "slack_s")}
    machine = {"cores": os.cpu_count(), "load_average": os.getloadavg()[0]}
    result: dict[str, Any] = {"meta": {**sizes, "bundle": h.repo_path(args.bundle), **machine}}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        result |= attack(args, Path(tmp))
    result["run"] = h.run_info("bench/hostile.py", argv)
    save(args, result, json_out(args, h.RESULTS / "hostile.json"), BLOCK, render)
    return 0 if all(r["pass"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
