"""A Matryoshka student between its first stage and its fine-tuning: STS-B at each width along
WiSE-FT's interpolation theta_alpha = (1 - alpha) theta_start + alpha theta_tuned (Wortsman et al.,
CVPR 2022; `distilembed average START TUNED --weights 1-alpha,alpha` writes one).

Fine-tuning on NLI lifts a Matryoshka student's 128-d figure by about 1 point and its 32-d figure
by under half of that, so the 32-d share falls as alpha grows (issue 23). For each alpha this prints
STS-B dev and test at every width and the shares of the widest, and picks alpha on dev alone: the
highest mean dev over the widths among the alphas whose dev shares meet ``--min-shares``.

    python bench/wise_curve.py --start runs/mrl-ts05-tt07 --tuned runs/mrl-ts05-tt07-nli \
        --out docs/results/wise_curve_mrl-ts05-tt07-nli.json
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

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from harness import run_info  # noqa: E402

from training.average import average_state_dicts  # noqa: E402
from training.data.sts import STSPair, load_stsb_split  # noqa: E402
from training.evaluation import evaluate_pairs, memoised, sentence_transformer_encoder, truncated  # noqa: E402


def scores_by_width(model: Any, pairs: list[STSPair], widths: list[int]) -> dict[int, float]:
    """STS ``pairs`` at each width, every sentence encoded once."""
    encode = memoised(sentence_transformer_encoder(model, batch_size=128))
    return {w: round(evaluate_pairs(truncated(encode, w), pairs), 2) for w in widths}


def shares(scores: dict[int, float]) -> dict[int, float]:
    widest = max(scores)
    return {w: round(100 * v / scores[widest], 2) for w, v in scores.items() if w != widest}


def best_row(rows: list[dict[str, Any]], min_shares: dict[Any, float]) -> dict[str, Any] | None:
    """The row of the best mean dev among those whose dev shares meet ``min_shares`` (width keys as
    the rows have them: ints here, strings in a curve read back from its JSON)."""
    ok = [r for r in rows if all(r["dev_shares"][w] >= s for w, s in min_shares.items())]
    return max(ok, key=lambda r: r["dev_mean"]) if ok else None


def pick(rows: list[dict[str, Any]], min_shares: dict[int, float]) -> float | None:
    """The alpha of the best mean dev among those whose dev shares meet ``min_shares``."""
    row = best_row(rows, min_shares)
    return None if row is None else row["alpha"]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", required=True, help="the first stage's checkpoint (alpha 0)")
    parser.add_argument("--tuned", required=True, help="its fine-tuning (alpha 1)")
    parser.add_argument("--alphas", default="0,0.3,0.4,0.5,0.6,0.7,0.8,1")
    parser.add_argument("--widths", default="128,64,32")
    parser.add_argument("--min-shares", default="64:99,32:97", help="dev shares an alpha must meet")
    parser.add_argument("--sts-dir", default=f"{data}/sts/stsbenchmark")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from sentence_transformers import SentenceTransformer

    widths = [int(w) for w in args.widths.split(",")]
    min_shares = {int(w): float(s) for w, s in (item.split(":") for item in args.min_shares.split(","))}
    sets = {split: load_stsb_split(args.sts_dir, split) for split in ("dev", "test")}
    start = SentenceTransformer(args.start, device="cpu").state_dict()
    tuned = SentenceTransformer(args.tuned, device="cpu").state_dict()
    model = SentenceTransformer(args.start, device="cpu")
    rows = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        model.load_state_dict(average_state_dicts([start, tuned], [1 - alpha, alpha]))
        row: dict[str, Any] = {"alpha": alpha}
        for split, pairs in sets.items():
            scores = scores_by_width(model, pairs, widths)
            row[split], row[f"{split}_shares"] = scores, shares(scores)
        row["dev_mean"] = round(float(np.mean(list(row["dev"].values()))), 2)
        rows.append(row)
    chosen = pick(rows, min_shares)

    table = Table(title=f"WiSE-FT from {args.start} (alpha 0) to {args.tuned} (alpha 1): STS-B, PyTorch")
    by_width = " / ".join(map(str, widths))
    for column in ("alpha", f"dev {by_width}", "dev mean", "dev shares", f"test {by_width}", "test shares"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            f"{r['alpha']:g}" + (" *" if r["alpha"] == chosen else ""),
            " / ".join(f"{v:.2f}" for v in r["dev"].values()),
            f"{r['dev_mean']:.2f}",
            " / ".join(f"{v:.2f}%" for v in r["dev_shares"].values()),
            " / ".join(f"{v:.2f}" for v in r["test"].values()),
            " / ".join(f"{v:.2f}%" for v in r["test_shares"].values()),
        )
    Console().print(table)
    print(f"chosen on dev (best mean dev with dev shares >= {args.min_shares}): alpha {chosen}")
    result = {"start": args.start, "tuned": args.tuned, "min_shares": min_shares, "chosen_alpha": chosen}
    result |= {"rows": rows, "run": run_info("bench/wise_curve.py", argv)}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
