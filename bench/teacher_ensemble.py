"""A teacher ensemble's ceiling: STS-B Spearman of two teachers' cosines averaged by weight.

python bench/teacher_ensemble.py --out docs/results/teacher_ensemble.json

The ensemble is what ``distilembed train --ensemble-teacher NAME:W`` distils
(training/teacher_ensemble.py): each teacher's normalised vector scaled by sqrt(weight),
concatenated. Vectors come from the training target cache. The weight is chosen on STS-B dev.
Rewrites the block ``teacher-ensemble`` of docs/results.md (``--no-doc``: not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import add_doc_args, markdown_table, publish, publish_saved, run_info  # noqa: E402


def render(result: dict[str, Any]) -> str:
    header = ["teacher", *(f"STS-B {split}" for split in result["splits"])]
    rows = [
        [name, *(f"{result['spearman'][name][s]:.2f}" for s in result["splits"])]
        for name in result["spearman"]
    ]
    best = result["best_on_dev"]
    return markdown_table(header, rows) + f"\n\nBest weight on STS-B dev: **{best}**."


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--member", default="all-MiniLM-L6-v2", help="the second teacher")
    parser.add_argument("--weights", default="0.1,0.2,0.3,0.4,0.5", help="the second teacher's weights")
    parser.add_argument("--sts-dir", default=f"{data}/sts")
    parser.add_argument("--out", default="docs/results/teacher_ensemble.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "teacher-ensemble", render):
        return

    from training.data.sts import distinct_sentences, load_stsb_split
    from training.evaluation import evaluate_vectors
    from training.teacher_ensemble import combine
    from training.teacher_targets import Teacher

    teachers = [Teacher(name, device="cpu", batch_size=16) for name in (args.teacher, args.member)]
    weights = [float(w) for w in args.weights.split(",")]
    splits = ("dev", "test")
    spearman: dict[str, dict[str, float]] = {}
    for split in splits:
        pairs = load_stsb_split(args.sts_dir, split)
        sentences = distinct_sentences(pairs)
        vectors = [np.asarray(t.targets(sentences)[0], dtype=np.float32) for t in teachers]
        candidates = {t.name: v for t, v in zip(teachers, vectors, strict=True)}
        for w in weights:
            candidates[f"{args.teacher} {1 - w:g} + {args.member} {w:g}"] = combine(vectors, [1 - w, w])
        for name, rows in candidates.items():
            spearman.setdefault(name, {})[split] = round(evaluate_vectors(sentences, rows, pairs), 2)
    mixes = [name for name in spearman if " + " in name]
    result = {
        "splits": list(splits),
        "spearman": spearman,
        "best_on_dev": max(mixes, key=lambda name: spearman[name]["dev"]),
        "run": run_info("bench/teacher_ensemble.py", argv),
    }
    print(json.dumps(spearman, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    publish(args, result, Path(args.out), "teacher-ensemble", render)


if __name__ == "__main__":
    main()
