"""One JSON (and a printed table) from the run folders a lent-GPU job brought back: each run's flags
that vary, its steps, best STS-B dev and the STS-B test of its best checkpoint at each trained width.

    python scripts/gpu_runs_summary.py /tmp/widths/widths --machine "one lent NVIDIA H100 (...)" \
        --command "ROUND=1..3 bash scripts/gpu_widths_job.sh" --out bench/results/gpu_widths_h100.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

FLAGS = (
    "dim", "matryoshka", "matryoshka_weights", "congen_teacher_space", "hpd_weight", "lr", "epochs",
    "n_sentences", "ensemble_teachers", "exclude_text", "temperature", "teacher_temperature",
)  # fmt: skip


def summarise(manifest: dict[str, Any]) -> dict[str, Any]:
    """One run: flags, steps, dev selection and STS-B test by width (share of the widest)."""
    config, training = manifest["config"], manifest["training"]
    widest = config["dim"]
    by_width = {str(widest): manifest["scores"]["STS-B"]}
    for width, scores in (manifest.get("matryoshka", {}).get("scores") or {}).items():
        by_width[str(width)] = scores["STS-B"]
    return {
        "flags": {name: config.get(name) for name in FLAGS},
        "steps": training["steps"],
        "best_step": training["best_step"],
        "best_dev": training["best_dev_spearman"],
        "dev_selection": manifest.get("matryoshka", {}).get("selection", "STS-B dev"),
        "stsb_test_by_width": by_width,
        "share_of_widest": {w: round(100 * v / by_width[str(widest)], 1) for w, v in by_width.items()},
        "train_seconds": manifest["seconds"]["train"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="folder holding one folder per run, each with manifest.json")
    parser.add_argument("--machine", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--base-flags", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = {
        path.parent.name: summarise(json.loads(path.read_text()))
        for path in sorted(args.runs.glob("*/manifest.json"))
    }
    if not runs:
        raise SystemExit(f"error: no */manifest.json under {args.runs}")
    result = {"machine": args.machine, "command": args.command, "base_flags": args.base_flags, "runs": runs}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, run in runs.items():
        widths = "  ".join(
            f"{w}: {v:.2f} ({run['share_of_widest'][w]:.1f}%)" for w, v in run["stsb_test_by_width"].items()
        )
        print(f"{name:24s} dev {run['best_dev']:.2f} @ {run['best_step']:>5} / {run['steps']:<5} {widths}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
