"""Quora semantic retrieval, the HPD protocol (paper section 4.2, Table 3), in one run and one table.

Corpus: every distinct question of both Quora files; queries: question1 of each duplicate pair;
relevant: its question2. The query's own entry is removed from its results (it is in the corpus).
Rows: teacher 768-d and student 128-d, each exact (flat inner product) and IVF (nlist 1024,
nprobe 5, and the curve for --nprobes). Search time is the whole query set in one call, median
of --repeats, given per 1000 queries; index memory is the serialised Faiss index.

    python bench/quora_sr.py --bundle runs/bundles/hpd-mpnet \
        --teacher-vectors runs/gpu/quora_teacher.npy --out bench/results/quora_sr.json

Without --teacher-vectors the teacher (PyTorch, all-mpnet-base-v2) encodes the questions here
(about 17 minutes on 2 cores, once: they go through the teacher-target cache); with it, the file's
recorded corpus hash must match. ``--distractors N`` adds the first N Wikipedia sentences to the
corpus (the paper's corpus is ~400k Quora questions); their teacher vectors come from the same
cache, which the HPD CPU preset fills for N = 200000.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quora_data import QuoraRetrieval, add_distractors, load_quora_retrieval

from training.data.text import content_hash, read_sentences


def teacher_vectors(
    args: argparse.Namespace, questions: list[str], distractors: list[str], kept: list[int]
) -> np.ndarray:
    """Questions from --teacher-vectors or the teacher; distractors always through the target cache.

    Both go through ``Teacher.targets`` (the on-disk cache of ``distilembed train``), so the
    questions are encoded once per machine and the first 200k Wikipedia sentences share the HPD
    preset's cache (``distilembed targets ... --n-sentences 200000``)."""
    from training.teacher_targets import Teacher

    teacher = Teacher(args.teacher, batch_size=args.teacher_batch_size)
    if args.teacher_vectors:
        path = Path(args.teacher_vectors)
        meta = json.loads(path.with_suffix(".json").read_text())
        if meta["corpus_sha256"] != content_hash(questions):
            raise SystemExit(f"error: {path} was computed for another corpus")
        vectors = np.load(path).astype(np.float32)
    else:
        vectors = teacher.targets(questions)[0].astype(np.float32)
    if kept:
        extra = teacher.targets(distractors)[0][np.asarray(kept)].astype(np.float32)
        vectors = np.concatenate([vectors, extra])
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def student_vectors(args: argparse.Namespace, data: QuoraRetrieval) -> tuple[np.ndarray, float]:
    from export.runtime import Encoder

    encoder = Encoder(args.bundle, variant=args.variant, threads=args.threads)
    start = time.perf_counter()
    vectors = encoder.encode(data.corpus)
    return vectors, len(data.corpus) / (time.perf_counter() - start)


def make_index(vectors: np.ndarray, kind: str, nlist: int, seed: int, train_sample: int) -> faiss.Index:
    dim = vectors.shape[1]
    if kind == "exact":
        index: faiss.Index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        sample = np.random.default_rng(seed).permutation(len(vectors))[:train_sample]
        index.train(vectors[np.sort(sample)])
    index.add(vectors)
    return index


def raw_search(index: faiss.Index, queries: np.ndarray, k: int, nprobe: int) -> np.ndarray:
    params = faiss.SearchParametersIVF(nprobe=nprobe) if isinstance(index, faiss.IndexIVF) else None
    return index.search(queries, k, params=params)[1]


def drop_self(ids: np.ndarray, self_ids: np.ndarray, k: int) -> np.ndarray:
    """Top-k ids per query with the query's own corpus entry dropped (ids holds k + 1 per row)."""
    out = np.full((len(ids), k), -1, dtype=np.int64)
    for row, (hits, own) in enumerate(zip(ids, self_ids, strict=True)):
        kept = hits[hits != own][:k]
        out[row, : len(kept)] = kept
    return out


def retrieval_scores(ids: np.ndarray, relevant: np.ndarray) -> tuple[float, float]:
    hit = ids == relevant[:, None]
    ranks = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, 0)
    mrr = float(np.mean(np.where(ranks > 0, 1.0 / np.maximum(ranks, 1), 0.0)))
    return 100 * mrr, 100 * float(hit.any(axis=1).mean())


def overlap(ids: np.ndarray, exact: np.ndarray) -> float:
    """Recall of approximate top-k against exact top-k (fraction of exact neighbours found)."""
    found = sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(ids, exact, strict=True))
    return 100 * found / max(1, int((exact >= 0).sum()))


def timed_search(
    index: faiss.Index, queries: np.ndarray, own: np.ndarray, k: int, nprobe: int, repeats: int
) -> tuple[np.ndarray, float]:
    """Faiss's own search time only (k + 1 neighbours, one call for the whole query set)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ids = raw_search(index, queries, k + 1, nprobe)
        times.append(time.perf_counter() - start)
    return drop_self(ids, own, k), 1000 * statistics.median(times) / (len(queries) / 1000)


def evaluate_model(
    name: str, vectors: np.ndarray, data: QuoraRetrieval, args: argparse.Namespace
) -> list[dict]:
    queries_idx, relevant = np.asarray(data.queries), np.asarray(data.relevant)
    queries = np.ascontiguousarray(vectors[queries_idx])
    exact_index = make_index(vectors, "exact", args.nlist, args.seed, args.train_sample)
    exact_ids, exact_ms = timed_search(exact_index, queries, queries_idx, args.k, 1, args.repeats)
    mrr, recall = retrieval_scores(exact_ids, relevant)
    dim = vectors.shape[1]
    rows = [
        {
            "model": name,
            "dim": dim,
            "index": "exact",
            "nprobe": None,
            "mrr10": mrr,
            "recall10": recall,
            "ms_per_1000": exact_ms,
            "mb": faiss.serialize_index(exact_index).nbytes / 1e6,
            "vs_exact": 100.0,
        }
    ]
    ivf = make_index(vectors, "ivf", args.nlist, args.seed, args.train_sample)
    mb = faiss.serialize_index(ivf).nbytes / 1e6
    for nprobe in args.nprobes:
        ids, ms = timed_search(ivf, queries, queries_idx, args.k, nprobe, args.repeats)
        mrr, recall = retrieval_scores(ids, relevant)
        rows.append(
            {
                "model": name,
                "dim": dim,
                "index": f"IVF{args.nlist}",
                "nprobe": nprobe,
                "mrr10": mrr,
                "recall10": recall,
                "ms_per_1000": ms,
                "mb": mb,
                "vs_exact": overlap(ids, exact_ids),
            }
        )
    return rows


def verdict(rows: list[dict], nprobe: int) -> dict:
    def pick(model: str, index: str, probe: int | None) -> dict:
        return next(
            r for r in rows if r["model"] == model and r["index"].startswith(index) and r["nprobe"] == probe
        )

    teacher_exact, teacher_ivf = pick("teacher", "exact", None), pick("teacher", "IVF", nprobe)
    student_ivf = pick("student", "IVF", nprobe)
    return {
        "student_ivf_mrr_vs_teacher_exact_pct": 100 * student_ivf["mrr10"] / teacher_exact["mrr10"],
        "search_time_ratio_teacher_ivf_over_student_ivf": teacher_ivf["ms_per_1000"]
        / student_ivf["ms_per_1000"],
        "memory_ratio_teacher_ivf_over_student_ivf": teacher_ivf["mb"] / student_ivf["mb"],
    }


def main() -> None:
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quora-dir", default=f"{data_root}/quora")
    parser.add_argument("--bundle", required=True, help="Student bundle (export output).")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--teacher-vectors", help=".npy of teacher vectors (+ .json with corpus_sha256).")
    parser.add_argument("--teacher-batch-size", type=int, default=16, help="16 is fastest for mpnet on CPU")
    parser.add_argument(
        "--distractors", type=int, default=0, help="add the first N sentences of --distractor-corpus"
    )
    parser.add_argument(
        "--distractor-corpus", default=f"{data_root}/unlabeled/enwiki2015_1m_sentences.txt.gz"
    )
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument(
        "--train-sample", type=int, default=65_536, help="IVF training points (>= 39 x nlist)"
    )
    parser.add_argument("--nprobes", type=lambda s: [int(x) for x in s.split(",")], default=[5, 10, 20, 40])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/quora_sr.json")
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)

    questions = load_quora_retrieval(args.quora_dir)
    distractors = read_sentences(args.distractor_corpus, limit=args.distractors) if args.distractors else []
    data, kept = add_distractors(questions, distractors)
    student, docs_per_s = student_vectors(args, data)
    teacher = teacher_vectors(args, questions.corpus, distractors, kept)
    rows = evaluate_model("teacher", teacher, data, args) + evaluate_model("student", student, data, args)
    result = {
        "corpus": len(data.corpus),
        "distractors": {"asked": args.distractors, "added": len(kept), "from": args.distractor_corpus},
        "queries": len(data.queries),
        "corpus_sha256": data.corpus_sha256,
        "bundle": args.bundle,
        "variant": args.variant,
        "threads": args.threads,
        "student_encode_docs_per_s": docs_per_s,
        "rows": rows,
        "acceptance": verdict(rows, 5),
        "note": f"IVF{args.nlist} trained on {min(args.train_sample, len(data.corpus))} corpus vectors",
    }
    table = Table(title=f"Quora SR: {len(data.corpus)} documents, {len(data.queries)} queries")
    for col in ("model", "dim", "index", "nprobe", "MRR@10", "R@10", "ms/1000 q", "MB", "top-10 vs exact %"):
        table.add_column(col, justify="left" if col in ("model", "index") else "right")
    for r in rows:
        table.add_row(
            r["model"],
            str(r["dim"]),
            r["index"],
            str(r["nprobe"] or "-"),
            f"{r['mrr10']:.2f}",
            f"{r['recall10']:.2f}",
            f"{r['ms_per_1000']:.1f}",
            f"{r['mb']:.1f}",
            f"{r['vs_exact']:.1f}",
        )
    console = Console()
    console.print(table)
    console.print(result["acceptance"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
