"""The int8 graph's variants, in one run: 8-bit against 7-bit weights (``distilembed export
--full-range / --reduce-range``, decision 52), and SmoothQuant at each ``--smooth-alphas`` (export's
``--smooth-alpha``, decision 55, on the inputs export smooths by default, and once on every input;
``--no-smooth`` is the 8-bit row).

For each bundle's fp32 graph, quantise it each way (export's own quantiser and smoothing, calibrated
on the first 1,024 STS-B train sentences as export is by default) into a scratch bundle and score
STS-B dev and test at the given widths, plus the mean cosine of its vectors to the fp32 graph's over
the STS-B dev sentences (what picks alpha) and the test sentences.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import named_path, run_info

from export.bundle import quantize_graph
from export.runtime import MODEL_FILES, Encoder, cosines
from export.smooth import SMOOTH_ALPHA, SMOOTH_TEXTS, Smoothing, calibrate_smoothing
from training.data.sts import distinct_sentences, load_stsb_split
from training.evaluation import spearman_x100

SPLITS = ("dev", "test")
Pairs = dict[str, tuple[np.ndarray, np.ndarray]]


def scores(vectors: Pairs, gold: dict[str, list[float]], dims: list[int]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for split, (left, right) in vectors.items():
        out[split] = {}
        for dim in dims:
            cosine = cosines(left[:, :dim], right[:, :dim])
            out[split][str(dim)] = round(spearman_x100(cosine, gold[split]), 2)
    return out


def measure(
    bundle: Path,
    pairs: dict[str, Any],
    dims: list[int],
    scratch: Path,
    alphas: list[float],
    calibration: list[str],
) -> dict[str, Any]:
    """Every variant's scores; ``calibration``: the sentences SmoothQuant's maxima come from."""
    texts = {s: ([p.sentence1 for p in ps], [p.sentence2 for p in ps]) for s, ps in pairs.items()}
    gold = {s: [p.score for p in ps] for s, ps in pairs.items()}

    def encode(encoder: Encoder) -> Pairs:
        return {s: (encoder.encode(a), encoder.encode(b)) for s, (a, b) in texts.items()}

    fp32 = Encoder(bundle, "fp32", threads=os.cpu_count(), verify=False)
    reference = encode(fp32)
    rows: dict[str, Any] = {"fp32": {"spearman": scores(reference, gold, dims)}}
    maxima = calibrate_smoothing(bundle / MODEL_FILES["fp32"], fp32.feed_batches(calibration)).maxima
    variants: list[tuple[str, bool, Smoothing | None]] = [
        ("int8 8-bit", False, None),
        ("int8 7-bit", True, None),
    ]
    variants += [(f"smooth {alpha:g}", False, Smoothing(maxima, alpha)) for alpha in alphas]
    variants.append((f"smooth {SMOOTH_ALPHA:g}, every input", False, Smoothing(maxima, SMOOTH_ALPHA, 0.0)))
    for name, reduce_range, smoothing in variants:
        copy = scratch / name.replace(" ", "-")
        shutil.copytree(bundle, copy, ignore=shutil.ignore_patterns(MODEL_FILES["int8"]))
        quantize_graph(copy / MODEL_FILES["fp32"], copy / MODEL_FILES["int8"], reduce_range, smoothing)
        got = encode(Encoder(copy, "int8", threads=os.cpu_count(), verify=False))
        row: dict[str, Any] = {"spearman": scores(got, gold, dims)}
        for split in SPLITS:
            cos = cosines(np.concatenate(got[split]), np.concatenate(reference[split]))
            row[f"mean_cosine_to_fp32_{split}"] = round(float(cos.mean()), 5)
        rows[name] = row
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", action="append", required=True, help="NAME=DIR with a model.onnx")
    parser.add_argument("--sts-dir", default=f"{data}/sts/stsbenchmark")
    parser.add_argument("--dims", default="128,64,32")
    parser.add_argument("--smooth-alphas", default="0.5,0.75,0.9,1.0", help="SmoothQuant rows, one per alpha")
    parser.add_argument("--out", default="docs/results/int8_range.json")
    args = parser.parse_args(argv)
    dims = [int(d) for d in args.dims.split(",")]
    alphas = [float(a) for a in args.smooth_alphas.split(",") if a]
    pairs = {split: load_stsb_split(args.sts_dir, split) for split in SPLITS}
    # export's default calibration: the first distinct STS-B train sentences
    calibration = distinct_sentences(load_stsb_split(args.sts_dir, "train"))[:SMOOTH_TEXTS]
    result: dict[str, Any] = {"dims": dims, "bundles": {}}
    table = Table(title="STS-B dev / test at each width: fp32 graph, int8 8-bit, 7-bit and smoothed")
    columns = ("bundle", "graph", *(f"{s} {d}" for s in SPLITS for d in dims), "cos dev", "cos test")
    for column in columns:
        table.add_column(column, justify="left" if column in ("bundle", "graph") else "right")
    for spec in args.bundle:
        name, path = named_path(spec)
        bundle = Path(path)
        if not (bundle / MODEL_FILES["fp32"]).exists():
            parser.error(f"{bundle} has no {MODEL_FILES['fp32']} to quantise")
        with tempfile.TemporaryDirectory() as scratch:
            rows = measure(bundle, pairs, dims, Path(scratch), alphas, calibration)
        result["bundles"][name] = {"path": path, "graphs": rows}
        for graph, row in rows.items():
            cells = [f"{row['spearman'][s][str(d)]:.2f}" for s in SPLITS for d in dims]
            cosine = [str(row.get(f"mean_cosine_to_fp32_{s}", "")) for s in SPLITS]
            table.add_row(name, graph, *cells, *cosine)
    Console().print(table)
    result["run"] = run_info("bench/int8_range.py", argv)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
