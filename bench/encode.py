"""Encoder speed, and whether a sentence's vector depends on the other sentences in its batch.

``speed``: sentences/s over the STS-B test sentences at batch 32 (median of --repeats) and batch-1
p50/p99 latency, for the teacher, MiniLM and the student, PyTorch and ONNX. Block ``encode``:

    python bench/encode.py speed --minilm-bundle runs/bundles/minilm --student-bundle models/default

``batch-invariance``: export's dynamic int8 graph quantises each MatMul input with one scale per batch,
so a sentence alone and among 31 others gets slightly different vectors. For one bundle that keeps
its fp32 graph: that graph, the shipped int8 one and one quantised here with ranges calibrated on
Wikipedia (static: constant scales); STS-B test, the cosine of each sentence alone and batched,
sentences/s (interleaved rounds), the model file. Block ``batch-invariance``:

    python bench/encode.py batch-invariance --bundle runs/bundles/congen-ens-mrl

Each writes its JSON (--out, under docs/results/) and rewrites its block of docs/results.md (--no-doc:
not); ``SUBCOMMAND --render-from JSON`` rewrites the block from an earlier run's JSON.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import harness as h
import numpy as np

from export.runtime import MODEL_FILES, Encoder

SHIPPED = "int8 dynamic (shipped)"


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


def alone_vs_batched(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """Cosine of each text's vector encoded alone with its vector from one batched call."""
    alone = np.stack([encoder.encode([text])[0] for text in texts])
    return np.sum(alone * encoder.encode(texts), axis=1)


def static_int8(bundle: Path, out: Path, calibration: list[str], reference: Encoder) -> None:
    """A bundle copy in ``out`` whose int8 graph has calibrated (constant) activation scales."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = reference.feed_batches(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    for name in ("manifest.json", "tokenizer.json"):
        shutil.copy(bundle / name, out / name)
    prepared = out / "prepared.onnx"
    quant_pre_process(str(bundle / MODEL_FILES["fp32"]), str(prepared), skip_symbolic_shape=True)
    quantize_static(
        str(prepared), str(out / MODEL_FILES["int8"]), Reader(), quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"], per_channel=True, activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )  # fmt: skip
    prepared.unlink()


def render_invariance(result: h.Result) -> str:
    header = ["quantisation", "STS-B test", "cosine alone / batched: min", "mean", "sent/s", "x int8 dynamic"]
    spec = ("{name}", "{stsb_test:.2f}", "{cos_min:.5f}", "{cos_mean:.5f}", "{sentences_per_s:,.0f}")
    spec += ("{speed_ratio:.2f}", "{megabytes:.1f} MB")
    rows = [[cell.format(**r) for cell in spec] for r in result["rows"]]
    note = (
        f"Bundle `{result['bundle']}`; {result['sentences']} STS-B test sentences alone and in batches "
        f"of 32; speed: the median of {result['rounds']} interleaved rounds over {result['speed_texts']} "
        f"sentences; static ranges from {result['calibration']:,} Wikipedia sentences."
    )
    return f"{h.markdown_table([*header, 'model file'], rows)}\n\n{note}"


def batch_invariance(args: argparse.Namespace, argv: list[str]) -> None:
    from training.data.sts import distinct_sentences
    from training.data.text import read_sentences
    from training.evaluation import evaluate_pairs

    bundle, fp32, int8 = Path(args.bundle), MODEL_FILES["fp32"], MODEL_FILES["int8"]
    if not (bundle / fp32).is_file():
        raise SystemExit(f"error: {bundle} has no {fp32} (export keeps it unless told not to)")
    pairs = h.stsb_test(args.data_dir)
    texts = distinct_sentences(pairs)[: args.sentences]
    wiki = Path(args.data_dir) / h.WIKIPEDIA
    calibration = read_sentences(wiki, limit=args.calibration, skip=args.calibration_skip)
    result = {"bundle": args.bundle, "sentences": len(texts), "rounds": args.rounds}
    result |= {"calibration": len(calibration), "speed_texts": len(texts), "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        shipped = Encoder(bundle, "int8", threads=args.threads)
        static_int8(bundle, Path(tmp), calibration, shipped)
        static = Encoder(tmp, "int8", args.threads, verify=False)
        encoders = {SHIPPED: (shipped, bundle / int8), "int8 static (calibrated)": (static, Path(tmp) / int8)}
        encoders["fp32"] = (Encoder(bundle, "fp32", threads=args.threads), bundle / fp32)
        calls = {name: partial(encoder.encode, texts) for name, (encoder, _) in encoders.items()}
        timed = h.interleaved_seconds(calls, args.rounds)
        seconds = {name: statistics.median(spent) for name, spent in timed.items()}
        for name, (encoder, path) in encoders.items():
            cos = alone_vs_batched(encoder, texts)
            row = {"name": name, "stsb_test": round(evaluate_pairs(encoder.encode, pairs), 2)}
            row |= {"cos_min": float(cos.min()), "cos_mean": float(cos.mean())}
            row |= {"sentences_per_s": len(texts) / seconds[name], "megabytes": path.stat().st_size / 1e6}
            row["speed_ratio"] = seconds[SHIPPED] / seconds[name]
            result["rows"].append(row)
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
    same.add_argument("--bundle", help="a bundle that keeps model.onnx (fp32) beside model.int8.onnx")
    same.add_argument("--sentences", type=int, default=256, help="STS-B test sentences compared")
    same.add_argument("--calibration", type=int, default=2048, help="Wikipedia sentences (static ranges)")
    same.add_argument("--calibration-skip", type=int, default=900_000, help="... after the first N")
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
