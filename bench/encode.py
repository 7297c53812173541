"""Encoder speed, and whether a sentence's vector depends on the other sentences in its batch.

``speed``: sentences/s over the STS-B test sentences at batch 32 (median of --repeats) and batch-1
p50/p99 latency, for the teacher, MiniLM and the student, PyTorch and ONNX. Block ``encode``:

    python bench/encode.py speed --minilm-bundle runs/bundles/minilm --student-bundle models/default

``batch-invariance``: whether a sentence's vector depends on the other sentences in its batch. For
each ``--bundle NAME=DIR`` (the first is the reference): STS-B test, the cosine of each sentence
alone and batched and the share that are bit-identical, sentences/s (interleaved rounds), the model
file. Export's int8 graphs have static (calibrated) activation scales; ``export --dynamic`` keeps
onnxruntime's per-batch ones. Block ``batch-invariance``:

    python bench/encode.py batch-invariance --bundle static=models/default --bundle dynamic=DIR

Each writes its JSON (--out, under docs/results/) and rewrites its block of docs/results.md (--no-doc:
not); ``SUBCOMMAND --render-from JSON`` rewrites the block from an earlier run's JSON.
"""

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import harness as h
import numpy as np

from export.runtime import MODEL_FILES, Encoder


def measure(path: str, variant: str, texts: list[str], args: argparse.Namespace) -> h.Result:
    """Throughput at batch 32 (median of --repeats passes) and batch-1 latency percentiles of a
    PyTorch model (``variant`` torch) or a bundle."""
    if variant == "torch":
        from training.teachers import load_sentence_encoder

        encode = partial(load_sentence_encoder(path).encode, show_progress_bar=False)
    else:
        encode = Encoder(path, variant=variant, threads=args.threads).encode  # type: ignore[arg-type]
    encode(texts[:64], batch_size=32)  # warm-up
    rates, latencies = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        encode(texts, batch_size=32)
        rates.append(len(texts) / (time.perf_counter() - start))
    for text in texts[: args.latency_n]:
        start = time.perf_counter()
        encode([text], batch_size=1)
        latencies.append((time.perf_counter() - start) * 1000)
    p50, p99 = (round(float(np.percentile(latencies, q)), 2) for q in (50, 99))
    runs = [round(r, 1) for r in rates]
    return {"sent_per_s": round(statistics.median(rates), 1), "runs": runs, "p50_ms": p50, "p99_ms": p99}


def render_speed(result: h.Result) -> str:
    meta, rows = result["meta"], result["rows"]
    first = "x teacher" if rows[0]["setup"].startswith("teacher") else "x first row"
    keys = ("ratio", "p50_ms", "p99_ms")
    cells = [[r["setup"], f"{r['sent_per_s']:,.1f}", *(f"{r[k]:.2f}" for k in keys)] for r in rows]
    table = h.markdown_table(("setup", "sent/s (bs 32)", first, "bs-1 p50 ms", "bs-1 p99 ms"), cells)
    conditions = (
        f"{meta['sentences']:,} STS-B test sentences at batch 32 (median of {meta['repeats']}), "
        f"batch-1 latency over {meta['latency_n']} sentences, {meta['threads']} threads."
    )
    return f"{conditions}\n\n{table}"


def speed(args: argparse.Namespace, argv: list[str]) -> None:
    import torch

    torch.set_num_threads(args.threads)
    pairs = h.stsb_test(args.data_dir)
    texts = ([p.sentence1 for p in pairs] + [p.sentence2 for p in pairs])[: args.limit]
    setups = [] if args.skip_teacher else [(f"teacher {args.teacher} (PyTorch)", args.teacher, "torch")]
    setups += [(f"{args.minilm} (PyTorch)", args.minilm, "torch")]
    setups += [(f"{args.minilm} int8 bundle", args.minilm_bundle, "int8")]
    setups += [("student (PyTorch)", args.student, "torch")] if args.student else []
    setups += [(f"student ONNX {v}", args.student_bundle, v) for v in ("fp32", "int8") if args.student_bundle]
    rows = []
    for name, path, variant in setups:
        rows.append({"setup": name, **measure(path, variant, texts, args)})
        print(rows[-1], flush=True)
    for row in rows:
        row["ratio"] = round(row["sent_per_s"] / rows[0]["sent_per_s"], 2)
    meta = {"sentences": len(texts), "repeats": args.repeats, "latency_n": args.latency_n}
    result = {"meta": meta | {"threads": args.threads}, "rows": rows}
    h.finish(args, result | {"run": h.run_info("bench/encode.py", argv)}, "encode", render_speed)


def render_invariance(result: h.Result) -> str:
    header = ["int8 graph", "STS-B test", "alone = batched", "cosine alone / batched: min", "mean", "sent/s"]
    spec = ("{name} (`{bundle}`)", "{stsb_test:.2f}", "{identical:.0%}", "{cos_min:.7f}", "{cos_mean:.7f}")
    spec += ("{sentences_per_s:,.0f}", "{speed_ratio:.2f}", "{megabytes:.1f} MB")
    rows = [[cell.format(**r) for cell in spec] for r in result["rows"]]
    first = result["rows"][0]["name"]
    note = (
        f"{result['sentences']} STS-B test sentences, each encoded alone and in batches of 32; speed: "
        f"the median of {result['rounds']} interleaved rounds over them."
    )
    return f"{h.markdown_table([*header, f'x {first}', 'model file'], rows)}\n\n{note}"


def batch_invariance(args: argparse.Namespace, argv: list[str]) -> None:
    from training.data.sts import distinct_sentences
    from training.evaluation import evaluate_pairs

    pairs = h.stsb_test(args.data_dir)
    texts = distinct_sentences(pairs)[: args.sentences]
    bundles = h.named_bundles(args.bundle)
    encoders = {name: Encoder(path, "int8", threads=args.threads) for name, path in bundles.items()}
    timed = h.interleaved_seconds({n: partial(e.encode, texts) for n, e in encoders.items()}, args.rounds)
    seconds = {name: statistics.median(spent) for name, spent in timed.items()}
    result: h.Result = {"sentences": len(texts), "rounds": args.rounds, "rows": []}
    for name, encoder in encoders.items():
        alone = np.stack([encoder.encode([text])[0] for text in texts])
        batched = encoder.encode(texts)
        cos = np.sum(alone * batched, axis=1)
        row = {
            "name": name,
            "bundle": bundles[name],
            "stsb_test": round(evaluate_pairs(encoder.encode, pairs), 2),
        }
        row |= {"cos_min": float(cos.min()), "cos_mean": float(cos.mean())}
        row["identical"] = float(np.mean(np.all(alone == batched, axis=1)))
        row |= {
            "sentences_per_s": len(texts) / seconds[name],
            "speed_ratio": seconds[next(iter(bundles))] / seconds[name],
        }
        row["megabytes"] = (Path(bundles[name]) / MODEL_FILES["int8"]).stat().st_size / 1e6
        result["rows"].append(row)
        print(row, flush=True)
    result["run"] = h.run_info("bench/encode.py", argv)
    h.finish(args, result, "batch-invariance", render_invariance)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fast = commands.add_parser("speed", help="sentences/s and batch-1 latency per setup")
    fast.add_argument("--teacher", default="all-mpnet-base-v2")
    fast.add_argument("--skip-teacher", action="store_true")
    fast.add_argument("--minilm", default="all-MiniLM-L6-v2")
    fast.add_argument("--minilm-bundle", help="int8 bundle of --minilm (required unless --render-from)")
    fast.add_argument("--student", help="student checkpoint (PyTorch)")
    fast.add_argument("--student-bundle", help="student bundle (ONNX fp32 and int8)")
    fast.add_argument("--repeats", type=int, default=3)
    fast.add_argument("--latency-n", type=int, default=300)
    fast.add_argument("--limit", type=int, help="only the first N sentences (quick checks)")
    fast.add_argument("--threads", type=int, default=2)
    fast.add_argument("--out", type=Path, default=h.RESULTS / "encode.json")
    same = commands.add_parser("batch-invariance", help="vectors alone vs batched, per quantisation")
    same.add_argument("--bundle", action="append", type=h.named_path, default=[], help="NAME=DIR, repeated")
    same.add_argument("--sentences", type=int, default=256, help="STS-B test sentences compared")
    same.add_argument("--rounds", type=int, default=5)
    same.add_argument("--threads", type=int)
    same.add_argument("--out", type=Path, default=h.RESULTS / "batch_invariance.json")
    for sub in (fast, same):
        sub.add_argument("--data-dir", default=h.data_root())
        h.add_doc_args(sub)
    args = parser.parse_args(argv)
    if args.command == "speed" and not h.publish_saved(args, "encode", render_speed):
        if not args.minilm_bundle:
            fast.error("--minilm-bundle is required")
        speed(args, argv)
    elif args.command == "batch-invariance" and not h.publish_saved(args, args.command, render_invariance):
        if not args.bundle:
            same.error("--bundle is required")
        batch_invariance(args, argv)


if __name__ == "__main__":
    main()
