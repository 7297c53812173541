"""Students compared under IVF clustering noise: Quora MRR@10 at IVF nprobe 5 over several seeds.

An IVF index is trained by k-means on a sample of the corpus, and both the sample and the
initial centroids come from a seed. ``bench/quora_sr.py`` trains one index per model with seed 0,
so two students whose exact search is a tie can differ by a tenth of a point at nprobe 5 only
because one student's documents fell on better cell boundaries. This script encodes the corpus
once per bundle, trains the IVF at ``--seeds`` seeds (each seed its own sample and k-means start,
the same for every bundle) and reports each bundle's exact MRR@10, its IVF MRR@10 as mean, standard
deviation and range over the seeds, and the mean paired difference to the first bundle (seed by
seed) with its standard deviation. Shares are of the teacher's exact search on the same corpus.

    python bench/ivf_seeds.py --bundle default=models/default --bundle new=runs/bundles/new \
        --distractors 100000 --seeds 10 --out docs/results/ivf_seeds.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import QuoraRetrieval, add_distractors, load_quora_retrieval, named_path, run_info
from quora_sr import (
    add_ivf_args,
    add_model_args,
    make_index,
    mrr10,
    raw_search,
    read_distractors,
    teacher_vectors,
)

from distilembed.artifacts import atomic_write_json


@dataclass(frozen=True)
class SeedSummary:
    """One bundle's IVF MRR@10 over the seeds, and its paired difference to the reference bundle."""

    mean: float
    sd: float
    low: float
    high: float
    diff_mean: float
    diff_sd: float


def summarise(values: list[float], reference: list[float]) -> SeedSummary:
    """``values`` and ``reference`` hold one MRR@10 per seed, in the same seed order."""
    if len(values) != len(reference) or not values:
        raise ValueError("one value per seed for both bundles")
    diffs = [v - r for v, r in zip(values, reference, strict=True)]
    spread = statistics.stdev if len(values) > 1 else (lambda _: 0.0)
    return SeedSummary(
        statistics.fmean(values),
        spread(values),
        min(values),
        max(values),
        statistics.fmean(diffs),
        spread(diffs),
    )


def parse_bundles(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """``--bundle NAME=PATH`` pairs in the order given (the first is the reference), names unique."""
    out = dict(pairs)
    if len(out) != len(pairs):
        raise SystemExit("error: a --bundle name is given twice")
    return out


class SeedSearch(NamedTuple):
    """MRR@10 of exact search; per seed, IVF's MRR@10 and the share of queries (%) whose relevant
    document's list is among the ``nprobe`` lists searched."""

    exact: float
    ivf: list[float]
    probed: list[float]


def probed_share(index: faiss.IndexIVF, queries: np.ndarray, relevant: np.ndarray, nprobe: int) -> float:
    """% of ``queries`` whose ``relevant`` vector (one per query) falls in one of their ``nprobe``
    nearest lists: the relevant documents IVF can find at all."""
    _, probed = index.quantizer.search(queries, nprobe)
    _, home = index.quantizer.search(relevant, 1)
    return 100 * float((probed == home).any(axis=1).mean())


def search_mrrs(
    vectors: np.ndarray, data: QuoraRetrieval, args: argparse.Namespace, seeds: list[int]
) -> SeedSearch:
    """Exact search, and IVF (nprobe ``--nprobe``) trained at each of ``seeds``."""
    queries = np.ascontiguousarray(vectors[np.asarray(data.queries)])
    relevant = np.ascontiguousarray(vectors[np.asarray(data.relevant)])
    exact = make_index(vectors, None, args.nlist, args.seed, args.train_sample)
    ivf, probed = [], []
    for seed in seeds:
        index = make_index(vectors, "float32", args.nlist, seed, args.train_sample, args.kmeans_niter)
        ivf.append(mrr10(raw_search(index, queries, 11, args.nprobe), data))
        probed.append(probed_share(index, queries, relevant, args.nprobe))
    return SeedSearch(mrr10(raw_search(exact, queries, 11, 1), data), ivf, probed)


def main(argv: list[str] | None = None) -> None:
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bundle", dest="bundles", action="append", type=named_path, required=True, help="NAME=PATH"
    )
    add_model_args(parser, data_root, one_bundle=False)
    parser.add_argument("--distractors", type=int, default=0)
    parser.add_argument(
        "--distractor-corpus", default=f"{data_root}/unlabeled/enwiki2015_1m_sentences.txt.gz"
    )
    add_ivf_args(parser)  # --seed: the first of the seeds
    parser.add_argument("--seeds", type=int, default=10, help="IVF trainings: seeds --seed, --seed + 1, ...")
    parser.add_argument("--nprobe", type=int, default=5)
    parser.add_argument("--teacher-ivf", action="store_true", help="also the teacher's IVF at each seed")
    parser.add_argument("--out", default="docs/results/ivf_seeds.json")
    args = parser.parse_args(argv)
    bundles = parse_bundles(args.bundles)
    faiss.omp_set_num_threads(args.threads)
    from export.runtime import Encoder

    questions = load_quora_retrieval(args.quora_dir)
    distractors, pool = read_distractors(args.distractor_corpus, args.distractors)
    data, kept = add_distractors(questions, distractors)
    vectors = {"teacher": teacher_vectors(args, questions.corpus, pool, kept)}
    for name, path in bundles.items():
        encoder = Encoder(path, variant=args.variant, threads=args.threads)
        vectors[name] = encoder.encode(data.corpus, progress=name)
    seeds = list(range(args.seed, args.seed + args.seeds))
    names = list(bundles) + (["teacher"] if args.teacher_ivf else [])
    found = {name: search_mrrs(v, data, args, seeds if name in names else []) for name, v in vectors.items()}
    teacher_exact = found["teacher"][0]
    reference = found[next(iter(bundles))][1]
    rows = {
        name: {"exact": found[name][0], "ivf": found[name][1]} | vars(summarise(found[name][1], reference))
        for name in names
    }
    result = {
        "corpus": len(data.corpus),
        "distractors": {"asked": args.distractors, "added": len(kept)},
        "queries": len(data.queries),
        "nlist": args.nlist,
        "nprobe": args.nprobe,
        "kmeans_niter": args.kmeans_niter,
        "seeds": seeds,
        "teacher_exact": teacher_exact,
        "bundles": bundles,
        "variant": args.variant,
        "rows": rows,
        "run": run_info("bench/ivf_seeds.py", argv if argv is not None else sys.argv[1:]),
    }
    shape = f"IVF{args.nlist} nprobe {args.nprobe}, {len(seeds)} seeds, k-means x{args.kmeans_niter}"
    table = Table(title=f"Quora MRR@10, {len(data.corpus):,} documents, {shape}")
    for col in ("model", "exact", "IVF mean", "sd", "range", "% of teacher exact", "paired diff (sd)"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name, r in rows.items():
        table.add_row(
            name,
            f"{r['exact']:.2f}",
            f"{r['mean']:.2f}",
            f"{r['sd']:.2f}",
            f"{r['low']:.2f}-{r['high']:.2f}",
            f"{100 * r['mean'] / teacher_exact:.2f}",
            f"{r['diff_mean']:+.2f} ({r['diff_sd']:.2f})",
        )
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    console.print(f"teacher exact MRR@10: {teacher_exact:.2f}")
    atomic_write_json(args.out, result)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
