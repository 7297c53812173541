"""The Ray index build against the local build on the same corpus, through the CLI a user runs.

    python bench/scale_build.py --docs 1000000 --kill-actor-at 0.3 --kill-driver-at 0.5 \
        --out docs/results/scale_build_1m.json

Builds the first --docs Wikipedia sentences with ``--engine local``, then ``--engine ray`` (a
local Ray cluster on this machine only; --kill-actor-at kill -9s one encoder actor part-way, so the
timed run includes Ray restarting it and retrying its split), reports both docs/s and their ratio,
and checks that the two indexes hold the same ntotal, ids and vectors and give the same top-10 for
--queries queries. --kill-driver-at then runs an ``--on-disk`` Ray build, kill -9s its driver
part-way, reruns the same command, and checks the rerun encoded only what was left and that its
index equals the local one. Rewrites the block ``scale-build`` of docs/results.md
(``scale-build-faults`` when something was killed; --no-doc: not); ``--render-from JSON`` rewrites it
from an earlier run's JSON, measuring nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import add_doc_args, markdown_table, publish, publish_saved, run_info
from rich.console import Console
from rich.table import Table

SPLIT = 8192


def write_corpus(source: Path, n: int, dest: Path) -> Path:
    if dest.exists():
        return dest
    tmp = dest.with_suffix(".tmp")
    with gzip.open(source, "rt", encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as out:
        for i, line in enumerate(src):
            if i == n:
                break
            out.write(line)
    tmp.replace(dest)
    return dest


def build_cmd(args: argparse.Namespace, corpus: Path, out: Path, engine: str) -> list[str]:
    cmd = [sys.executable, "-m", "distilembed.cli", "index", "build", "--bundle", args.bundle]
    cmd += ["--corpus", str(corpus), "--out", str(out), "--engine", engine, "--overwrite"]
    return cmd + (["--threads", str(args.local_threads)] if engine == "local" else [])


def run_build(cmd: list[str], log: Path) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    with open(log, "w") as handle:
        subprocess.run(cmd, check=True, stdout=handle, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    out = Path(cmd[cmd.index("--out") + 1])
    return wall, json.loads((out / "manifest.json").read_text())


def contents(directory: Path) -> tuple[np.ndarray, np.ndarray, list[str], Any]:
    from index.live import LiveIndex
    from index.vectors import held_vectors

    live = LiveIndex(directory, writable=False)
    ids, vectors = held_vectors(live.index)
    order = np.argsort(ids)
    docs = live.store.get_many(ids.tolist())
    return ids[order], vectors[order], [docs[int(i)].id for i in ids[order]], live


def compare(a_dir: Path, b_dir: Path, queries: int) -> dict[str, Any]:
    a_ids, a_vec, a_ext, a = contents(a_dir)
    b_ids, b_vec, b_ext, b = contents(b_dir)
    picks = np.random.default_rng(0).choice(len(a_vec), size=min(queries, len(a_vec)), replace=False)
    top_a = [[h.id for h in row] for row in a.search(a_vec[picks], 10)]
    top_b = [[h.id for h in row] for row in b.search(a_vec[picks], 10)]
    return {
        "ntotal": [int(a.ntotal), int(b.ntotal)],
        "same_ids": bool(np.array_equal(a_ids, b_ids) and a_ext == b_ext),
        "same_vectors": bool(a_vec.shape == b_vec.shape and np.array_equal(a_vec, b_vec)),
        "queries": len(picks),
        "same_top10": sum(x == y for x, y in zip(top_a, top_b, strict=True)),
    }


def encoder_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if proc.name.isdigit() and b"MapWorker" in cmdline:
            pids.append(int(proc.name))
    return pids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (by parent pid), e.g. the local Ray cluster a driver started."""
    parents: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def shards_done(out: Path) -> int:
    return len(list((out.with_name(out.name + ".partial") / "shards").glob("[0-9]*.npy")))


def watched_build(
    cmd: list[str], log: Path, total_splits: int, kill_actor_at: float | None, kill_driver_at: float | None
) -> tuple[float, dict[str, Any]]:
    """Run a Ray build, kill -9 one encoder actor once ``kill_actor_at`` of the splits are saved
    and the driver once ``kill_driver_at`` are; returns (wall seconds, what was killed when)."""
    out = Path(cmd[cmd.index("--out") + 1])
    events: dict[str, Any] = {}
    start = time.perf_counter()
    with open(log, "w") as handle:
        driver = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)
        while driver.poll() is None:
            done = shards_done(out)
            due = kill_actor_at is not None and done >= kill_actor_at * total_splits
            if due and "actor_killed_at_shards" not in events and (pids := encoder_pids()):
                os.kill(pids[0], signal.SIGKILL)
                events["actor_killed_at_shards"] = done
            if kill_driver_at is not None and done >= kill_driver_at * total_splits:
                cluster = descendants(driver.pid)
                os.kill(driver.pid, signal.SIGKILL)  # the driver alone, as a crash would
                driver.wait()
                events["driver_killed_at_shards"] = shards_done(out)
                # Its local cluster would outlive it here and compete with the rerun for the CPUs.
                for pid in cluster:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.5)  # a bench polls the build's progress; tests never do
    if driver.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"the build failed (exit {driver.returncode}): see {log}")
    return time.perf_counter() - start, events


def block_name(result: dict[str, Any]) -> str:
    return "scale-build-faults" if result["ray"].get("killed") or "driver_killed" in result else "scale-build"


def same(equality: dict[str, Any]) -> str:
    kept = [name for name in ("ids", "vectors") if equality[f"same_{name}"]]
    return f"same {', '.join(kept) or 'nothing'}; top-10 {equality['same_top10']:,}/{equality['queries']:,}"


def render(result: dict[str, Any]) -> str:
    splits = -(-result["docs"] // SPLIT)
    rows = []
    for engine in ("local", "ray"):
        r = result[engine]
        killed = r.get("killed", {}).get("actor_killed_at_shards")
        label = f"{engine}, kill -9 of an encoder actor at split {killed} of {splits}" if killed else engine
        ratio = f"{r['docs_per_s'] / result['local']['docs_per_s']:.3f}"
        check = same(result["equality"]) if engine == "ray" else ""
        cells = [f"{r['wall_seconds']:,.1f} s", f"{r['docs_per_s']:,.1f}", ratio, f"{r['ntotal']:,}"]
        rows.append([label, *cells, check])
    header = ("engine", "wall-clock", "docs/s", "vs local", "ntotal", "against local")
    lines = [
        f"The first {result['docs']:,} Wikipedia sentences, `{result['bundle']}`, {result['cpus']} CPUs.",
        "",
        markdown_table(header, rows, "lrrrrl"),
    ]
    driver = result.get("driver_killed")
    if driver:
        lines += [
            "",
            f"kill -9 of the driver of an `--on-disk` Ray build at split {driver['driver_killed_at_shards']} "
            f"of {splits}, then the same command again: the rerun took {driver['rerun_seconds']:,.1f} s and "
            f"encoded **{driver['rerun_docs_encoded']:,}** documents; against local: "
            f"{same(driver['equality'])}.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument("--source", default=f"{data}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--local-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--work", default="runs/scale_build")
    parser.add_argument(
        "--kill-actor-at",
        type=float,
        help="kill -9 an encoder actor of the timed Ray build here",
    )
    parser.add_argument(
        "--kill-driver-at", type=float, help="then an on-disk Ray build whose driver is killed here, rerun"
    )
    parser.add_argument("--out", default="docs/results/scale_build.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, block_name, render):
        return

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(Path(args.source), args.docs, work / f"wiki-{args.docs}.txt")
    result: dict[str, Any] = {"docs": args.docs, "bundle": args.bundle, "cpus": os.cpu_count()}
    result["run"] = run_info("bench/scale_build.py", argv)
    splits = -(-args.docs // SPLIT)
    wall, _ = run_build(build_cmd(args, corpus, work / "local", "local"), work / "local.log")
    result["local"] = {"wall_seconds": round(wall, 1)}
    cmd = build_cmd(args, corpus, work / "ray", "ray")
    wall, events = watched_build(cmd, work / "ray.log", splits, args.kill_actor_at, None)
    result["ray"] = {"wall_seconds": round(wall, 1), "killed": events}
    for engine in ("local", "ray"):
        manifest = json.loads((work / engine / "manifest.json").read_text())
        result[engine]["docs_per_s"] = round(manifest["ntotal"] / result[engine]["wall_seconds"], 1)
        result[engine] |= {k: manifest[k] for k in ("build_seconds", "encode_seconds_this_run", "ntotal")}
    result["ray_over_local"] = round(result["ray"]["docs_per_s"] / result["local"]["docs_per_s"], 3)
    result["equality"] = compare(work / "local", work / "ray", args.queries)
    save(result, Path(args.out))  # the timed part, in case the killed-driver part is cut short
    if args.kill_driver_at is not None:
        cmd = [*build_cmd(args, corpus, work / "ray-resumed", "ray"), "--on-disk"]
        _, events = watched_build(cmd, work / "ray-killed.log", splits, None, args.kill_driver_at)
        wall, manifest = run_build(cmd, work / "ray-resumed.log")
        result["driver_killed"] = events | {
            "on_disk": True,
            "rerun_seconds": round(wall, 1),
            "rerun_docs_encoded": manifest["docs_encoded_this_run"],
            "equality": compare(work / "local", work / "ray-resumed", args.queries),
        }

    table = Table(title=f"index build of {args.docs:,} Wikipedia sentences, {os.cpu_count()} cores")
    for col in ("engine", "wall s", "docs/s", "vs local"):
        table.add_column(col, justify="right")
    for engine in ("local", "ray"):
        row = result[engine]
        rate = row["docs_per_s"] / result["local"]["docs_per_s"]
        table.add_row(engine, f"{row['wall_seconds']:.1f}", f"{row['docs_per_s']:.1f}", f"{rate:.3f}")
    Console().print(table)
    Console().print(json.dumps({k: result.get(k) for k in ("equality", "driver_killed")}, indent=1))
    save(result, Path(args.out))
    publish(args, result, Path(args.out), block_name(result), render)


def save(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
