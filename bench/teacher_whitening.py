"""Whitened PCA targets: the teacher's STS-B Spearman after its PCA to --dim, partially whitened.

python bench/teacher_whitening.py --out docs/results/teacher_whitening.json

The PCA is training.losses.hpd.PCATargets fitted on the STS-B train sentences, as ``distilembed
train --pca-whiten P`` fits it: component variances v become v^(1 - P). Teachers: --teacher alone
and with --member at --member-weight (``--ensemble-teacher``, training/teacher_ensemble.py).
Vectors come from the training target cache. The power is chosen on STS-B dev. Rewrites the block
``teacher-whitening`` of docs/results.md (``--no-doc``: not).
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
    rows = [
        [name, f"{scores['dev']:.2f}", f"{scores['test']:.2f}"] for name, scores in result["spearman"].items()
    ]
    best = ", ".join(f"{teacher}: **{name}**" for teacher, name in result["best_on_dev"].items())
    return (
        markdown_table(["teacher, PCA", "STS-B dev", "STS-B test"], rows) + f"\n\nBest on STS-B dev: {best}."
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--member", default="all-MiniLM-L6-v2", help="the ensemble's second teacher")
    parser.add_argument("--member-weight", type=float, default=0.3)
    parser.add_argument("--powers", default="0,0.25,0.5,1", help="whitening powers P")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--sts-dir", default=f"{data}/sts")
    parser.add_argument("--out", default="docs/results/teacher_whitening.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "teacher-whitening", render):
        return

    from training.data.sts import distinct_sentences, load_stsb_split, read_stsb
    from training.evaluation import evaluate_vectors
    from training.losses.hpd import PCATargets
    from training.teacher_ensemble import combine
    from training.teacher_targets import Teacher

    teachers = [Teacher(name, device="cpu", batch_size=16) for name in (args.teacher, args.member)]
    mix = f"{args.teacher} {1 - args.member_weight:g} + {args.member} {args.member_weight:g}"

    def vectors(texts: list[str]) -> dict[str, np.ndarray]:
        rows = [np.asarray(t.targets(texts)[0], dtype=np.float32) for t in teachers]
        return {args.teacher: rows[0], mix: combine(rows, [1 - args.member_weight, args.member_weight])}

    fit = vectors(distinct_sentences(read_stsb(Path(args.sts_dir) / "stsbenchmark" / "sts-train.csv")))
    splits = {}  # split: (pairs, distinct sentences, each teacher's vectors of them), read once
    for split in ("dev", "test"):
        pairs = load_stsb_split(args.sts_dir, split)
        sentences = distinct_sentences(pairs)
        splits[split] = (pairs, sentences, vectors(sentences))
    spearman: dict[str, dict[str, float]] = {}
    best: dict[str, str] = {}
    for teacher, fitted in fit.items():
        for power in (float(p) for p in args.powers.split(",")):
            pca = PCATargets.fit(fitted, args.dim, whiten=power)
            name = f"{teacher}, PCA-{args.dim}, whitening {power:g}"
            for split, (pairs, sentences, split_vectors) in splits.items():
                reduced = pca.transform(split_vectors[teacher])
                spearman.setdefault(name, {})[split] = round(evaluate_vectors(sentences, reduced, pairs), 2)
            if teacher not in best or spearman[name]["dev"] > spearman[best[teacher]]["dev"]:
                best[teacher] = name
    result = {"spearman": spearman, "best_on_dev": best, "run": run_info("bench/teacher_whitening.py", argv)}
    print(json.dumps(spearman, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    publish(args, result, Path(args.out), "teacher-whitening", render)


if __name__ == "__main__":
    main()
