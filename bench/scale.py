"""Ray against plain runs on this machine, on a local Ray cluster each command starts; each writes its
JSON to --out and rewrites its block of docs/results.md (bench/harness.py: --no-doc, --render-from).

``ray-build`` (block ``scale-build``; with a fault, ``scale-build-faults``): the first --docs Wikipedia
sentences built with ``--engine local``, then ``--engine ray``: docs/s; ntotal, ids, vectors and the
top-10 of --queries queries compared. --kill-actor-at kill -9s one encoder actor once that share of
the splits is saved; --kill-driver-at then kill -9s the driver of an ``--on-disk`` Ray build there,
reruns it and checks that it encoded only what was left:

    python bench/scale.py ray-build --docs 1000000 --out docs/results/scale_build_1m_timed.json
    python bench/scale.py ray-build --docs 1000000 --kill-actor-at 0.3 --kill-driver-at 0.5 \\
        --out docs/results/scale_build_1m.json

``all`` (block ``scale``; --parts some of them: no block, the JSON under --work unless --out says):
build, as ray-build without faults; serve, plain ``serve`` and the --setups of Ray Serve (1 replica
of 2 CPUs, 2 of 1; or 1 behind Ray's Python proxy), each on a fresh index of --serve-docs STS-B
sentences: seconds to ready, one-sentence embed p50/p99 at concurrency 1 and req/s at 8, search p50
at 1, in --rounds rounds whose order rotates (each Ray figure divided by the plain one of its round,
medians reported); shards, the local build cut into 2 shards against the whole: QPS of held-out
queries in process, then search p50 over HTTP, plain ``serve`` of the whole against Ray of the shards.

    python bench/scale.py all --rounds 5 --out docs/results/scale.json     # about 25 minutes, 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness as h
import httpx
import numpy as np
from http_load import STS_TEST, fill, load, one_each, serving, sts_sentences
from index_build import CLI, WIKI, build_cmd, run_build, write_corpus

SPLIT = 8192  # lines per build split
RAY = ["--engine", "ray", "--replicas"]
SETUPS: dict[str, tuple[list[str], dict[str, str]]] = {
    "plain": ([], {}),
    "ray 1 replica": ([*RAY, "1", "--replica-cpus", "2"], {}),
    "ray 2 replicas": ([*RAY, "2", "--replica-cpus", "1"], {}),
    "ray 1 replica, Python proxy": ([*RAY, "1", "--replica-cpus", "2"], {"DISTILEMBED_RAY_HAPROXY": "false"}),
}
PARTS = ("build", "serve", "shards")


def compare(a_dir: Path, b_dir: Path, queries: int) -> dict[str, Any]:
    """Whether two indexes hold the same ids (internal and external) and vectors, and the same top-10."""
    from index.live import LiveIndex
    from index.vectors import held_vectors

    held = []
    for live in (LiveIndex(a_dir, writable=False), LiveIndex(b_dir, writable=False)):
        ids, vectors = held_vectors(live.index)
        order = np.argsort(ids)
        docs = live.store.get_many(ids.tolist())
        held.append((ids[order], vectors[order], [docs[int(i)].id for i in ids[order]], live))
    (a_ids, a_vec, a_ext, a), (b_ids, b_vec, b_ext, b) = held
    picks = np.random.default_rng(0).choice(len(a_vec), size=min(queries, len(a_vec)), replace=False)
    top_a, top_b = ([[hit.id for hit in row] for row in x.search(a_vec[picks], 10)] for x in (a, b))
    return {
        "ntotal": [int(a.ntotal), int(b.ntotal)],
        "same_ids": bool(np.array_equal(a_ids, b_ids) and a_ext == b_ext),
        "same_vectors": bool(a_vec.shape == b_vec.shape and np.array_equal(a_vec, b_vec)),
        "queries": len(picks),
        "same_top10": sum(x == y for x, y in zip(top_a, top_b, strict=True)),
    }


def processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found[int(proc.name)] = (ppid, (proc / "cmdline").read_bytes())
    return found


def watched_build(
    cmd: list[str], log: Path, docs: int, kill_actor_at: float | None, kill_driver_at: float | None
) -> tuple[float, dict[str, Any]]:
    """A Ray build that kill -9s one encoder actor once ``kill_actor_at`` of its splits are saved, and
    the driver once ``kill_driver_at`` are (then its local cluster, which would compete with a rerun)."""
    shards, splits, events = Path(cmd[cmd.index("--out") + 1] + ".partial") / "shards", -(-docs // SPLIT), {}
    start = time.perf_counter()
    with open(log, "w") as handle:
        driver = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)
        while driver.poll() is None:
            done = len(list(shards.glob("[0-9]*.npy")))
            due = kill_actor_at is not None and done >= kill_actor_at * splits and not events
            if due and (actors := [pid for pid, (_, line) in processes().items() if b"MapWorker" in line]):
                os.kill(actors[0], signal.SIGKILL)
                events["actor_killed_at_shards"] = done
            if kill_driver_at is not None and done >= kill_driver_at * splits:
                family, cluster = processes(), [driver.pid]
                for pid in cluster:  # grows as it is read: every descendant of the driver
                    cluster += [child for child, (ppid, _) in family.items() if ppid == pid]
                os.kill(driver.pid, signal.SIGKILL)  # the driver alone, as a crash would
                driver.wait()
                events["driver_killed_at_shards"] = len(list(shards.glob("[0-9]*.npy")))
                for pid in cluster[1:]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.5)  # a benchmark polls the build's progress; tests never do
    if driver.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"the build failed (exit {driver.returncode}): see {log}")
    return time.perf_counter() - start, events


def local_and_ray(args: argparse.Namespace, kill_actor_at: float | None = None) -> dict[str, Any]:
    """The first --docs sentences built by each engine: docs/s, the manifests' figures, equality."""
    work = args.work
    corpus = write_corpus(Path(args.source), args.docs, work / f"wiki-{args.docs}.txt")
    local = build_cmd(args.bundle, corpus, work / "local", "local", os.cpu_count())
    out: dict[str, Any] = {"local": {"wall_seconds": round(run_build(local, work / "local.log")[0], 1)}}
    ray = build_cmd(args.bundle, corpus, work / "ray", "ray")
    wall, events = watched_build(ray, work / "ray.log", args.docs, kill_actor_at, None)
    out["ray"] = {"wall_seconds": round(wall, 1), "killed": events}
    for engine in ("local", "ray"):
        manifest = json.loads((work / engine / "manifest.json").read_text())
        out[engine]["docs_per_s"] = round(manifest["ntotal"] / out[engine]["wall_seconds"], 1)
        out[engine] |= {k: manifest[k] for k in ("build_seconds", "encode_seconds_this_run", "ntotal")}
    out["ray_over_local"] = round(out["ray"]["docs_per_s"] / out["local"]["docs_per_s"], 3)
    return out | {"equality": compare(work / "local", work / "ray", args.queries)}


def ray_build(args: argparse.Namespace) -> dict[str, Any]:
    result = {"docs": args.docs, "bundle": h.repo_path(args.bundle), "cpus": os.cpu_count(), "run": args.run}
    result |= local_and_ray(args, args.kill_actor_at)
    h.write_json(args.out, result)  # the timed part, in case the killed-driver part is cut short
    if args.kill_driver_at is not None:
        corpus, resumed = args.work / f"wiki-{args.docs}.txt", args.work / "ray-resumed"
        cmd = [*build_cmd(args.bundle, corpus, resumed, "ray"), "--on-disk"]
        _, events = watched_build(cmd, args.work / "ray-killed.log", args.docs, None, args.kill_driver_at)
        wall, manifest = run_build(cmd, args.work / "ray-resumed.log")
        result["driver_killed"] = events | {
            "on_disk": True, "rerun_seconds": round(wall, 1),
            "rerun_docs_encoded": manifest["docs_encoded_this_run"],
            "equality": compare(args.work / "local", resumed, args.queries),
        }  # fmt: skip
    return result


def same(equality: dict[str, Any]) -> str:
    kept = [name for name in ("ids", "vectors") if equality[f"same_{name}"]]
    return f"same {', '.join(kept) or 'nothing'}; top-10 {equality['same_top10']:,}/{equality['queries']:,}"


def render_build(result: dict[str, Any]) -> str:
    splits, rows = -(-result["docs"] // SPLIT), []
    for engine in ("local", "ray"):
        r = result[engine]
        killed = r.get("killed", {}).get("actor_killed_at_shards")
        label = f"{engine}, kill -9 of an encoder actor at split {killed} of {splits}" if killed else engine
        ratio = f"{r['docs_per_s'] / result['local']['docs_per_s']:.3f}"
        cells = [f"{r['wall_seconds']:,.1f} s", f"{r['docs_per_s']:,.1f}", ratio, f"{r['ntotal']:,}"]
        rows.append([label, *cells, same(result["equality"]) if engine == "ray" else ""])
    header = ("engine", "wall-clock", "docs/s", "vs local", "ntotal", "against local")
    text = f"The first {result['docs']:,} Wikipedia sentences, `{result['bundle']}`, {result['cpus']} CPUs."
    text += f"\n\n{h.markdown_table(header, rows, 'lrrrrl')}"
    if driver := result.get("driver_killed"):
        text += (
            "\n\nkill -9 of the driver of an `--on-disk` Ray build at split "
            f"{driver['driver_killed_at_shards']} of {splits}, then the same command again: the rerun took "
            f"{driver['rerun_seconds']:,.1f} s and encoded **{driver['rerun_docs_encoded']:,}** documents; "
            f"against local: {same(driver['equality'])}."
        )
    return text


def measure_setup(args: argparse.Namespace, name: str, sentences: list[str]) -> h.Result:
    """One serve setup on a fresh index of --serve-docs sentences: seconds to ready, one-sentence
    embeds at concurrency 1 and 8, searches at 1 (of sentences from the end of the list)."""
    extra, env = SETUPS[name]
    embed, search = one_each("embed", sentences), one_each("search", sentences[::-1])
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        flags, log = ["--index", f"{tmp}/index", "--create-index", *extra], args.log_dir / f"{name}.log"
        started = time.perf_counter()
        with serving(args.bundle, flags, log, env=os.environ | env) as (base, _):
            out: h.Result = {"ready_s": round(time.perf_counter() - started, 1)}
            fill(base, sentences, args.serve_docs, "s")
            load(base, embed, 8, min(200, args.requests), 10)  # warm-up: arenas, connections, caches
            for key, make, c in (("embed_c1", embed, 1), ("embed_c8", embed, 8), ("search_c1", search, 1)):
                out[key] = load(base, make, c, args.requests, args.duration).summary()
    return out


def serve_rounds(args: argparse.Namespace) -> h.Result:
    """--rounds rounds of plain and the other --setups, the order rotating by one each round."""
    sentences, rounds = sts_sentences(args.sts_file), []
    names = [name for name in SETUPS if name in {"plain", *args.setups}]  # plain first: the baseline
    for r in range(args.rounds):
        rounds.append({})
        for name in names[r % len(names) :] + names[: r % len(names)]:
            print(f"-- serve, round {r + 1}: {name}", flush=True)
            rounds[-1][name] = measure_setup(args, name, sentences)
    return {"rounds": rounds, "summary": {name: summarise(rounds, name) for name in rounds[0]}}


def summarise(rounds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The medians over rounds of a setup's figures, and of their ratios to plain's in the same round."""
    runs = [(r[name], r["plain"]) for r in rounds if name in r]

    def median(phase: str, key: str, against_plain: bool = False) -> float:
        ratios = [m[phase][key] / (p[phase][key] if against_plain else 1) for m, p in runs]
        return round(float(np.median(ratios)), 2)

    phases = [m[phase]["statuses"] for m, _ in runs for phase in ("embed_c1", "embed_c8", "search_c1")]
    return {
        "rounds": len(runs),
        "c1_p50_ms": median("embed_c1", "p50_ms"), "c1_p99_ms": median("embed_c1", "p99_ms"),
        "c1_p50_vs_plain": median("embed_c1", "p50_ms", against_plain=True),
        "c8_rps": median("embed_c8", "rps"), "c8_rps_vs_plain": median("embed_c8", "rps", against_plain=True),
        "search_c1_p50_ms": median("search_c1", "p50_ms"),
        "ready_s": round(float(np.median([m["ready_s"] for m, _ in runs])), 2),
        "non_2xx": sum(n for statuses in phases for k, n in statuses.items() if not k.startswith("2")),
    }  # fmt: skip


def shards(args: argparse.Namespace) -> dict[str, Any]:
    """The local build's index cut into 2 shards against the whole: in-process QPS of held-out
    queries, one a call and as one batch (interleaved rounds); then over HTTP, plain ``serve`` of the
    whole against Ray of the shards (one IndexShard deployment each): search c1 p50; same top-10."""
    from export.runtime import Encoder
    from index.live import LiveIndex
    from index.shards import open_sharded

    whole, cut = args.work / "local", args.work / "sharded-2"
    cmd = [*CLI, "index", "shard", "--index", str(whole), "--shards", "2", "--out", str(cut), "--overwrite"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    skip = args.docs + 10_000  # past the corpus: not documents
    with gzip.open(args.source, "rt", encoding="utf-8") as handle:
        texts = [line.strip() for line in itertools.islice(handle, skip, skip + args.queries)]
    queries = Encoder(args.bundle, threads=os.cpu_count()).encode(texts)
    indexes = {"unsharded": LiveIndex(whole, writable=False), "2 shards": open_sharded(cut, queries.shape[1])}
    top = [
        [[(hit.id, round(hit.score, 4)) for hit in row] for row in ix.search(queries, 10)]
        for ix in indexes.values()
    ]
    calls: dict[str, Callable[[], object]] = {}
    for name, ix in indexes.items():
        calls[f"{name}, one query a call"] = lambda ix=ix: [ix.search(q[None], 10) for q in queries]
        calls[f"{name}, one batch"] = lambda ix=ix: ix.search(queries, 10)
    seconds = h.interleaved_seconds(calls, args.timing_rounds, desc="shard timing")
    for ix in indexes.values():
        ix.close()
    sample = texts[: args.http_queries]
    http: dict[str, Any] = {"queries": len(sample)}
    answers, search = [], one_each("search", sample)
    setups = {"plain, whole index": [], "ray, 2 shard deployments": [*RAY, "1", "--replica-cpus", "1"]}
    for (name, extra), index_dir in zip(setups.items(), (whole, cut), strict=True):
        print(f"-- shards over HTTP: {name}", flush=True)
        log = args.log_dir / f"{index_dir.name}.log"
        with serving(args.bundle, ["--index", str(index_dir), *extra], log) as (base, _):
            asked = [httpx.post(f"{base}/search", json={"query": t}, timeout=60).json() for t in sample]
            answers.append([[(hit["id"], round(hit["score"], 4)) for hit in a["results"]] for a in asked])
            load(base, search, 1, 100, 5)  # warm-up
            http[name] = load(base, search, 1, args.requests, args.duration).summary()
    http["same_top10"] = sum(a == b for a, b in zip(*answers, strict=True))
    return {
        "queries": len(queries),
        "same_top10": sum(a == b for a, b in zip(*top, strict=True)),
        "qps": {name: round(len(queries) / float(np.median(s)), 1) for name, s in seconds.items()},
        "http": http,
    }


def scale_all(args: argparse.Namespace) -> h.Result:
    meta = {"docs": args.docs, "bundle": h.repo_path(args.bundle), "cores": os.cpu_count()}
    result: h.Result = {"meta": meta | {"rounds": args.rounds, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
    for part, measure in (("build", local_and_ray), ("serve", serve_rounds), ("shards", shards)):
        if part in args.parts:
            result[part] = measure(args)
    return result | {"run": args.run}


def render_all(result: h.Result) -> str:
    """The scale table: rows for each part measured (all three: the block)."""
    meta, rows = result["meta"], []
    if b := result.get("build"):
        build, kept = f"build {meta['docs']:,}", same(b["equality"]).removeprefix("same ")
        rows.append([build, "local", "docs/s", f"{b['local']['docs_per_s']:,.0f}", "1.000", ""])
        ratio = f"**{b['ray_over_local']:.3f}**"
        rows.append([build, "ray", "docs/s", f"{b['ray']['docs_per_s']:,.0f}", ratio, kept])
    for name, s in result.get("serve", {}).get("summary", {}).items():  # c1 p50 and c8 req/s against plain's
        vs = "1 / 1" if name == "plain" else f"**{s['c1_p50_vs_plain']:.2f}** / {s['c8_rps_vs_plain']:.2f}"
        value = f"{s['c1_p50_ms']:.2f} / {s['c8_rps']:.0f}"
        rows.append(["serve", name, "c1 p50 ms / c8 req/s", value, vs, ""])
    if sh := result.get("shards"):
        top = f"top-10 {sh['same_top10']:,}/{sh['queries']:,}"
        for what in ("one query a call", "one batch"):
            whole, cut = sh["qps"][f"unsharded, {what}"], sh["qps"][f"2 shards, {what}"]
            cells = [f"{whole:,.0f} / {cut:,.0f}", f"{cut / whole:.2f}", top]
            rows.append(["shards (in-process)", f"unsharded / 2 shards, {what}", "QPS", *cells])
        http, setup = sh["http"], "plain whole index / Ray, 2 shard deployments"
        plain, ray = (http[k]["p50_ms"] for k in ("plain, whole index", "ray, 2 shard deployments"))
        top, value = f"top-10 {http['same_top10']}/{http['queries']}", f"{plain:.2f} / {ray:.2f}"
        rows.append(["shards (HTTP)", setup, "search c1 p50 ms", value, f"{ray / plain:.2f}", top])
    setup = (
        f"{meta['cores']} cores; `vs baseline` is against local / plain `serve` / the unsharded index. Serve "
        f"figures are medians over {meta['rounds']} rotating rounds of one sentence per request (each Ray "
        "figure divided by the plain run of its own round)."
    )
    header = ("part", "setup", "figure", "value", "vs baseline", "same results")
    return f"{setup}\n\n{h.markdown_table(header, rows, 'lllrrl')}"


def build_block(result: dict[str, Any]) -> str:
    return "scale-build-faults" if result["ray"].get("killed") or "driver_killed" in result else "scale-build"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    subs = parser.add_subparsers(dest="command", required=True)
    build, every = subs.add_parser("ray-build"), subs.add_parser("all")
    for sub, work in ((build, "scale_build"), (every, "scale")):
        arg = sub.add_argument
        arg("--bundle", default=str(h.ROOT / "models" / "default"))
        arg("--source", "--corpus", type=Path, default=WIKI, help="Wikipedia sentences, .gz")
        arg("--docs", type=int, default=200_000, help="Wikipedia sentences to build")
        arg("--queries", type=int, default=1000, help="queries compared (build, shards)")
        arg("--work", type=Path, default=h.ROOT / "runs" / work, help="corpus, indexes and build logs")
        h.add_doc_args(sub)
    build.add_argument("--out", type=Path, default=h.RESULTS / "scale_build.json")
    build.add_argument("--kill-actor-at", type=float, help="kill -9 an encoder actor of the Ray build here")
    build.add_argument("--kill-driver-at", type=float, help="then kill -9 an on-disk build's driver, rerun")
    arg = every.add_argument
    arg("--out", type=Path, help="results JSON (default docs/results/scale.json; some --parts: under --work)")
    arg("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    arg("--sts-file", type=Path, default=STS_TEST)
    arg("--rounds", type=int, default=3, help="rotating rounds of the serve setups")
    arg("--requests", type=int, default=2000, help="most requests per serve phase")
    arg("--duration", type=float, default=15.0, help="most seconds per serve phase")
    arg("--setups", nargs="+", default=list(SETUPS)[:3], choices=list(SETUPS), help="plain always runs")
    arg("--serve-docs", type=int, default=1000, help="documents upserted before the serve phases")
    arg("--http-queries", type=int, default=200, help="shards over HTTP: queries compared")
    arg("--timing-rounds", type=int, default=5, help="shards: interleaved timing rounds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    ray = args.command == "ray-build"  # its block: a function of the results
    measure, render, block = (
        (ray_build, render_build, build_block) if ray else (scale_all, render_all, "scale")
    )
    if h.publish_saved(args, block, render):
        return
    if not ray and set(args.parts) != set(PARTS):  # a part alone: no block
        args.no_doc, args.out = True, args.out or args.work / f"scale-{'-'.join(args.parts)}.json"
    args.out = args.out or h.RESULTS / "scale.json"
    os.environ.pop("RAY_ADDRESS", None)  # only ever a cluster this benchmark starts
    args.run, args.log_dir = h.run_info("bench/scale.py", argv), Path(tempfile.mkdtemp(prefix="bench-scale-"))
    result = measure(args)
    h.finish(args, result, block(result) if callable(block) else block, render)


if __name__ == "__main__":
    main()
