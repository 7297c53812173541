"""Lexical (BM25) search beside the vectors: a 128-d student blurs rare names, codes and numbers that
an inverted index finds exactly. It is an SQLite FTS5 table inside the document store, so writes,
snapshots, shards and kill -9 treat it as they treat the documents.

The table is external-content (``content='docs'``): FTS5 keeps only its inverted index and reads the
text from ``docs``. The store's write statements keep it in step in their own transaction
(``index_rows`` and ``unindex_rows``, index/store.py), not triggers: the store's connections run with
``trusted_schema=OFF`` (docs/decisions.md, 26), and SQLite 3.40 refuses any trigger, TEMP ones too,
that writes an FTS5 table there ("unsafe use of virtual table"). A user's text reaches FTS5 only as
quoted strings OR'ed together (``match_query``): its syntax is never interpreted, and BM25 ranks a
document by the rare words it shares with the query.
"""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from collections.abc import Sequence
from typing import Any, NamedTuple

from distilembed.errors import first_line

TABLE = "docs_fts"
# unicode61: Unicode word boundaries and case folding; remove_diacritics 2: "Zurich" finds "Zürich"
# (mode 1 misses letters carrying several marks)
CREATE = (
    f"CREATE VIRTUAL TABLE IF NOT EXISTS {TABLE} USING fts5(text, content='docs', "
    "content_rowid='int_id', tokenize='unicode61 remove_diacritics 2')"
)
_IDS = "int_id IN (SELECT value FROM json_each(?))"
_INDEX = f"INSERT INTO {TABLE} (rowid, text) SELECT int_id, text FROM docs WHERE {_IDS}"
# An external-content row is removed by naming the text it was indexed with: read it before it changes.
_UNINDEX = f"INSERT INTO {TABLE} ({TABLE}, rowid, text) SELECT 'delete', int_id, text FROM docs WHERE {_IDS}"
MAX_TERMS = 64
# A query is planned by document frequency (``plan``): FTS5 scores every document holding any term of
# an OR query, so at 1M sentences a question with "the" and "is" in it took 0.6-0.8 s. The rarest terms
# are kept while their documents add up to POSTINGS_BUDGET (about 1.5 us each here; decision 65); terms
# in more than STOPWORD_SHARE of the documents (and the budget) carry almost no BM25 weight and are
# never searched.
POSTINGS_BUDGET = 2048
STOPWORD_SHARE = 0.05
DF_CACHE_SIZE = 65_536
_TOKEN = re.compile(r"[^\W_]+")  # letters and digits, as FTS5's unicode61 tokenizer cuts text


def enabled(db: sqlite3.Connection, schema: str = "main") -> bool:
    """Whether ``schema`` (main, or an attached database's name) holds the lexical table."""
    query = f"SELECT 1 FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?"
    return db.execute(query, (TABLE,)).fetchone() is not None


def enable(db: sqlite3.Connection) -> bool:
    """Create the table if missing and (re)build it from ``docs``; run it inside a write transaction.
    Returns whether it was created (idempotent: a rebuild also repairs a damaged one)."""
    created = not enabled(db)
    db.execute(CREATE)
    db.execute(f"INSERT INTO {TABLE} ({TABLE}) VALUES ('rebuild')")
    db.execute(f"INSERT INTO {TABLE} ({TABLE}) VALUES ('optimize')")  # one segment: fewer pages a term
    return created


def index_rows(db: sqlite3.Connection, int_ids: Sequence[int]) -> None:
    """Index the current text of these documents (after they were written)."""
    db.execute(_INDEX, (_json_ids(int_ids),))


def unindex_rows(db: sqlite3.Connection, int_ids: Sequence[int]) -> None:
    """Remove these documents from the index (before their text changes or they are deleted)."""
    db.execute(_UNINDEX, (_json_ids(int_ids),))


def _json_ids(int_ids: Sequence[int]) -> str:
    return "[" + ",".join(str(int(i)) for i in int_ids) + "]"


def query_terms(text: str) -> list[str]:
    """The distinct tokens of ``text`` as FTS5 indexed them (case folded, diacritics removed: its
    ``remove_diacritics 2``), at most ``MAX_TERMS``; lone surrogates (no UTF-8) are dropped."""
    folded = unicodedata.normalize("NFD", text.lower().encode("utf-8", "ignore").decode("utf-8"))
    plain = "".join(c for c in folded if not unicodedata.combining(c))
    return list(dict.fromkeys(_TOKEN.findall(plain)))[:MAX_TERMS]


def match_query(terms: Sequence[str]) -> str | None:
    """An FTS5 query OR-ing ``terms``, each a quoted string ('"' doubled): FTS5 never reads a user's
    text as its query syntax; None without terms."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms) or None


class TermCount(NamedTuple):
    documents: int  # documents holding the term, counted up to a cap
    exact: bool  # False: at least ``documents`` (the cap was reached)


def document_frequencies(
    db: sqlite3.Connection, terms: Sequence[str], cache: dict[str, TermCount], cap: int
) -> dict[str, int]:
    """Documents holding each term, counted up to ``cap`` (``cap``: at least that many; a stopword's
    full count would read its whole posting list); ``cache`` keeps them. A planning figure: it may lag
    writes."""
    if len(cache) + len(terms) > DF_CACHE_SIZE:
        cache.clear()
    count = f"SELECT count(*) FROM (SELECT 1 FROM {TABLE} WHERE {TABLE} MATCH ? LIMIT ?)"
    found = {}
    for term in terms:
        known = cache.get(term)
        if known is None or (not known.exact and known.documents < cap):
            documents = int(db.execute(count, (match_query([term]), cap)).fetchone()[0])
            known = cache[term] = TermCount(documents, documents < cap)
        found[term] = min(known.documents, cap)
    return found


def plan(
    db: sqlite3.Connection, text: str, cache: dict[str, TermCount], budget: int = POSTINGS_BUDGET
) -> list[str]:
    """The terms of ``text`` to search: the rarest first while their documents add up to ``budget``
    (the rarest one always), none in more than ``STOPWORD_SHARE`` of the documents (and ``budget``:
    a small index has no stopwords)."""
    documents = db.execute("SELECT max(int_id) FROM docs").fetchone()[0] or 0
    common = int(max(STOPWORD_SHARE * documents, budget))
    terms = query_terms(text)
    # Counted up to the budget first: once a term within it is kept, no term over it can join, so
    # those need no exact count (at 1M documents a count up to 5% read up to 50,000 postings a term).
    counts = document_frequencies(db, terms, cache, budget + 1)
    if not any(0 < n <= budget for n in counts.values()):  # the rarest is over the budget: which one?
        counts = document_frequencies(db, terms, cache, common + 1)
    kept: list[str] = []
    total = 0
    for term in sorted((t for t, n in counts.items() if 0 < n <= common), key=lambda t: counts[t]):
        if kept and total + counts[term] > budget:
            break
        kept.append(term)
        total += counts[term]
    return kept


def search(
    db: sqlite3.Connection,
    text: str,
    k: int,
    where_sql: str | None = None,
    params: Sequence[Any] = (),
    *,
    cache: dict[str, TermCount] | None = None,
) -> list[tuple[int, float]]:
    """The top-k (int id, BM25 score over the planned terms, higher is better) for ``text``, ties by
    id; ``where_sql``: a condition on each matching ``docs`` row (index/filter_sql.py, per row) with
    its ``params``; ``cache``: document frequencies kept between calls. User text and filter values
    reach SQLite as bound parameters only."""
    query = match_query(plan(db, text, {} if cache is None else cache))
    if query is None or k < 1:
        return []
    # the text's matches drive the loop (CROSS JOIN keeps that order): a filter costs what they cost
    joined = f" CROSS JOIN docs ON docs.int_id = {TABLE}.rowid" if where_sql else ""
    condition = f" AND ({where_sql})" if where_sql else ""
    sql = (
        f"SELECT {TABLE}.rowid, bm25({TABLE}) AS r FROM {TABLE}{joined} "
        f"WHERE {TABLE} MATCH ?{condition} ORDER BY r, {TABLE}.rowid LIMIT ?"
    )
    return [(int(i), -float(r)) for i, r in db.execute(sql, [query, *params, k])]


def check(db: sqlite3.Connection) -> list[str]:
    """FTS5's integrity-check, the index against the documents' text too; [] if sound. It is a write
    statement: SQLite refuses it on a read-only connection and takes the write lock for it."""
    try:
        db.execute(f"INSERT INTO {TABLE} ({TABLE}, rank) VALUES ('integrity-check', 1)")
    except sqlite3.DatabaseError as exc:
        return [first_line(exc)]
    return []
