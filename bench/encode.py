"""Encoding speed of teacher, MiniLM and student, PyTorch vs ONNX, in one run and one table.

Throughput: sentences/s over all STS-B test sentences at batch 32 (median of --repeats).
Latency: batch-1 p50/p99 over --latency-n sentences. Ratios are to the teacher's throughput.

    python bench/encode.py --student runs/hpd-mpnet --student-bundle runs/bundles/hpd-mpnet \
        --minilm-bundle runs/bundles/minilm --out docs/results/encode.json

Rewrites the block ``encode`` of docs/results.md (--no-doc: not); ``--render-from JSON`` rewrites it
from an earlier run's JSON, measuring nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import add_doc_args, markdown_table, publish, publish_saved, run_info
from rich.console import Console
from rich.table import Table

EncodeFn = Callable[[list[str]], object]


def stsb_sentences(sts_dir: Path) -> list[str]:
    from training.data.sts import load_stsb_split

    pairs = load_stsb_split(sts_dir, "test")
    return [p.sentence1 for p in pairs] + [p.sentence2 for p in pairs]


def measure(
    encode_batch: EncodeFn, encode_one: EncodeFn, texts: list[str], repeats: int, latency_n: int
) -> dict:
    encode_batch(texts[:64])  # warm-up
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        encode_batch(texts)
        rates.append(len(texts) / (time.perf_counter() - start))
    latencies = []
    for text in texts[:latency_n]:
        start = time.perf_counter()
        encode_one([text])
        latencies.append((time.perf_counter() - start) * 1000)
    return {
        "sent_per_s": round(statistics.median(rates), 1),
        "runs": [round(r, 1) for r in rates],
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
    }


def torch_model(path: str) -> tuple[EncodeFn, EncodeFn]:
    from training.teachers import load_sentence_encoder

    model = load_sentence_encoder(path)
    return (
        lambda t: model.encode(t, batch_size=32, show_progress_bar=False),
        lambda t: model.encode(t, batch_size=1, show_progress_bar=False),
    )


def bundle_model(path: str, variant: str, threads: int) -> tuple[EncodeFn, EncodeFn]:
    from export.runtime import Encoder

    encoder = Encoder(path, variant=variant, threads=threads)  # type: ignore[arg-type]
    return (lambda t: encoder.encode(t, batch_size=32), lambda t: encoder.encode(t, batch_size=1))


def plain_session(path: str, threads: int) -> tuple[EncodeFn, EncodeFn]:
    """A bare onnxruntime session + tokenizers, batches in input order: the no-wrapper baseline."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    manifest = json.loads((Path(path) / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    tokenizer.enable_truncation(manifest["max_seq_len"])
    tokenizer.enable_padding(pad_id=manifest.get("pad_token_id", 0))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        str(Path(path) / "model.int8.onnx"), options, providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in session.get_inputs()}

    def run(texts: list[str], batch: int) -> None:
        for lo in range(0, len(texts), batch):
            enc = tokenizer.encode_batch(texts[lo : lo + batch])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            feeds = {
                "input_ids": ids,
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.zeros_like(ids),
            }
            session.run(None, {k: v for k, v in feeds.items() if k in names})

    return (lambda t: run(t, 32), lambda t: run(t, 1))


def render(result: dict[str, Any]) -> str:
    """The markdown table of a JSON this script wrote."""
    meta, rows = result["meta"], result["rows"]
    first = "x teacher" if rows[0]["setup"].startswith("teacher") else "x first row"
    cells = [
        [r["setup"], f"{r['sent_per_s']:,.1f}", *(f"{r[k]:.2f}" for k in ("ratio", "p50_ms", "p99_ms"))]
        for r in rows
    ]
    table = markdown_table(("setup", "sent/s (bs 32)", first, "bs-1 p50 ms", "bs-1 p99 ms"), cells)
    conditions = (
        f"{meta['sentences']:,} STS-B test sentences at batch 32 (median of {meta['repeats']}), "
        f"batch-1 latency over {meta['latency_n']} sentences, {meta['threads']} threads."
    )
    return f"{conditions}\n\n{table}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--minilm", default="all-MiniLM-L6-v2")
    parser.add_argument("--minilm-bundle")
    parser.add_argument("--student", help="student checkpoint (PyTorch)")
    parser.add_argument("--student-bundle", help="student bundle (ONNX fp32 and int8)")
    parser.add_argument(
        "--sts-dir", default=str(Path(os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")) / "sts")
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-n", type=int, default=300)
    parser.add_argument("--limit", type=int, help="use only the first N sentences (quick checks)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-teacher", action="store_true")
    parser.add_argument("--out", default="docs/results/encode.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "encode", render):
        return
    if not args.minilm_bundle:
        parser.error("--minilm-bundle is required")

    import torch

    torch.set_num_threads(args.threads)
    texts = stsb_sentences(Path(args.sts_dir))[: args.limit]
    setups: list[tuple[str, Callable[[], tuple[EncodeFn, EncodeFn]]]] = []
    if not args.skip_teacher:
        setups.append((f"teacher {args.teacher} (PyTorch)", lambda: torch_model(args.teacher)))
    setups += [
        (f"{args.minilm} (PyTorch)", lambda: torch_model(args.minilm)),
        (
            f"{args.minilm} int8 bundle (runtime encoder)",
            lambda: bundle_model(args.minilm_bundle, "int8", args.threads),
        ),
        (
            f"{args.minilm} int8 bundle (plain onnxruntime session)",
            lambda: plain_session(args.minilm_bundle, args.threads),
        ),
    ]
    if args.student:
        setups.append(("student (PyTorch)", lambda: torch_model(args.student)))
    if args.student_bundle:
        setups.append(("student ONNX fp32", lambda: bundle_model(args.student_bundle, "fp32", args.threads)))
        setups.append(("student ONNX int8", lambda: bundle_model(args.student_bundle, "int8", args.threads)))

    rows = []
    for name, make in setups:
        batch_fn, one_fn = make()
        result = measure(batch_fn, one_fn, texts, args.repeats, args.latency_n)
        rows.append({"setup": name, **result})
        Console().print(f"{name}: {result}")
    base = rows[0]["sent_per_s"]
    table = Table(title=f"Encoding speed, {len(texts)} STS-B test sentences, {args.threads} threads")
    for col in ("setup", "sent/s (bs 32)", "x first row", "bs-1 p50 ms", "bs-1 p99 ms"):
        table.add_column(col, justify="left" if col == "setup" else "right")
    for row in rows:
        row["ratio"] = round(row["sent_per_s"] / base, 2)
        table.add_row(
            row["setup"],
            f"{row['sent_per_s']:.1f}",
            f"{row['ratio']:.2f}",
            f"{row['p50_ms']:.2f}",
            f"{row['p99_ms']:.2f}",
        )
    Console(width=150).print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "sentences": len(texts),
        "repeats": args.repeats,
        "latency_n": args.latency_n,
        "threads": args.threads,
        "cpu": os.uname().machine,
        "cores": os.cpu_count(),
    }
    result = {"meta": meta, "rows": rows, "run": run_info("bench/encode.py", argv)}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    publish(args, result, out, "encode", render)


if __name__ == "__main__":
    main()
