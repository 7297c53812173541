"""The full check behind ``index verify``: every recorded sha256, SQLite's integrity_check, and the
Faiss ids against the stored documents' ids."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from distilembed.artifacts import read_manifest, sha256_file
from distilembed.errors import BusyError, UserError
from index.integrity import INDEX_FILE, STORE_FILE, has_records, ids_of, match_record
from index.live import LiveIndex
from index.snapshot import SNAPSHOT_KIND, check_snapshot

VERIFY_RETRIES = 100  # a full check of an index another process writes retries until no write lands


def verify_index(directory: Path) -> dict[str, Any]:
    """The full check of an index directory (each shard of a sharded one; a snapshot's files):
    every recorded sha256, SQLite's integrity_check, and that the Faiss index holds exactly the
    stored documents' ids once the change log is replayed. Returns what was checked; UserError
    names the first problem."""
    start, where = time.perf_counter(), f"index {directory}"
    if not (directory / "manifest.json").is_file():
        raise UserError(f"not an index directory (no manifest.json): {directory}")
    manifest = read_manifest(directory)
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
                    match_record(
                        where, name, entry, (directory / name).stat().st_size, sha256_file(directory / name)
                    )
                    files[name] = "sha256 ok"
        problems = live.store.check(full=True)
        if problems:
            raise UserError(f"{where}: {STORE_FILE} fails SQLite's integrity_check: {problems[0]}")
        files[STORE_FILE] = "integrity_check ok"
        counts = _compare_ids(where, live)
    finally:
        live.close(checkpoint=False)
    checksums = (
        "recorded" if INDEX_FILE in files else "none (written before they were kept; a checkpoint adds them)"
    )
    return (
        {"index": str(directory), "sound": True, "checksums": checksums, "files": files}
        | counts
        | {"seconds": round(time.perf_counter() - start, 3)}
    )


def _compare_ids(where: str, live: LiveIndex) -> dict[str, Any]:
    """Faiss ids against the stored documents' ids, both as of one SQLite state: the index is
    brought up to the log, then the documents read, and the pair kept only if no other
    connection committed in between (``PRAGMA data_version``)."""
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
