"""The full check behind ``index verify``: every recorded sha256, SQLite's integrity_check, and the
Faiss ids against the stored documents' ids."""

from __future__ import annotations

import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

from distilembed.artifacts import sha256_file
from distilembed.errors import BusyError, UserError
from index import lexical
from index.integrity import INDEX_FILE, STORE_FILE, has_records, match_record, read_index_manifest
from index.live import LiveIndex
from index.snapshot import SNAPSHOT_KIND, check_snapshot
from index.vectors import ids_of

VERIFY_RETRIES = 100  # a full check of an index another process writes retries until no write lands


def verify_index(directory: Path) -> dict[str, Any]:
    """The full check of an index (each shard; a snapshot's files); UserError names the first problem."""
    start, where = time.perf_counter(), f"index {directory}"
    manifest = read_index_manifest(directory, kinds=("index", "index_shards", SNAPSHOT_KIND))
    if manifest.get("kind") == "index_shards":
        shards = [verify_index(directory / name) for name in manifest["shards"]]
        return {"index": str(directory), "sound": True, "shards": shards}
    if manifest.get("kind") == SNAPSHOT_KIND:
        checked = check_snapshot(directory)["files"]
        return {"snapshot": str(directory), "sound": True, "files": dict.fromkeys(checked, "sha256 ok")}
    live = LiveIndex(directory, writable=False)  # sizes, the Faiss file's sha256, quick_check
    try:
        files: dict[str, str] = {}
        if has_records(live.manifest):
            files[INDEX_FILE] = "sha256 ok"
            for name, entry in live.manifest["files"].items():
                if name != INDEX_FILE and "sha256" in entry:
                    path = directory / name
                    match_record(where, name, entry, path.stat().st_size, sha256_file(path))
                    files[name] = "sha256 ok"
        problems = live.store.check(full=True)
        if problems:
            raise UserError(f"{where}: {STORE_FILE} fails SQLite's integrity_check: {problems[0]}")
        files[STORE_FILE] = "integrity_check ok"
        counts = _compare_ids(where, live)
        if live.store.lexical:
            _check_lexical(where, live)
            counts["lexical"] = "integrity-check ok"
    finally:
        live.close(checkpoint=False)
    unchecked = "none (written before they were kept; a checkpoint adds them)"
    checksums = "recorded" if INDEX_FILE in files else unchecked
    result = {"index": str(directory), "sound": True, "checksums": checksums, "files": files} | counts
    return result | {"seconds": round(time.perf_counter() - start, 3)}


def _compare_ids(where: str, live: LiveIndex) -> dict[str, Any]:
    """Faiss ids against the stored documents' ids, both as of one SQLite state (``data_version``)."""
    db = live.store.db
    for _ in range(VERIFY_RETRIES):
        before = db.execute("PRAGMA data_version").fetchone()[0]
        live.refresh()
        db.execute("BEGIN")
        try:
            stored = np.fromiter((row[0] for row in db.execute("SELECT int_id FROM docs")), dtype=np.int64)
            logged = int(db.execute("SELECT COUNT(*) FROM changes").fetchone()[0])
            after = db.execute("PRAGMA data_version").fetchone()[0]
        finally:
            db.execute("COMMIT")
        if after == before:
            break
    else:
        raise BusyError(f"{where}: writes kept landing while it was compared; verify it again")
    held = ids_of(live.index)
    if len(held) != len(stored) or not np.array_equal(np.sort(held), np.sort(stored)):
        missing, extra = np.setdiff1d(stored, held), np.setdiff1d(held, stored)
        raise UserError(
            f"{where}: the Faiss index holds {len(held):,} vectors and the store {len(stored):,} "
            f"documents once {logged} logged changes are replayed ({len(missing)} documents without a "
            f"vector, {len(extra)} vectors without a document)"
        )
    return {"ntotal": len(held), "documents": len(stored), "logged_changes": logged}


def _check_lexical(where: str, live: LiveIndex) -> None:
    """FTS5's integrity-check of the lexical index against the documents, on a private copy of the
    store: in place it would take the store's write lock, and a served index's writes would wait."""
    with (
        tempfile.TemporaryDirectory(prefix="distilembed-verify-") as tmp,
        closing(sqlite3.connect(f"{tmp}/{STORE_FILE}", isolation_level=None)) as copy,
    ):
        live.store.db.backup(copy)
        problems = lexical.check(copy)
    if problems:
        raise UserError(
            f"{where}: its lexical index ({lexical.TABLE}) fails FTS5's integrity-check ({problems[0]}): "
            f"rebuild it with 'distilembed index lexical {live.dir}'"
        )
