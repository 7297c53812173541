"""bench/serve.py's tables: block ``serve`` (the phases against the in-process encoder, each with the
server's CPU a request, and infinity-emb) and block ``serve-load``."""

from __future__ import annotations

from typing import Any

import harness as h


def render(results: dict[str, Any]) -> str:
    meta, peer = results["meta"], results.get("infinity", {})
    if meta["mode"] == "load":
        return render_load(results)
    one = "embed_1_sentence_c"
    phases = {k: f"1 sentence, concurrency {k.removeprefix(one)}" for k in results if k.startswith(one)}
    phases["embed_16_sentences_c32"] = "16 sentences, concurrency 32"
    phases["search_c8"] = "/search, concurrency 8"
    phases["search_c1"] = "/search, concurrency 1"
    phases["search_32_queries_c1"] = "/search, 32 queries a request, concurrency 1"
    rows = []
    encoder, embed_c8 = results["in_process_sent_per_s"], results.get("embed_1_sentence_c8", {}).get("rps")
    for key, name in phases.items():
        if p := results.get(key):
            bad = sum(n for code, n in p["statuses"].items() if not str(code).startswith("2"))
            search = key in ("search_c8", "search_c1")
            items = h.fmt(None if search else p["items_per_s"])
            latency = [h.fmt(p.get(f"p{q}_ms"), ".2f") for q in (50, 99)]
            ratio = (
                p["rps"] / embed_c8 if search and embed_c8 else None if search else p["items_per_s"] / encoder
            )
            if key == "search_c8" and "search_vs_embed_c8" in results:  # the paired rounds' median
                ratio = results["search_vs_embed_c8"]["median"]
            if key == "embed_1_sentence_c32" and "c32_vs_in_process" in results:  # paired the same way
                ratio = results["c32_vs_in_process"]["median"]
            if key == "search_c1":  # against one-sentence embeds at the same concurrency
                ratio = p["rps"] / results["embed_1_sentence_c1"]["rps"]
            if key == "search_32_queries_c1":  # queries/s against one query a request, paired
                paired = results.get("search32_vs_search_c1")
                ratio = paired["median"] if paired else p["items_per_s"] / results["search_c1"]["rps"]
            cells = [name, h.fmt(p["rps"]), items, h.fmt(ratio, ".0%"), *latency, cpu_cell(p)]
            rows.append([*cells, bad + p["transport_errors"]])
    batch1, core_ms = results.get("in_process_batch1_p50_ms"), results.get("in_process_core_ms")
    in_process = ["in-process encoder, same texts", "", h.fmt(encoder), "100%", h.fmt(batch1, ".2f"), ""]
    rows.append([*in_process, h.fmt(core_ms, ".2f") + " a sentence" if core_ms else "", ""])
    text = (
        f"`distilembed serve --bundle {meta['bundle']}` (max_batch {meta['max_batch']}, run_batch "
        f"{meta['run_batch']}, index `{meta['index']}`), client {meta['client']}, "
        f"{meta['duration_cap_s']:.0f} s per phase over {meta['sentences']:,} STS-B test sentences.\n\n"
    ) + h.markdown_table(
        ("phase", "req/s", "sentences/s", "of in-process", "p50 ms", "p99 ms", "CPU ms (loop)", "non-2xx"),
        rows,
    )
    text += (
        "\n\n*of in-process*: sentences/s against the in-process encoder (length-sorted runs of run_batch, "
        "all threads; at concurrency 32 the median of --peer-rounds back-to-back pairs with it, order "
        "alternating); for /search, its req/s against one-sentence embeds at the same concurrency (at 8: "
        "paired the same way); for 32 queries a request, its queries/s against one query a request (paired "
        "too). The in-process p50 is one sentence at a time. *CPU ms (loop)*: the server's CPU time a "
        "request, all threads (its event loop's alone); for the encoder, a sentence's. The load generator "
        "runs on the same cores."
    )
    if "rounds" in peer:
        theirs = ", ".join(h.fmt(r["infinity"]["rps"]) for r in peer["rounds"])
        ratios = ", ".join(f"{r['ratio']:.2f}" for r in peer["rounds"])
        text += (
            f"\n\nAgainst infinity-emb (`{peer['model']}`, {peer['engine']}), one sentence per request at "
            f"concurrency 8, {len(peer['rounds'])} alternating rounds: infinity {theirs} req/s; "
            f"distilembed / infinity {ratios}; **median {peer['median_ratio']:.2f}x**."
        )
    return text


def render_load(results: dict[str, Any]) -> str:
    load_, meta, restart = results["load_c32"], results["meta"], results.get("restart_after_kill9")
    kinds = ", ".join(f"{kind} {v['ok']:,}" for kind, v in load_["by_kind"].items())
    rows = [
        ("requests / ok", f"{load_['requests']:,} / {load_['ok']:,} ({kinds})"),
        ("5xx / transport errors", f"**{load_['5xx']}** / {load_['transport_errors']}"),
        ("p50 / p95 / p99 ms", " / ".join(h.fmt(load_[k], ".0f") for k in ("p50_ms", "p95_ms", "p99_ms"))),
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
        f"{load_['seconds']:.0f} s at concurrency 32 ({meta['client']}) of embed, search and upsert on a "
        f"copy of `{meta['index']}`, after a warm-up; then `kill -9`, a restart, and every document "
        "looked up."
    )
    return f"{setup}\n\n{h.markdown_table(('figure', 'value'), rows)}"


def cpu_cell(phase: dict[str, Any]) -> str:
    """The server's core-ms a request and, in brackets, its event loop's ("" if not measured)."""
    if "server_core_ms" not in phase:
        return ""
    return f"{phase['server_core_ms']:.2f} ({phase['loop_core_ms']:.2f})"
