"""The ceiling of a narrow student: the teacher's STS-B test Spearman after a PCA to N dimensions.

python bench/teacher_pca.py --out docs/results/teacher_pca.json

The PCA is training.losses.hpd.PCATargets fitted on the teacher's vectors of the STS-B train
sentences, as `distilembed train` fits it (``--pca-fit sts/stsbenchmark/sts-train.csv``); the
teacher's vectors come from the training target cache. A Matryoshka student's ratios (64-d or 32-d
over 128-d) compare with the teacher's PCA ratios here. Rewrites the block ``teacher-pca`` of
docs/results.md (``--no-doc``: not).
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
    scores = {int(width): value for width, value in result["spearman"].items()}
    base = scores[result["reference_width"]]
    header = ["teacher", "split", *(f"{w}" if w != result["dim"] else f"{w} (full)" for w in scores)]
    rows = [[result["teacher"], "STS-B test", *(f"{v:.2f}" for v in scores.values())]]
    rows.append(
        ["", f"share of {result['reference_width']}-d", *(f"{100 * v / base:.1f}%" for v in scores.values())]
    )
    return markdown_table(header, rows, "ll" + "r" * len(scores))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--sts-dir", default=f"{data}/sts")
    parser.add_argument("--widths", default="128,96,64,48,32,16")
    parser.add_argument("--reference-width", type=int, default=128)
    parser.add_argument("--out", default="docs/results/teacher_pca.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "teacher-pca", render):
        return

    from training.data.sts import distinct_sentences, load_stsb_split, read_stsb
    from training.evaluation import evaluate_vectors
    from training.losses.hpd import PCATargets
    from training.teacher_targets import Teacher

    teacher = Teacher(args.teacher, device="cpu", batch_size=16)
    widths = [int(x) for x in args.widths.split(",")]
    fit = distinct_sentences(read_stsb(Path(args.sts_dir) / "stsbenchmark" / "sts-train.csv"))
    pca = PCATargets.fit(teacher.targets(fit)[0], max(widths))  # the PCA `distilembed train` fits
    pairs = load_stsb_split(args.sts_dir, "test")
    sentences = distinct_sentences(pairs)
    full = np.asarray(teacher.targets(sentences)[0], dtype=np.float32)
    reduced = pca.transform(full)  # components by explained variance: a width is a prefix
    scores = {full.shape[1]: full} | {w: reduced[:, :w] for w in widths}
    spearman = {
        width: round(evaluate_vectors(sentences, vectors, pairs), 2) for width, vectors in scores.items()
    }
    result = {
        "teacher": args.teacher,
        "dim": full.shape[1],
        "pca_fit": "STS-B train sentences",
        "reference_width": args.reference_width,
        "spearman": spearman,
        "run": run_info("bench/teacher_pca.py", argv),
    }
    print(json.dumps(spearman))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    publish(args, result, Path(args.out), "teacher-pca", render)


if __name__ == "__main__":
    main()
