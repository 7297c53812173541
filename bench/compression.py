"""Smaller indexes: width x storage for each student against the 768-d teacher, in one run and one table.

For each student (--bundle NAME=DIR) and width (--widths: the first N dimensions, re-normalised),
every storage of ``index build --storage`` (float32, sq8, pq, binary; pq and binary also rescored
from float32 rows on disk by the service's code). Quora retrieval as in bench/retrieval.py, on the
questions and with --distractors Wikipedia sentences: MRR@10 (also as a share of the teacher's exact
search), search time (interleaved rounds; the teacher's IVF is the reference), bytes per document in
RAM, and STS-B test of what each storage keeps. Block ``compression``:

    python bench/compression.py --bundle default=models/default --bundle matryoshka=runs/bundles/congen-mrl-e6

Writes docs/results/compression.json (--out) and rewrites the block (--no-doc: not); ``--render-from
JSON`` rewrites it from an earlier run's JSON, measuring nothing.
"""

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import faiss
import harness as h
import numpy as np
from scipy.stats import spearmanr

from export.runtime import Encoder
from index.rescore import DEFAULT_RESCORE_K, Rescorer, write_rows
from index.vectors import binary_lists, default_nprobe, default_pq_m, new_ivf, plan_index, search, signs

Rows = list[tuple[h.Result, Callable[[], np.ndarray]]]  # each row with its search: ids (queries, k + 1)


def lists_of(vectors: np.ndarray, storage: str, args: argparse.Namespace) -> faiss.Index:
    """An IVF as ``index build`` makes it, trained on a sample, holding ids 0..n-1; binary lists get
    the nlist ``index build`` plans for them (about sqrt(n))."""
    dim, nlist = vectors.shape[1], args.nlist
    if storage == "binary":
        nlist = plan_index(len(vectors), args.nlist, 0, "binary").nlist
    index = new_ivf(dim, nlist, storage, (default_pq_m(dim), 8))
    sample = np.random.default_rng(0).permutation(len(vectors))[: args.train_sample]
    index.train(vectors[np.sort(sample)])
    index.add_with_ids(vectors, np.arange(len(vectors)))
    return index


def ids_of(
    index: faiss.Index, queries: np.ndarray, k: int, nprobe: int, rescorer: Rescorer | None = None
) -> np.ndarray:
    return (rescorer.search(index, queries, k, nprobe) if rescorer else search(index, queries, k, nprobe))[1]


def rows_of(model: str, vectors: np.ndarray, own: np.ndarray, args: argparse.Namespace, tmp: Path) -> Rows:
    """One model's rows at one width and corpus size: the teacher's exact search and float32 IVF, or
    every storage of a student."""
    (n, dim), queries = vectors.shape, vectors[own]
    find = partial(ids_of, queries=queries, k=args.k + 1)
    base = {"model": model, "width": dim, "corpus": n, "rescore_bytes_on_disk": 0}
    base["code_bytes"] = 4.0 * dim + 8  # the teacher's float32 lists
    if model == "teacher":
        exact, ivf = faiss.IndexFlatIP(dim), lists_of(vectors, "float32", args)
        exact.add(vectors)
        flat, lists = base | {"storage": "exact", "code_bytes": 4.0 * dim}, base | {"storage": "float32"}
        return [(flat, partial(find, exact, nprobe=1)), (lists, partial(find, ivf, nprobe=args.nprobe))]
    write_rows(tmp / f"{model}-{dim}-{n}.f32", np.arange(n), vectors, dim)
    rescorer, rows = Rescorer(tmp / f"{model}-{dim}-{n}.f32", dim, args.rescore_k), []
    for storage in args.storages.split(","):
        index = lists_of(vectors, storage, args)
        nprobe = {"binary": args.binary_nprobe, "pq": args.pq_nprobe}.get(storage, args.nprobe)
        row = base | {"storage": storage, "code_bytes": float(index.code_size + 8)}
        row["nlist"] = faiss.extract_index_ivf(index).nlist
        rows.append((row, partial(find, index, nprobe=nprobe)))
        if storage in ("pq", "binary"):
            rescored = row | {"storage": f"{storage}+rescore", "rescore_bytes_on_disk": 4 * dim}
            rows.append((rescored, partial(find, index, nprobe=nprobe, rescorer=rescorer)))
    return rows


def sts_scores(left: np.ndarray, right: np.ndarray, fit: np.ndarray, gold: list[float]) -> dict[str, float]:
    """STS-B Spearman x 100 of the cosine of what each storage keeps of the (unit) vectors."""
    dim, unit = left.shape[1], h.unit_rows

    def spearman(a: np.ndarray, b: np.ndarray) -> float:
        return round(100 * float(spearmanr((unit(a) * unit(b)).sum(axis=1), gold).statistic), 2)

    out = {"float32": spearman(left, right)}
    sq8 = faiss.ScalarQuantizer(dim, faiss.ScalarQuantizer.QT_8bit)
    for name, quantiser in (("sq8", sq8), ("pq", faiss.ProductQuantizer(dim, default_pq_m(dim), 8))):
        quantiser.train(fit)
        out[name] = spearman(*(quantiser.decode(quantiser.compute_codes(x)) for x in (left, right)))
    lists = binary_lists(dim, 1)  # owns the rotation: keep it referenced while the rotation is used
    rotation = faiss.downcast_VectorTransform(lists.vt)
    bits = [np.unpackbits(signs(rotation.apply(x)), axis=1) for x in (left, right)]
    out["binary"] = round(100 * float(spearmanr((bits[0] == bits[1]).mean(axis=1), gold).statistic), 2)
    return out | {"pq+rescore": out["float32"], "binary+rescore": out["float32"]}


def measure(rows: Rows, own: np.ndarray, relevant: np.ndarray, args: argparse.Namespace) -> None:
    """MRR@10 and recall of every row, then its search time (all but the exact teacher, interleaved)."""
    for row, find in rows:
        row["mrr10"], row["recall10"] = h.retrieval_scores(h.drop_self(find(), own, args.k), relevant)
    timed = {str(i): find for i, (row, find) in enumerate(rows) if row["storage"] != "exact"}
    seconds = h.interleaved_seconds(timed, args.repeats, desc=f"timing ({rows[0][0]['corpus']} docs)")
    for i, (row, _) in enumerate(rows):
        spent = seconds.get(str(i))
        row["ms_per_1000"] = 1e6 * statistics.median(spent) / len(own) if spent else None


def acceptance(rows: list[h.Result]) -> h.Result:
    """Per student, width and corpus: the rescored pq and binary rows against the teacher."""
    out: h.Result = {}
    for corpus in sorted({r["corpus"] for r in rows}):
        at = [r for r in rows if r["corpus"] == corpus]
        teacher = {r["storage"]: r for r in at if r["model"] == "teacher"}
        exact, ivf = teacher["exact"], teacher["float32"]
        for r in at:
            if r["model"] != "teacher" and r["storage"] in ("pq+rescore", "binary+rescore"):
                out[f"{r['model']} {r['width']} {r['storage']} ({corpus} docs)"] = {
                    "mrr_vs_teacher_exact_pct": round(100 * r["mrr10"] / exact["mrr10"], 2),
                    "list_bytes_vs_teacher_float": round(exact["code_bytes"] / (r["code_bytes"] - 8), 1),
                    "teacher_ivf_time_over_this": round(ivf["ms_per_1000"] / r["ms_per_1000"], 2),
                }
    return out


def render(result: h.Result) -> str:
    """Every (model, width, storage) row with one column group per corpus, then the acceptance."""
    args, rows = result["args"], result["rows"]
    corpora = sorted({r["corpus"] for r in rows})
    exact = {r["corpus"]: r["mrr10"] for r in rows if r["storage"] == "exact"}
    by_key: dict[tuple[str, int, str], dict[int, h.Result]] = {}
    for r in rows:
        by_key.setdefault((r["model"], r["width"], r["storage"]), {})[r["corpus"]] = r
    header = ["model", "width", "storage", "B/doc in RAM", "STS-B test"]
    for n in corpora:
        header += [f"MRR@10, {n:,} docs", "% of teacher exact", "ms / 1000 q"]
    table = []
    for (model, width, storage), at in by_key.items():
        first = next(iter(at.values()))
        line = [model, width, storage, f"{first['code_bytes']:.0f}", h.fmt(first["sts_b_test"], ".2f")]
        for n in corpora:
            r = at.get(n, {"mrr10": None, "ms_per_1000": None})
            share = None if r["mrr10"] is None else 100 * r["mrr10"] / exact[n]
            line += [h.fmt(r["mrr10"], ".2f"), h.fmt(share, ".1f"), h.fmt(r["ms_per_1000"])]
        table.append(line)
    bundles = (b.partition("=") for b in args["bundles"].split(","))
    models = ", ".join(f"{name} = `{h.repo_path(path)}`" for name, _, path in bundles)
    planned = sorted({(r["corpus"], r["nlist"]) for r in rows if r["storage"] == "binary" and "nlist" in r})
    binary_nlist = args.get("binary_nlist") or args["nlist"]
    if planned:
        binary_nlist = (
            " / ".join(f"{n:,}" for _, n in planned) + " (about sqrt(n), as `index build` plans them)"
        )
    pq_nprobe = args.get("pq_nprobe", args["nprobe"])
    setup = (
        f"Students: {models} ({args['variant']}). Quora retrieval as in bench/retrieval.py; IVF nlist "
        f"{args['nlist']}, nprobe {args['nprobe']} (pq lists: nprobe {pq_nprobe}; "
        f"binary lists: nlist {binary_nlist}, nprobe {args['binary_nprobe']}), rescore_k "
        f"{args['rescore_k']}, {result['threads']} threads. B/doc in RAM: the lists' code plus the 8-byte "
        "id; rescored storages also keep 4 x width bytes per document on disk. STS-B test: the cosine of "
        "what the storage keeps. Time: median of interleaved rounds; the reference is the teacher's IVF."
    )
    widest: dict[str, int] = {}
    for r in rows:
        widest[r["model"]] = max(widest.get(r["model"], 0), r["width"])
    verdict = []
    for name, v in result["acceptance"].items():
        model, width, storage, corpus = name.replace("(", "").split()[:4]
        if int(width) == widest[model]:
            mrr, share = f"{v['mrr_vs_teacher_exact_pct']:.2f}%", f"1/{v['list_bytes_vs_teacher_float']:.0f}"
            time = f"{v['teacher_ivf_time_over_this']:.2f}x"
            verdict.append([f"{model} {width} {storage}", f"{int(corpus):,}", mrr, share, time])
    header2 = ("student, width, storage", "docs", "MRR@10, % of teacher exact", "list bytes / teacher's")
    verdict_table = h.markdown_table((*header2, "teacher IVF time / this"), verdict, "lrrrr")
    rows_table = h.markdown_table(header, table, "lrl" + "r" * (len(header) - 3))
    return "\n\n".join([setup, rows_table, verdict_table])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", action="append", type=h.named_path, default=[], help="NAME=DIR (repeat)")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--widths", default="128,64,32")
    h.add_quora_args(parser, distractors=100_000)
    parser.add_argument("--storages", default="float32,sq8,pq,binary", help="the students' storages")
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=5, help="float32 and sq8 lists, and the teacher's")
    parser.add_argument("--pq-nprobe", type=int, default=default_nprobe("pq"))
    parser.add_argument("--binary-nprobe", type=int, default=default_nprobe("binary"))
    parser.add_argument("--train-sample", type=int, default=65_536)
    parser.add_argument("--rescore-k", type=int, default=DEFAULT_RESCORE_K)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=h.RESULTS / "compression.json")
    h.add_doc_args(parser)
    args = parser.parse_args(argv)
    if h.publish_saved(args, "compression", render):
        return
    bundles = h.named_bundles(args.bundle or [("default", "models/default")])
    faiss.omp_set_num_threads(args.threads)
    questions, data, teacher = h.quora_corpus(args)
    own, relevant = np.asarray(data.queries), np.asarray(data.relevant)
    pairs, widths = h.stsb_test(args.data_dir), [int(w) for w in args.widths.split(",")]
    students, sts = {}, {}
    for name, path in bundles.items():
        encoder = Encoder(path, args.variant, threads=args.threads)
        students[name] = encoder.encode(data.corpus, progress=f"student {name}")
        left, right = (encoder.encode([getattr(p, s) for p in pairs]) for s in ("sentence1", "sentence2"))
        for w in widths:
            fit = h.unit_rows(students[name][: args.train_sample, :w])
            cut = [h.unit_rows(x[:, :w]) for x in (left, right)]
            sts[(name, w)] = sts_scores(*cut, fit, [p.score for p in pairs])
    results: list[h.Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        for n in sorted({len(questions.corpus), len(data.corpus)}):
            rows = rows_of("teacher", teacher[:n], own, args, Path(tmp))
            for name, vectors in students.items():
                for w in widths:
                    rows += rows_of(name, h.unit_rows(vectors[:n, :w]), own, args, Path(tmp))
            measure(rows, own, relevant, args)
            for row, _ in rows:
                row["sts_b_test"] = sts.get((row["model"], row["width"]), {}).get(row["storage"])
            results += [row for row, _ in rows]
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings["bundles"] = ",".join(f"{name}={path}" for name, path in bundles.items())
    result = {"args": settings, "threads": args.threads, "rows": results, "acceptance": acceptance(results)}
    h.finish(args, result | {"run": h.run_info("bench/compression.py", argv)}, "compression", render)


if __name__ == "__main__":
    main()
