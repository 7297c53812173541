"""Dense, lexical (BM25) and hybrid (reciprocal-rank fusion) search: quality and speed. Block ``hybrid``:

    python bench/hybrid.py --bundle models/default --large 1000000

Quality, MRR@10 and recall@10 per mode:

* Quora: each duplicate pair's first question searches for its second among every question (the
  query's own entry dropped), alone and with ``--distractors`` Wikipedia sentences beside them.
* Known item: ``--known`` Wikipedia sentences held back from the distractors (from line ``--held-back``,
  ten words or more) join that corpus; each is searched for by its ``--rare-words`` rarest words only
  (document frequency in the corpus): the names, numbers and rare terms a 128-d student blurs.

Speed: the p50 of one query at a time in process (query encoding included for dense and hybrid,
lexical needs none) at ``--distractors`` and ``--large`` documents; at ``--large``, dense and hybrid
/search through ``distilembed serve`` too (``--served-rounds``); and the lexical index's bytes per
document. Indexes are built once under ``--work`` (``distilembed index build``'s code, IVF float32)
and reused. Writes its JSON (--out) and the block of docs/results.md (--no-doc: not).
"""

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import harness as h
import numpy as np

from distilembed.artifacts import atomic_write_json
from export.runtime import Encoder
from index import lexical
from index.build import BuildConfig, build
from index.corpus import CorpusSpec
from index.integrity import STORE_FILE
from index.live import LiveIndex
from training.data.text import content_hash, read_sentences

MODES = ("dense", "lexical", "hybrid")


def corpus_index(work: Path, name: str, docs: list[tuple[str, str]], args: argparse.Namespace) -> Path:
    """An index of ``docs`` (id, text) under ``work``, built unless one of the same documents is there."""
    out = work / name
    stamp = content_hash([f"{i} {t}" for i, t in docs])
    manifest = out / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("bench_docs") == stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        path = Path(tmp) / "corpus.jsonl"
        path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs))
        build(BuildConfig(bundle=args.bundle, out=str(out), nlist=args.nlist), CorpusSpec(path))
    atomic_write_json(manifest, json.loads(manifest.read_text()) | {"bench_docs": stamp})
    return out


def rare_word_query(text: str, frequency: Counter[str], words: int) -> str:
    """The ``words`` rarest distinct terms of ``text`` (ties: first seen), in the text's order."""
    terms = lexical.query_terms(text)
    rarest = set(sorted(terms, key=lambda t: (frequency[t], terms.index(t)))[:words])
    return " ".join(t for t in terms if t in rarest)


def top_ids(index: LiveIndex, mode: str, texts: list[str], vectors: np.ndarray, k: int) -> list[list[str]]:
    if mode == "dense":
        return [[hit.id for hit in row] for row in index.search(vectors, k)]
    if mode == "lexical":
        return [[hit.id for hit in index.search_lexical(text, k)] for text in texts]
    return [
        [hit.id for hit in index.search_hybrid(v, text, k)] for v, text in zip(vectors, texts, strict=True)
    ]


def scores(found: list[list[str]], relevant: list[str], own: list[str] | None = None) -> dict[str, float]:
    """MRR@10 and recall@10 (x 100), each query's own id dropped first when ``own`` is given."""
    ranks = []
    for row, (ids, target) in enumerate(zip(found, relevant, strict=True)):
        kept = [i for i in ids if own is None or i != own[row]][:10]
        ranks.append(kept.index(target) + 1 if target in kept else 0)
    mrr = statistics.fmean(1 / r if r else 0.0 for r in ranks)
    return {"mrr10": round(100 * mrr, 2), "recall10": round(100 * statistics.fmean(r > 0 for r in ranks), 2)}


def p50_ms(index: LiveIndex, encoder: Encoder, texts: list[str]) -> dict[str, float]:
    """Median milliseconds per mode of one query at a time, encoding included where the mode needs a
    vector; the modes take turns on each query, so a slow moment of the machine costs them alike."""
    calls = {
        "dense": lambda text: index.search(encoder.encode([text]), 10),
        "lexical": lambda text: index.search_lexical(text, 10),
        "hybrid": lambda text: index.search_hybrid(encoder.encode([text])[0], text, 10),
    }
    spent: dict[str, list[float]] = {mode: [] for mode in MODES}
    for text in texts:
        for mode in MODES:
            start = time.perf_counter()
            calls[mode](text)
            spent[mode].append(time.perf_counter() - start)
    return {mode: round(1000 * statistics.median(s), 2) for mode, s in spent.items()}


def lexical_bytes(index_dir: Path, documents: int) -> float:
    """The lexical index's bytes per document: the store's size with it less its size without it."""
    store = index_dir / STORE_FILE
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / store.name
        shutil.copy(store, copy)
        db = sqlite3.connect(copy, isolation_level=None)
        db.execute("VACUUM")
        with_it = copy.stat().st_size
        db.execute(f"DROP TABLE {lexical.TABLE}")
        db.execute("VACUUM")
        db.close()
        return round((with_it - copy.stat().st_size) / documents, 1)


def served_p50(args: argparse.Namespace, folder: Path, texts: list[str]) -> dict[str, Any]:
    """Dense and hybrid /search through ``distilembed serve`` over ``folder``, one query at a time over
    HTTP (wrk if installed, else httpx), in ``--served-rounds`` rounds whose order alternates: each
    mode's p50 per round, and the medians. The server finds a hybrid query's lexical side while its
    encoder makes the vector, which an in-process call that is handed the vector cannot."""
    import http_load as hl

    bodies = {mode: [{"query": t, "top_k": 10, "mode": mode} for t in texts] for mode in ("dense", "hybrid")}
    client = "wrk" if shutil.which("wrk") else "httpx"

    def p50(base: str, mode: str) -> float:
        if client == "wrk":
            return float(hl.wrk(base, "/search", bodies[mode], 1, args.served_seconds)["p50_ms"])
        requests = bodies[mode]
        make: hl.MakeRequest = lambda i: (mode, ("POST", "/search", requests[i % len(requests)]))  # noqa: E731
        return float(hl.load(base, make, 1, 10**9, args.served_seconds).summary()["p50_ms"])

    rounds = []
    logs = Path(tempfile.mkdtemp(prefix="bench-hybrid-serve-"))
    with hl.serving(args.bundle, ["--index", str(folder)], logs / "serve.log") as (base, _):
        p50(base, "hybrid")  # warm: the lists, the pages and the planner's term counts
        for r in range(args.served_rounds):
            order = ("dense", "hybrid")[:: 1 if r % 2 == 0 else -1]
            rounds.append({mode: p50(base, mode) for mode in order})
    shutil.rmtree(logs, ignore_errors=True)
    medians = {mode: round(statistics.median(r[mode] for r in rounds), 2) for mode in ("dense", "hybrid")}
    return {"client": client, "rounds": rounds, "p50_ms": medians}


def run(args: argparse.Namespace, argv: list[str]) -> h.Result:
    data = h.load_quora_retrieval(Path(args.data_dir) / "quora")
    wiki_path = Path(args.data_dir) / h.WIKIPEDIA
    wiki = read_sentences(wiki_path, limit=max(args.large, args.distractors))
    later = read_sentences(wiki_path, limit=50_000, skip=args.held_back)
    pool = [t for t in later if len(lexical.query_terms(t)) >= 10]
    targets = pool[:: max(1, 40_000 // args.known)][: args.known]  # spread over the held-back slice
    questions = [(f"q{i}", t) for i, t in enumerate(data.corpus)]
    small = questions + [(f"w{i}", t) for i, t in enumerate(wiki[: args.distractors])]
    small += [(f"t{i}", t) for i, t in enumerate(targets)]
    frequency = Counter(term for _, text in small for term in set(lexical.query_terms(text)))
    known = [rare_word_query(t, frequency, args.rare_words) for t in targets]
    work, encoder = Path(args.work), Encoder(args.bundle)
    query_texts = [data.corpus[i] for i in data.queries][: args.queries]
    relevant = [f"q{i}" for i in data.relevant][: args.queries]
    own = [f"q{i}" for i in data.queries][: args.queries]
    vectors, known_vectors = encoder.encode(query_texts), encoder.encode(known)
    sets = {
        "Quora": (corpus_index(work, "quora", questions, args), query_texts, vectors, relevant, own),
        f"Quora + {args.distractors:,} Wikipedia": (
            corpus_index(work, f"quora-wiki{args.distractors}", small, args),
            query_texts,
            vectors,
            relevant,
            own,
        ),
    }
    sets[f"known item ({args.rare_words} rarest words)"] = (
        sets[f"Quora + {args.distractors:,} Wikipedia"][0],
        known,
        known_vectors,
        [f"t{i}" for i in range(len(known))],
        None,
    )
    rows = []
    for name, (folder, texts, vecs, targets_ids, own_ids) in sets.items():
        index = LiveIndex(folder)
        row: dict[str, Any] = {"set": name, "documents": index.ntotal, "queries": len(texts)}
        for mode in MODES:
            found = top_ids(index, mode, texts, vecs, 11)
            row[mode] = scores(found, targets_ids, own_ids)
            print(name, mode, row[mode], flush=True)
        index.close()
        rows.append(row)
    speed = []
    sizes = {args.distractors: sets[f"Quora + {args.distractors:,} Wikipedia"][0]}
    large = questions + [(f"w{i}", t) for i, t in enumerate(wiki[: args.large])]
    sizes[len(large)] = corpus_index(work, f"quora-wiki{args.large}", large, args)
    for folder in sizes.values():
        index = LiveIndex(folder)
        timing = query_texts[: args.timed]
        for text in timing[:20]:  # warm: the lists and the term counts the planner caches
            index.search_hybrid(encoder.encode([text])[0], text, 10)
        p50 = p50_ms(index, encoder, timing)
        speed.append(
            {
                "documents": index.ntotal,
                "p50_ms": p50,
                "lexical_bytes_per_doc": lexical_bytes(folder, index.ntotal),
            }
        )
        index.close()
        if args.served_rounds and folder == sizes[len(large)]:
            speed[-1]["served"] = served_p50(args, folder, timing)
        print(speed[-1], flush=True)
    settings = {
        k: getattr(args, k)
        for k in ("bundle", "distractors", "known", "rare_words", "large", "nlist", "timed")
    }
    return {"quality": rows, "speed": speed, "settings": settings, "run": h.run_info("bench/hybrid.py", argv)}


def served_line(documents: int, served: dict[str, Any]) -> str:
    dense, hybrid = served["p50_ms"]["dense"], served["p50_ms"]["hybrid"]
    return (
        f"at {documents:,} documents, dense {dense:.2f} ms and hybrid {hybrid:.2f} ms, "
        f"**{hybrid / dense:.2f}x** ({served['client']}, the median of {len(served['rounds'])} alternating "
        "rounds)"
    )


def render(result: h.Result) -> str:
    header = ["set", "documents", *(f"{m} MRR@10 / R@10" for m in MODES), "hybrid / dense MRR"]
    cells = []
    for row in result["quality"]:
        pairs = [f"{row[m]['mrr10']:.2f} / {row[m]['recall10']:.2f}" for m in MODES]
        ratio = row["hybrid"]["mrr10"] / max(row["dense"]["mrr10"], 1e-9)
        cells.append([row["set"], f"{row['documents']:,}", *pairs, f"{ratio:.2f}x"])
    quality = h.markdown_table(header, cells)
    header = ["documents", *(f"{m} p50 ms" for m in MODES), "hybrid / dense", "lexical bytes per doc"]
    cells = [
        [f"{s['documents']:,}", *(f"{s['p50_ms'][m]:.2f}" for m in MODES),
         f"{s['p50_ms']['hybrid'] / s['p50_ms']['dense']:.2f}x", f"{s['lexical_bytes_per_doc']:,.0f}"]
        for s in result["speed"]
    ]  # fmt: skip
    st = result["settings"]
    note = (
        f"`{st['bundle']}`, IVF float32 (nlist {st['nlist']}, nprobe 5); lexical: BM25 over the query's "
        "rarest terms within 2,048 postings; hybrid: each side's top 50, min-max scaled scores summed "
        "1:1, the lexical side beside the dense one. "
        f"Quora: {result['quality'][0]['queries']:,} queries. Known item: "
        f"{st['known']:,} held-back Wikipedia sentences. Latency: {st['timed']} Quora queries one at a time "
        "in process, query encoding included for dense and hybrid."
    )
    served = [served_line(s["documents"], s["served"]) for s in result["speed"] if "served" in s]
    if served:
        note += (
            " Through `distilembed serve`, one /search at a time over HTTP, where a hybrid query's "
            "lexical side runs while the encoder makes its vector: " + "; ".join(served) + "."
        )
    return f"{quality}\n\n{h.markdown_table(header, cells)}\n\n{note}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="models/default")
    parser.add_argument("--data-dir", default=h.data_root())
    parser.add_argument("--distractors", type=int, default=100_000)
    parser.add_argument(
        "--large", type=int, default=1_000_000, help="Wikipedia sentences of the speed corpus"
    )
    parser.add_argument("--known", type=int, default=1000, help="known-item queries")
    parser.add_argument("--rare-words", type=int, default=3)
    parser.add_argument(
        "--held-back", type=int, default=950_000, help="known items: Wikipedia from this line"
    )
    parser.add_argument("--queries", type=int, default=10_000, help="Quora queries scored (at most)")
    parser.add_argument("--timed", type=int, default=300, help="queries timed per mode and size")
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--served-rounds", type=int, default=5, help="served p50 rounds (0: none)")
    parser.add_argument("--served-seconds", type=float, default=8.0, help="seconds per served phase")
    parser.add_argument("--work", default="runs/bench-hybrid", help="where the indexes are kept")
    parser.add_argument("--out", type=Path, default=h.RESULTS / "hybrid.json")
    h.add_doc_args(parser)
    args = parser.parse_args(argv)
    if not h.publish_saved(args, "hybrid", render):
        h.finish(args, run(args, argv), "hybrid", render)


if __name__ == "__main__":
    main()
