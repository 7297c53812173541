"""What vector width buys in IVF search time, on Quora: the teacher's vectors cut by PCA to each
width, and the student's own 128-d vectors, each in IVF1024 / nprobe 5, timed in interleaved rounds,
with each one's MRR@10 (exact and IVF) as a share of the full teacher's exact search.

A line t(d) = f + c * d is fitted to the teacher-PCA times. ``f`` is what a query costs whatever
the width (choosing nprobe of nlist centroids, result heaps, list setup, threads); ``c`` is the
cost per dimension. Going from 768 to 128 dimensions can then buy at most
(f + 768c) / (f + 128c), not 768 / 128 = 6, which is why the 5x search-time target of
bench/quora_sr.py sits near the edge at 36,824 documents (issue 4, docs/results.md).

    python bench/ivf_width.py --bundle models/default --out docs/results/ivf_width.json

The MRR columns say what a 128-d student can reach at all: the teacher's own PCA-128 is the target
HPD and ConGen distil, so its IVF share is the ceiling of a student that copies it perfectly.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from functools import partial
from pathlib import Path

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved_seconds, load_quora_retrieval
from quora_sr import (
    add_ivf_args,
    add_model_args,
    make_index,
    mrr10,
    raw_search,
    student_vectors,
    teacher_vectors,
)


def pca_widths(vectors: np.ndarray, widths: list[int], fit_on: int, seed: int) -> dict[int, np.ndarray]:
    """``vectors`` projected on their first ``w`` principal axes and re-normalised, for each width
    (the full width is kept as it is)."""
    rng = np.random.default_rng(seed)
    sample = vectors[rng.choice(len(vectors), size=min(fit_on, len(vectors)), replace=False)]
    mean = sample.mean(axis=0)
    axes = np.linalg.svd(sample - mean, full_matrices=False)[2]
    out = {}
    for width in widths:
        cut = vectors if width >= vectors.shape[1] else (vectors - mean) @ axes[:width].T
        out[width] = np.ascontiguousarray(cut / np.linalg.norm(cut, axis=1, keepdims=True), dtype=np.float32)
    return out


def fixed_and_per_dim(widths: list[int], ms: list[float]) -> tuple[float, float]:
    """Least-squares line through (width, ms): intercept (the width-free part), slope (per dim)."""
    slope, intercept = np.polyfit(np.asarray(widths, dtype=float), np.asarray(ms, dtype=float), 1)
    return float(intercept), float(slope)


def main() -> None:
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser, data_root)
    parser.add_argument(
        "--widths", type=lambda s: [int(x) for x in s.split(",")], default=[32, 64, 128, 256, 384, 768]
    )
    add_ivf_args(parser)
    parser.add_argument("--nprobe", type=int, default=5)
    parser.add_argument("--pca-sample", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default="docs/results/ivf_width.json")
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)

    data = load_quora_retrieval(args.quora_dir)
    queries = np.asarray(data.queries)
    by_width = pca_widths(teacher_vectors(args, data.corpus, [], []), args.widths, args.pca_sample, args.seed)
    candidates = {f"teacher-{w}": v for w, v in by_width.items()}
    candidates["student-128"] = student_vectors(args, data)[0]
    calls, mrr = {}, {}
    for name, vectors in candidates.items():
        index = make_index(vectors, "float32", args.nlist, args.seed, args.train_sample, args.kmeans_niter)
        search = partial(raw_search, index, np.ascontiguousarray(vectors[queries]), 11, args.nprobe)
        exact = make_index(vectors, None, args.nlist, args.seed, args.train_sample)
        mrr[name] = {
            "exact": mrr10(raw_search(exact, vectors[queries], 11, 1), data),
            "ivf": mrr10(search(), data),  # also warms it
        }
        calls[name] = search
    reference = mrr[f"teacher-{max(args.widths)}"]["exact"]
    seconds = interleaved_seconds(calls, args.repeats)
    ms = {name: 1e6 * statistics.median(s) / len(queries) for name, s in seconds.items()}

    teacher_ms = [ms[f"teacher-{w}"] for w in args.widths]
    fixed, per_dim = fixed_and_per_dim(args.widths, teacher_ms)
    widest = max(args.widths)
    result = {
        "corpus": len(data.corpus),
        "queries": len(queries),
        "threads": args.threads,
        "nlist": args.nlist,
        "nprobe": args.nprobe,
        "ms_per_1000": ms,
        "mrr10": mrr,
        "mrr10_pct_of_widest_teacher_exact": {
            name: {kind: 100 * value / reference for kind, value in row.items()} for name, row in mrr.items()
        },
        "fit_fixed_ms_per_1000": fixed,
        "fit_ms_per_1000_per_dim": per_dim,
        "fit_ratio_widest_over_128": (fixed + widest * per_dim) / (fixed + 128 * per_dim),
        "ratio_widest_over_pca_128": ms[f"teacher-{widest}"] / ms["teacher-128"]
        if 128 in args.widths
        else None,
        "ratio_widest_over_student": ms[f"teacher-{widest}"] / ms["student-128"],
    }
    table = Table(
        title=f"IVF{args.nlist} / nprobe {args.nprobe}, {len(data.corpus)} documents, {args.threads} threads"
    )
    table.add_column("vectors")
    table.add_column("ms / 1000 q", justify="right")
    table.add_column("MRR@10 exact", justify="right")
    table.add_column(f"MRR@10 IVF nprobe {args.nprobe}", justify="right")
    table.add_column("IVF, % of full teacher exact", justify="right")
    for name, value in ms.items():
        row = mrr[name]
        table.add_row(
            name,
            f"{value:.2f}",
            f"{row['exact']:.2f}",
            f"{row['ivf']:.2f}",
            f"{100 * row['ivf'] / reference:.1f}",
        )
    console = Console()
    console.print(table)
    console.print({k: v for k, v in result.items() if k.startswith(("fit", "ratio"))})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
