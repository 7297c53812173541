"""One JSON (and a printed table) from the run folders a lent-GPU job brought back: each run's flags
that vary, its steps, best STS-B dev and the STS-B test of its best checkpoint at each trained width.

    python scripts/gpu_runs_summary.py /tmp/widths/widths --machine "one lent NVIDIA H100 (...)" \
        --command "ROUND=1..3 bash scripts/gpu_widths_job.sh" --out docs/results/gpu_widths_h100.json
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
FINETUNE_FLAGS = (
    "finetune_lr", "finetune_epochs", "finetune_batch_size", "finetune_temperature", "matryoshka_weights",
    "seed",
)  # fmt: skip


def summarise(manifest: dict[str, Any], evaluation: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run: flags, steps, dev selection and STS-B test by width (share of the widest). A
    fine-tuning reports its own stage and flags; a soup (``distilembed average``, whose manifest has
    no test score) its sources, with the test from ``distilembed eval --json`` beside it."""
    config = manifest["config"]
    widest = config["dim"]
    if "average" in manifest:
        if evaluation is None:
            raise SystemExit("error: a soup needs its eval.json")
        average = manifest["average"]
        return {
            "soup": average["recipe"],
            "sources": [Path(p).name for p in average["chosen"]],
            "best_dev": average["dev_spearman"],
            "stsb_test_by_width": {str(widest): round(evaluation["scores"]["STS-B"], 2)},
        }
    stage = manifest["stages"][-1] if "finetune" in manifest else manifest["training"]
    flags = FINETUNE_FLAGS if "finetune" in manifest else FLAGS
    by_width = {str(widest): manifest["scores"]["STS-B"]}
    for width, scores in (manifest.get("matryoshka", {}).get("scores") or {}).items():
        by_width[str(width)] = scores["STS-B"]
    return {
        "flags": {name: config.get(name) for name in flags},
        "steps": stage["steps"],
        "best_step": stage["best_step"],
        "best_dev": stage["best_dev_spearman"],
        "dev_selection": manifest.get("matryoshka", {}).get("selection", "STS-B dev"),
        "stsb_test_by_width": by_width,
        "share_of_widest": {w: round(100 * v / by_width[str(widest)], 1) for w, v in by_width.items()},
        "train_seconds": stage.get("train_seconds", manifest["seconds"].get("train")),
    }


def read_run(folder: Path) -> dict[str, Any]:
    evaluation = folder / "eval.json"
    manifest = json.loads((folder / "manifest.json").read_text())
    return summarise(manifest, json.loads(evaluation.read_text()) if evaluation.is_file() else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="folder holding one folder per run, each with manifest.json")
    parser.add_argument("--machine", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--base-flags", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = {path.parent.name: read_run(path.parent) for path in sorted(args.runs.glob("*/manifest.json"))}
    if not runs:
        raise SystemExit(f"error: no */manifest.json under {args.runs}")
    result = {"machine": args.machine, "command": args.command, "base_flags": args.base_flags, "runs": runs}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, run in runs.items():
        shares = run.get("share_of_widest", {})
        by_width = run["stsb_test_by_width"].items()
        widths = "  ".join(f"{w}: {v:.2f} ({shares.get(w, 100.0):.1f}%)" for w, v in by_width)
        steps = f"{run['best_step']:>5} / {run['steps']:<5}" if "steps" in run else f"{run['soup']:>13}"
        print(f"{name:24s} dev {run['best_dev']:.2f} @ {steps} {widths}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
