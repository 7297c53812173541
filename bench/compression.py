"""Smaller indexes: width x storage for each student, against the 768-d teacher, in one run and one table.

For each student bundle (--bundles name=path,...) and each width (--widths; the vectors cut to the
first N dimensions and re-normalised, as the API's ``dimensions`` does), every storage of
``index build --storage``: float32, sq8, pq and binary IVF lists, and pq and binary again with
rescoring (``--rescore-k`` candidates from the lists scored exactly against float32 rows read from a
memory-mapped file, index/rescore.py, the code the service runs). Quora retrieval follows
bench/quora_sr.py's protocol (every distinct question is a document, question1 of each duplicate
pair a query, its question2 the relevant document), on the questions alone and with the first
--distractors Wikipedia sentences added; MRR@10 is also given as a percentage of the teacher's
exact search on the same corpus. Search time: the whole query set in one call, median of --repeats
interleaved rounds, per 1000 queries; the teacher's IVF (float32, same nlist and nprobe) is the
time reference. Memory: bytes per document the lists hold in RAM (code + 8-byte id); the rescoring
rows (4 x width bytes) stay on disk. STS-B test: Spearman of the cosine of the stored codes decoded
(sq8, pq) or of the sign bits the binary lists keep (of the vectors under the lists' fixed rotation:
1 - 2 x Hamming / width); rescored rows score like float32.

    python bench/compression.py --bundles default=models/default,matryoshka=runs/bundles/congen-mrl-e6

Teacher vectors come through the teacher-target cache as in bench/quora_sr.py (encoded once per
machine). Writes JSON (--out) and a PNG of MRR@10 against bytes per document (--png), and rewrites
the block ``compression`` of docs/results.md (--no-doc: not); ``--render-from JSON`` rewrites it
from an earlier run's JSON, measuring nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from quora_data import add_distractors, load_quora_retrieval  # noqa: E402
from quora_sr import drop_self, retrieval_scores, teacher_vectors  # noqa: E402
from results_doc import add_doc_args, fmt, markdown_table, publish, publish_saved, repo_path, run_info  # noqa: E402
from timing import interleaved_seconds  # noqa: E402

from index.rescore import DEFAULT_RESCORE_K, Rescorer, write_rows  # noqa: E402
from index.vectors import (  # noqa: E402
    binary_lists,
    default_nprobe,
    default_pq_m,
    new_ivf,
    plan_index,
    search,
    signs,
)
from training.data.sts import read_stsb  # noqa: E402
from training.data.text import read_sentences  # noqa: E402

STORAGES = ("float32", "sq8", "pq", "pq+rescore", "binary", "binary+rescore")


def unit(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), np.float32)


@dataclass
class Row:
    model: str
    width: int
    storage: str
    corpus: int
    search: Any  # () -> ids (n_queries, k + 1)
    code_bytes: float
    rescore_bytes: int = 0
    result: dict[str, Any] = field(default_factory=dict)


def trained_ivf(
    vectors: np.ndarray, storage: str, args: argparse.Namespace, planned: bool = True
) -> faiss.Index:
    """An IVF as ``index build`` makes it (index/vectors.py), trained on a sample, filled with ids 0..n-1.
    Binary lists get the nlist ``index build`` plans (about sqrt(n), decision 43) unless not ``planned``."""
    dim = vectors.shape[1]
    nlist = (args.binary_nlist or args.nlist) if storage == "binary" else args.nlist
    if storage == "binary" and planned:
        nlist = plan_index(len(vectors), nlist, 0, "binary").nlist
    index = new_ivf(dim, nlist, storage, (default_pq_m(dim), 8))
    sample = vectors[np.sort(np.random.default_rng(args.seed).permutation(len(vectors))[: args.train_sample])]
    index.train(sample)
    index.add_with_ids(vectors, np.arange(len(vectors)))
    return index


def student_rows(
    model: str, vectors: np.ndarray, queries: np.ndarray, args: argparse.Namespace, scratch: Path
) -> list[Row]:
    """One row per storage for one student's vectors at one width and one corpus size."""
    n, dim = vectors.shape
    rows = []
    rescore_path = scratch / f"{model}-{dim}-{n}.f32"
    write_rows(rescore_path, np.arange(n), vectors, dim)
    rescorer = Rescorer(rescore_path, dim, args.rescore_k)
    k = args.k + 1
    for storage in args.storages.split(","):
        index = trained_ivf(vectors, storage, args)
        code = float(index.code_size + 8)
        nprobe = {"binary": args.binary_nprobe, "pq": args.pq_nprobe}.get(storage, args.nprobe)
        nlist = faiss.extract_index_ivf(index).nlist
        search_ = partial(plain_search, index, queries, k, nprobe)
        rows.append(Row(model, dim, storage, n, search_, code, result={"nlist": nlist}))
        if storage in ("pq", "binary"):
            rescored = partial(rescored_search, rescorer, index, queries, k, nprobe)
            rows.append(Row(model, dim, f"{storage}+rescore", n, rescored, code, 4 * dim, {"nlist": nlist}))
    return rows


def plain_search(index: faiss.Index, queries: np.ndarray, k: int, nprobe: int) -> np.ndarray:
    return search(index, queries, k, nprobe)[1]


def rescored_search(
    rescorer: Rescorer,
    index: faiss.Index,
    queries: np.ndarray,
    k: int,
    nprobe: int,
    rescore_k: int | None = None,
) -> np.ndarray:
    return rescorer.search(index, queries, k, nprobe, rescore_k=rescore_k)[1]


def teacher_rows(vectors: np.ndarray, queries: np.ndarray, args: argparse.Namespace) -> list[Row]:
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    ivf = trained_ivf(vectors, "float32", args)
    k, n, d = args.k + 1, len(vectors), vectors.shape[1]
    return [
        Row("teacher", d, "exact", n, partial(plain_search, exact, queries, k, 1), 4.0 * d),
        Row("teacher", d, "float32", n, partial(plain_search, ivf, queries, k, args.nprobe), 4.0 * d + 8),
    ]


def sts_scores(left: np.ndarray, right: np.ndarray, fit: np.ndarray, gold: list[float]) -> dict[str, float]:
    """STS-B Spearman x 100 of the cosine of what each storage keeps of the vectors."""
    dim = left.shape[1]

    def spearman(a: np.ndarray, b: np.ndarray) -> float:
        return round(100 * float(spearmanr((unit(a) * unit(b)).sum(axis=1), gold).statistic), 2)

    out = {"float32": spearman(left, right)}
    sq = faiss.ScalarQuantizer(dim, faiss.ScalarQuantizer.QT_8bit)
    sq.train(fit)
    out["sq8"] = spearman(sq.decode(sq.compute_codes(left)), sq.decode(sq.compute_codes(right)))
    pq = faiss.ProductQuantizer(dim, default_pq_m(dim), 8)
    pq.train(fit)
    out["pq"] = spearman(pq.decode(pq.compute_codes(left)), pq.decode(pq.compute_codes(right)))
    lists = binary_lists(dim, 1)  # owns the rotation: keep it referenced while the rotation is used
    rotation = faiss.downcast_VectorTransform(lists.vt)
    left_bits, right_bits = signs(rotation.apply(left)), signs(rotation.apply(right))
    bits = (np.unpackbits(left_bits, axis=1) == np.unpackbits(right_bits, axis=1)).mean(axis=1)
    out["binary"] = round(100 * float(spearmanr(bits, gold).statistic), 2)
    out["pq+rescore"] = out["binary+rescore"] = out["float32"]
    return out


def measure(rows: list[Row], own: np.ndarray, relevant: np.ndarray, args: argparse.Namespace) -> None:
    """Ids (MRR, recall) of every row, then times: the exact teacher once, the rest interleaved."""
    for row in rows:
        ids = drop_self(row.search(), own, args.k)
        row.result["mrr10"], row.result["recall10"] = retrieval_scores(ids, relevant)
    timed = {str(i): row.search for i, row in enumerate(rows) if row.storage != "exact"}
    seconds = interleaved_seconds(timed, args.repeats, desc=f"timing ({rows[0].corpus} docs)")
    per_1000 = len(own) / 1000
    for i, row in enumerate(rows):
        spent = seconds.get(str(i))
        row.result["ms_per_1000"] = 1000 * statistics.median(spent) / per_1000 if spent else None


def acceptance(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 23's figures, per student at full width and per corpus: binary and pq with rescoring."""
    out: dict[str, Any] = {}
    for corpus in sorted({r["corpus"] for r in rows}):
        at = [r for r in rows if r["corpus"] == corpus]
        exact = next(r for r in at if r["model"] == "teacher" and r["storage"] == "exact")
        ivf = next(r for r in at if r["model"] == "teacher" and r["storage"] == "float32")
        for r in at:
            if r["model"] == "teacher" or r["storage"] not in ("pq+rescore", "binary+rescore"):
                continue
            out[f"{r['model']} {r['width']} {r['storage']} ({corpus} docs)"] = {
                "mrr_vs_teacher_exact_pct": round(100 * r["mrr10"] / exact["mrr10"], 2),
                "list_bytes_vs_teacher_float": round(exact["code_bytes"] / (r["code_bytes"] - 8), 1),
                "teacher_ivf_time_over_this": round(ivf["ms_per_1000"] / r["ms_per_1000"], 2),
            }
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = sorted({r["corpus"] for r in rows})
    fig, axes = plt.subplots(1, len(corpora), figsize=(6.5 * len(corpora), 4.8), squeeze=False)
    markers = {"float32": "o", "sq8": "s", "pq": "v", "pq+rescore": "^", "binary": "x", "binary+rescore": "P"}
    models = sorted({r["model"] for r in rows})
    colors = {m: f"C{i}" for i, m in enumerate(models)}
    for ax, corpus in zip(axes[0], corpora, strict=True):
        for r in (r for r in rows if r["corpus"] == corpus):
            marker = "*" if r["model"] == "teacher" else markers[r["storage"]]
            ax.scatter(r["code_bytes"], r["mrr10"], color=colors[r["model"]], marker=marker, s=40)
            ax.annotate(str(r["width"]), (r["code_bytes"], r["mrr10"]), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")  # fmt: skip
        ax.set_xscale("log")
        ax.set(xlabel="bytes per document in RAM (code + id)", ylabel="Quora MRR@10")
        ax.set_title(f"{corpus:,} documents")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[m], marker="o", ls="") for m in models]
    handles += [plt.Line2D([], [], color="grey", marker=mk, ls="") for mk in markers.values()]
    axes[0][0].legend(handles, models + list(markers), fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def render(result: dict[str, Any]) -> str:
    """Every (model, width, storage) row with one column group per corpus, then the acceptance."""
    args, rows = result["args"], result["rows"]
    corpora = sorted({r["corpus"] for r in rows})
    exact = {r["corpus"]: r["mrr10"] for r in rows if r["storage"] == "exact"}
    by_key: dict[tuple[str, int, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((r["model"], r["width"], r["storage"]), {})[r["corpus"]] = r
    header = ["model", "width", "storage", "B/doc in RAM", "STS-B test"]
    for n in corpora:
        header += [f"MRR@10, {n:,} docs", "% of teacher exact", "ms / 1000 q"]
    table = []
    for (model, width, storage), at in by_key.items():
        first = next(iter(at.values()))
        line = [model, width, storage, f"{first['code_bytes']:.0f}", fmt(first["sts_b_test"], ".2f")]
        for n in corpora:
            r = at.get(n, {"mrr10": None, "ms_per_1000": None})
            share = None if r["mrr10"] is None else 100 * r["mrr10"] / exact[n]
            line += [fmt(r["mrr10"], ".2f"), fmt(share, ".1f"), fmt(r["ms_per_1000"])]
        table.append(line)
    bundles = (b.split("=", 1) for b in args["bundles"].split(","))
    models = ", ".join(f"{name} = `{repo_path(path)}`" for name, path in bundles)
    planned = sorted(
        {(r["corpus"], r["nlist"]) for r in result["rows"] if r["storage"] == "binary" and "nlist" in r}
    )
    binary_nlist = (
        " / ".join(f"{nlist:,}" for _, nlist in planned) + " (about sqrt(n), as `index build` plans them)"
        if planned
        else args.get("binary_nlist") or args["nlist"]
    )
    pq_nprobe = args.get("pq_nprobe", args["nprobe"])
    setup = (
        f"Students: {models} ({args['variant']}). Quora retrieval as in bench/quora_sr.py; IVF nlist "
        f"{args['nlist']}, nprobe {args['nprobe']} (pq lists: nprobe {pq_nprobe}; "
        f"binary lists: nlist {binary_nlist}, nprobe {args['binary_nprobe']}), rescore_k "
        f"{args['rescore_k']}, {result['threads']} threads. B/doc in RAM: the lists' code plus the 8-byte "
        "id; rescored storages also keep 4 x width bytes per document on disk. STS-B test: the cosine of "
        "what the storage keeps. Time: median of interleaved rounds; the reference is the teacher's IVF."
    )
    return "\n\n".join(
        [setup, markdown_table(header, table, "lrl" + "r" * (len(header) - 3)), render_acceptance(result)]
    )


def render_acceptance(result: dict[str, Any]) -> str:
    """The acceptance figures of each student at its full width."""
    widest: dict[str, int] = {}
    for r in result["rows"]:
        widest[r["model"]] = max(widest.get(r["model"], 0), r["width"])
    lines = []
    for name, v in result["acceptance"].items():
        model, width, storage, corpus = re.fullmatch(r"(\S+) (\d+) (\S+) \((\d+) docs\)", name).groups()
        if int(width) == widest[model]:
            mrr, share = f"{v['mrr_vs_teacher_exact_pct']:.2f}%", f"1/{v['list_bytes_vs_teacher_float']:.0f}"
            time = f"{v['teacher_ivf_time_over_this']:.2f}x"
            lines.append([f"{model} {width} {storage}", f"{int(corpus):,}", mrr, share, time])
    header = ("student, width, storage", "docs", "MRR@10, % of teacher exact", "list bytes / teacher's")
    return markdown_table((*header, "teacher IVF time / this"), lines, "lrrrr")


@dataclass
class Retrieval:
    """The Quora questions, then the distractors after them; what every row is measured on."""

    sizes: list[int]  # corpus sizes measured: the questions alone, and with the distractors
    corpus: list[str]
    own: np.ndarray  # each query's own document, dropped from its hits
    relevant: np.ndarray
    teacher: np.ndarray  # the teacher's unit vectors of ``corpus``


def load_retrieval(args: argparse.Namespace) -> Retrieval:
    questions = load_quora_retrieval(args.quora_dir)
    extra = read_sentences(args.distractor_corpus, limit=args.distractors) if args.distractors else []
    full, kept = add_distractors(questions, extra)
    return Retrieval(
        sorted({len(questions.corpus), len(full.corpus)}),
        full.corpus,
        np.asarray(full.queries),
        np.asarray(full.relevant),
        teacher_vectors(args, questions.corpus, extra, kept),
    )


def make_parser(data: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundles", default="default=models/default", help="name=path,...")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--widths", default="128,64,32")
    parser.add_argument("--quora-dir", default=f"{data}/quora")
    parser.add_argument("--sts-file", default=f"{data}/sts/stsbenchmark/sts-test.csv")
    parser.add_argument("--distractors", type=int, default=100_000, help="0: the questions alone only")
    parser.add_argument("--distractor-corpus", default=f"{data}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    parser.add_argument("--teacher", default="all-mpnet-base-v2")
    parser.add_argument("--teacher-vectors", help=".npy of the questions' teacher vectors (see quora_sr.py)")
    parser.add_argument("--teacher-batch-size", type=int, default=16)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=5, help="float32 and sq8 lists, and the teacher's")
    parser.add_argument("--pq-nprobe", type=int, default=default_nprobe("pq"), help="pq lists")
    parser.add_argument("--binary-nprobe", type=int, default=default_nprobe("binary"), help="binary lists")
    parser.add_argument("--binary-nlist", type=int, help="binary lists' nlist (default: --nlist)")
    parser.add_argument("--storages", default="float32,sq8,pq,binary", help="students' storages")
    parser.add_argument("--train-sample", type=int, default=65_536)
    parser.add_argument("--rescore-k", type=int, default=DEFAULT_RESCORE_K)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/compression.json")
    parser.add_argument("--png", help="plot (default: --out with .png, so a partial run keeps the doc's)")
    add_doc_args(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = make_parser(os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")).parse_args(argv)
    if publish_saved(args, "compression", render):
        return
    faiss.omp_set_num_threads(args.threads)
    from export.runtime import Encoder

    bundles = dict(item.split("=", 1) for item in args.bundles.split(","))
    widths = [int(w) for w in args.widths.split(",")]
    data = load_retrieval(args)
    own = data.own
    pairs = read_stsb(Path(args.sts_file))
    gold = [p.score for p in pairs]
    students, sts = {}, {}
    for name, path in bundles.items():
        encoder = Encoder(path, args.variant, threads=args.threads)
        students[name] = encoder.encode(data.corpus, progress=f"student {name}")
        left = encoder.encode([p.sentence1 for p in pairs])
        right = encoder.encode([p.sentence2 for p in pairs])
        for width in widths:
            fit = unit(students[name][: args.train_sample, :width])
            sts[(name, width)] = sts_scores(unit(left[:, :width]), unit(right[:, :width]), fit, gold)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        for n in data.sizes:
            teacher_n = unit(data.teacher[:n])
            rows = teacher_rows(teacher_n, teacher_n[own], args)
            for name, vectors in students.items():
                for width in widths:
                    cut = unit(vectors[:n, :width])
                    rows += student_rows(name, cut, cut[own], args, Path(tmp))
            measure(rows, own, data.relevant, args)
            for row in rows:
                scores = sts.get((row.model, row.width), {})
                results.append(
                    {
                        "model": row.model,
                        "width": row.width,
                        "storage": row.storage,
                        "corpus": row.corpus,
                        "code_bytes": row.code_bytes,
                        "rescore_bytes_on_disk": row.rescore_bytes,
                        "sts_b_test": scores.get(row.storage),
                    }
                    | row.result
                )
    report(results, args, run_info("bench/compression.py", argv))


def report(results: list[dict[str, Any]], args: argparse.Namespace, run: dict[str, str]) -> None:
    exact = {r["corpus"]: r["mrr10"] for r in results if r["storage"] == "exact"}
    shape = (
        f"nlist {args.nlist}, nprobe {args.nprobe} (pq {args.pq_nprobe}, binary {args.binary_nprobe}), "
        f"rescore_k {args.rescore_k}"
    )
    table = Table(title=f"Compressed indexes ({shape}): Quora MRR@10, STS-B test, memory, search time")
    columns = ("model", "width", "storage", "docs", "STS-B", "MRR@10", "% teacher", "B/doc RAM", "ms/1000 q")
    for col in columns:
        table.add_column(col, justify="left" if col in ("model", "storage") else "right", no_wrap=True)
    for r in results:
        table.add_row(
            r["model"], str(r["width"]), r["storage"], f"{r['corpus']:,}",
            "-" if r["sts_b_test"] is None else f"{r['sts_b_test']:.2f}",
            f"{r['mrr10']:.2f}", f"{100 * r['mrr10'] / exact[r['corpus']]:.1f}", f"{r['code_bytes']:.0f}",
            "-" if r["ms_per_1000"] is None else f"{r['ms_per_1000']:.1f}",
        )  # fmt: skip
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    verdict = acceptance(results)
    console.print(verdict)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out = {"args": settings, "threads": args.threads, "rows": results, "acceptance": verdict, "run": run}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    png = Path(args.png) if args.png else Path(args.out).with_suffix(".png")
    plot(results, png)
    console.print(f"wrote {args.out} and {png}")
    publish(args, out, Path(args.out), "compression", render)


if __name__ == "__main__":
    main()
