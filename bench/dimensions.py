"""What `dimensions: N` costs: STS-B test Spearman of a bundle's vectors cut to N and re-normalised.

python bench/dimensions.py --bundle models/default --out docs/results/dimensions-default.json

Rewrites the block ``dimensions-<bundle folder name>`` of docs/results.md (``--no-doc``: not);
``--render-from JSON`` rewrites it from an earlier run's JSON without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import add_doc_args, markdown_table, publish, publish_saved, run_info  # noqa: E402

from export.runtime import Encoder  # noqa: E402
from training.data.sts import read_stsb  # noqa: E402


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def block_name(result: dict[str, Any]) -> str:
    return f"dimensions-{Path(result['bundle']).name}"


def render(result: dict[str, Any]) -> str:
    """One row: STS-B test at each width, and the narrower widths as a share of the widest."""
    scores = {int(dim): value for dim, value in result["spearman"].items()}
    widest = max(scores)
    shares = [d for d in (64, 32) if d in scores and d < widest]
    header = ["bundle", "variant", *(str(d) for d in scores), *(f"{d} / {widest}" for d in shares)]
    row = [f"`{result['bundle']}`", result["variant"], *(f"{v:.2f}" for v in scores.values())]
    row += [f"{100 * scores[d] / scores[widest]:.1f}%" for d in shares]
    return markdown_table(header, [row], "ll" + "r" * (len(header) - 2))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--sts-file", default=f"{data}/sts/stsbenchmark/sts-test.csv")
    parser.add_argument("--dims", default="128,96,64,48,32,16")
    parser.add_argument("--out", default="docs/results/dimensions.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, block_name, render):
        return

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
    result["run"] = run_info("bench/dimensions.py", argv)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    publish(args, result, Path(args.out), block_name(result), render)


if __name__ == "__main__":
    main()
