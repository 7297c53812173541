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
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from compression_report import render, report  # noqa: E402
from harness import (  # noqa: E402
    add_distractors,
    add_doc_args,
    interleaved_seconds,
    load_quora_retrieval,
    publish_saved,
    run_info,
)
from quora_sr import drop_self, read_distractors, retrieval_scores, teacher_vectors  # noqa: E402
from quora_sr import unit_rows as unit  # noqa: E402

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

STORAGES = ("float32", "sq8", "pq", "pq+rescore", "binary", "binary+rescore")


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
    extra, pool = read_distractors(args.distractor_corpus, args.distractors)
    full, kept = add_distractors(questions, extra)
    return Retrieval(
        sorted({len(questions.corpus), len(full.corpus)}),
        full.corpus,
        np.asarray(full.queries),
        np.asarray(full.relevant),
        teacher_vectors(args, questions.corpus, pool, kept),
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
    parser.add_argument("--out", default="docs/results/compression.json")
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


if __name__ == "__main__":
    main()
