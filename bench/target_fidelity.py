"""How faithfully a student copies its target, text domain by text domain.

A student loses Quora MRR@10 through IVF where its vectors stray from its target's: a query and its
duplicate that the target keeps in one list can land in two. This script asks whether that
straying depends on the text: for each set of sentences (Quora's questions, Wikipedia sentences
past every training and distractor slice, STS-B dev), it encodes them with the student and with
the training run's target (the teacher ensemble cut by the PCA fitted on ``--pca-fit``, as
``bench/target_space.py`` rebuilds it) and reports, within each set:

- the share of each sentence's 10 nearest neighbours that the student and the target agree on;
- the Spearman correlation of their cosines over random pairs, and over each sentence's 10
  nearest pairs in the target (the fine structure IVF's lists cut through).

The target's own agreement with the full ensemble it was cut from is shown beside, as the ceiling
that the reduction to ``--dim`` already sets. No Quora text is fitted on or trained on.

    python bench/target_fidelity.py --bundle models/default --out docs/results/target_fidelity.json

``--checkpoint RUN`` scores a training checkpoint in PyTorch instead (e.g. a run's step-0 snapshot:
all-MiniLM-L6-v2 with the ridge head, before any distillation).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import load_quora_retrieval, run_info
from quora_sr import unit_rows
from target_space import add_target_args, target_pca, teacher_name

from distilembed.artifacts import atomic_write_json


def nearest(vectors: np.ndarray, k: int) -> np.ndarray:
    """Each unit row's ``k`` nearest other rows by cosine (self excluded), best first."""
    scores = vectors @ vectors.T
    np.fill_diagonal(scores, -np.inf)
    top = np.argpartition(-scores, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)


def neighbour_agreement(a: np.ndarray, b: np.ndarray, k: int = 10) -> float:
    """Mean share (%) of each row's ``k`` nearest neighbours in ``a`` that are among its ``k`` in ``b``."""
    na, nb = nearest(a, k), nearest(b, k)
    shared = [len(set(x) & set(y)) for x, y in zip(na.tolist(), nb.tolist(), strict=True)]
    return 100 * float(np.mean(shared)) / k


def cosine_correlation(a: np.ndarray, b: np.ndarray, pairs: np.ndarray) -> float:
    """Spearman (x 100) of the two spaces' cosines over ``pairs`` (rows of two indices)."""
    left, right = pairs[:, 0], pairs[:, 1]
    cos_a = np.sum(a[left] * a[right], axis=1)
    cos_b = np.sum(b[left] * b[right], axis=1)
    return 100 * float(spearmanr(cos_a, cos_b).statistic)


def random_pairs(n: int, count: int, seed: int) -> np.ndarray:
    """``count`` pairs of distinct indices below ``n``."""
    rng = np.random.default_rng(seed)
    left = rng.integers(0, n, size=count)
    right = (left + rng.integers(1, n, size=count)) % n
    return np.stack([left, right], axis=1)


def near_pairs(reference: np.ndarray, k: int) -> np.ndarray:
    """Each row with each of its ``k`` nearest neighbours in ``reference``."""
    top = nearest(reference, k)
    return np.stack([np.repeat(np.arange(len(top)), k), top.ravel()], axis=1)


def text_sets(args: argparse.Namespace, data_root: str) -> dict[str, list[str]]:
    from training.data.extra_text import source_sentences
    from training.data.text import read_sentences

    quora = list(dict.fromkeys(load_quora_retrieval(args.quora_dir).corpus))
    rng = np.random.default_rng(args.seed)
    questions = [quora[i] for i in np.sort(rng.choice(len(quora), size=args.n, replace=False))]
    wiki = read_sentences(f"{data_root}/unlabeled/enwiki2015_1m_sentences.txt.gz", args.n, args.wiki_skip)
    sts = source_sentences("sts/stsbenchmark/sts-dev.csv", data_root)
    sts = [sts[i] for i in np.sort(rng.choice(len(sts), size=min(args.n, len(sts)), replace=False))]
    return {
        "Quora questions": questions,
        f"Wikipedia (after sentence {args.wiki_skip:,})": wiki,
        "STS-B dev sentences": sts,
    }


def student_encoder(args: argparse.Namespace) -> Callable[[list[str], str], np.ndarray]:
    """Unit rows of the student's vectors: its bundle through the runtime encoder, or its
    checkpoint through sentence-transformers (``bench/checkpoint_quora.py``'s way)."""
    if args.bundle:
        from export.runtime import Encoder

        bundle = Encoder(args.bundle, variant=args.variant, threads=args.threads)
        return lambda texts, name: bundle.encode(texts, progress=name)
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args.checkpoint, device="cpu")

    def encode(texts: list[str], name: str) -> np.ndarray:
        print(f"{name}: {len(texts):,} sentences through {args.checkpoint}")
        return model.encode(texts, batch_size=64, normalize_embeddings=True).astype(np.float32)

    return encode


def main(argv: list[str] | None = None) -> None:
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    student = parser.add_mutually_exclusive_group(required=True)
    student.add_argument("--bundle", help="student bundle (export output)")
    student.add_argument("--checkpoint", help="student checkpoint (a training run's folder), in PyTorch")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"), help="of --bundle")
    parser.add_argument("--quora-dir", default=f"{data_root}/quora")
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--teacher-batch-size", type=int, default=16)
    add_target_args(parser)
    parser.add_argument("--n", type=int, default=3000, help="sentences per text set")
    parser.add_argument(
        "--wiki-skip", type=int, default=600_000, help="past the training and distractor slices"
    )
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=200_000, help="random pairs per set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="docs/results/target_fidelity.json")
    args = parser.parse_args(argv)
    teacher, _, pca = target_pca(args)
    encode = student_encoder(args)
    rows: dict[str, dict[str, float]] = {}
    for name, texts in text_sets(args, data_root).items():
        full = np.asarray(teacher.targets(texts)[0], dtype=np.float32)
        target = unit_rows(pca.transform(full))
        student = encode(texts, name)
        spread = random_pairs(len(texts), args.pairs, args.seed)
        close = near_pairs(target, args.k)
        rows[name] = {
            "sentences": len(texts),
            "student_neighbours": neighbour_agreement(student, target, args.k),
            "student_random_pairs": cosine_correlation(student, target, spread),
            "student_near_pairs": cosine_correlation(student, target, close),
            "target_neighbours_of_full": neighbour_agreement(target, unit_rows(full), args.k),
        }
    result = {
        "student": args.bundle or args.checkpoint,
        "variant": args.variant if args.bundle else "PyTorch float32",
        "target": f"{teacher_name(args)}, PCA-{args.dim} fitted on {args.pca_fit}",
        "k": args.k,
        "rows": rows,
        "run": run_info("bench/target_fidelity.py", argv if argv is not None else sys.argv[1:]),
    }
    table = Table(title=f"Student against its target, {result['target']}")
    columns = (
        "text",
        "sentences",
        f"shared top-{args.k} %",
        "cosine Spearman, random pairs",
        f"cosine Spearman, target's top-{args.k} pairs",
        f"target's top-{args.k} shared with the full ensemble %",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "text" else "right")
    for name, r in rows.items():
        table.add_row(
            name,
            f"{r['sentences']:,}",
            f"{r['student_neighbours']:.1f}",
            f"{r['student_random_pairs']:.1f}",
            f"{r['student_near_pairs']:.1f}",
            f"{r['target_neighbours_of_full']:.1f}",
        )
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    atomic_write_json(args.out, result)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
