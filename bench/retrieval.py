"""Quora semantic retrieval (the HPD protocol, paper section 4.2), and students compared over IVF seeds.

Corpus: every distinct Quora question, then --distractors Wikipedia sentences; queries: question1 of
each duplicate pair, relevant: its question2 (the query itself dropped from its results). The teacher
encodes through the teacher-target cache, once per machine.

``sr``: teacher and student, exact and IVF (nlist 1024, --nprobes; --sq8: 8-bit lists): MRR@10,
search time per 1000 queries (median of interleaved rounds), index size, top-10 overlap with exact
search, and the acceptance figures at nprobe 5. Block ``quora-sr`` (``quora-sr-dN``, N distractors):

    python bench/retrieval.py sr --bundle models/default [--distractors 46000] [--sq8]

``seeds``: students whose exact search ties can differ at IVF nprobe 5 by where k-means put the
cells, so each bundle's IVF is trained at --seeds seeds: exact MRR@10, IVF MRR@10 over the seeds
and the paired difference to the first bundle. JSON only (docs/results/ivf_seeds.json):

    python bench/retrieval.py seeds --bundle default=models/default --bundle new=runs/bundles/new

``sr --render-from JSON`` rewrites the block from an earlier run's JSON, measuring nothing.
"""

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import faiss
import harness as h
import numpy as np

from export.runtime import Encoder
from index.vectors import new_ivf


def make_index(vectors: np.ndarray, storage: str | None, args: argparse.Namespace, seed: int) -> faiss.Index:
    """Exact search (``storage`` None) or IVF with float32 / sq8 lists as ``index build`` makes
    them: k-means (--kmeans-niter iterations) on --train-sample vectors drawn with ``seed``."""
    if storage is None:
        index: faiss.Index = faiss.IndexFlatIP(vectors.shape[1])
    else:
        index = new_ivf(vectors.shape[1], args.nlist, storage)
        index.cp.seed, index.cp.niter = seed, args.kmeans_niter
        sample = np.sort(np.random.default_rng(seed).permutation(len(vectors))[: args.train_sample])
        index.train(vectors[sample])
    index.add(vectors)
    return index


def raw_search(index: faiss.Index, queries: np.ndarray, k: int, nprobe: int) -> np.ndarray:
    params = faiss.SearchParametersIVF(nprobe=nprobe) if isinstance(index, faiss.IndexIVF) else None
    return index.search(queries, k, params=params)[1]


def mrr10(ids: np.ndarray, data: h.QuoraRetrieval) -> float:
    """MRR@10 of search results holding 11 ids per query, the query's own entry dropped."""
    return h.retrieval_scores(h.drop_self(ids, np.asarray(data.queries), 10), np.asarray(data.relevant))[0]


@dataclass
class Spec:
    """One row of the table before it is timed: which model, index, nprobe and query vectors."""

    model: str
    index: faiss.Index
    name: str
    nprobe: int | None
    queries: np.ndarray

    def search(self, k: int) -> np.ndarray:
        return raw_search(self.index, self.queries, k, self.nprobe or 1)


def specs_of(model: str, vectors: np.ndarray, data: h.QuoraRetrieval, args: argparse.Namespace) -> list[Spec]:
    queries, ivf = vectors[np.asarray(data.queries)], f"IVF{args.nlist}"
    specs = [Spec(model, make_index(vectors, None, args, args.seed), "exact", None, queries)]
    lists = make_index(vectors, "float32", args, args.seed)
    specs += [Spec(model, lists, ivf, nprobe, queries) for nprobe in args.nprobes]
    if args.sq8:
        specs.append(Spec(model, make_index(vectors, "sq8", args, args.seed), f"{ivf},SQ8", 5, queries))
    return specs


def table_rows(specs: list[Spec], times: list[list[float]], data: h.QuoraRetrieval, k: int) -> list[h.Result]:
    rows: list[h.Result] = []
    exact: dict[str, np.ndarray] = {}
    size = {id(s.index): faiss.serialize_index(s.index).nbytes / 1e6 for s in specs}  # IVF rows share one
    for spec, spent in zip(specs, times, strict=True):
        found = h.drop_self(spec.search(k + 1), np.asarray(data.queries), k)
        truth = exact.setdefault(spec.model, found)  # each model's exact spec comes first
        hits = sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(found, truth, strict=True))
        mrr, recall = h.retrieval_scores(found, np.asarray(data.relevant))
        ms = [1e6 * s / len(spec.queries) for s in spent]  # per 1000 queries
        row = {"model": spec.model, "dim": spec.index.d, "index": spec.name, "nprobe": spec.nprobe}
        row |= {"mrr10": mrr, "recall10": recall, "ms_per_1000": statistics.median(ms)}
        row |= {"ms_per_1000_min": min(ms), "mb": size[id(spec.index)]}
        rows.append(row | {"vs_exact": 100 * hits / max(1, int((truth >= 0).sum()))})
    return rows


def find_row(rows: list[h.Result], model: str, index: str, nprobe: int | None) -> int:
    """Position of the row (and of its spec: the two lists are parallel)."""
    key = (model, index, nprobe)
    return next(i for i, r in enumerate(rows) if (r["model"], r["index"], r["nprobe"]) == key)


def verdict(rows: list[h.Result], times: list[list[float]], nprobe: int, ivf: str = "IVF1024") -> h.Result:
    """The acceptance figures: the float32 IVF rows (``ivf``) at ``nprobe``, both models."""
    teacher, student = find_row(rows, "teacher", ivf, nprobe), find_row(rows, "student", ivf, nprobe)
    t, s, exact = rows[teacher], rows[student], rows[find_row(rows, "teacher", "exact", None)]
    per_round = [a / b for a, b in zip(times[teacher], times[student], strict=True)]
    return {
        "student_ivf_mrr_vs_teacher_exact_pct": 100 * s["mrr10"] / exact["mrr10"],
        "search_time_ratio_teacher_ivf_over_student_ivf": t["ms_per_1000"] / s["ms_per_1000"],
        "search_time_ratio_per_round": [round(r, 3) for r in per_round],
        "search_time_ratio_of_fastest_rounds": t["ms_per_1000_min"] / s["ms_per_1000_min"],
        "memory_ratio_teacher_ivf_over_student_ivf": t["mb"] / s["mb"],
    }


def block_name(result: h.Result) -> str:
    return f"quora-sr-d{result['distractors']['asked']}" if result["distractors"]["added"] else "quora-sr"


def render(result: h.Result) -> str:
    """One line per index (teacher and student side by side), then the nprobe-5 acceptance figures."""
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    by_index: dict[tuple[str, int | None], dict[str, h.Result]] = {}
    for r in result["rows"]:
        by_index.setdefault((r["index"], r["nprobe"]), {})[r["model"]] = r
    cells = (("mrr10", ".2f"), ("ms_per_1000", ",.1f"), ("mb", ",.1f"), ("vs_exact", ".1f"))
    rows = [
        [index, nprobe or "", *(h.fmt(at[m][k], f) if m in at else "-" for m in models for k, f in cells)]
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
    a = result["acceptance"]
    ratio, threads = a["search_time_ratio_teacher_ivf_over_student_ivf"], result["threads"]
    spent = f"**{ratio:.2f}x** its search time on {threads} threads"
    if rounds := a.get("search_time_ratio_per_round"):
        spent += f" (rounds {min(rounds):.2f}-{max(rounds):.2f})"
    if one := a.get("search_time_ratio_one_thread"):
        spent += f" and **{one:.2f}x** on one thread"
    mrr, memory = a["student_ivf_mrr_vs_teacher_exact_pct"], a["memory_ratio_teacher_ivf_over_student_ivf"]
    line = (
        f"Student IVF at nprobe 5: MRR@10 **{mrr:.1f}%** of the teacher's exact search; the teacher's IVF "
        f"at nprobe 5 takes **{memory:.1f}x** its memory and {spent}."
    )
    return f"{setup}\n\n{h.markdown_table(header, rows, 'lr' + 'r' * (len(header) - 2))}\n\n{line}"


def sr(args: argparse.Namespace, argv: list[str]) -> None:
    encoder = Encoder(args.bundle, variant=args.variant, threads=args.threads)
    questions, data, teacher = h.quora_corpus(args)
    student = encoder.encode(data.corpus, progress="student")
    specs = specs_of("teacher", teacher, data, args) + specs_of("student", student, data, args)
    for spec in specs:
        spec.search(11)  # warm: pages touched, lists in cache
    calls = {str(i): partial(spec.search, 11) for i, spec in enumerate(specs)}
    times = list(h.interleaved_seconds(calls, args.repeats).values())
    rows, ivf = table_rows(specs, times, data, 10), f"IVF{args.nlist}"
    added, wiki = len(data.corpus) - len(questions.corpus), str(Path(args.data_dir) / h.WIKIPEDIA)
    distractors = {"asked": args.distractors, "added": added, "from": wiki}
    result = {"corpus": len(data.corpus), "distractors": distractors, "queries": len(data.queries)}
    result |= {"bundle": args.bundle, "variant": args.variant, "threads": args.threads, "rows": rows}
    result["acceptance"] = verdict(rows, times, 5, ivf)
    result["note"] = f"IVF{args.nlist} trained on {min(args.train_sample, len(data.corpus))} corpus vectors"
    result["run"] = h.run_info("bench/retrieval.py", argv)
    h.finish(args, result, block_name(result), render)


def summarise(values: list[float], reference: list[float]) -> dict[str, float]:
    """Mean, sd, range of one MRR@10 per seed; mean, sd of the seed-by-seed difference to ``reference``."""
    if len(values) != len(reference) or not values:
        raise ValueError("one value per seed for both bundles")
    diffs = [v - r for v, r in zip(values, reference, strict=True)]
    sd = statistics.stdev if len(values) > 1 else (lambda _: 0.0)
    spread = {"mean": statistics.fmean(values), "sd": sd(values), "low": min(values), "high": max(values)}
    return spread | {"diff_mean": statistics.fmean(diffs), "diff_sd": sd(diffs)}


def seed_mrrs(
    vectors: np.ndarray, data: h.QuoraRetrieval, args: argparse.Namespace, seeds: range
) -> h.Result:
    """MRR@10 of exact search, and of IVF at --nprobe trained at each of ``seeds``."""
    queries = np.ascontiguousarray(vectors[np.asarray(data.queries)])
    exact = mrr10(raw_search(make_index(vectors, None, args, 0), queries, 11, 1), data)
    ivfs = (make_index(vectors, "float32", args, seed) for seed in seeds)
    return {"exact": exact, "ivf": [mrr10(raw_search(i, queries, 11, args.nprobe), data) for i in ivfs]}


def seeds(args: argparse.Namespace, argv: list[str]) -> None:
    bundles = h.named_bundles(args.bundle)
    questions, data, teacher = h.quora_corpus(args)
    trainings = range(args.seed, args.seed + args.seeds)
    rows = {}
    for name, path in bundles.items():
        vectors = Encoder(path, args.variant, threads=args.threads).encode(data.corpus, progress=name)
        rows[name] = seed_mrrs(vectors, data, args, trainings)
    teacher_exact = seed_mrrs(teacher, data, args, range(0))["exact"]
    reference = rows[next(iter(bundles))]["ivf"]
    rows = {name: row | summarise(row["ivf"], reference) for name, row in rows.items()}
    added = len(data.corpus) - len(questions.corpus)
    result = {"corpus": len(data.corpus), "distractors": {"asked": args.distractors, "added": added}}
    result |= {"queries": len(data.queries), "nlist": args.nlist, "nprobe": args.nprobe}
    result |= {"kmeans_niter": args.kmeans_niter, "seeds": list(trainings), "teacher_exact": teacher_exact}
    result |= {"bundles": bundles, "variant": args.variant, "rows": rows}
    h.write_json(args.out, result | {"run": h.run_info("bench/retrieval.py", argv)})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    h.add_quora_args(common, distractors=0)
    common.add_argument("--variant", default="int8", choices=("int8", "fp32"), help="of the student bundles")
    common.add_argument("--nlist", type=int, default=1024)
    common.add_argument("--train-sample", type=int, default=65_536, help="IVF training points")
    common.add_argument("--kmeans-niter", type=int, default=10, help="as index build (Faiss's IVF default)")
    common.add_argument("--seed", type=int, default=0, help="the IVF's sample and k-means (seeds: the first)")
    common.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("sr", parents=[common], help="teacher and student, exact and IVF")
    one.add_argument("--bundle", help="student bundle (required unless --render-from)")
    one.add_argument("--nprobes", type=lambda s: [int(x) for x in s.split(",")], default=[5, 10, 20, 40])
    one.add_argument("--sq8", action="store_true", help="also IVF with 8-bit lists (--storage sq8)")
    one.add_argument("--repeats", type=int, default=7, help="timing rounds (median reported)")
    one.add_argument("--out", type=Path, default=h.RESULTS / "quora_sr.json")
    h.add_doc_args(one)
    many = commands.add_parser("seeds", parents=[common], help="bundles' IVF MRR@10 over k-means seeds")
    many.add_argument("--bundle", action="append", type=h.named_path, required=True, help="NAME=DIR")
    many.add_argument("--seeds", type=int, default=10, help="IVF trainings: seeds --seed, --seed + 1, ...")
    many.add_argument("--nprobe", type=int, default=5)
    many.add_argument("--out", type=Path, default=h.RESULTS / "ivf_seeds.json")
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    if args.command == "seeds":
        seeds(args, argv)
    elif not h.publish_saved(args, block_name, render):
        if not args.bundle:
            one.error("--bundle is required")
        sr(args, argv)


if __name__ == "__main__":
    main()
