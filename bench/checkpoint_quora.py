"""Training checkpoints before export: STS-B dev / test and Quora MRR@10 in PyTorch float32.

Comparing two recipes through their int8 bundles mixes in the quantisation's own draw, which moves
IVF MRR@10 by about 0.2 (docs/results.md, "More tries at the Quora target"). This scores the
checkpoints as training wrote them: STS-B dev and test (Spearman x 100), Quora exact MRR@10 and IVF
at ``--nprobe`` over ``--seeds`` k-means seeds (``bench/ivf_seeds.py``'s search, with the share of
queries whose duplicate's list is probed), the mean cosine of a query with its duplicate and with a
random other question (``bench/target_space.py``'s), and each checkpoint's paired IVF difference to
the first one. ``--body`` adds, for each checkpoint, a row for its pooled encoder output (the input
of its Dense head, all-MiniLM-L6-v2's 384 dimensions): what the 128-d head keeps of it. ``--width``
scores each checkpoint's output cut to its first N dimensions (a Matryoshka student's prefix).

    python bench/checkpoint_quora.py --checkpoint base=runs/ens04r --checkpoint new=runs/ens04-hpdgen \
        --out docs/results/checkpoint_quora.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import QuoraRetrieval, load_quora_retrieval, named_path, run_info
from ivf_seeds import parse_bundles, search_mrrs, summarise
from quora_sr import add_ivf_args
from target_space import GEOMETRY_COLUMNS, geometry_cells, pair_geometry

from distilembed.artifacts import atomic_write_json
from training.data.sts import STSPair, load_stsb_split
from training.evaluation import evaluate_model_pairs

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense


BODY_SUFFIX = " (body)"


def dense_head(model: SentenceTransformer) -> Dense:
    """``model``'s first Dense layer: the head that reads its pooled encoder output."""
    from training.student import models  # sentence-transformers' modules, under either path

    head = next((module for module in model if isinstance(module, models.Dense)), None)
    if head is None:
        raise SystemExit("--body: a checkpoint has no Dense head to take off")
    return head


def without_head(model: SentenceTransformer) -> SentenceTransformer:
    """The modules before ``model``'s first Dense layer: the pooled encoder output its head reads."""
    from sentence_transformers import SentenceTransformer

    modules = list(model)
    return SentenceTransformer(modules=modules[: modules.index(dense_head(model))], device="cpu")


def score_checkpoint(
    path: str,
    data: QuoraRetrieval,
    sts: dict[str, list[STSPair]],
    args: argparse.Namespace,
    seeds: list[int],
    body: bool = False,
) -> dict[str, Any]:
    """STS-B per split, and Quora by exact search, IVF over ``seeds`` and the pair cosines; of the
    checkpoint's output (its first ``args.width`` dimensions where set), or with ``body`` of its
    output before the Dense head."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu", truncate_dim=None if body else args.width)
    if body:
        model = without_head(model)
    scores = {split: evaluate_model_pairs(model, pairs, args.batch_size) for split, pairs in sts.items()}
    vectors = model.encode(
        data.corpus, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True
    ).astype(np.float32)
    found = search_mrrs(vectors, data, args, seeds)
    return {"sts": scores, "exact": found.exact, "ivf": found.ivf, "probed": found.probed} | pair_geometry(
        vectors, data, args.seed
    )


def add_scoring_args(parser: argparse.ArgumentParser, data_root: str) -> None:
    """Where STS-B and Quora are, and the IVF searched over ``--seeds`` (shared with head_refit.py)."""
    parser.add_argument("--quora-dir", default=f"{data_root}/quora")
    parser.add_argument("--sts-dir", default=f"{data_root}/sts/stsbenchmark")
    add_ivf_args(parser)  # --seed: the first of the seeds
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--nprobe", type=int, default=5)


def main(argv: list[str] | None = None) -> None:
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", dest="checkpoints", action="append", type=named_path, required=True, help="NAME=DIR"
    )
    add_scoring_args(parser, data_root)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--body", action="store_true", help="also each checkpoint's pooled output before its Dense head"
    )
    parser.add_argument(
        "--width", type=int, help="score each checkpoint's output cut to its first N dimensions (Matryoshka)"
    )
    parser.add_argument("--out", default="docs/results/checkpoint_quora.json")
    args = parser.parse_args(argv)
    checkpoints = parse_bundles(args.checkpoints)
    faiss.omp_set_num_threads(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    data = load_quora_retrieval(args.quora_dir)
    sts = {split: load_stsb_split(args.sts_dir, split) for split in ("dev", "test")}
    seeds = list(range(args.seed, args.seed + args.seeds))
    found = {}
    for name, path in checkpoints.items():
        found[name] = score_checkpoint(path, data, sts, args, seeds)
        if args.body:
            found[name + BODY_SUFFIX] = score_checkpoint(path, data, sts, args, seeds, body=True)
    reference = found[next(iter(checkpoints))]["ivf"]
    rows = {name: r | vars(summarise(r["ivf"], reference)) for name, r in found.items()}
    result = {
        "corpus": len(data.corpus),
        "queries": len(data.queries),
        "nlist": args.nlist,
        "nprobe": args.nprobe,
        "seeds": seeds,
        "checkpoints": checkpoints,
        "body": args.body,
        "width": args.width,
        "rows": rows,
        "run": run_info("bench/checkpoint_quora.py", argv if argv is not None else sys.argv[1:]),
    }
    table = Table(
        title=f"PyTorch float32; Quora MRR@10, IVF{args.nlist} nprobe {args.nprobe}, {len(seeds)} seeds"
    )
    columns = ("checkpoint", "STS-B dev", "STS-B test", "exact", "IVF mean (sd)", "paired diff (sd)")
    for col in (*columns, *GEOMETRY_COLUMNS):
        table.add_column(col, justify="left" if col == "checkpoint" else "right")
    for name, r in rows.items():
        table.add_row(
            name,
            f"{r['sts']['dev']:.2f}",
            f"{r['sts']['test']:.2f}",
            f"{r['exact']:.2f}",
            f"{r['mean']:.2f} ({r['sd']:.2f})",
            f"{r['diff_mean']:+.2f} ({r['diff_sd']:.2f})",
            *geometry_cells(r),
        )
    console = Console(width=None if sys.stdout.isatty() else 170)
    console.print(table)
    atomic_write_json(args.out, result)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
