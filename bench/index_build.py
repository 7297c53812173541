"""Is the index build encoder-bound? Build docs/s end to end vs the runtime encoder on the same texts.

    python bench/index_build.py --bundle runs/bundles/hpd-mpnet --n 30000 \
        --out docs/results/index_build.json

Takes the first --n lines of the Wikipedia corpus, times ``Encoder.encode`` on them (the build's
batch size and thread count), then ``distilembed index build`` on the same lines into a fresh
directory, and reports both rates and their ratio (median of --repeats for the encoder). Rewrites
the block ``index-build`` of docs/results.md (``--no-doc``: not; ``--render-from JSON``: from an
earlier run's JSON, measuring nothing).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import add_doc_args, markdown_table, publish, publish_saved, run_info
from rich.console import Console
from rich.table import Table


def first_lines(path: Path, n: int) -> list[str]:
    out: list[str] = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                out.append(line.strip())
            if len(out) == n:
                break
    return out


def render(result: dict[str, Any]) -> str:
    build = result["build_docs_per_s_wall_clock"]
    rows = [
        ("`Encoder.encode`, in process", f"{result['encoder_docs_per_s']:,.1f}"),
        ("`distilembed index build`, whole command, wall-clock", f"{build:,.1f}"),
        ("ratio build / encoder", f"{result['build_over_encoder']:.3f}"),
    ]
    shape = result["index"]
    title = (
        f"First {result['n']:,} Wikipedia sentences, `{result['bundle']}`, {result['threads']} threads; "
        f"the build made {shape['index_type']} nlist {shape['nlist']}, nprobe {shape['nprobe']}."
    )
    return f"{title}\n\n{markdown_table(('measure', 'docs/s'), rows)}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle")
    parser.add_argument("--corpus", default=f"{data_root}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    parser.add_argument("--n", type=int, default=30_000)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="docs/results/index_build.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "index-build", render):
        return
    if not args.bundle:
        parser.error("--bundle is required")

    from export.runtime import Encoder

    texts = first_lines(Path(args.corpus), args.n)
    encoder = Encoder(args.bundle, threads=args.threads, batch_size=args.batch_size)
    encoder.encode(texts[:256])
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        encoder.encode(texts)
        rates.append(len(texts) / (time.perf_counter() - start))
    encoder_rate = statistics.median(rates)
    del encoder

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
        cmd = [
            sys.executable,
            "-m",
            "distilembed.cli",
            "index",
            "build",
            "--bundle",
            args.bundle,
            "--corpus",
            str(corpus),
            "--out",
            str(Path(tmp) / "index"),
            "--threads",
            str(args.threads),
        ]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        manifest = json.loads((Path(tmp) / "index" / "manifest.json").read_text())
    build_rate = len(texts) / wall
    result = {
        "n": len(texts),
        "threads": args.threads,
        "bundle": args.bundle,
        "encoder_docs_per_s": round(encoder_rate, 1),
        "build_docs_per_s_wall_clock": round(build_rate, 1),
        "build_docs_per_s_manifest": manifest.get("build", {}).get("docs_per_s", manifest.get("docs_per_s")),
        "build_over_encoder": round(build_rate / encoder_rate, 3),
        "index": {k: manifest.get(k) for k in ("index_type", "nlist", "nprobe", "ntotal")},
        "run": run_info("bench/index_build.py", argv),
    }
    table = Table(title=f"index build vs encoder, {len(texts)} Wikipedia sentences, {args.threads} threads")
    for col in ("measure", "docs/s"):
        table.add_column(col)
    table.add_row("Encoder.encode (in process)", f"{encoder_rate:.1f}")
    table.add_row("distilembed index build (whole command, wall-clock)", f"{build_rate:.1f}")
    table.add_row("ratio build / encoder", f"{build_rate / encoder_rate:.3f}")
    Console().print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    publish(args, result, Path(args.out), "index-build", render)


if __name__ == "__main__":
    main()
