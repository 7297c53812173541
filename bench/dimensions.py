"""What `dimensions: N` costs: STS-B test Spearman of a bundle's vectors cut to N and re-normalised.

python bench/dimensions.py --bundle models/default --out bench/results/dimensions-default.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from export.runtime import Encoder  # noqa: E402
from training.data.sts import read_stsb  # noqa: E402


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def main() -> None:
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--sts-file", default=f"{data}/sts/stsbenchmark/sts-test.csv")
    parser.add_argument("--dims", default="128,96,64,48,32,16")
    parser.add_argument("--out", default="bench/results/dimensions.json")
    args = parser.parse_args()

    pairs = read_stsb(Path(args.sts_file))
    encoder = Encoder(args.bundle, args.variant, threads=os.cpu_count())
    left, right = encoder.encode([p.sentence1 for p in pairs]), encoder.encode([p.sentence2 for p in pairs])
    gold = [p.score for p in pairs]
    scores = {}
    for dim in (int(d) for d in args.dims.split(",")):
        cosine = (unit(left[:, :dim]) * unit(right[:, :dim])).sum(axis=1)
        scores[dim] = round(100 * float(spearmanr(cosine, gold).statistic), 2)
    table = Table(title=f"STS-B test ({len(pairs)} pairs), {args.bundle} {args.variant}, first N dimensions")
    for dim in scores:
        table.add_column(str(dim), justify="right")
    table.add_row(*(f"{v:.2f}" for v in scores.values()))
    Console().print(table)
    result = {"bundle": args.bundle, "variant": args.variant, "pairs": len(pairs), "spearman": scores}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
