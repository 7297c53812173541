"""What bench/serve.py makes of its results: the console table and the ``serve`` and ``serve-load``
blocks of docs/results.md."""

from __future__ import annotations

from typing import Any

from harness import fmt, markdown_table
from rich.console import Console
from rich.table import Table


def report(results: dict[str, Any]) -> None:
    table = Table(title=f"distilembed serving: {results['meta']['bundle']}")
    for col in ("phase", "ok/requests", "req/s", "items/s", "p50 ms", "p95 ms", "p99 ms", "non-2xx"):
        table.add_column(col, justify="left" if col == "phase" else "right")

    def row(name: str, s: dict[str, Any]) -> None:
        bad = sum(v for k, v in s["statuses"].items() if not k.startswith("2")) + s["transport_errors"]
        cells = [f"{s['ok']}/{s['requests']}", f"{s['rps']}", f"{s['items_per_s']}"]
        cells += [f"{s.get(k, '-')}" for k in ("p50_ms", "p95_ms", "p99_ms")] + [str(bad)]
        table.add_row(name, *cells)

    for key, value in results.items():
        if isinstance(value, dict) and "statuses" in value:
            row(key, value)
        elif key == "infinity" and "rounds" in value:
            for r, measured in enumerate(value["rounds"], 1):
                for name in ("distilembed", "infinity"):
                    row(f"peer round {r}: {name} c8", measured[name])
    Console(width=140).print(table)
    extras = {k: v for k, v in results.items() if not isinstance(v, dict) or "skipped" in v}
    if "median_ratio" in results.get("infinity", {}):
        ratios = [r["ratio"] for r in results["infinity"]["rounds"]]
        median = results["infinity"]["median_ratio"]
        extras["distilembed / infinity c8 req/s"] = {"rounds": ratios, "median": median}
    Console().print(extras)


def block_name(results: dict[str, Any]) -> str:
    return "serve-load" if results["meta"]["mode"] == "load" else "serve"


def non_2xx(phase: dict[str, Any]) -> int:
    bad = sum(n for code, n in phase["statuses"].items() if not str(code).startswith("2"))
    return bad + phase["transport_errors"]


def latency(phase: dict[str, Any]) -> tuple[str, str]:
    return fmt(phase["p50_ms"], ".2f"), fmt(phase["p99_ms"], ".2f")


def render(results: dict[str, Any]) -> str:
    meta, peer = results["meta"], results.get("infinity", {})
    if meta["mode"] == "load":
        return render_load(results)
    one = "embed_1_sentence_c"
    phases = {k: f"1 sentence, concurrency {k.removeprefix(one)}" for k in results if k.startswith(one)}
    phases["embed_16_sentences_c32"] = "16 sentences, concurrency 32"
    phases["search_c8"] = "/search, concurrency 8"
    rows = [
        [name, fmt(p["rps"]), fmt(None if key == "search_c8" else p["items_per_s"]), *latency(p), non_2xx(p)]
        for key, name in phases.items()
        if (p := results.get(key))
    ]
    rows.append(["in-process encoder, same texts", "", fmt(results["in_process_sent_per_s"]), "", "", ""])
    lines = [
        f"`distilembed serve --bundle {meta['bundle']}` (max_batch {meta['max_batch']}, run_batch "
        f"{meta['run_batch']}, index `{meta['index']}`), client {meta['client']}, "
        f"{meta['duration_cap_s']:.0f} s per phase over {meta['sentences']:,} STS-B test sentences.",
        "",
        markdown_table(("phase", "req/s", "sentences/s", "p50 ms", "p99 ms", "non-2xx"), rows),
    ]
    if "rounds" in peer:
        theirs = ", ".join(fmt(r["infinity"]["rps"]) for r in peer["rounds"])
        ratios = ", ".join(f"{r['ratio']:.2f}" for r in peer["rounds"])
        lines += [
            "",
            f"Against infinity-emb (`{peer['model']}`, {peer['engine']}), one sentence per request at "
            f"concurrency 8, {len(peer['rounds'])} alternating rounds: infinity {theirs} req/s; "
            f"distilembed / infinity {ratios}; **median {peer['median_ratio']:.2f}x**.",
        ]
    return "\n".join(lines)


def render_load(results: dict[str, Any]) -> str:
    load, meta, restart = results["load_c32"], results["meta"], results.get("restart_after_kill9")
    kinds = ", ".join(f"{kind} {v['ok']:,}" for kind, v in load["by_kind"].items())
    rows = [
        ("requests / ok", f"{load['requests']:,} / {load['ok']:,} ({kinds})"),
        ("5xx / transport errors", f"**{load['5xx']}** / {load['transport_errors']}"),
        ("p50 / p95 / p99 ms", " / ".join(fmt(load[k], ".0f") for k in ("p50_ms", "p95_ms", "p99_ms"))),
    ]
    if "rss_growth_pct" in results:
        mib = [results.get(k, 0) / 2**20 for k in ("rss_after_warmup_bytes", "rss_end_bytes")]
        rows.append(("RSS after warm-up / at the end", f"{mib[0]:.1f} / {mib[1]:.1f} MiB"))
        growth = f"**{results['rss_growth_pct']}%** ({results['rss_growth_mb']} MiB)"
        rows.append(("RSS growth", f"{growth}; {results['rss_growth_from_ready_pct']}% from `/ready`"))
    if restart:
        found = f"**{restart['found_again']:,} / {restart['documents_before']:,}**"
        rows.append(("documents held before `kill -9` / found again after restart", found))
    setup = (
        f"{load['seconds']:.0f} s at concurrency 32 ({meta['client']}) of embed, search and upsert on a copy "
        f"of `{meta['index']}`, after a warm-up; then `kill -9`, a restart, and every document looked up."
    )
    return f"{setup}\n\n{markdown_table(('figure', 'value'), rows)}"
