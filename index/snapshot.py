"""Snapshots of an index directory while it serves and is written, and their restore
(docs/decisions.md, 27). A snapshot pins one instant: it opens the Faiss file (pinning its inode:
files are replaced by rename), begins a SQLite read transaction, reads the manifest and checks the
path still names the pinned inode, then opens any rescoring file (renamed in before the Faiss file,
so it holds every row the log lacks). A writer pins under its lock, a reader retries. Then, with no
lock held, the files are hard-linked or copied and the transaction's state copied by SQLite's backup.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, closing, nullcontext
from pathlib import Path
from typing import Any

from distilembed.artifacts import MANIFEST, atomic_directory, atomic_write_json, now_iso, read_manifest
from distilembed.errors import BusyError, UserError
from index import integrity
from index.integrity import INDEX_FILE, IVFDATA_FILE, RESCORE_FILE, STORE_FILE, file_identity
from index.store import DocumentStore, sqlite_problems

SNAPSHOT_KIND, PAYLOAD = "index_snapshot", "index"
PAYLOAD_FILES = (MANIFEST, INDEX_FILE, STORE_FILE, IVFDATA_FILE, RESCORE_FILE)
PIN_RETRIES = 1000  # each retry means a checkpoint landed within the few microseconds of a pin
Pin = Callable[[], AbstractContextManager[dict[str, Any]]]


def take_snapshot(
    directory: Path, out: Path, overwrite: bool = False, pin: Pin | None = None, link: bool = True
) -> dict[str, Any]:
    """Snapshot the index at ``directory`` into the new directory ``out``; ``pin``: the writer's guard
    (``LiveIndex._pinned``); ``link``: hard-link the files where the filesystem allows, else copy."""
    start, where = time.perf_counter(), f"index {directory}"
    shards_hint = {"index_shards": " (snapshot each shard of a sharded index)"}
    manifest = integrity.read_index_manifest(directory, hints=shards_hint)
    integrity.refuse_existing(out, overwrite)
    integrity.check_static_files(where, directory, manifest)  # and never create a store
    store = DocumentStore(directory / STORE_FILE, readonly=True)
    try:
        with atomic_directory(out, overwrite=overwrite) as tmp:
            payload = tmp / PAYLOAD
            payload.mkdir()
            fds, manifest, blocked = _pin(directory, store, pin)
            try:
                if (directory / IVFDATA_FILE).is_file():  # on-disk lists: never written after the build
                    fds[IVFDATA_FILE] = os.open(directory / IVFDATA_FILE, os.O_RDONLY)
                copied = {n: _link_or_copy(directory / n, fd, payload / n, link) for n, fd in fds.items()}
            finally:
                for fd in fds.values():
                    os.close(fd)
            ntotal = store.count()
            _backup(store.db, payload / STORE_FILE)
            store.db.execute("COMMIT")
            records = _check_copies(where, payload, manifest)
            described = manifest | {"ntotal": ntotal, "files": integrity.record_files(payload, records)}
            atomic_write_json(payload / MANIFEST, described)
            records |= {name: integrity.record(payload / name) for name in (MANIFEST, STORE_FILE)}
            snapshot = {
                "kind": SNAPSHOT_KIND,
                "created": now_iso(),
                "source": {"path": str(directory.resolve()), "pinned_by": "writer" if pin else "reader"},
                "ntotal": ntotal,
                "dim": manifest.get("dim"),
                "index_type": manifest.get("index_type"),
                "files": {f"{PAYLOAD}/{name}": records[name] for name in PAYLOAD_FILES if name in records},
                "faiss_file": copied[INDEX_FILE],
                "blocking_seconds": round(blocked, 6) if pin else 0.0,
                "seconds": round(time.perf_counter() - start, 3),
            }
            atomic_write_json(tmp / MANIFEST, snapshot)
            for path in (*payload.iterdir(), payload, tmp):
                integrity.fsync_path(path)
    finally:
        if store.db.in_transaction:
            store.db.execute("ROLLBACK")
        store.close()
    return snapshot


def _pin(
    directory: Path, store: DocumentStore, pin: Pin | None
) -> tuple[dict[str, int], dict[str, Any], float]:
    """(descriptors, manifest, seconds pinned) of one instant, ``store`` left in its read transaction."""
    path = directory / INDEX_FILE
    for _ in range(PIN_RETRIES):
        with pin() if pin else nullcontext(None) as held:
            began = time.perf_counter()  # the writer's lock is held from here
            fd = os.open(path, os.O_RDONLY)
            try:
                store.db.execute("BEGIN")
                store.db.execute("SELECT max(seq) FROM changes").fetchone()  # the read starts here
                manifest = held if held is not None else read_manifest(directory)
                st = os.fstat(fd)
                if file_identity(path) == (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size):
                    fds = {INDEX_FILE: fd}
                    if (directory / RESCORE_FILE).is_file():
                        fds[RESCORE_FILE] = os.open(directory / RESCORE_FILE, os.O_RDONLY)
                    return fds, manifest, time.perf_counter() - began
            except BaseException:
                os.close(fd)
                raise
        os.close(fd)  # a checkpoint replaced the file meanwhile: pin again
        store.db.execute("ROLLBACK")
    raise BusyError(f"index {directory}: its Faiss file kept being replaced; try the snapshot again")


def _link_or_copy(path: Path, fd: int, dest: Path, link: bool) -> str:
    """Hard-link the file open at ``fd`` to ``dest`` if ``path`` still names it, else copy it from ``fd``."""
    pinned = os.fstat(fd)
    if link:
        with contextlib.suppress(OSError):
            os.link(path, dest)
            linked = dest.stat()
            if (linked.st_dev, linked.st_ino) == (pinned.st_dev, pinned.st_ino):
                return "hard link"
            dest.unlink()
    with open(dest, "wb") as out:  # fsynced with the directory
        offset = 0  # pread: the copy never depends on, or moves, the pinned descriptor's offset
        while block := os.pread(fd, 1 << 22, offset):
            out.write(block)
            offset += len(block)
    return "copy"


def _backup(source: sqlite3.Connection, dest: Path) -> None:
    """Copy the state ``source``'s open read transaction sees into a single-file database."""
    with closing(sqlite3.connect(dest, isolation_level=None)) as target:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # no -wal beside the copy


def _check_copies(where: str, payload: Path, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Records of the copied files, checked against the source's: a damaged file is refused, not sealed."""
    records: dict[str, dict[str, Any]] = {}
    for name in (INDEX_FILE, IVFDATA_FILE, RESCORE_FILE):
        if (payload / name).is_file():
            made = records[name] = integrity.record(payload / name)
            entry = manifest.get("files", {}).get(name) if integrity.has_records(manifest) else None
            if isinstance(entry, dict) and "sha256" in entry:
                advice = "no snapshot of a damaged index is taken"
                integrity.match_record(where, name, entry, made["bytes"], made["sha256"], advice=advice)
    # read-only: the check leaves the copy as it is
    with closing(sqlite3.connect(f"file:{payload / STORE_FILE}?mode=ro", uri=True)) as copy:
        problems = sqlite_problems(copy)
    if problems:
        raise UserError(f"{where}: {STORE_FILE} fails SQLite's quick_check: {problems[0]}")
    return records


def _snapshot_manifest(snapshot: Path) -> dict[str, Any]:
    where = f"snapshot {snapshot}"
    if not (snapshot / MANIFEST).is_file():
        raise UserError(f"not a snapshot directory (no manifest.json): {snapshot}")
    manifest = read_manifest(snapshot)
    if (kind := manifest.get("kind")) != SNAPSHOT_KIND:
        raise UserError(f"{snapshot} is a {kind!r} directory, not a snapshot (`index snapshot` makes one)")
    files = manifest.get("files")
    allowed = {f"{PAYLOAD}/{name}" for name in PAYLOAD_FILES}
    if not isinstance(files, dict) or not set(files) <= allowed:
        raise UserError(f"{where}: its manifest lists files other than {', '.join(sorted(allowed))}")
    for name in (MANIFEST, INDEX_FILE, STORE_FILE):
        if f"{PAYLOAD}/{name}" not in files:
            raise UserError(f"{where}: its manifest does not record {PAYLOAD}/{name}")
    return manifest


def check_snapshot(snapshot: Path, copy_to: Path | None = None) -> dict[str, Any]:
    """Check every file of a snapshot (sizes, then sha256), copying each into ``copy_to``."""
    manifest, where = _snapshot_manifest(snapshot), f"snapshot {snapshot}"
    for rel, entry in manifest["files"].items():
        if not (snapshot / rel).is_file():
            raise UserError(f"{where}: {rel} is missing")
        integrity.match_record(where, rel, entry, (snapshot / rel).stat().st_size, None)
    for rel, entry in manifest["files"].items():
        digest = _copy_hashing(snapshot / rel, copy_to / Path(rel).name if copy_to else None)
        integrity.match_record(where, rel, entry, entry["bytes"], digest, advice="take the snapshot again")
    return manifest


def _copy_hashing(path: Path, dest: Path | None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src, open(dest, "wb") if dest else nullcontext() as out:
        while block := src.read(1 << 22):
            digest.update(block)
            if out is not None:
                out.write(block)  # fsynced with the directory
    return digest.hexdigest()


def restore_snapshot(snapshot: Path, out: Path, overwrite: bool = False) -> dict[str, Any]:
    """Restore a snapshot into the new index directory ``out`` once every file matched its checksum."""
    start = time.perf_counter()
    _snapshot_manifest(snapshot)  # refuse a non-snapshot before anything else
    with integrity.claim_output(out, overwrite), atomic_directory(out, overwrite=overwrite) as tmp:
        manifest = check_snapshot(snapshot, copy_to=tmp)
        for path in (*tmp.iterdir(), tmp):
            integrity.fsync_path(path)
    return {
        "restored": str(out),
        "snapshot": str(snapshot),
        "created": manifest["created"],
        "ntotal": manifest["ntotal"],
        "files": len(manifest["files"]),
        "bytes": sum(entry["bytes"] for entry in manifest["files"].values()),
        "seconds": round(time.perf_counter() - start, 3),
    }
