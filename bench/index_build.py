"""Index building on this machine; each measurement writes its JSON to --out and rewrites its block of
docs/results.md (bench/harness.py: --no-doc, --render-from).

Block ``index-build``, is a build encoder-bound: ``Encoder.encode`` on the first --n Wikipedia
sentences (median of --repeats, after a warm-up) against ``distilembed index build`` of the same
lines (the whole command, wall-clock):

    python bench/index_build.py --bundle models/default --n 30000 --out docs/results/index_build_s10.json

Block ``ondisk-rss``: ``distilembed serve`` of one corpus built with its lists in RAM and built
``--on-disk`` (bench/scale.py ray-build --kill-driver-at leaves both): VmRSS, RssAnon and RssFile
when ready and after each block of --searches (top 10; the last sentences of --source); --limit-mb
serves the on-disk one again in a cgroup-v1 memory limit (root):

    python bench/index_build.py ondisk-rss --in-ram runs/scale_build/ray \\
        --on-disk runs/scale_build/ray-resumed --limit-mb 400 --out docs/results/ondisk_rss_1m.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import harness as h
import httpx
from http_load import memory, serving

CLI = [sys.executable, "-m", "distilembed.cli"]
WIKI = Path(h.data_root()) / h.WIKIPEDIA
MB, RSS = 2**20, ("VmRSS", "RssAnon", "RssFile")


def write_corpus(source: Path, n: int, dest: Path) -> Path:
    """The first ``n`` lines of the gzipped ``source`` (reused when it exists)."""
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(source, "rt", encoding="utf-8") as src:
            dest.with_suffix(".tmp").write_text("".join(itertools.islice(src, n)), encoding="utf-8")
        dest.with_suffix(".tmp").replace(dest)
    return dest


def build_cmd(bundle: str, corpus: Path, out: Path, engine: str, threads: int | None = None) -> list[str]:
    cmd = [*CLI, "index", "build", "--bundle", bundle, "--corpus", str(corpus), "--out", str(out)]
    return [*cmd, "--engine", engine, "--overwrite", *(["--threads", str(threads)] if threads else [])]


def run_build(cmd: list[str], log: Path) -> tuple[float, dict[str, Any]]:
    """Wall-clock seconds of an ``index build`` command, and the manifest it wrote."""
    start = time.perf_counter()
    with open(log, "w") as handle:
        subprocess.run(cmd, check=True, stdout=handle, stderr=subprocess.STDOUT)
    out = Path(cmd[cmd.index("--out") + 1])
    return time.perf_counter() - start, json.loads((out / "manifest.json").read_text())


def index_build(args: argparse.Namespace) -> h.Result:
    """Encoder.encode (median of --repeats, after a warm-up) and ``index build`` on the same lines."""
    from export.runtime import Encoder

    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(Path(args.source), args.n, Path(tmp) / "corpus.txt")
        texts = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
        encoder = Encoder(args.bundle, threads=args.threads, batch_size=args.batch_size)
        encoder.encode(texts[:256])
        seconds = h.interleaved_seconds({"encode": partial(encoder.encode, texts)}, args.repeats)["encode"]
        del encoder
        cmd = build_cmd(args.bundle, corpus, Path(tmp) / "index", "local", args.threads)
        wall, manifest = run_build(cmd, Path(tmp) / "build.log")
    encoder_rate, build_rate = statistics.median(len(texts) / s for s in seconds), len(texts) / wall
    return {
        "n": len(texts), "threads": args.threads, "bundle": h.repo_path(args.bundle),
        "encoder_docs_per_s": round(encoder_rate, 1), "build_docs_per_s_wall_clock": round(build_rate, 1),
        "build_docs_per_s_manifest": manifest.get("build", {}).get("docs_per_s", manifest.get("docs_per_s")),
        "build_over_encoder": round(build_rate / encoder_rate, 3),
        "index": {k: manifest.get(k) for k in ("index_type", "nlist", "nprobe", "ntotal")}, "run": args.run,
    }  # fmt: skip


def render_index_build(result: h.Result) -> str:
    shape, build = result["index"], "`distilembed index build`, whole command, wall-clock"
    rows = [
        ("`Encoder.encode`, in process", f"{result['encoder_docs_per_s']:,.1f}"),
        (build, f"{result['build_docs_per_s_wall_clock']:,.1f}"),
        ("ratio build / encoder", f"{result['build_over_encoder']:.3f}"),
    ]
    return (
        f"First {result['n']:,} Wikipedia sentences, `{result['bundle']}`, {result['threads']} threads; "
        f"the build made {shape['index_type']} nlist {shape['nlist']}, nprobe {shape['nprobe']}.\n\n"
        + h.markdown_table(("measure", "docs/s"), rows)
    )


@contextlib.contextmanager
def memory_cgroup(limit_mb: int, on_disk: Path) -> Iterator[Path]:
    """A cgroup-v1 memory group limited to ``limit_mb`` (no swap here: only page cache and mapped file
    pages can be given back, so the mapped lists are what the kernel drops). Page cache stays charged
    to the group that first read it: the index's pages are evicted first, or the earlier runs' cached
    lists would be mapped for free and the limit never bite."""
    for path in (p for p in on_disk.iterdir() if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    root = Path("/sys/fs/cgroup/memory")
    (group := root / f"distilembed-bench-{os.getpid()}").mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mb * MB))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (root / "cgroup.procs").write_text(pid)  # back to the root before removing
        group.rmdir()


def served_memory(index_dir: Path, args: argparse.Namespace, texts: list[str], group: Path | None) -> dict:
    """``serve`` of ``index_dir``: its memory when ready and after each block of searches."""
    # In a group, the shell joins it first and then becomes the server, so every page is charged there.
    prefix = ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "serve"] if group else []
    size = sum(p.stat().st_size for p in index_dir.iterdir() if p.suffix in (".faiss", ".ivfdata"))
    out: dict[str, Any] = {"index_dir": str(index_dir), "index_bytes": size}
    log = args.log_dir / f"{index_dir.name}.log"
    with serving(args.bundle, ["--index", str(index_dir)], log, prefix=prefix) as (base, proc):
        out["info"] = httpx.get(f"{base}/info").json()["index"]
        out["samples"] = [{"searches": 0} | memory(proc.pid, RSS)]
        with httpx.Client(base_url=base, timeout=60) as client:
            for lo, hi in itertools.pairwise([0, *args.searches]):
                start = time.perf_counter()
                for text in texts[lo:hi]:
                    client.post("/search", json={"query": text, "top_k": 10}).raise_for_status()
                ms = round((time.perf_counter() - start) * 1000 / (hi - lo), 2)
                out["samples"].append({"searches": hi, "ms_per_search": ms} | memory(proc.pid, RSS))
        if group is not None:
            names = {"limit_bytes": "limit_in_bytes", "max_usage_bytes": "max_usage_in_bytes"}
            names["times_at_limit"] = "failcnt"
            out["cgroup"] = {key: int((group / f"memory.{name}").read_text()) for key, name in names.items()}
    return out


def ondisk_rss(args: argparse.Namespace) -> h.Result:
    args.log_dir = Path(tempfile.mkdtemp(prefix="bench-ondisk-rss-"))
    with gzip.open(args.source, "rt", encoding="utf-8") as handle:  # the file's last sentences
        texts = [line.strip() for line in collections.deque(handle, maxlen=max(args.searches))]
    dirs = {"in RAM": args.in_ram, "on disk": args.on_disk}
    result = {name: served_memory(index_dir, args, texts, None) for name, index_dir in dirs.items()}
    if args.limit_mb:
        with memory_cgroup(args.limit_mb, args.on_disk) as group:
            result[f"on disk, {args.limit_mb} MB limit"] = served_memory(args.on_disk, args, texts, group)
    return result | {"run": args.run}


def render_ondisk(result: h.Result) -> str:
    """One row per server, its samples (after 0, 100, ... searches) joined by slashes; MB are MiB."""
    rows = []
    for name, r in ((k, v) for k, v in result.items() if k != "run"):
        samples, size = r["samples"], r["index_bytes"]
        cells = [" / ".join(f"{s['searches']:,}" for s in samples)]
        cells.append(" / ".join(f"{s['ms_per_search']:.1f}" for s in samples if "ms_per_search" in s))
        cells += [" / ".join(f"{s[field] / MB:.0f}" for s in samples) for field in RSS]
        cells.append(" / ".join(f"{s['VmRSS'] / size:.2f}" for s in samples))
        rows.append([name, f"{r['info']['ntotal']:,}", f"{size / MB:.0f}", *cells])
    header = ("index", "ntotal", "index MB", "searches", "ms/search", "VmRSS MB", "RssAnon MB", "RssFile MB")
    return h.markdown_table((*header, "RSS / index"), rows, "lrrrrrrrr")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    rss = argv[:1] == ["ondisk-rss"]
    block, measure, render = (
        ("ondisk-rss", ondisk_rss, render_ondisk) if rss else ("index-build", index_build, render_index_build)
    )
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.prog += " ondisk-rss" if rss else ""
    arg = parser.add_argument
    arg("--bundle", default=str(h.ROOT / "models" / "default"))
    arg("--source", "--corpus", type=Path, default=WIKI, help="Wikipedia sentences, .gz")
    arg("--out", type=Path, default=h.RESULTS / f"{block.replace('-', '_')}.json")
    if rss:
        arg("--in-ram", type=Path, help="an index built without --on-disk")
        arg("--on-disk", type=Path, help="the same corpus built with --on-disk")
        arg("--searches", type=int, nargs="+", default=[100, 1000, 5000])
        arg("--limit-mb", type=int, help="also serve the on-disk index under this memory limit (cgroup v1)")
    else:
        arg("--n", type=int, default=30_000)
        arg("--threads", type=int, default=os.cpu_count() or 1)
        arg("--batch-size", type=int, default=64)
        arg("--repeats", type=int, default=1, help="encoder timings (median)")
    h.add_doc_args(parser)
    args = parser.parse_args(argv[1:] if rss else argv)
    if h.publish_saved(args, block, render):
        return
    if rss and not (args.in_ram and args.on_disk):
        parser.error("ondisk-rss measures --in-ram and --on-disk (two builds of one corpus)")
    args.run = h.run_info("bench/index_build.py", argv)
    h.finish(args, measure(args), block, render)


if __name__ == "__main__":
    main()
