"""Is it the sign bits or the binary lists? Quora MRR@10 of four binary codes of one student, each
searched exhaustively (flat Hamming, no IVF) and then with its top ``--rescore-k`` rescored exactly.

    python bench/binary_codes.py --bundle models/default --out docs/results/binary_codes.json

Codes: the sign bits of the vectors as they are (what ``encoding_format: binary`` and ``--storage
binary`` use), of the vectors centred on the corpus mean, of the centred vectors under a random
rotation, and under ITQ's learned rotation (Gong and Lazebnik, 2011: alternate the nearest codes
and the orthogonal Procrustes rotation that maps the data onto them). A flat search has no lists,
so the gap between its rescored MRR and bench/compression.py's binary+rescore row is what the IVF
lists lose, and the gap between codes is what a better code could win. MRR only, no timing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import load_quora_retrieval, run_info
from quora_sr import add_ivf_args, add_model_args, make_index, mrr10, raw_search, student_vectors


def itq_rotation(centred: np.ndarray, iterations: int, seed: int) -> np.ndarray:
    """ITQ's rotation R (d x d, orthogonal) minimising ||sign(XR) - XR||: alternate B = sign(XR)
    and R = U V^T from the SVD of X^T B (orthogonal Procrustes)."""
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.standard_normal((centred.shape[1],) * 2))[0]
    for _ in range(iterations):
        codes = np.where(centred @ rotation >= 0, 1.0, -1.0)
        u, _, vt = np.linalg.svd(centred.T @ codes)
        rotation = u @ vt
    return rotation.astype(np.float32)


def code_variants(vectors: np.ndarray, iterations: int, seed: int) -> dict[str, np.ndarray]:
    """The float vectors whose sign bits each code keeps."""
    centred = vectors - vectors.mean(axis=0)
    random = np.linalg.qr(np.random.default_rng(seed + 1).standard_normal((vectors.shape[1],) * 2))[0]
    return {
        "sign(x)": vectors,
        "sign(x - mean)": centred,
        "sign((x - mean) R), R random": centred @ random.astype(np.float32),
        "sign((x - mean) R), R by ITQ": centred @ itq_rotation(centred, iterations, seed),
    }


def flat_hamming(bits: np.ndarray) -> faiss.IndexBinaryFlat:
    index = faiss.IndexBinaryFlat(bits.shape[1] * 8)
    index.add(bits)
    return index


def rescored(vectors: np.ndarray, queries: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    scores = np.einsum("qd,qkd->qk", vectors[queries], vectors[candidates])
    return np.take_along_axis(candidates, np.argsort(-scores, axis=1, kind="stable")[:, :k], axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser, os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data"))
    add_ivf_args(parser)
    parser.add_argument("--rescore-k", type=int, default=50)
    parser.add_argument("--itq-iterations", type=int, default=50)
    parser.add_argument("--out", default="docs/results/binary_codes.json")
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)

    data = load_quora_retrieval(args.quora_dir)
    queries = np.asarray(data.queries)
    vectors = np.ascontiguousarray(student_vectors(args, data)[0], dtype=np.float32)

    exact = make_index(vectors, None, args.nlist, args.seed, args.train_sample)
    rows = {
        "float32 exact": {
            "hamming": None,
            "rescored": mrr10(raw_search(exact, vectors[queries], 11, 1), data),
        }
    }
    for name, projected in code_variants(vectors, args.itq_iterations, args.seed).items():
        bits = np.packbits(projected > 0, axis=1)
        index = flat_hamming(bits)
        candidates = index.search(bits[queries], args.rescore_k + 1)[1]
        rows[name] = {
            "hamming": mrr10(index.search(bits[queries], 11)[1], data),
            "rescored": mrr10(rescored(vectors, queries, candidates, 11), data),
        }

    table = Table(title=f"Quora, {len(data.corpus):,} documents, flat search, rescore_k {args.rescore_k}")
    for column in ("code", "MRR@10, Hamming", f"MRR@10, top-{args.rescore_k} rescored"):
        table.add_column(column, justify="left" if column == "code" else "right")
    for name, row in rows.items():
        hamming = "-" if row["hamming"] is None else f"{row['hamming']:.2f}"
        table.add_row(name, hamming, f"{row['rescored']:.2f}")
    Console().print(table)
    result = {
        **run_info("bench/binary_codes.py", sys.argv[1:]),
        "bundle": args.bundle,
        "documents": len(data.corpus),
        "queries": len(queries),
        "rescore_k": args.rescore_k,
        "mrr10": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
