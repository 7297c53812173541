"""How far students retrieve from their own target space: Quora MRR@10, exact and over IVF seeds.

HPD and ConGen distil a teacher's vectors cut by PCA, and the training run fits that PCA on its
``--pca-fit`` text (the default's recipe: all-mpnet-base-v2 0.6 + all-MiniLM-L6-v2 0.4 concatenated,
fitted on the STS-B train sentences). This script rebuilds that target space as training does
(``build_teacher``, ``PCATargets.fit``; no Quora text is fitted on) and scores it on
``bench/quora_sr.py``'s protocol beside the students: exact search and IVF at ``--nprobe`` over
``--seeds`` k-means seeds (``bench/ivf_seeds.py``'s), each as a share of the main teacher's exact
search. For comparison it also scores the main teacher's PCA fitted on the Quora corpus itself,
what ``bench/ivf_width.py`` reports as teacher-128. Two columns say why a space loses to IVF: the
share of queries whose duplicate's list is among those probed (mean over the seeds), and the mean
cosine of a query with its duplicate beside that with a random other document.

    python bench/target_space.py --bundle default=models/default \
        --out docs/results/target_space.json

``--neighbourhood-preset congen-ens-hpd-cpu`` adds the target that ``train --target-reduction
neighbourhood`` fits (decision 58) on that preset's text.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import QuoraRetrieval, load_quora_retrieval, named_path, run_info
from ivf_seeds import parse_bundles, search_mrrs, summarise
from quora_sr import add_ivf_args, add_model_args, teacher_vectors, unit_rows

from distilembed.artifacts import atomic_write_json


def target_pca_name(args: argparse.Namespace) -> str:
    return f"target PCA-{args.dim}, fitted on {args.pca_fit}"


DEFAULT_ENSEMBLE = ["all-MiniLM-L6-v2:0.4"]  # the default's recipe (congen-ens-hpd-cpu)


def add_target_args(parser: argparse.ArgumentParser) -> None:
    """The training run's teacher and its PCA: shared with bench/target_fidelity.py."""
    parser.add_argument("--ensemble-teacher", action="append", default=None, help="NAME:WEIGHT, repeatable")
    parser.add_argument("--pca-fit", default="sts/stsbenchmark/sts-train.csv")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--pca-seed", type=int, default=42, help="the training run's --seed")


def teacher_name(args: argparse.Namespace) -> str:
    """The training run's teacher, its members joined: "all-mpnet-base-v2 + all-MiniLM-L6-v2:0.4"."""
    return " + ".join([args.teacher, *(args.ensemble_teacher or DEFAULT_ENSEMBLE)])


def target_pca(args: argparse.Namespace) -> tuple[Any, np.ndarray, Any]:
    """(teacher, its vectors of the ``--pca-fit`` text, the PCA fitted on them): the target space as
    the training run builds it (``build_teacher``, ``PCATargets.fit``)."""
    from training.data.extra_text import source_sentences
    from training.losses.hpd import PCATargets
    from training.teacher_ensemble import build_teacher

    ensemble = args.ensemble_teacher or DEFAULT_ENSEMBLE
    teacher = build_teacher(
        args.teacher, ensemble, device="cpu", batch_size=args.teacher_batch_size, backend="auto"
    )
    fit_text = source_sentences(args.pca_fit, os.environ.get("DISTILEMBED_DATA_DIR"))
    fit_vectors = np.asarray(teacher.targets(fit_text)[0], dtype=np.float32)
    return teacher, fit_vectors, PCATargets.fit(fit_vectors, args.dim, args.pca_seed)


def target_spaces(args: argparse.Namespace, corpus: list[str], main: np.ndarray) -> dict[str, np.ndarray]:
    """The training run's teacher, its PCA fitted on ``--pca-fit``, and the main teacher's PCA
    fitted on a sample of the corpus (ivf_width's teacher-128), all unit rows."""
    from training.losses.hpd import PCATargets

    teacher, fit_vectors, pca = target_pca(args)
    full = np.asarray(teacher.targets(corpus)[0], dtype=np.float32)
    rng = np.random.default_rng(args.seed)
    sample = main[rng.choice(len(main), size=min(args.corpus_pca_sample, len(main)), replace=False)]
    on_corpus = PCATargets.fit(sample, args.dim, args.pca_seed)
    name = teacher_name(args)
    spaces = {
        f"target teacher ({name}), {full.shape[1]}-d": unit_rows(full),
        target_pca_name(args): unit_rows(pca.transform(full)),
        f"{args.teacher} PCA-{args.dim} fitted on the Quora corpus": unit_rows(on_corpus.transform(main)),
    }
    if args.neighbourhood_preset:
        refit = neighbourhood_target(args, teacher, fit_vectors)
        spaces[f"the same refitted to keep neighbours ({args.neighbourhood_preset}'s text)"] = unit_rows(
            refit.transform(full)
        )
    return spaces


def neighbourhood_target(args: argparse.Namespace, teacher: Any, fit_vectors: np.ndarray) -> Any:
    """``train --target-reduction neighbourhood``'s targets (``fit_targets``) for a run of
    ``--neighbourhood-preset``: the target PCA refitted on that run's text, picked on STS-B dev."""
    from training.config import make_config
    from training.target_reduction import fit_targets
    from training.training_text import training_text

    data_dir = os.environ.get("DISTILEMBED_DATA_DIR")
    overrides = {"target_reduction": "neighbourhood", "dim": args.dim, "seed": args.pca_seed}
    cfg = make_config(args.neighbourhood_preset, overrides)
    corpus = teacher.targets(training_text(cfg, data_dir).corpus)[0]
    refit, report = fit_targets(cfg, fit_vectors, corpus, teacher, f"{data_dir}/sts/stsbenchmark")
    print(f"target refit: STS-B dev {report['dev_pca']:.2f} (PCA) -> {report['dev']:.2f}")
    return refit


def pair_geometry(vectors: np.ndarray, data: QuoraRetrieval, seed: int) -> dict[str, float]:
    """Mean cosine of each query with its duplicate, and with a random other document (``seed``):
    how tightly a space holds paraphrases against how far apart it holds anything."""
    own = np.asarray(data.queries)
    queries = vectors[own]
    duplicates = vectors[np.asarray(data.relevant)]
    drawn = np.random.default_rng(seed).integers(0, len(vectors) - 1, size=len(own))
    others = vectors[drawn + (drawn >= own)]  # never the query's own entry
    return {
        "duplicate_cosine": float(np.mean(np.sum(queries * duplicates, axis=1))),
        "random_cosine": float(np.mean(np.sum(queries * others, axis=1))),
    }


GEOMETRY_COLUMNS = ("duplicate's list probed %", "cos duplicate / random")


def geometry_cells(row: dict[str, Any]) -> tuple[str, str]:
    """A row's :data:`GEOMETRY_COLUMNS`: the probed share over the seeds, and :func:`pair_geometry`."""
    return (
        f"{statistics.fmean(row['probed']):.2f}",
        f"{row['duplicate_cosine']:.3f} / {row['random_cosine']:.3f}",
    )


def main(argv: list[str] | None = None) -> None:
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", dest="bundles", action="append", type=named_path, default=[])
    add_model_args(parser, data_root, one_bundle=False)
    add_target_args(parser)
    parser.add_argument("--corpus-pca-sample", type=int, default=20_000)
    parser.add_argument(
        "--neighbourhood-preset",
        default=None,
        help="also score the target PCA refitted to keep neighbours on this training preset's text",
    )
    add_ivf_args(parser)  # --seed: the first IVF seed
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--nprobe", type=int, default=5)
    parser.add_argument("--out", default="docs/results/target_space.json")
    args = parser.parse_args(argv)
    bundles = parse_bundles(args.bundles)
    faiss.omp_set_num_threads(args.threads)
    from export.runtime import Encoder

    data = load_quora_retrieval(args.quora_dir)
    main_teacher = teacher_vectors(args, data.corpus, [], [])  # unit rows already
    vectors = {f"{args.teacher} (the reference)": main_teacher}
    vectors |= target_spaces(args, data.corpus, main_teacher)
    for name, path in bundles.items():
        vectors[f"{name} ({args.variant})"] = Encoder(
            path, variant=args.variant, threads=args.threads
        ).encode(data.corpus, progress=name)
    seeds = list(range(args.seed, args.seed + args.seeds))
    found = {name: search_mrrs(v, data, args, seeds) for name, v in vectors.items()}
    reference_exact = found[f"{args.teacher} (the reference)"].exact
    target_ivf = found[target_pca_name(args)].ivf
    rows = {
        name: {"exact": r.exact, "ivf": r.ivf, "probed": r.probed}
        | vars(summarise(r.ivf, target_ivf))
        | pair_geometry(vectors[name], data, args.seed)
        for name, r in found.items()
    }
    result = {
        "corpus": len(data.corpus),
        "queries": len(data.queries),
        "nlist": args.nlist,
        "nprobe": args.nprobe,
        "seeds": seeds,
        "reference_exact": reference_exact,
        "pca_fit": args.pca_fit,
        "ensemble_teacher": args.ensemble_teacher or DEFAULT_ENSEMBLE,
        "bundles": bundles,
        "rows": rows,
        "run": run_info("bench/target_space.py", argv if argv is not None else sys.argv[1:]),
    }
    table = Table(title=f"Quora MRR@10, {len(data.corpus):,} documents, IVF{args.nlist} nprobe {args.nprobe}")
    columns = ("vectors", "exact", "% of ref.", "IVF mean (sd)", "% of ref.", "IVF - target PCA's")
    for col in (*columns, *GEOMETRY_COLUMNS):
        table.add_column(col, justify="left" if col == "vectors" else "right")
    for name, r in rows.items():
        table.add_row(
            name,
            f"{r['exact']:.2f}",
            f"{100 * r['exact'] / reference_exact:.2f}",
            f"{r['mean']:.2f} ({r['sd']:.2f})",
            f"{100 * r['mean'] / reference_exact:.2f}",
            f"{r['diff_mean']:+.2f}",
            *geometry_cells(r),
        )
    console = Console(width=None if sys.stdout.isatty() else 170)
    console.print(table)
    atomic_write_json(args.out, result)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
