"""What a service over an ``--on-disk`` index keeps in memory, against the same index held in RAM.

    python bench/ondisk_rss.py --in-ram runs/scale_build/local --on-disk runs/scale_build/ray-resumed \
        --out docs/results/ondisk_rss_1m.json

For each index, plain ``distilembed serve`` on 127.0.0.1 is started, its memory read from
/proc/PID/status when ready and after each --searches block of searches (the source file's last
sentences): VmRSS, split into RssAnon (the process's own memory) and RssFile (pages of mapped
files, the on-disk lists among them: page cache that the kernel drops under memory pressure and
reads back on the next probe). The index's size is its Faiss files (the .faiss file and, on disk, .ivfdata).
With --limit-mb the on-disk index is served a third time inside a cgroup-v1 memory limit (needs
root and /sys/fs/cgroup/memory): the kernel must then drop mapped pages to stay under it, which is
what RSS below the index's size means under memory pressure; search latency is recorded too.
Rewrites the block ``ondisk-rss`` of docs/results.md (--no-doc: not); ``--render-from JSON``
rewrites it from an earlier run's JSON, measuring nothing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_doc_args, markdown_table, publish, publish_saved, run_info  # noqa: E402
from http_harness import free_port, server  # noqa: E402

FIELDS = ("VmRSS", "RssAnon", "RssFile")
MB = 1024 * 1024
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def memory(pid: int) -> dict[str, int]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    values = {line.split(":")[0]: line.split()[1] for line in lines if line.split(":")[0] in FIELDS}
    return {name: int(values[name]) * 1024 for name in FIELDS}


def index_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.suffix in (".faiss", ".ivfdata"))


@contextlib.contextmanager
def memory_cgroup(limit_mb: int) -> Iterator[Path]:
    """A cgroup-v1 memory group limited to ``limit_mb`` (no swap here: only page cache and mapped
    file pages can be given back, so the mapped lists are what the kernel drops)."""
    group = CGROUP_ROOT / f"distilembed-bench-{os.getpid()}"
    # Page cache stays charged to the group that first read it: evict the index's pages first, or
    # the earlier runs' cached lists would be mapped for free and the limit never bite.
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mb * MB))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (CGROUP_ROOT / "cgroup.procs").write_text(pid)  # back to the root before removing
        group.rmdir()


def evict_from_page_cache(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def measure(
    index_dir: Path, args: argparse.Namespace, texts: list[str], log_dir: Path, group: Path | None = None
) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # In a group, the shell joins it first and then becomes the server, so every page is charged there.
    wrap = ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "serve"] if group else []
    cmd = [
        *wrap,
        sys.executable,
        "-m",
        "distilembed.cli",
        "serve",
        "--bundle",
        args.bundle,
        "--index",
        str(index_dir),
    ]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    out: dict[str, Any] = {"index_dir": str(index_dir), "index_bytes": index_bytes(index_dir), "samples": []}
    with server(cmd, f"{base}/ready", log_dir / f"{index_dir.name}.log") as proc:
        out["info"] = httpx.get(f"{base}/info").json()["index"]
        out["samples"].append({"searches": 0} | memory(proc.pid))
        with httpx.Client(base_url=base, timeout=60) as client:
            done = 0
            for block in args.searches:
                start = time.perf_counter()
                for text in texts[done:block]:
                    client.post("/search", json={"query": text, "top_k": 10}).raise_for_status()
                per_search_ms = (time.perf_counter() - start) * 1000 / (block - done)
                done = block
                out["samples"].append(
                    {"searches": done, "ms_per_search": round(per_search_ms, 2)} | memory(proc.pid)
                )
        if group is not None:
            out["cgroup"] = {
                "limit_bytes": int((group / "memory.limit_in_bytes").read_text()),
                "max_usage_bytes": int((group / "memory.max_usage_in_bytes").read_text()),
                "times_at_limit": int((group / "memory.failcnt").read_text()),
            }
    return out


def render(result: dict[str, Any]) -> str:
    """One row per server, its samples (after 0, 100, ... searches) joined by slashes; MB are MiB."""
    rows = []
    for name, r in result.items():
        if name == "run":
            continue
        samples = r["samples"]
        cells = [
            " / ".join(f"{s['searches']:,}" for s in samples),
            " / ".join(f"{s['ms_per_search']:.1f}" for s in samples if "ms_per_search" in s),
            *(" / ".join(f"{s[f] / MB:.0f}" for s in samples) for f in FIELDS),
            " / ".join(f"{s['VmRSS'] / r['index_bytes']:.2f}" for s in samples),
        ]
        rows.append([name, f"{r['info']['ntotal']:,}", f"{r['index_bytes'] / MB:.0f}", *cells])
    header = ("index", "ntotal", "index MB", "searches", "ms/search", "VmRSS MB", "RssAnon MB", "RssFile MB")
    return markdown_table((*header, "RSS / index"), rows, "lrrrrrrrr")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = Path(os.environ.get("DISTILEMBED_DATA_DIR", ROOT.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--in-ram", type=Path, help="an index built without --on-disk")
    parser.add_argument("--on-disk", type=Path, help="the same corpus built with --on-disk")
    parser.add_argument("--bundle", default=str(ROOT / "models" / "default"))
    parser.add_argument("--source", default=str(data / "unlabeled" / "enwiki2015_1m_sentences.txt.gz"))
    parser.add_argument("--searches", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--limit-mb", type=int, help="also serve the on-disk index under this memory limit")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "ondisk_rss.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "ondisk-rss", render):
        return
    if not (args.in_ram and args.on_disk):
        parser.error("--in-ram and --on-disk are required")
    with gzip.open(args.source, "rt", encoding="utf-8") as handle:  # the file's last sentences
        texts = [line.strip() for line in collections.deque(handle, maxlen=max(args.searches))]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-ondisk-"))
    result = {
        name: measure(d, args, texts, log_dir)
        for name, d in (("in RAM", args.in_ram), ("on disk", args.on_disk))
    }
    if args.limit_mb:
        evict_from_page_cache(args.on_disk)
        with memory_cgroup(args.limit_mb) as group:
            result[f"on disk, {args.limit_mb} MB limit"] = measure(args.on_disk, args, texts, log_dir, group)

    table = Table(title="serve: memory with the index in RAM and on disk (bench/ondisk_rss.py)")
    for col in (
        "index",
        "ntotal",
        "index MB",
        "searches",
        "ms/search",
        "VmRSS MB",
        "RssAnon MB",
        "RssFile MB",
        "RSS / index",
    ):
        table.add_column(col, justify="left" if col == "index" else "right")
    for name, r in result.items():
        for s in r["samples"]:
            table.add_row(
                name, f"{r['info']['ntotal']:,}", f"{r['index_bytes'] / MB:.0f}", f"{s['searches']:,}",
                str(s.get("ms_per_search", "")),
                *(f"{s[f] / MB:.0f}" for f in FIELDS), f"{s['VmRSS'] / r['index_bytes']:.2f}",
            )  # fmt: skip
    Console(width=140).print(table)
    result["run"] = run_info("bench/ondisk_rss.py", argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    publish(args, result, args.out, "ondisk-rss", render)


if __name__ == "__main__":
    main()
