"""8-bit against 7-bit int8 weights (``distilembed export --full-range / --reduce-range``), in one run.

For each bundle's fp32 graph, quantise it both ways (export's own quantiser) into a scratch bundle
and score STS-B dev and test at the given widths, plus the mean cosine of its vectors to the fp32
graph's over the STS-B test sentences. Decision 52 has the reasoning.
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
from results_doc import named_path, run_info

from export.bundle import quantize_graph
from export.runtime import MODEL_FILES, Encoder, cosines
from training.data.sts import load_stsb_split
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


def measure(bundle: Path, pairs: dict[str, Any], dims: list[int], scratch: Path) -> dict[str, Any]:
    texts = {s: ([p.sentence1 for p in ps], [p.sentence2 for p in ps]) for s, ps in pairs.items()}
    gold = {s: [p.score for p in ps] for s, ps in pairs.items()}

    def encode(encoder: Encoder) -> Pairs:
        return {s: (encoder.encode(a), encoder.encode(b)) for s, (a, b) in texts.items()}

    reference = encode(Encoder(bundle, "fp32", threads=os.cpu_count(), verify=False))
    rows: dict[str, Any] = {"fp32": {"spearman": scores(reference, gold, dims)}}
    test_reference = np.concatenate(reference["test"])
    for name, reduce_range in (("int8 8-bit", False), ("int8 7-bit", True)):
        copy = scratch / name.replace(" ", "-")
        shutil.copytree(bundle, copy, ignore=shutil.ignore_patterns(MODEL_FILES["int8"]))
        quantize_graph(copy / MODEL_FILES["fp32"], copy / MODEL_FILES["int8"], reduce_range)
        got = encode(Encoder(copy, "int8", threads=os.cpu_count(), verify=False))
        cos = cosines(np.concatenate(got["test"]), test_reference)
        rows[name] = {"spearman": scores(got, gold, dims), "mean_cosine_to_fp32": round(float(cos.mean()), 5)}
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", action="append", required=True, help="NAME=DIR with a model.onnx")
    parser.add_argument("--sts-dir", default=f"{data}/sts/stsbenchmark")
    parser.add_argument("--dims", default="128,64,32")
    parser.add_argument("--out", default="bench/results/int8_range.json")
    args = parser.parse_args(argv)
    dims = [int(d) for d in args.dims.split(",")]
    pairs = {split: load_stsb_split(args.sts_dir, split) for split in SPLITS}
    result: dict[str, Any] = {"dims": dims, "bundles": {}}
    table = Table(title="STS-B dev / test at each width: fp32 graph, int8 with 8-bit and 7-bit weights")
    for column in ("bundle", "graph", *(f"{s} {d}" for s in SPLITS for d in dims), "cos to fp32"):
        table.add_column(column, justify="left" if column in ("bundle", "graph") else "right")
    for spec in args.bundle:
        name, path = named_path(spec)
        bundle = Path(path)
        if not (bundle / MODEL_FILES["fp32"]).exists():
            parser.error(f"{bundle} has no {MODEL_FILES['fp32']} to quantise")
        with tempfile.TemporaryDirectory() as scratch:
            rows = measure(bundle, pairs, dims, Path(scratch))
        result["bundles"][name] = {"path": path, "graphs": rows}
        for graph, row in rows.items():
            cells = [f"{row['spearman'][s][str(d)]:.2f}" for s in SPLITS for d in dims]
            table.add_row(name, graph, *cells, str(row.get("mean_cosine_to_fp32", "")))
    Console().print(table)
    result["run"] = run_info("bench/int8_range.py", argv)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
