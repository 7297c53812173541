"""The Ray index build against the local build on the same corpus, through the CLI a user runs.

    python bench/scale_build.py --docs 1000000 --out bench/results/scale_build.json
    python bench/scale_build.py --docs 1000000 --faults --out bench/results/scale_build_faults.json

Builds the first --docs Wikipedia sentences with ``--engine local`` and ``--engine ray`` (a local
Ray cluster on this machine only), reports both docs/s and their ratio, and checks that the two
indexes hold the same ntotal, ids and vectors, and give the same top-10 for --queries queries.
``--faults`` then builds with Ray again, kill -9s one encoder actor process part-way, kill -9s the
driver (its whole process group) later, reruns it, and checks the result against the local build
and that the rerun encoded only what was left.
"""

from __future__ import annotations

import argparse
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
from rich.console import Console
from rich.table import Table


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


def shards_done(out: Path) -> int:
    return len(list((out.with_name(out.name + ".partial") / "shards").glob("[0-9]*.npy")))


def faults(args: argparse.Namespace, corpus: Path, out: Path, total_splits: int, log: Path) -> dict[str, Any]:
    """kill -9 an actor at --kill-actor-at of the splits, the driver at --kill-driver-at, rerun."""
    cmd = build_cmd(args, corpus, out, "ray")
    events: dict[str, Any] = {}
    with open(log, "w") as handle:
        driver = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        while driver.poll() is None:
            done = shards_done(out)
            if "actor_killed_at_shards" not in events and done >= args.kill_actor_at * total_splits:
                if pids := encoder_pids():
                    os.kill(pids[0], signal.SIGKILL)
                    events["actor_killed_at_shards"] = done
            if "actor_killed_at_shards" in events and done >= args.kill_driver_at * total_splits:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
                events["driver_killed_at_shards"] = shards_done(out)
                break
            time.sleep(0.5)  # a bench polls the build's progress; tests never do
    events["killed_driver_exit"] = driver.returncode
    wall, manifest = run_build(cmd, log.with_suffix(".rerun.log"))
    events |= {"rerun_seconds": round(wall, 1), "rerun_docs_encoded": manifest["docs_encoded_this_run"]}
    return events


def main() -> None:
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument("--source", default=f"{data}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--local-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--work", default="runs/scale_build")
    parser.add_argument("--faults", action="store_true", help="also the kill -9 run (actor, then driver)")
    parser.add_argument("--kill-actor-at", type=float, default=0.3)
    parser.add_argument("--kill-driver-at", type=float, default=0.6)
    parser.add_argument("--out", default="bench/results/scale_build.json")
    args = parser.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(Path(args.source), args.docs, work / f"wiki-{args.docs}.txt")
    result: dict[str, Any] = {"docs": args.docs, "bundle": args.bundle, "cpus": os.cpu_count()}
    rows = []
    for engine in ("local", "ray"):
        wall, manifest = run_build(build_cmd(args, corpus, work / engine, engine), work / f"{engine}.log")
        result[engine] = {"wall_seconds": round(wall, 1), "docs_per_s": round(manifest["ntotal"] / wall, 1)}
        result[engine] |= {k: manifest[k] for k in ("build_seconds", "encode_seconds_this_run", "index_type")}
        rows.append((engine, wall, manifest["ntotal"] / wall))
    result["ray_over_local"] = round(result["ray"]["docs_per_s"] / result["local"]["docs_per_s"], 3)
    result["equality"] = compare(work / "local", work / "ray", args.queries)
    if args.faults:
        splits = -(-args.docs // 8192)
        result["faults"] = faults(args, corpus, work / "ray-faults", splits, work / "ray-faults.log")
        result["faults"]["equality"] = compare(work / "local", work / "ray-faults", args.queries)

    table = Table(title=f"index build of {args.docs:,} Wikipedia sentences, {os.cpu_count()} cores")
    for col in ("engine", "wall s", "docs/s", "vs local"):
        table.add_column(col, justify="right")
    for engine, wall, rate in rows:
        table.add_row(engine, f"{wall:.1f}", f"{rate:.1f}", f"{rate / rows[0][2]:.3f}")
    Console().print(table)
    Console().print(json.dumps({k: result[k] for k in result if k in ("equality", "faults")}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
