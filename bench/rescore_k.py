"""How many candidates compressed lists should rescore: MRR@10 and search time against ``--rescore-k``.

    python bench/rescore_k.py --threads 2

The compression benchmark's protocol (bench/compression.py): Quora questions alone and with the
first --distractors Wikipedia sentences, `models/default` at 128-d in binary lists (about sqrt(n)
lists) and pq lists (1,024) as `index build` plans them, probed as bench/compression.py probes them,
each rescore_k in one run. MRR@10 is given as a share of the 768-d teacher's exact search on the same
corpus, read from --teacher-from (a bench/compression.py JSON of the same corpora), so this needs no
teacher vectors; time is relative to the largest rescore_k, in interleaved rounds.
bench/binary_lists.py times the same binary lists against the teacher's IVF.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import compression  # noqa: E402
from harness import (  # noqa: E402
    add_distractors,
    add_doc_args,
    interleaved_seconds,
    load_quora_retrieval,
    markdown_table,
    publish,
    publish_saved,
    repo_path,
    run_info,
)
from quora_sr import drop_self, retrieval_scores  # noqa: E402

from index.rescore import DEFAULT_RESCORE_K, Rescorer, write_rows  # noqa: E402
from training.data.text import read_sentences  # noqa: E402


def teacher_exact(path: Path) -> dict[int, float]:
    """The teacher's exact MRR@10 per corpus size in a bench/compression.py JSON."""
    rows = json.loads(path.read_text())["rows"]
    return {r["corpus"]: r["mrr10"] for r in rows if r["model"] == "teacher" and r["storage"] == "exact"}


def render(result: dict[str, Any]) -> str:
    sizes = sorted({r["docs"] for r in result["rows"]})
    header = [
        "storage",
        "rescore_k",
        *(f"{label}, {n:,} docs" for n in sizes for label in ("MRR@10 %", "time")),
    ]
    by_k: dict[tuple[str, int], list[str]] = {}
    for row in result["rows"]:
        cells = by_k.setdefault((row["storage"], row["rescore_k"]), [])
        cells += [f"{row['pct_of_teacher_exact']:.2f}%", f"{row['time_vs_largest']:.2f}"]
    default = result["default_rescore_k"]
    rows = [
        [storage, f"**{k}** (default)" if k == default else str(k), *cells]
        for (storage, k), cells in by_k.items()
    ]
    lists = "; ".join(
        f"{storage} {' / '.join(map(str, n.values()))} lists at nprobe {result['nprobe'][storage]}"
        for storage, n in result["nlist"].items()
    )
    note = (
        "MRR@10 as a share of the teacher's exact search on the same corpus; time per query relative "
        f"to the largest rescore_k of the same lists, in the same rounds. `{result['bundle']}` (int8), "
        f"{lists}, {result['threads']} threads."
    )
    return note + "\n\n" + markdown_table(header, rows, "l" + "r" * (len(header) - 1))


def sweep(
    searches: dict[int, Callable[[], np.ndarray]],
    own: np.ndarray,
    relevant: np.ndarray,
    depth: int,
    teacher_mrr: float,
    repeats: int,
    label: str,
) -> list[dict[str, Any]]:
    """One row per rescore_k (the keys of ``searches``): MRR@``depth``, also as a share of the
    teacher's, and the time relative to the largest rescore_k, in interleaved rounds."""
    seconds = interleaved_seconds(
        {str(rescore_k): search for rescore_k, search in searches.items()}, repeats, desc=f"timing ({label})"
    )
    largest = statistics.median(seconds[str(max(searches))])
    rows = []
    for rescore_k, search in searches.items():
        mrr = retrieval_scores(drop_self(search(), own, depth), relevant)[0]
        rows.append(
            {
                "rescore_k": rescore_k,
                "mrr10": round(mrr, 2),
                "pct_of_teacher_exact": round(100 * mrr / teacher_mrr, 2),
                "time_vs_largest": round(statistics.median(seconds[str(rescore_k)]) / largest, 3),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument("--rescore-ks", default="10,20,30,40,50,100")
    parser.add_argument("--storages", default="binary,pq")
    parser.add_argument("--quora-dir", default=f"{data}/quora")
    parser.add_argument("--distractors", type=int, default=100_000)
    parser.add_argument("--distractor-corpus", default=f"{data}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    parser.add_argument("--teacher-from", type=Path, default=ROOT / "docs/results/compression.json")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="docs/results/rescore_k.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, "rescore-k", render):
        return
    from export.runtime import Encoder

    faiss.omp_set_num_threads(args.threads)
    try:
        ks = sorted({int(k) for k in args.rescore_ks.split(",")})
    except ValueError:
        raise SystemExit(f"error: --rescore-ks {args.rescore_ks!r} is not a list of integers") from None
    if ks[0] < 1:
        raise SystemExit("error: --rescore-ks values must be at least 1")
    storages = args.storages.split(",")
    if unknown := sorted(set(storages) - {"binary", "pq"}):
        raise SystemExit(f"error: --storages {','.join(unknown)}: only binary and pq lists are rescored")
    exact = teacher_exact(args.teacher_from)
    questions = load_quora_retrieval(args.quora_dir)
    extra = read_sentences(args.distractor_corpus, limit=args.distractors) if args.distractors else []
    full, _ = add_distractors(questions, extra)
    sizes = sorted({len(questions.corpus), len(full.corpus)})
    if missing := [n for n in sizes if n not in exact]:
        raise SystemExit(f"error: {args.teacher_from} has no teacher row for {missing} documents")
    own, relevant = np.asarray(full.queries), np.asarray(full.relevant)
    vectors = compression.unit(
        Encoder(args.bundle, "int8", threads=args.threads).encode(full.corpus, progress="student")
    )
    shared = compression.make_parser(data).parse_args([])
    nprobe = {"binary": shared.binary_nprobe, "pq": shared.pq_nprobe}
    rows: list[dict[str, Any]] = []
    nlists: dict[str, dict[str, int]] = {}
    queries = np.ascontiguousarray(vectors[own])  # query ids are the same rows at every size
    with tempfile.TemporaryDirectory(prefix="bench-rescore-k-") as tmp:
        for n in sizes:
            path = write_rows(Path(tmp) / f"rescore-{n}.f32", np.arange(n), vectors[:n], vectors.shape[1])
            rescorer = Rescorer(path, vectors.shape[1])
            for storage in storages:
                index = compression.trained_ivf(vectors[:n], storage, shared)
                nlists.setdefault(storage, {})[str(n)] = faiss.extract_index_ivf(index).nlist
                searches = {
                    k: partial(
                        compression.rescored_search,
                        rescorer,
                        index,
                        queries,
                        shared.k + 1,
                        nprobe[storage],
                        k,
                    )
                    for k in ks
                }
                for row in sweep(
                    searches, own, relevant, shared.k, exact[n], args.repeats, f"{storage}, {n:,} docs"
                ):
                    rows.append({"storage": storage, "docs": n, **row})
                    print(json.dumps(rows[-1]), flush=True)
    result = {
        "bundle": args.bundle,
        "rows": rows,
        "nlist": nlists,
        "nprobe": nprobe,
        "threads": args.threads,
        "default_rescore_k": DEFAULT_RESCORE_K,
        "teacher_exact_from": repo_path(args.teacher_from),
        "run": run_info("bench/rescore_k.py", argv),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    publish(args, result, Path(args.out), "rescore-k", render)


if __name__ == "__main__":
    main()
