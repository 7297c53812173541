"""The lexical (BM25) side on two engines: SQLite FTS5 (the product's, with its query planning) and
tantivy (tantivy-py, block-max WAND top-k pruning). Block ``lexical-engines``:

    python bench/lexical_engines.py

Both corpora are bench/hybrid.py's: Quora + ``--distractors`` Wikipedia sentences + the known-item
targets, and Quora + ``--large`` Wikipedia sentences. FTS5 reuses that script's indexes under
``--work`` (built only when absent); tantivy's are built once beside them (``tantivy-<name>``). Per
corpus: build seconds and index bytes per document, then the p50 and p90 of one query at a time at
``--k`` (the hybrid candidate window) over ``--timed`` Quora questions, the engines taking turns on
each. On the smaller corpus also MRR@10 and recall@10 on the Quora queries (own entry dropped).
tantivy is searched with every term of the query (its pruning's claim) and with FTS5's planned terms.
Writes its JSON (--out) and the block of docs/results.md (--no-doc: not).
"""

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import unicodedata
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import harness as h
from hybrid import corpus_index, scores

from index import lexical
from index.integrity import STORE_FILE
from index.live import LiveIndex
from training.data.text import content_hash, read_sentences

try:
    import tantivy
except ImportError:
    sys.exit("error: tantivy is not installed (pip install tantivy==0.27.0): it is no product dependency")

ENGINES = ("FTS5 (planned terms)", "tantivy (all terms)", "tantivy (planned terms)")
ANALYZER = "fts5like"  # simple (alphanumeric runs) + lowercase + ascii_fold: unicode61 remove_diacritics 2
STAMP = "bench-stamp.json"
HEAP, THREADS = 1_000_000_000, 1  # one writer thread, one segment: as FTS5's 'optimize' leaves it
Docs = list[tuple[str, str]]
Search = Callable[[str, int], list[int]]  # the top-k int ids (FTS5) or rows (tantivy) of a text
Ids = Callable[[list[int]], list[str]]  # those as the documents' ids


def analyzer() -> Any:
    builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
    return builder.filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.ascii_fold()).build()


def fts5_tokens(text: str) -> list[str]:
    """Every token of ``text`` as FTS5 cuts it (index/lexical.py's ``query_terms``, repeats kept)."""
    folded = unicodedata.normalize("NFD", text.lower().encode("utf-8", "ignore").decode("utf-8"))
    return lexical._TOKEN.findall("".join(c for c in folded if not unicodedata.combining(c)))


def tantivy_index(folder: Path, docs: Docs) -> tuple[Any, dict[str, Any]]:
    """tantivy's index of ``docs`` (id: the row, fast; text: not stored, positions as FTS5 keeps them),
    built unless the stamp says these documents are in it; and the build's record."""
    stamp = {"docs": len(docs), "hash": content_hash([f"{i} {t}" for i, t in docs])}
    stamp |= {"analyzer": ANALYZER, "tantivy": tantivy.__version__, "threads": THREADS, "heap": HEAP}
    record = folder / STAMP
    saved = json.loads(record.read_text()) if record.is_file() else {}
    if {k: saved.get(k) for k in stamp} == stamp:
        index = tantivy.Index.open(str(folder))
        index.register_tokenizer(ANALYZER, analyzer())
        return index, saved | {"cached": True}
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    schema = tantivy.SchemaBuilder()
    schema.add_integer_field("id", fast=True)
    schema.add_text_field("text", tokenizer_name=ANALYZER, index_option="position")
    index = tantivy.Index(schema.build(), path=str(folder))
    index.register_tokenizer(ANALYZER, analyzer())
    start = time.perf_counter()
    writer = index.writer(heap_size=HEAP, num_threads=THREADS)
    for row, (_, text) in enumerate(docs):
        writer.add_document(tantivy.Document(id=row, text=text))
    writer.commit()
    writer.wait_merging_threads()
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name != STAMP)
    stamp |= {"build_s": round(seconds, 1), "bytes_per_doc": round(size / len(docs), 1)}
    h.write_json(record, stamp)
    index.reload()
    return index, stamp | {"cached": False}


def tantivy_searches(index: Any, store_db: sqlite3.Connection) -> dict[str, Search]:
    """Top-k rows by tantivy: every term of the text, or the terms FTS5's planner keeps. The user's text
    is never parsed as a query: its FTS5 terms, each through the field's analyzer, OR'ed."""
    searcher, schema, tokens, cache = index.searcher(), index.schema, analyzer(), {}

    def top(terms: list[str], k: int) -> list[int]:
        words = list(dict.fromkeys(w for t in terms for w in tokens.analyze(t)))
        if not words:
            return []
        should = [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "text", w)) for w in words]
        hits = searcher.search(tantivy.Query.boolean_query(should), k, count=False).hits  # count: no pruning
        return [int(r) for r in searcher.fast_field_values("id", [address for _, address in hits])]

    return {
        "tantivy (all terms)": lambda text, k: top(lexical.query_terms(text), k),
        "tantivy (planned terms)": lambda text, k: top(lexical.plan(store_db, text, cache), k),
    }


def fts5_cost(folder: Path, documents: int) -> dict[str, float]:
    """FTS5's bytes per document (hybrid.py's ``lexical_bytes``: the store VACUUMed with the table less
    without it) and its build seconds ('rebuild' + 'optimize', ``lexical.enable``) on a copy."""
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        copy = Path(tmp) / STORE_FILE
        shutil.copy(folder / STORE_FILE, copy)
        db = sqlite3.connect(copy, isolation_level=None)
        db.execute("VACUUM")
        with_it = copy.stat().st_size
        db.execute(f"DROP TABLE {lexical.TABLE}")
        db.execute("VACUUM")
        without = copy.stat().st_size
        start = time.perf_counter()
        db.execute("BEGIN")
        lexical.enable(db)
        db.execute("COMMIT")
        seconds = time.perf_counter() - start
        db.close()
    return {"build_s": round(seconds, 1), "bytes_per_doc": round((with_it - without) / documents, 1)}


def fts5_index(work: Path, name: str, docs: Docs, args: argparse.Namespace) -> Path:
    """bench/hybrid.py's index of ``docs``: reused, built when absent, never rebuilt over another."""
    folder = work / name
    manifest = folder / "manifest.json"
    stamp = content_hash([f"{i} {t}" for i, t in docs])
    if manifest.is_file() and json.loads(manifest.read_text()).get("bench_docs") != stamp:
        sys.exit(f"error: {folder} holds other documents than this run's: run bench/hybrid.py first")
    return corpus_index(work, name, docs, args)


def timings(engines: dict[str, Search], texts: list[str], k: int) -> dict[str, dict[str, float]]:
    """p50 and p90 ms of one query at a time; the engines take turns on each query, the first of them
    rotating (the one before warms the pages the next reads)."""
    for text in texts[:20]:  # warm: the pages, and the term counts the planner caches
        for search in engines.values():
            search(text, k)
    spent: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for turn, text in enumerate(texts):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            search = engines[name]
            start = time.perf_counter()
            search(text, k)
            spent[name].append(time.perf_counter() - start)
    return {
        name: {
            "p50": round(1000 * statistics.median(s), 2),
            "p90": round(1000 * statistics.quantiles(s, n=10)[8], 2),
        }
        for name, s in spent.items()
    }


def fts5_ids(store: Any) -> Ids:
    def ids(int_ids: list[int]) -> list[str]:
        found = store.get_many(int_ids)
        return [found[i].id for i in int_ids if i in found]

    return ids


def row_ids(docs: Docs) -> Ids:
    return lambda rows: [docs[r][0] for r in rows]


def run(args: argparse.Namespace, argv: list[str]) -> h.Result:
    data = h.load_quora_retrieval(Path(args.data_dir) / "quora")
    wiki_path = Path(args.data_dir) / h.WIKIPEDIA
    wiki = read_sentences(wiki_path, limit=max(args.large, args.distractors))
    later = read_sentences(wiki_path, limit=50_000, skip=args.held_back)
    pool = [t for t in later if len(lexical.query_terms(t)) >= 10]
    targets = pool[:: max(1, 40_000 // args.known)][: args.known]  # as bench/hybrid.py picks them
    questions = [(f"q{i}", t) for i, t in enumerate(data.corpus)]
    small = questions + [(f"w{i}", t) for i, t in enumerate(wiki[: args.distractors])]
    small += [(f"t{i}", t) for i, t in enumerate(targets)]
    large = questions + [(f"w{i}", t) for i, t in enumerate(wiki[: args.large])]
    query_texts = [data.corpus[i] for i in data.queries][: args.queries]
    relevant = [f"q{i}" for i in data.relevant][: args.queries]
    own = [f"q{i}" for i in data.queries][: args.queries]
    corpora = {
        f"Quora + {args.distractors:,} Wikipedia": (f"quora-wiki{args.distractors}", small, True),
        f"Quora + {args.large:,} Wikipedia": (f"quora-wiki{args.large}", large, False),
    }
    work, rows, tokenizer = Path(args.work), [], analyzer()
    for corpus, (name, docs, scored) in corpora.items():
        folder = fts5_index(work, name, docs, args)
        index = LiveIndex(folder, writable=False)
        if index.ntotal != len(docs):
            sys.exit(f"error: {folder} holds {index.ntotal:,} documents, this run's corpus {len(docs):,}")
        tindex, built = tantivy_index(work / f"tantivy-{name}", docs)
        sample = docs[:: max(1, len(docs) // 20_000)]
        differ = sum(tokenizer.analyze(t) != fts5_tokens(t) for _, t in sample) / len(sample)
        print(corpus, "tantivy", built, f"tokens differ from FTS5's on {100 * differ:.2f}%", flush=True)
        store = index.store  # the call hybrid search makes: int ids, no documents read
        engines = {
            "FTS5 (planned terms)": lambda text, k, store=store: [i for i, _ in store.lexical_search(text, k)]
        }
        engines |= tantivy_searches(tindex, store.db)
        speed = timings(engines, query_texts[: args.timed], args.k)
        fts5 = fts5_cost(folder, len(docs))
        for engine, search in engines.items():
            tantivy_side = engine.startswith("tantivy")
            cost = built if tantivy_side else fts5
            row: dict[str, Any] = {"engine": engine, "corpus": corpus, "documents": len(docs)}
            row |= {key: cost[key] for key in ("build_s", "bytes_per_doc")} | speed[engine]
            row |= {"tokens_differ_pct": round(100 * differ, 2) if tantivy_side else None, "quality": None}
            if scored:
                ids = row_ids(docs) if tantivy_side else fts5_ids(store)
                found = [ids(search(text, 11)) for text in query_texts]
                row["quality"] = scores(found, relevant, own)
            print(row, flush=True)
            rows.append(row)
        index.close()
    settings = {k: getattr(args, k) for k in ("distractors", "large", "known", "queries", "timed", "k")}
    settings |= {"tantivy": metadata.version("tantivy"), "analyzer": "simple + lowercase + ascii_fold"}
    settings |= {"writer_threads": THREADS, "writer_heap": HEAP}
    return {"rows": rows, "settings": settings, "run": h.run_info("bench/lexical_engines.py", argv)}


def render(result: h.Result) -> str:
    header = ["engine", "documents", "build s", "docs/s", "bytes/doc", "p50 ms", "p90 ms", "MRR@10 / R@10"]
    cells = []
    for r in result["rows"]:
        quality = f"{r['quality']['mrr10']:.2f} / {r['quality']['recall10']:.2f}" if r["quality"] else "-"
        rate = f"{r['documents'] / r['build_s']:,.0f}" if r["build_s"] else "-"
        cells.append(
            [r["engine"], f"{r['documents']:,}", f"{r['build_s']:.1f}", rate, f"{r['bytes_per_doc']:.1f}",
             f"{r['p50']:.2f}", f"{r['p90']:.2f}", quality]
        )  # fmt: skip
    st = result["settings"]
    note = (
        f"Latency: {st['timed']} Quora questions one at a time in process, top {st['k']}, the engines "
        "taking turns on each query. FTS5: BM25 over the query's rarest terms within 2,048 postings "
        f"(index/lexical.py); tantivy {st['tantivy']} ({st['analyzer']}, {st['writer_threads']} writer "
        "thread, one commit), every term OR'ed, or the terms FTS5's planner keeps (counted by FTS5). "
        f"Build: FTS5 'rebuild' + 'optimize' of the table; bytes/doc: the files (tantivy), the store "
        f"with the table less without it (FTS5). Quality: {st['queries']:,} Quora queries at most, own "
        "entry dropped."
    )
    return f"{h.markdown_table(header, cells)}\n\n{note}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="models/default", help="encodes an FTS5 index built here")
    parser.add_argument("--data-dir", default=h.data_root())
    parser.add_argument("--distractors", type=int, default=100_000)
    parser.add_argument(
        "--large", type=int, default=1_000_000, help="Wikipedia sentences of the large corpus"
    )
    parser.add_argument("--known", type=int, default=1000, help="known-item targets in the smaller corpus")
    parser.add_argument(
        "--held-back", type=int, default=950_000, help="known items: Wikipedia from this line"
    )
    parser.add_argument("--queries", type=int, default=10_000, help="Quora queries scored (at most)")
    parser.add_argument("--timed", type=int, default=300, help="queries timed per engine and corpus")
    parser.add_argument("--k", type=int, default=50, help="hits per timed query (the hybrid window)")
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--work", default="runs/bench-hybrid", help="where the indexes are kept")
    parser.add_argument("--out", type=Path, default=h.RESULTS / "lexical-engines.json")
    h.add_doc_args(parser)
    args = parser.parse_args(argv)
    if not h.publish_saved(args, "lexical-engines", render):
        h.finish(args, run(args, argv), "lexical-engines", render)


if __name__ == "__main__":
    main()
