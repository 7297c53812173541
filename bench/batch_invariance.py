"""Does a text's vector depend on the other texts in its batch? Per quantisation of one bundle.

    python bench/batch_invariance.py --bundle runs/bundles/congen-ens-mrl \
        --out docs/results/batch_invariance.json

onnxruntime's dynamic int8 (what `distilembed export` ships) quantises each MatMul's input with one
scale for the whole batch tensor, so a sentence encoded alone and the same sentence among 31 others
get slightly different vectors. Rows, from the one bundle (which must keep its fp32 graph,
``model.onnx``):

- int8 dynamic: the bundle's ``model.int8.onnx``;
- int8 static: the fp32 graph quantised here with activation ranges calibrated on Wikipedia
  sentences (onnxruntime ``quantize_static``, QDQ, per-channel int8 weights, MinMax), so every
  scale is a constant;
- fp32: the bundle's ``model.onnx``.

Columns: STS-B test; the cosine between each of N STS-B sentences encoded alone and encoded in the
length-sorted batches of 32 that `Encoder` forms (minimum, mean); sentences/s at batch 32 (median
of interleaved rounds) and its ratio to int8 dynamic; the model file's size.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import (  # noqa: E402
    add_doc_args,
    interleaved_seconds,
    markdown_table,
    publish,
    publish_saved,
    run_info,
)

from export.runtime import MODEL_FILES, Encoder  # noqa: E402
from training.data.sts import distinct_sentences, read_stsb  # noqa: E402
from training.evaluation import evaluate_pairs  # noqa: E402

BLOCK = "batch-invariance"


def alone_vs_batched(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """Cosine of each text's vector encoded alone with its vector from one batched call."""
    alone = np.stack([encoder.encode([text])[0] for text in texts])
    return np.sum(alone * encoder.encode(texts), axis=1)


def calibration_batches(encoder: Encoder, texts: list[str]) -> Iterator[dict[str, np.ndarray]]:
    """The feeds `Encoder` would run on ``texts``, batch by batch."""
    for batch in encoder._batches(encoder.tokenize(texts), encoder.batch_size):
        yield encoder.feeds(batch)


def static_int8(bundle: Path, out: Path, calibration: list[str], reference: Encoder) -> None:
    """A bundle copy in ``out`` whose int8 graph has calibrated (constant) activation scales."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = calibration_batches(reference, calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    for name in ("manifest.json", "tokenizer.json"):
        shutil.copy(bundle / name, out / name)
    prepared = out / "prepared.onnx"
    quant_pre_process(str(bundle / MODEL_FILES["fp32"]), str(prepared), skip_symbolic_shape=True)
    quantize_static(
        str(prepared),
        str(out / MODEL_FILES["int8"]),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    prepared.unlink()


def render(result: dict[str, Any]) -> str:
    header = ["quantisation", "STS-B test", "cosine alone / batched: min", "mean", "sent/s", "x int8 dynamic"]
    header.append("model file")
    rows = [
        [
            r["name"],
            f"{r['stsb_test']:.2f}",
            f"{r['cos_min']:.5f}",
            f"{r['cos_mean']:.5f}",
            f"{r['sentences_per_s']:,.0f}",
            f"{r['speed_ratio']:.2f}",
            f"{r['megabytes']:.1f} MB",
        ]
        for r in result["rows"]
    ]
    note = (
        f"Bundle `{result['bundle']}`; {result['sentences']} STS-B test sentences alone and in batches "
        f"of 32; speed: the median of {result['rounds']} interleaved rounds over {result['speed_texts']} "
        f"sentences; static ranges from {result['calibration']:,} Wikipedia sentences."
    )
    return f"{markdown_table(header, rows)}\n\n{note}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", help="a bundle that keeps model.onnx (fp32) beside model.int8.onnx")
    parser.add_argument("--data-dir", default=os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data"))
    parser.add_argument("--sentences", type=int, default=256, help="STS-B test sentences compared")
    parser.add_argument("--calibration", type=int, default=2048, help="Wikipedia sentences (static ranges)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="docs/results/batch_invariance.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, BLOCK, render):
        return
    if not args.bundle:
        parser.error("--bundle is required")
    bundle = Path(args.bundle)
    if not (bundle / MODEL_FILES["fp32"]).is_file():
        parser.error(f"{bundle} has no {MODEL_FILES['fp32']} (export keeps it unless told not to)")

    pairs = read_stsb(f"{args.data_dir}/sts/stsbenchmark/sts-test.csv")
    texts = distinct_sentences(pairs)[: args.sentences]
    with gzip.open(f"{args.data_dir}/unlabeled/enwiki2015_1m_sentences.txt.gz", "rt", encoding="utf-8") as f:
        calibration = [line.strip() for line in itertools.islice(f, 900_000, 900_000 + args.calibration)]
    result: dict[str, Any] = {"bundle": args.bundle, "sentences": len(texts), "rounds": args.rounds}
    result.update(calibration=len(calibration), speed_texts=len(texts), rows=[])
    with tempfile.TemporaryDirectory() as tmp:
        dynamic = Encoder(bundle, "int8", threads=args.threads)
        static_int8(bundle, Path(tmp), calibration, dynamic)
        encoders = {
            "int8 dynamic (shipped)": (dynamic, bundle / MODEL_FILES["int8"]),
            "int8 static (calibrated)": (
                Encoder(tmp, "int8", threads=args.threads, verify=False),
                Path(tmp) / MODEL_FILES["int8"],
            ),
            "fp32": (Encoder(bundle, "fp32", threads=args.threads), bundle / MODEL_FILES["fp32"]),
        }
        calls = {name: (lambda e=enc: e.encode(texts)) for name, (enc, _) in encoders.items()}
        seconds = interleaved_seconds(calls, args.rounds, desc="speed")
        base = len(texts) / float(np.median(seconds["int8 dynamic (shipped)"]))
        for name, (encoder, path) in encoders.items():
            cos = alone_vs_batched(encoder, texts)
            speed = len(texts) / float(np.median(seconds[name]))
            row = {"name": name, "stsb_test": round(evaluate_pairs(encoder.encode, pairs), 2)}
            row.update(cos_min=float(cos.min()), cos_mean=float(cos.mean()))
            row.update(sentences_per_s=speed, speed_ratio=speed / base, megabytes=path.stat().st_size / 1e6)
            result["rows"].append(row)
            print(row, flush=True)
    result["run"] = run_info("bench/batch_invariance.py", argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    publish(args, result, out, BLOCK, render)
    print(render(result))


if __name__ == "__main__":
    main()
