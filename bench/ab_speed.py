"""Two bundles' int8 encoding speed, interleaved rounds on the same texts: is B faster than A?

Rounds alternate A, B, B, A, ... so a slow moment of the machine costs both alike. Per batch size,
sentences/s over the first --n STS-B test sentences through ``export.runtime.Encoder`` (the
encoder index/ and service/ use), median of --rounds, plus the cosine between the two bundles'
vectors when they have the same width (is it the same model?). Prints a table, writes JSON and
rewrites the block ``ab-<folder name of B>`` of docs/results.md (``--no-doc``: not; ``--render-from
JSON``: from an earlier run's JSON, measuring nothing).

    git show 421cf10:models/default/model.int8.onnx > /tmp/old/model.int8.onnx  # + manifest, tokenizer
    python bench/ab_speed.py --a /tmp/old --b models/default --out docs/results/ab_unfuse.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode import stsb_sentences  # noqa: E402
from harness import (  # noqa: E402
    add_doc_args,
    interleaved_seconds,
    markdown_table,
    publish,
    publish_saved,
    run_info,
)

from export.runtime import Encoder, cosines  # noqa: E402


def encode_in_batches(encoder: Encoder, texts: list[str], batch_size: int) -> None:
    for lo in range(0, len(texts), batch_size):
        encoder.encode(texts[lo : lo + batch_size], batch_size=batch_size)


def block_name(result: dict[str, Any]) -> str:
    return f"ab-{Path(result['b']).name}"


def render(result: dict[str, Any]) -> str:
    a, b = (f"`{result[k]}`" for k in ("a", "b"))
    rows = [
        (batch, f"{s['a']:,.0f}", f"{s['b']:,.0f}", f"{s['ratio']:.2f}x")
        for batch, s in result["summary"].items()
    ]
    lines = [
        f"int8 sentences/s through `export.runtime.Encoder`, first {result['texts']:,} STS-B test sentences, "
        f"{result['threads']} threads, median of {result['rounds']} alternating rounds.",
        "",
        markdown_table(("batch", f"A: {a}", f"B: {b}", "B / A"), rows),
    ]
    if result.get("cosine_min") is not None:
        cosine = f"min {result['cosine_min']}, mean {result['cosine_mean']}"
        lines += ["", f"Cosine of A's and B's vectors: {cosine}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", type=Path, help="baseline bundle")
    parser.add_argument("--b", type=Path, help="candidate bundle")
    parser.add_argument("--sts-dir", type=Path, default=Path(data_root) / "sts")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--n", type=int, default=1024, help="sentences per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="docs/results/ab_speed.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, block_name, render):
        return
    if not (args.a and args.b):
        parser.error("--a and --b are required")

    texts = stsb_sentences(args.sts_dir)[: args.n]
    encoders = {
        "a": Encoder(args.a, verify=False, threads=args.threads),
        "b": Encoder(args.b, verify=False, threads=args.threads),
    }
    va, vb = encoders["a"].encode(texts), encoders["b"].encode(texts)
    cos = None  # different widths (e.g. 384-d vs 128-d) are different models: no cosine
    if va.shape == vb.shape:
        cos = cosines(va, vb)
    results: dict[str, dict[str, list[float]]] = {}
    for batch_size in args.batch_sizes:
        calls = {name: partial(encode_in_batches, e, texts, batch_size) for name, e in encoders.items()}
        seconds = interleaved_seconds(calls, args.rounds, alternate=True, desc=f"batch {batch_size}")
        results[str(batch_size)] = {name: [len(texts) / t for t in s] for name, s in seconds.items()}

    table = Table(title=f"int8 sentences/s, {len(texts)} STS-B test sentences, median of {args.rounds}")
    for column in ("batch", "A", "B", "B / A"):
        table.add_column(column, justify="right")
    summary = {}
    for batch_size, rates in results.items():
        a, b = statistics.median(rates["a"]), statistics.median(rates["b"])
        summary[batch_size] = {"a": round(a, 1), "b": round(b, 1), "ratio": round(b / a, 3)}
        table.add_row(batch_size, f"{a:.0f}", f"{b:.0f}", f"{b / a:.2f}x")
    Console().print(table)
    if cos is not None:
        print(f"cosine A vs B: min {cos.min():.6f}, mean {cos.mean():.6f}")
    report = {
        "a": str(args.a),
        "b": str(args.b),
        "texts": len(texts),
        "threads": args.threads,
        "rounds": args.rounds,
        "summary": summary,
        "rates": results,
        "cosine_min": None if cos is None else round(float(cos.min()), 6),
        "cosine_mean": None if cos is None else round(float(cos.mean()), 6),
        "run": run_info("bench/ab_speed.py", argv),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    publish(args, report, Path(args.out), block_name(report), render)


if __name__ == "__main__":
    main()
