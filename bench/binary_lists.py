"""Binary lists with rescoring at several (nlist, nprobe), against the teacher's IVF, in one timed run.

    python bench/binary_lists.py --threads 2 --out docs/results/binary_lists.json

The compression benchmark's protocol (bench/compression.py): Quora questions alone and with
--distractors Wikipedia sentences, `models/default` at 128-d, rescore_k 50, the teacher's IVF at
nlist 1024 and nprobe 5 as the time reference. It asks which number and size of binary lists
(``index build --storage binary``) buys the most MRR for the time: the default nprobe comes from it.
Beside each, a float32 IVF with the same nlist and nprobe (same k-means seed and sample, so the same
lists), without rescoring: what the binary candidates rescored are measured against.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import faiss
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import compression  # noqa: E402
from harness import run_info  # noqa: E402

from index.rescore import Rescorer, write_rows  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument(
        "--configs",
        default="1024/5,1024/8,1024/12,1024/16,512/8,256/8",
        help="nlist/nprobe[/rescore_k],... (rescore_k: --rescore-k of bench/compression.py unless given)",
    )
    parser.add_argument("--quora-dir", default=f"{data}/quora")
    parser.add_argument("--distractors", type=int, default=100_000)
    parser.add_argument("--distractor-corpus", default=f"{data}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="docs/results/binary_lists.json")
    args = parser.parse_args(argv)
    # compression.py's protocol and defaults: teacher, nlist 1024, nprobe 5, rescore_k, repeats
    shared = compression.make_parser(data).parse_args(
        [
            *("--quora-dir", args.quora_dir, "--distractors", str(args.distractors)),
            *("--distractor-corpus", args.distractor_corpus, "--threads", str(args.threads)),
        ]
    )
    configs = [parse_config(c, shared.rescore_k) for c in args.configs.split(",")]
    faiss.omp_set_num_threads(args.threads)
    from export.runtime import Encoder

    retrieval = compression.load_retrieval(shared)
    own = retrieval.own
    student = Encoder(args.bundle, "int8", threads=args.threads).encode(retrieval.corpus, progress="student")
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="bench-binary-lists-") as tmp:
        for n in retrieval.sizes:
            cut = compression.unit(retrieval.teacher[:n])
            rows = compression.teacher_rows(cut, cut[own], shared)
            vectors = compression.unit(student[:n])
            path = Path(tmp) / f"rescore-{n}.f32"
            write_rows(path, np.arange(n), vectors, vectors.shape[1])
            rescorer = Rescorer(path, vectors.shape[1], shared.rescore_k)
            floats_done: set[tuple[int, int]] = set()
            for nlist, nprobe, rescore_k in configs:
                sized = argparse.Namespace(**{**vars(shared), "nlist": nlist, "binary_nlist": nlist})
                index = compression.trained_ivf(vectors, "binary", sized, planned=False)
                search = partial(
                    compression.rescored_search,
                    rescorer,
                    index,
                    vectors[own],
                    shared.k + 1,
                    nprobe,
                    rescore_k,
                )
                name = f"binary {nlist}/{nprobe} + rescore"
                name += "" if rescore_k == shared.rescore_k else f" {rescore_k}"
                rows.append(compression.Row("student", 128, name, n, search, 24.0))
                if (nlist, nprobe) in floats_done:
                    continue
                floats_done.add((nlist, nprobe))
                floats = compression.trained_ivf(vectors, "float32", sized)  # the same lists, float32
                search = partial(compression.plain_search, floats, vectors[own], shared.k + 1, nprobe)
                rows.append(compression.Row("student", 128, f"float32 {nlist}/{nprobe}", n, search, 520.0))
            compression.measure(rows, own, retrieval.relevant, shared)
            exact, ivf = rows[0].result["mrr10"], rows[1].result["ms_per_1000"]
            for row in rows:
                ms = row.result["ms_per_1000"]
                line = {
                    "index": f"{row.model} {row.storage}",
                    "docs": n,
                    "mrr10": round(row.result["mrr10"], 2),
                    "pct_of_teacher_exact": round(100 * row.result["mrr10"] / exact, 2),
                    "ms_per_1000": None if ms is None else round(ms, 2),
                    "teacher_ivf_time_over_this": None if ms is None else round(ivf / ms, 2),
                }
                rows_out.append(line)
                print(json.dumps(line), flush=True)
    report = {"rows": rows_out, "run": run_info("bench/binary_lists.py", argv)}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def parse_config(text: str, rescore_k: int) -> tuple[int, int, int]:
    """``nlist/nprobe`` or ``nlist/nprobe/rescore_k`` as three ints."""
    parts = [int(x) for x in text.split("/")]
    if len(parts) not in (2, 3):
        raise SystemExit(f"error: --configs entry {text!r} is not nlist/nprobe[/rescore_k]")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else rescore_k


if __name__ == "__main__":
    main()
