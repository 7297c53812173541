"""Quora semantic retrieval, the HPD protocol (paper section 4.2, Table 3), in one run and one table.

Corpus: every distinct question of both Quora files; queries: question1 of each duplicate pair;
relevant: its question2. The query's own entry is removed from its results (it is in the corpus).
Rows: teacher 768-d and student 128-d, each exact (flat inner product) and IVF (nlist 1024,
nprobe 5, and the curve for --nprobes). Search time is Faiss's own, the whole query set in one
call, median of --repeats rounds that each run every row once (so machine drift hits teacher and
student alike), given per 1000 queries; the two nprobe-5 IVF rows are also timed on one thread
(the per-core cost). Index memory is the serialised Faiss index. ``--sq8`` adds an IVF row with
8-bit lists (``index build --storage sq8``) for each model, outside the acceptance figures.

    python bench/quora_sr.py --bundle runs/bundles/hpd-mpnet \
        --teacher-vectors runs/gpu/quora_teacher.npy --out docs/results/quora_sr.json

Without --teacher-vectors the teacher (PyTorch, all-mpnet-base-v2) encodes the questions here
(about 17 minutes on 2 cores, once: they go through the teacher-target cache); with it, the file's
recorded corpus hash must match. ``--distractors N`` adds the first N Wikipedia sentences to the
corpus (the paper's corpus is ~400k Quora questions); their teacher vectors come from the same
cache, which the HPD CPU preset fills for N = 200000.

Each run rewrites its block of docs/results.md (``quora-sr``, or ``quora-sr-dN`` with distractors;
--no-doc: not); ``--render-from JSON`` rewrites it from an earlier run's JSON, measuring nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    QuoraRetrieval,
    add_distractors,
    add_doc_args,
    fmt,
    interleaved_seconds,
    load_quora_retrieval,
    markdown_table,
    publish,
    publish_saved,
    run_info,
)

from index.vectors import new_ivf
from training.data.text import content_hash, read_sentences

DISTRACTOR_CHUNK = 100_000  # teacher-cache entries of distractors: whole slices, so runs share them


def read_distractors(path: str, n: int) -> tuple[list[str], list[str]]:
    """The first ``n`` sentences of ``path``, and the whole ``DISTRACTOR_CHUNK`` slices that hold
    them: pass the second to ``teacher_vectors`` so that runs of any ``n`` share the teacher cache."""
    if n <= 0:
        return [], []
    pool = read_sentences(path, limit=-(-n // DISTRACTOR_CHUNK) * DISTRACTOR_CHUNK)
    return pool[:n], pool


def teacher_vectors(
    args: argparse.Namespace, questions: list[str], distractors: list[str], kept: list[int]
) -> np.ndarray:
    """Questions from --teacher-vectors or the teacher; distractors always through the target cache.

    Both go through ``Teacher.targets`` (the on-disk cache of ``distilembed train``), so the
    questions are encoded once per machine. The cache is keyed by the whole list, so distractors go
    in slices of ``DISTRACTOR_CHUNK``: a run with 200k reuses the first 100k of a run with 100k."""
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
        chunks = [
            teacher.targets(distractors[start : start + DISTRACTOR_CHUNK])[0]
            for start in range(0, len(distractors), DISTRACTOR_CHUNK)
        ]
        extra = np.concatenate(chunks)[np.asarray(kept)].astype(np.float32)
        vectors = np.concatenate([vectors, extra])
    return unit_rows(vectors)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as a contiguous float32 array (what Faiss takes)."""
    rows = np.asarray(vectors, dtype=np.float32)
    return np.ascontiguousarray(rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12))


def student_vectors(args: argparse.Namespace, data: QuoraRetrieval) -> tuple[np.ndarray, float]:
    from export.runtime import Encoder

    encoder = Encoder(args.bundle, variant=args.variant, threads=args.threads)
    start = time.perf_counter()
    vectors = encoder.encode(data.corpus, progress="student")
    return vectors, len(data.corpus) / (time.perf_counter() - start)


def make_index(
    vectors: np.ndarray, storage: str | None, nlist: int, seed: int, train_sample: int, niter: int = 10
) -> faiss.Index:
    """Exact search (``storage`` None) or IVF with float32 / sq8 lists, as ``index build`` makes them
    (k-means at Faiss's ``niter`` for IVF, 10, unless told otherwise)."""
    dim = vectors.shape[1]
    if storage is None:
        index: faiss.Index = faiss.IndexFlatIP(dim)
    else:
        index = new_ivf(dim, nlist, storage)
        index.cp.seed = seed
        index.cp.niter = niter
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


def mrr10(ids: np.ndarray, data: QuoraRetrieval) -> float:
    """MRR@10 of search results holding 11 ids per query, the query's own entry dropped."""
    return retrieval_scores(drop_self(ids, np.asarray(data.queries), 10), np.asarray(data.relevant))[0]


def overlap(ids: np.ndarray, exact: np.ndarray) -> float:
    """Recall of approximate top-k against exact top-k (fraction of exact neighbours found)."""
    found = sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(ids, exact, strict=True))
    return 100 * found / max(1, int((exact >= 0).sum()))


@dataclass
class SearchSpec:
    """One row of the table before it is timed: which index, which query vectors, which nprobe."""

    model: str
    index: faiss.Index
    name: str
    nprobe: int | None
    queries: np.ndarray

    def search(self, k: int) -> np.ndarray:
        return raw_search(self.index, self.queries, k, self.nprobe or 1)


def search_specs(
    name: str, vectors: np.ndarray, data: QuoraRetrieval, args: argparse.Namespace
) -> list[SearchSpec]:
    queries = np.ascontiguousarray(vectors[np.asarray(data.queries)])
    exact = make_index(vectors, None, args.nlist, args.seed, args.train_sample)
    ivf = make_index(vectors, "float32", args.nlist, args.seed, args.train_sample, args.kmeans_niter)
    specs = [SearchSpec(name, exact, "exact", None, queries)] + [
        SearchSpec(name, ivf, f"IVF{args.nlist}", nprobe, queries) for nprobe in args.nprobes
    ]
    if args.sq8:
        sq8 = make_index(vectors, "sq8", args.nlist, args.seed, args.train_sample, args.kmeans_niter)
        specs.append(SearchSpec(name, sq8, f"IVF{args.nlist},SQ8", 5, queries))
    return specs


def interleaved_times(specs: list[SearchSpec], k: int, rounds: int) -> list[list[float]]:
    """Seconds per search, ``rounds`` per spec, interleaved. Run after ``result_ids``, which leaves
    every index warm (pages touched, lists in cache)."""
    calls = {str(i): partial(spec.search, k + 1) for i, spec in enumerate(specs)}
    return list(interleaved_seconds(calls, rounds).values())


def result_ids(specs: list[SearchSpec], own: np.ndarray, k: int) -> list[np.ndarray]:
    return [drop_self(spec.search(k + 1), own, k) for spec in specs]


def table_rows(
    specs: list[SearchSpec], ids: list[np.ndarray], times: list[list[float]], relevant: np.ndarray
) -> list[dict]:
    rows, exact_ids = [], {}
    indexes = {id(s.index): s.index for s in specs}  # the IVF rows share one index: serialise it once
    mb = {key: faiss.serialize_index(index).nbytes / 1e6 for key, index in indexes.items()}
    for spec, found, spent in zip(specs, ids, times, strict=True):
        exact_ids.setdefault(spec.model, found)  # each model's exact spec comes first
        mrr, recall = retrieval_scores(found, relevant)
        per_1000 = len(spec.queries) / 1000
        rows.append(
            {
                "model": spec.model,
                "dim": spec.index.d,
                "index": spec.name,
                "nprobe": spec.nprobe,
                "mrr10": mrr,
                "recall10": recall,
                "ms_per_1000": 1000 * statistics.median(spent) / per_1000,
                "ms_per_1000_min": 1000 * min(spent) / per_1000,
                "mb": mb[id(spec.index)],
                "vs_exact": overlap(found, exact_ids[spec.model]),
            }
        )
    return rows


def find_row(rows: list[dict], model: str, index: str, nprobe: int | None) -> int:
    """Position of the row (and of its spec: the two lists are parallel)."""
    return next(
        i for i, r in enumerate(rows) if (r["model"], r["index"], r["nprobe"]) == (model, index, nprobe)
    )


def verdict(rows: list[dict], times: list[list[float]], nprobe: int, ivf: str = "IVF1024") -> dict:
    """The acceptance figures: the float32 IVF rows (``ivf``) at ``nprobe``, both models."""
    teacher_ivf = find_row(rows, "teacher", ivf, nprobe)
    student_ivf = find_row(rows, "student", ivf, nprobe)
    teacher_exact = rows[find_row(rows, "teacher", "exact", None)]
    t_ivf, s_ivf = rows[teacher_ivf], rows[student_ivf]
    per_round = [t / s for t, s in zip(times[teacher_ivf], times[student_ivf], strict=True)]
    return {
        "student_ivf_mrr_vs_teacher_exact_pct": 100 * s_ivf["mrr10"] / teacher_exact["mrr10"],
        "search_time_ratio_teacher_ivf_over_student_ivf": t_ivf["ms_per_1000"] / s_ivf["ms_per_1000"],
        "search_time_ratio_per_round": [round(r, 3) for r in per_round],
        "search_time_ratio_of_fastest_rounds": t_ivf["ms_per_1000_min"] / s_ivf["ms_per_1000_min"],
        "memory_ratio_teacher_ivf_over_student_ivf": t_ivf["mb"] / s_ivf["mb"],
    }


def one_thread_ratio(pair: list[SearchSpec], k: int, rounds: int) -> dict:
    """The teacher's and the student's IVF search (``pair``) timed again on one thread: the per-core
    cost, without OpenMP's scaling (the student's short search scales worse than the teacher's)."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        teacher, student = (statistics.median(t) for t in interleaved_times(pair, k, rounds))
    finally:
        faiss.omp_set_num_threads(threads)
    ms = 1e6 / len(pair[0].queries)  # seconds per search -> ms per 1000 queries
    return {
        "search_time_ratio_one_thread": teacher / student,
        "ms_per_1000_one_thread": {"teacher": teacher * ms, "student": student * ms},
    }


def add_model_args(
    parser: argparse.ArgumentParser, data_root: str, bundle_required: bool = True, one_bundle: bool = True
) -> None:
    """The Quora data, the student bundle (``one_bundle``) and the teacher: shared with
    bench/ivf_width.py and bench/ivf_seeds.py (which takes several bundles)."""
    parser.add_argument("--quora-dir", default=f"{data_root}/quora")
    if one_bundle:
        parser.add_argument("--bundle", required=bundle_required, help="Student bundle (export output).")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--teacher-vectors", help=".npy of teacher vectors (+ .json with corpus_sha256).")
    parser.add_argument("--teacher-batch-size", type=int, default=16, help="16 is fastest for mpnet on CPU")


def add_ivf_args(parser: argparse.ArgumentParser) -> None:
    """IVF shape, threads and seed: shared with bench/ivf_width.py."""
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument(
        "--train-sample", type=int, default=65_536, help="IVF training points (>= 39 x nlist)"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kmeans-niter", type=int, default=10, help="k-means iterations (Faiss's for IVF, as index build)"
    )


def block_name(result: dict[str, Any]) -> str:
    added = result["distractors"]["added"]
    return f"quora-sr-d{result['distractors']['asked']}" if added else "quora-sr"


def render(result: dict[str, Any]) -> str:
    """One line per index (teacher and student side by side), then the nprobe-5 acceptance figures."""
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    by_index: dict[tuple[str, int | None], dict[str, dict]] = {}
    for r in result["rows"]:
        by_index.setdefault((r["index"], r["nprobe"]), {})[r["model"]] = r
    cells = (("mrr10", ".2f"), ("ms_per_1000", ",.1f"), ("mb", ",.1f"), ("vs_exact", ".1f"))
    rows = [
        [index, nprobe or "", *(fmt(at[m][k], f) if m in at else "-" for m in models for k, f in cells)]
        for (index, nprobe), at in by_index.items()
    ]
    dims = {r["model"]: r["dim"] for r in result["rows"]}
    header = ["index", "nprobe"]
    for m in models:
        header += [f"{m} {dims[m]}-d MRR@10", "ms / 1000 q", "MB", "top-10 vs exact %"]
    added = result["distractors"]["added"]
    corpus = f"{result['corpus']:,} documents" + (f" ({added:,} Wikipedia distractors)" if added else "")
    setup = (
        f"{corpus}, {result['queries']:,} queries; student `{result['bundle']}` {result['variant']}, "
        f"{result['threads']} threads; {result['note']}."
    )
    a, threads = result["acceptance"], result["threads"]
    ratio = a["search_time_ratio_teacher_ivf_over_student_ivf"]
    time = f"**{ratio:.2f}x** its search time on {threads} threads"
    if rounds := a.get("search_time_ratio_per_round"):
        time += f" (rounds {min(rounds):.2f}-{max(rounds):.2f})"
    if one := a.get("search_time_ratio_one_thread"):
        time += f" and **{one:.2f}x** on one thread"
    mrr, memory = a["student_ivf_mrr_vs_teacher_exact_pct"], a["memory_ratio_teacher_ivf_over_student_ivf"]
    verdict_line = (
        f"Student IVF at nprobe 5: MRR@10 **{mrr:.1f}%** of the teacher's exact search; the teacher's IVF "
        f"at nprobe 5 takes **{memory:.1f}x** its memory and {time}."
    )
    return f"{setup}\n\n{markdown_table(header, rows, 'lr' + 'r' * (len(header) - 2))}\n\n{verdict_line}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(parser, data_root, bundle_required=False)
    parser.add_argument(
        "--distractors", type=int, default=0, help="add the first N sentences of --distractor-corpus"
    )
    parser.add_argument(
        "--distractor-corpus", default=f"{data_root}/unlabeled/enwiki2015_1m_sentences.txt.gz"
    )
    add_ivf_args(parser)
    parser.add_argument("--nprobes", type=lambda s: [int(x) for x in s.split(",")], default=[5, 10, 20, 40])
    parser.add_argument(
        "--sq8", action="store_true", help="also time IVF with 8-bit lists (index build --storage sq8)"
    )
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7, help="timing rounds (median reported)")
    parser.add_argument("--out", default="docs/results/quora_sr.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, block_name, render):
        return
    if not args.bundle:
        parser.error("--bundle is required")
    faiss.omp_set_num_threads(args.threads)

    questions = load_quora_retrieval(args.quora_dir)
    distractors, pool = read_distractors(args.distractor_corpus, args.distractors)
    data, kept = add_distractors(questions, distractors)
    student, docs_per_s = student_vectors(args, data)
    teacher = teacher_vectors(args, questions.corpus, pool, kept)
    specs = search_specs("teacher", teacher, data, args) + search_specs("student", student, data, args)
    ids = result_ids(specs, np.asarray(data.queries), args.k)
    times = interleaved_times(specs, args.k, args.repeats)
    rows = table_rows(specs, ids, times, np.asarray(data.relevant))
    ivf = f"IVF{args.nlist}"
    ivf5 = [specs[find_row(rows, model, ivf, 5)] for model in ("teacher", "student")]
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
        "acceptance": verdict(rows, times, 5, ivf) | one_thread_ratio(ivf5, args.k, args.repeats),
        "note": f"IVF{args.nlist} trained on {min(args.train_sample, len(data.corpus))} corpus vectors",
        "run": run_info("bench/quora_sr.py", argv),
    }
    table = Table(title=f"Quora SR: {len(data.corpus)} documents, {len(data.queries)} queries")
    for col in ("model", "dim", "index", "nprobe", "MRR@10", "R@10", "ms/1000 q", "MB", "top-10 vs exact %"):
        table.add_column(col, justify="left" if col in ("model", "index") else "right", no_wrap=True)
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
    console = Console(width=None if sys.stdout.isatty() else 160)  # a log file: no truncated columns
    console.print(table)
    console.print(result["acceptance"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    publish(args, result, Path(args.out), block_name(result), render)


if __name__ == "__main__":
    main()
