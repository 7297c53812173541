"""SQLite document store: external string id -> stable int64 id, text and JSON metadata; optionally a
lexical (BM25) index of the text (index/lexical.py), kept in step by every write here."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from distilembed.errors import UserError
from index import filter_sql, lexical
from index.filter_cache import MatchCache
from index.filters import MATCH_ALL, Node, conditions, join_path, split_path

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    int_id   INTEGER PRIMARY KEY,
    ext_id   TEXT    NOT NULL UNIQUE,
    text     TEXT    NOT NULL,
    metadata TEXT    NOT NULL DEFAULT '{}'
);
-- Vector changes not yet folded into the Faiss file: replayed in seq order when an index is
-- opened, deleted once a checkpoint has saved them. A NULL vector is a delete.
CREATE TABLE IF NOT EXISTS changes (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    int_id INTEGER NOT NULL,
    vector BLOB
);
"""


def _metadata(stored: str) -> dict[str, Any]:
    """A row's metadata: most documents have none, and orjson parses the rest ~5x faster than json
    (a 32-query search reads 320 rows); json for what orjson refuses (NaN, integers over 64 bits)."""
    if stored == "{}":
        return {}
    try:
        return orjson.loads(stored)
    except orjson.JSONDecodeError:
        return json.loads(stored)


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


# Durability and safety of every connection (docs/decisions.md, 26; a snapshot may come from anywhere).
PRAGMAS = (
    "journal_mode=WAL",
    "synchronous=FULL",
    "fullfsync=ON",
    "checkpoint_fullfsync=ON",
    "journal_size_limit=67108864",
    "cell_size_check=ON",
    "trusted_schema=OFF",
    # 64 MiB, not the 2 MiB default: a BM25 query reads each matching document's size and postings
    # pages, and at 1M documents those reads through the OS doubled its time (decision 65)
    "cache_size=-65536",
)
BUSY_TIMEOUT_S = 10.0  # a connection meeting a lock (WAL recovery, a checkpoint) waits, not fails
UPSERT_DOC = (  # a replaced document keeps its int id
    "INSERT INTO docs (ext_id, text, metadata) VALUES (?, ?, ?) ON CONFLICT (ext_id) "
    "DO UPDATE SET text = excluded.text, metadata = excluded.metadata RETURNING int_id"
)
INSERT_FIELD_VALUE = "INSERT INTO field_values (field, kind, value, int_id) VALUES (?, ?, ?, ?)"
SOURCE_HAS_FIELDS = "SELECT 1 FROM source.sqlite_master WHERE type = 'table' AND name = 'indexed_fields'"
IDS_PARAM = "SELECT value FROM json_each(?)"  # a list of int ids as one parameter
LOG_CHANGE = "INSERT INTO changes (int_id, vector) VALUES (?, ?)"  # a NULL vector: a delete


def sqlite_problems(db: sqlite3.Connection, pragma: str = "quick_check(20)") -> list[str]:
    """What SQLite's own check (``pragma``) finds wrong with the database, [] if it is sound."""
    try:
        rows = [str(row[0]) for row in db.execute(f"PRAGMA {pragma}").fetchall()]
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    return [] if rows == ["ok"] else rows


class DocumentStore:
    """One SQLite file, a transaction a write; ``readonly``: writes refused (``PRAGMA query_only``)."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.db = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None
        )
        for pragma in PRAGMAS:
            self.db.execute(f"PRAGMA {pragma}")
        self.db.executescript(SCHEMA)
        filter_sql.install(self.db)
        self._commits = 0  # this connection's commits: with data_version, what a cached match set saw
        self.matches = MatchCache()
        self._term_counts: dict[str, lexical.TermCount] = {}  # documents per lexical term, for planning
        if readonly:
            self.db.execute("PRAGMA query_only=ON")

    def close(self) -> None:
        self.db.close()

    def check(self, full: bool = False) -> list[str]:
        """SQLite's ``quick_check``, or ``integrity_check`` with ``full``."""
        return sqlite_problems(self.db, "integrity_check(20)" if full else "quick_check(20)")

    def upsert(
        self, docs: Sequence[Document], vectors: np.ndarray | None = None
    ) -> tuple[list[int], list[int]]:
        """Insert or replace by external id, the last occurrence winning, a replaced document keeping its
        int id, ``vectors`` logged in the same transaction; returns (int ids, replaced int ids)."""
        last = {doc.id: doc for doc in docs}
        rows = {doc.id: i for i, doc in enumerate(docs)}  # the last row of each id
        existing = self.int_ids(last)
        replaced = sorted(existing.values())
        with self._transaction():
            fields, fts = self.indexed_fields(), lexical.enabled(self.db)
            if fields and replaced:
                self._drop_field_values(replaced)
            if fts and replaced:
                lexical.unindex_rows(self.db, replaced)
            for doc in last.values():
                meta = json.dumps(doc.metadata, ensure_ascii=False, sort_keys=True)
                existing[doc.id] = int(self.db.execute(UPSERT_DOC, (doc.id, doc.text, meta)).fetchone()[0])
                if fields:
                    values = filter_sql.index_rows(existing[doc.id], doc.metadata, fields)
                    self.db.executemany(INSERT_FIELD_VALUE, values)
                if vectors is not None:
                    blob = np.ascontiguousarray(vectors[rows[doc.id]], dtype="<f4").tobytes()
                    self.db.execute(LOG_CHANGE, (existing[doc.id], blob))
            if fts:
                lexical.index_rows(self.db, [existing[ext] for ext in last])
        return [existing[doc.id] for doc in docs], replaced

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction, taken at once (BEGIN IMMEDIATE); rolled back on any exception."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        self._commits += 1

    def _select_in(self, columns: str, key: str, values: Sequence[object]) -> list[tuple]:
        """``SELECT columns FROM docs WHERE key IN values``, in chunks under SQLite's variable limit."""
        rows: list[tuple] = []
        for lo in range(0, len(values), 500):
            chunk = list(values[lo : lo + 500])
            marks = ",".join("?" * len(chunk))
            rows += self.db.execute(f"SELECT {columns} FROM docs WHERE {key} IN ({marks})", chunk).fetchall()
        return rows

    def int_ids(self, ext_ids: Iterable[str]) -> dict[str, int]:
        return {ext: int(i) for ext, i in self._select_in("ext_id, int_id", "ext_id", list(ext_ids))}

    def get(self, ext_id: str) -> Document | None:
        rows = self._select_in("ext_id, text, metadata", "ext_id", [ext_id])
        return Document(rows[0][0], rows[0][1], _metadata(rows[0][2])) if rows else None

    def get_many(self, int_ids: Sequence[int]) -> dict[int, Document]:
        rows = self._select_in("int_id, ext_id, text, metadata", "int_id", [int(i) for i in int_ids])
        return {r[0]: Document(r[1], r[2], _metadata(r[3])) for r in rows}

    def page(self, after: int, limit: int) -> list[tuple[int, Document]]:
        """Up to ``limit`` (int id, document) with an int id above ``after``, in int id order."""
        query = "SELECT int_id, ext_id, text, metadata FROM docs WHERE int_id > ? ORDER BY int_id LIMIT ?"
        return [
            (int(r[0]), Document(r[1], r[2], _metadata(r[3]))) for r in self.db.execute(query, (after, limit))
        ]

    def delete_logged(self, ext_ids: Sequence[str]) -> dict[str, int]:
        """Delete documents and log their vector removals in one transaction; return {ext id: int id}."""
        gone: dict[str, int] = {}
        with self._transaction():
            if lexical.enabled(self.db):
                lexical.unindex_rows(self.db, list(self.int_ids(ext_ids).values()))
            for ext in dict.fromkeys(ext_ids):
                row = self.db.execute("DELETE FROM docs WHERE ext_id = ? RETURNING int_id", (ext,)).fetchone()
                if row:
                    gone[ext] = int(row[0])
                    self._drop_field_values([gone[ext]])
                    self.db.execute(LOG_CHANGE, (gone[ext], None))
        return gone

    def changes(self, after: int = 0) -> list[tuple[int, int, bytes | None]]:
        """Logged vector changes past seq ``after``: (seq, int id, float32 bytes or None), oldest first."""
        query = "SELECT seq, int_id, vector FROM changes WHERE seq > ? ORDER BY seq"
        return self.db.execute(query, (after,)).fetchall()

    def last_change(self) -> int | None:
        """The newest logged change's seq (None: the log is empty), without reading the vectors."""
        return self.db.execute("SELECT MAX(seq) FROM changes").fetchone()[0]

    def count_changes(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM changes").fetchone()[0]

    def drop_changes(self, up_to_seq: int) -> None:
        self.db.execute("DELETE FROM changes WHERE seq <= ?", (up_to_seq,))

    def indexed_fields(self) -> tuple[str, ...]:
        """The fields with a payload index, read each time: another process may have added one."""
        return tuple(r[0] for r in self.db.execute("SELECT field FROM indexed_fields ORDER BY field"))

    def add_field_index(self, field: str) -> bool:
        """Index ``field`` for filters, kept in step with every write; False if it was indexed already."""
        try:
            field = join_path(split_path(field))
        except ValueError as exc:
            raise UserError(f"field {field!r}: {exc}") from None
        with self._transaction():
            if field in self.indexed_fields():
                return False
            self.db.execute("INSERT INTO indexed_fields (field) VALUES (?)", (field,))
            rows = self.db.execute("SELECT int_id, metadata FROM docs")
            while chunk := rows.fetchmany(10_000):
                values = [
                    r for i, meta in chunk for r in filter_sql.index_rows(i, json.loads(meta), (field,))
                ]
                self.db.executemany(INSERT_FIELD_VALUE, values)
        return True

    @property
    def lexical(self) -> bool:
        """Whether the store keeps a lexical index (index/lexical.py), read each time as fields are."""
        return lexical.enabled(self.db)

    def enable_lexical(self) -> bool:
        """Add the lexical index, or rebuild it, in one transaction; True if it was added."""
        self._term_counts.clear()
        with self._transaction():
            return lexical.enable(self.db)

    def lexical_search(self, text: str, k: int, node: Node | None = None) -> list[tuple[int, float]]:
        """The top-k (int id, BM25 score) for ``text`` among the documents passing ``node``."""
        if not self.lexical:
            where = self.path.parent
            raise UserError(f"{where} has no lexical index: add it with 'distilembed index lexical {where}'")
        if node is None or node == MATCH_ALL:
            return lexical.search(self.db, text, k, cache=self._term_counts)
        sql, params = filter_sql.compile_where(node, self.indexed_fields(), per_row=True)
        return lexical.search(self.db, text, k, sql, params, cache=self._term_counts)

    def _drop_field_values(self, int_ids: Sequence[int]) -> None:
        self.db.execute(f"DELETE FROM field_values WHERE int_id IN ({IDS_PARAM})", (json.dumps(int_ids),))

    def _matching_ids_sql(self, node: Node) -> tuple[str, list[Any]]:
        """A SELECT of the matching int ids: from the payload index if it covers the filter, else a scan."""
        fields = self.indexed_fields()
        if (compiled := filter_sql.compile_ids(node, fields)) is not None:
            return compiled
        sql, params = filter_sql.compile_where(node, fields)
        return f"SELECT int_id FROM docs WHERE {sql}", params

    def _state(self) -> tuple[int, int]:
        """Moves with every commit: this connection's, or another's (SQLite's ``data_version``)."""
        return self._commits, int(self.db.execute("PRAGMA data_version").fetchone()[0])

    def known_matches(self, node: Node) -> tuple[int, np.ndarray | None] | None:
        """(count, ids if kept) of the filter's matches, if a search since the last write found them."""
        return self.matches.get(node, self._state())

    def ids_matching(self, node: Node) -> np.ndarray:
        """Int ids (int64, ascending) of the documents that pass the filter (index/filter_cache.py)."""
        state = self._state()
        hit = self.matches.get(node, state)
        if hit is not None and hit[1] is not None:
            return hit[1]
        ids = self._find_ids(node)
        self.matches.put(node, state, ids)
        return ids

    def _find_ids(self, node: Node) -> np.ndarray:
        sql, params = self._matching_ids_sql(node)
        # one string through the C layer instead of a Python tuple per row
        query = f"SELECT group_concat(int_id) FROM (SELECT DISTINCT int_id FROM ({sql}) ORDER BY int_id)"
        text = self.db.execute(query, params).fetchone()[0]
        return np.fromstring(text, dtype=np.int64, sep=",") if text else np.zeros(0, np.int64)

    def count_matching(self, node: Node) -> int:
        if (known := self.known_matches(node)) is not None:
            return known[0]
        sql, params = self._matching_ids_sql(node)
        return int(self.db.execute(f"SELECT COUNT(DISTINCT int_id) FROM ({sql})", params).fetchone()[0])

    def which_match(self, node: Node, int_ids: Sequence[int]) -> set[int]:
        """Those of ``int_ids`` that pass the filter (from the payload index alone if it covers it)."""
        fields = self.indexed_fields()
        sql, params = filter_sql.compile_where(node, fields, per_row=True)
        if all(c.field in fields for c in conditions(node)):
            query = f"WITH ids(int_id) AS ({IDS_PARAM}) SELECT int_id FROM ids AS docs WHERE {sql}"
        else:
            query = f"SELECT int_id FROM docs WHERE int_id IN ({IDS_PARAM}) AND {sql}"
        return {int(r[0]) for r in self.db.execute(query, [json.dumps([int(i) for i in int_ids]), *params])}

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM docs").fetchone()[0])

    def copy_documents_from(self, source: Path, keep: Callable[[str], bool]) -> int:
        """Copy the documents whose external id ``keep`` accepts, int ids kept; returns how many."""
        self.db.create_function("keep_id", 1, lambda ext: int(keep(ext)), deterministic=True)
        self.db.execute("ATTACH DATABASE ? AS source", (str(source),))
        try:
            with self._transaction():
                cur = self.db.execute("INSERT INTO docs SELECT * FROM source.docs WHERE keep_id(ext_id)")
                if self.db.execute(SOURCE_HAS_FIELDS).fetchone():
                    self.db.execute(
                        "INSERT OR IGNORE INTO indexed_fields SELECT field FROM source.indexed_fields"
                    )
                    self.db.execute(
                        "INSERT INTO field_values SELECT v.* FROM source.field_values v "
                        "WHERE v.int_id IN (SELECT int_id FROM docs)"
                    )
                if lexical.enabled(self.db, "source") or lexical.enabled(self.db):
                    lexical.enable(self.db)
        finally:
            self.db.execute("DETACH DATABASE source")
        return int(cur.rowcount)
