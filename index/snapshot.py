"""Snapshots of an index directory, taken while it serves and is written, and their restore.

A snapshot directory holds ``manifest.json`` (kind ``index_snapshot``: when, from where, ntotal,
and bytes + sha256 of every file) and ``index/``, the index directory itself (its own manifest
with a ``files`` section). ``restore`` checks every file against the snapshot's manifest while it
copies them, and renames the copy into place only if all match.

Consistency. The Faiss file in place and the committed SQLite state are a consistent index at
every instant: that pair is what an open replays, and a checkpoint renames its new file in before
it drops the log rows the file covers. A snapshot pins one instant:

1. open the Faiss file: the descriptor pins its inode (files are replaced by rename, never
   rewritten, so the pinned file never changes);
2. begin a SQLite read transaction and read from it: in WAL mode it sees every commit made
   before and none after, and blocks no writer;
3. read the manifest, then check that the path still names the pinned inode: then that file was
   in place at step 2, and the manifest read in step 3 accepts its checksum;
4. for compressed lists, open the rescoring file: renamed in before the Faiss file, it holds
   every row the log of step 2 lacks (index/rescore.py).

A writable ``LiveIndex`` does 1-3 under its lock (``LiveIndex._pinned``), holding off its writes
and checkpoints for well under a millisecond; a reader (another process, e.g. the service, holds
the writer lock) retries them until no checkpoint renamed a file in between. Then, with no lock
held, the pinned file is hard-linked (copied from the descriptor across filesystems) and the
read transaction's state copied with SQLite's online backup API.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from distilembed.artifacts import MANIFEST, atomic_directory, atomic_write_json, now_iso, read_manifest
from distilembed.errors import BusyError, UserError
from index.integrity import (
    INDEX_FILE,
    IVFDATA_FILE,
    RESCORE_FILE,
    STORE_FILE,
    check_static_files,
    file_identity,
    fsync_path,
    has_records,
    match_record,
    read_index_manifest,
    record,
    record_files,
    writer_lock_held,
)
from index.store import DocumentStore

SNAPSHOT_KIND, PAYLOAD = "index_snapshot", "index"
PAYLOAD_FILES = (MANIFEST, INDEX_FILE, STORE_FILE, IVFDATA_FILE, RESCORE_FILE)
PIN_RETRIES = 1000  # each retry means a checkpoint landed within the few microseconds of a pin
Pin = Callable[[], AbstractContextManager[dict[str, Any]]]


def take_snapshot(
    directory: Path, out: Path, overwrite: bool = False, pin: Pin | None = None, link: bool = True
) -> dict[str, Any]:
    """Snapshot the index at ``directory`` into the new directory ``out``; returns its manifest.
    ``pin``: the writer's guard (``LiveIndex._pinned``); None when this process does not write.
    ``link``: hard-link the Faiss files when ``out`` is on the same filesystem (instant, no space;
    the snapshot shares their disk blocks until the index replaces them), else copy them."""
    start, where = time.perf_counter(), f"index {directory}"
    shards_hint = {"index_shards": " (snapshot each shard of a sharded index)"}
    manifest = read_index_manifest(directory, hints=shards_hint)
    if out.exists() and not overwrite:
        raise UserError(f"output exists: {out} (pass --overwrite to replace it)")
    check_static_files(where, directory, manifest)  # and never create a store
    store = DocumentStore(directory / STORE_FILE, readonly=True)
    try:
        with atomic_directory(out, overwrite=overwrite) as tmp:
            payload = tmp / PAYLOAD
            payload.mkdir()
            fd, rescore_fd, manifest, blocked = _pin(directory, store, pin)
            try:
                how = _link_or_copy(directory / INDEX_FILE, fd, payload / INDEX_FILE, link)
                if rescore_fd is not None:
                    _link_or_copy(directory / RESCORE_FILE, rescore_fd, payload / RESCORE_FILE, link)
            finally:
                os.close(fd)
                if rescore_fd is not None:
                    os.close(rescore_fd)
            if (directory / IVFDATA_FILE).is_file():  # on-disk lists: never written after the build
                with open(directory / IVFDATA_FILE, "rb") as handle:
                    _link_or_copy(directory / IVFDATA_FILE, handle.fileno(), payload / IVFDATA_FILE, link)
            ntotal = store.count()
            _backup(store.db, payload / STORE_FILE)
            store.db.execute("COMMIT")
            records = _check_copies(where, payload, manifest)
            described = manifest | {"ntotal": ntotal, "files": record_files(payload, records)}
            atomic_write_json(payload / MANIFEST, described)
            records |= {name: record(payload / name) for name in (MANIFEST, STORE_FILE)}
            snapshot = {
                "kind": SNAPSHOT_KIND,
                "created": now_iso(),
                "source": {"path": str(directory.resolve()), "pinned_by": "writer" if pin else "reader"},
                "ntotal": ntotal,
                "dim": manifest.get("dim"),
                "index_type": manifest.get("index_type"),
                "files": {f"{PAYLOAD}/{name}": records[name] for name in PAYLOAD_FILES if name in records},
                "faiss_file": how,
                "blocking_seconds": round(blocked, 6) if pin else 0.0,
                "seconds": round(time.perf_counter() - start, 3),
            }
            atomic_write_json(tmp / MANIFEST, snapshot)
            for path in (*payload.iterdir(), payload, tmp):
                fsync_path(path)
    finally:
        if store.db.in_transaction:
            store.db.execute("ROLLBACK")
        store.close()
    return snapshot


def _pin(
    directory: Path, store: DocumentStore, pin: Pin | None
) -> tuple[int, int | None, dict[str, Any], float]:
    """(a descriptor of the Faiss file, one of the rescoring file or None, the manifest that
    describes them, seconds ``pin`` was held) for one instant, with ``store`` left in a read
    transaction of that instant (module docstring)."""
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
                    rescored = (directory / RESCORE_FILE).is_file()
                    rescore_fd = os.open(directory / RESCORE_FILE, os.O_RDONLY) if rescored else None
                    return fd, rescore_fd, manifest, time.perf_counter() - began
            except BaseException:
                os.close(fd)
                raise
        os.close(fd)  # a checkpoint replaced the file meanwhile: pin again
        store.db.execute("ROLLBACK")
    raise BusyError(f"index {directory}: its Faiss file kept being replaced; try the snapshot again")


def _link_or_copy(path: Path, fd: int, dest: Path, link: bool) -> str:
    """Hard-link the file open at ``fd`` (reached through ``path``) to ``dest``, or copy it from
    the descriptor when ``path`` names another file by now or links cannot cross filesystems."""
    pinned = os.fstat(fd)
    with contextlib.suppress(OSError):
        if not link:
            raise OSError("copy asked for")
        os.link(path, dest)
        linked = dest.stat()
        if (linked.st_dev, linked.st_ino) == (pinned.st_dev, pinned.st_ino):
            return "hard link"
        dest.unlink()
    with open(dest, "wb") as out:
        offset = 0
        while block := os.pread(fd, 1 << 22, offset):
            out.write(block)
            offset += len(block)
        out.flush()
        os.fsync(out.fileno())
    return "copy"


def _backup(source: sqlite3.Connection, dest: Path) -> None:
    """Copy the state ``source``'s open read transaction sees into a single-file database."""
    target = sqlite3.connect(dest, isolation_level=None)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # no -wal beside the copy
    finally:
        target.close()


def _check_copies(where: str, payload: Path, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Records of the copied index files, checked against the source's records: a snapshot of a
    damaged file is refused rather than sealed with the damage."""
    records: dict[str, dict[str, Any]] = {}
    for name in (INDEX_FILE, IVFDATA_FILE, RESCORE_FILE):
        if (payload / name).is_file():
            records[name] = record(payload / name)
            entry = manifest.get("files", {}).get(name) if has_records(manifest) else None
            if isinstance(entry, dict) and "sha256" in entry:
                size, digest = records[name]["bytes"], records[name]["sha256"]
                match_record(
                    where, name, entry, size, digest, advice="no snapshot of a damaged index is taken"
                )
    copy = sqlite3.connect(f"file:{payload / STORE_FILE}?mode=ro", uri=True)  # leaves the file as it is
    try:
        problems = [str(row[0]) for row in copy.execute("PRAGMA quick_check(20)").fetchall()]
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    finally:
        copy.close()
    if problems != ["ok"]:
        raise UserError(f"{where}: {STORE_FILE} fails SQLite's quick_check: {problems[0]}")
    return records


def _snapshot_manifest(snapshot: Path) -> dict[str, Any]:
    where = f"snapshot {snapshot}"
    if not (snapshot / MANIFEST).is_file():
        raise UserError(f"not a snapshot directory (no manifest.json): {snapshot}")
    manifest = read_manifest(snapshot)
    if manifest.get("kind") != SNAPSHOT_KIND:
        kind = manifest.get("kind")
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
    """Check every file of a snapshot against its manifest (sizes first, then sha256), copying
    each into ``copy_to`` as it is hashed; returns the snapshot's manifest. UserError names the
    first file that does not match."""
    manifest, where = _snapshot_manifest(snapshot), f"snapshot {snapshot}"
    for rel, entry in manifest["files"].items():
        if not (snapshot / rel).is_file():
            raise UserError(f"{where}: {rel} is missing")
        match_record(where, rel, entry, (snapshot / rel).stat().st_size, None)
    for rel, entry in manifest["files"].items():
        digest = _copy_hashing(snapshot / rel, copy_to / Path(rel).name if copy_to else None)
        match_record(where, rel, entry, entry["bytes"], digest, advice="take the snapshot again")
    return manifest


def _copy_hashing(path: Path, dest: Path | None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src, open(dest, "wb") if dest else nullcontext() as out:
        while block := src.read(1 << 22):
            digest.update(block)
            if out is not None:
                out.write(block)
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
    return digest.hexdigest()


def restore_snapshot(snapshot: Path, out: Path, overwrite: bool = False) -> dict[str, Any]:
    """Restore a snapshot into the index directory ``out`` (written whole, then renamed in),
    after every file matched its checksum; returns what was restored."""
    start = time.perf_counter()
    _snapshot_manifest(snapshot)  # refuse a non-snapshot before anything else
    if out.exists() and not overwrite:
        raise UserError(f"output exists: {out} (pass --overwrite to replace it)")
    # A service writing the old directory would checkpoint its vectors into the restored one.
    held = writer_lock_held(out) if out.is_dir() else nullcontext()
    with held, atomic_directory(out, overwrite=overwrite) as tmp:
        manifest = check_snapshot(snapshot, copy_to=tmp)
        for path in (*tmp.iterdir(), tmp):
            fsync_path(path)
    return {
        "restored": str(out),
        "snapshot": str(snapshot),
        "created": manifest["created"],
        "ntotal": manifest["ntotal"],
        "files": len(manifest["files"]),
        "bytes": sum(entry["bytes"] for entry in manifest["files"].values()),
        "seconds": round(time.perf_counter() - start, 3),
    }
