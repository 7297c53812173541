"""Checksums of an index directory's files in its manifest's ``files`` section (docs/decisions.md, 26):
bytes + sha256 of the Faiss, ``.ivfdata`` and rescoring files; SQLite checks ``docs.sqlite`` itself.
A replaced file's record stays right across a crash at any step, each step durable before the next::

    manifest: {old}  ->  manifest: {new, replacing: old}  ->  rename new file in  ->  manifest: {new}
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import struct
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, Any

from distilembed.artifacts import atomic_write_json, read_manifest, sha256_file
from distilembed.errors import UserError
from index.store import DocumentStore

log = logging.getLogger(__name__)
INDEX_FILE, STORE_FILE, IVFDATA_FILE = "vectors.faiss", "docs.sqlite", "vectors.ivfdata"
RESCORE_FILE = "rescore.f32"  # exact vectors of compressed (pq, binary) lists: index/rescore.py
REPLACED_FILES = (RESCORE_FILE, INDEX_FILE)  # replaced by rename, in this order (rescore.py says why)
LOCK_FILE = ".writer.lock"
STAGED_FILE = f".{INDEX_FILE}.new"  # a replacement Faiss file, hashed before it is renamed in
STAGED_RESCORE = f".{RESCORE_FILE}.new"
SQLITE_CHECK = {"check": "sqlite"}
Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size


def file_identity(path: Path) -> Identity:
    """A replaced file (rename) has a new inode; the pinned or open old one keeps its number."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def record(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def record_files(directory: Path, known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``files`` section for a directory's index files (``known``: records already computed)."""
    files: dict[str, Any] = {}
    for name in (INDEX_FILE, IVFDATA_FILE, RESCORE_FILE):
        if (directory / name).is_file():
            files[name] = (known or {}).get(name) or record(directory / name)
    return files | {STORE_FILE: dict(SQLITE_CHECK)}


def with_files(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with the ``files`` section of what ``directory`` holds now (builds, shards)."""
    return manifest | {"files": record_files(directory)}


def seal(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write ``with_files(directory, manifest)`` as the directory's manifest; returns it."""
    manifest = with_files(directory, manifest)
    atomic_write_json(directory / "manifest.json", manifest)
    return manifest


def has_records(manifest: dict[str, Any]) -> bool:
    return isinstance(manifest.get("files"), dict) and INDEX_FILE in manifest["files"]


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (after a rename in it); F_FULLFSYNC where the OS has it (macOS)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(fcntl, "F_FULLFSYNC"):
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
        else:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(directory / "manifest.json", manifest)
    fsync_path(directory)


def _accepted(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry, *([entry["replacing"]] if isinstance(entry.get("replacing"), dict) else [])]


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    return {"bytes": entry["bytes"], "sha256": entry["sha256"]}


def match_record(
    where: str,
    name: str,
    entry: dict[str, Any],
    size: int,
    digest: str | None,
    *,
    advice: str = "restore the index from a snapshot or rebuild it",
) -> dict[str, Any]:
    """The accepted record a file of ``size`` and ``digest`` (None: size only) matches, else UserError."""
    for ok in _accepted(entry):
        if ok["bytes"] == size and digest in (None, ok["sha256"]):
            return _plain(ok)
    sizes = [ok["bytes"] for ok in _accepted(entry)]
    if size not in sizes:
        want = " or ".join(f"{s:,}" for s in sizes)
        hint = "truncated?" if size < min(sizes) else "overwritten or appended to?"
        raise UserError(f"{where}: {name} is {size:,} bytes, the manifest records {want} ({hint})")
    want = " or ".join(ok["sha256"][:16] for ok in _accepted(entry))
    raise UserError(
        f"{where}: {name} has sha256 {str(digest)[:16]}..., the manifest records {want}... "
        f"(altered or corrupt: {advice})"
    )


def check_static_files(where: str, directory: Path, manifest: dict[str, Any]) -> None:
    """Fast open-time checks: every file exists at its recorded size (but the replaced ones), and
    the SQLite file looks whole."""
    recorded = manifest.get("files")
    files: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    for name in dict.fromkeys([INDEX_FILE, STORE_FILE, *files]):
        path = directory / name
        if not path.is_file():
            raise UserError(f"{where}: {name} is missing")
        entry = files.get(name, {})
        if name not in REPLACED_FILES and "bytes" in entry:  # those may be replaced meanwhile
            match_record(where, name, entry, path.stat().st_size, None)
    if problem := sqlite_file_problem(directory / STORE_FILE):
        raise UserError(f"{where}: {STORE_FILE} {problem}")


def open_store(where: str, directory: Path, manifest: dict[str, Any], readonly: bool) -> DocumentStore:
    """The document store, after the fast checks of every file but the Faiss file's hash."""
    check_static_files(where, directory, manifest)
    try:
        store = DocumentStore(directory / STORE_FILE, readonly=readonly)
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    else:
        if not (problems := store.check()):
            return store
        store.close()
    raise UserError(f"{where}: {STORE_FILE} fails SQLite's quick_check: {problems[0]}")


def sqlite_file_problem(path: Path) -> str | None:
    """What is wrong with a SQLite file that SQLite may not notice (a missing tail reads as zeros, an
    empty file as an empty database), or None; with a non-empty WAL only the header is checked."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    with path.open("rb") as handle:
        header = handle.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return "is not a SQLite database"
    wal = path.with_name(path.name + "-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        return None
    (page_size,) = struct.unpack(">H", header[16:18])
    page_size = 65536 if page_size == 1 else page_size
    (changes,), (pages,), (valid_for,) = (struct.unpack(">I", header[i : i + 4]) for i in (24, 28, 92))
    if size % page_size:
        return f"is {size:,} bytes, not a whole number of {page_size}-byte pages (truncated?)"
    if changes == valid_for and pages * page_size > size:
        return f"is {size:,} bytes, its header records {pages * page_size:,} (truncated?)"
    return None


Checked = dict[str, tuple[Identity, dict[str, Any]]]  # file name -> (identity, record it matched)


def verified_files(where: str, directory: Path, names: tuple[str, ...], retries: int = 100) -> Checked:
    """Per file of ``names``: the identity of the file hashed and the manifest record it matched."""
    for _ in range(retries):
        before = {name: file_identity(directory / name) for name in names}
        digests = {name: sha256_file(directory / name) for name in names}
        manifest = read_manifest(directory)
        if all(file_identity(directory / name) == before[name] for name in names):  # all in place then
            checked: Checked = {}
            for name in names:
                entry = manifest.get("files", {}).get(name)
                if not isinstance(entry, dict):
                    raise UserError(f"{where}: the manifest no longer records {name}")
                checked[name] = before[name], match_record(where, name, entry, before[name][3], digests[name])
            return checked
    raise UserError(f"{where}: {', '.join(names)} kept being replaced while it was checked")


def recorded_replaced_files(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The replaced files (module docstring) the manifest records: the Faiss file, then any other."""
    files = manifest.get("files", {})
    return (INDEX_FILE, *(name for name in REPLACED_FILES if name != INDEX_FILE and name in files))


def replace_files(directory: Path, staged: dict[str, Path], manifest: dict[str, Any]) -> dict[str, Any]:
    """Rename staged files (name -> temp file) in, records kept crash-safe; returns the manifest to write."""
    new = {name: record(path) for name, path in staged.items()}
    final: dict[str, Any] | None = None
    if has_records(manifest):
        files = dict(manifest["files"])
        for name in [name for name in staged if "sha256" not in files.get(name, {})]:
            staged.pop(name).replace(directory / name)  # unrecorded, so unused until recorded below
        interim = files | {
            name: rec | ({"replacing": _plain(files[name])} if name in staged else {})
            for name, rec in new.items()
        }
        write_manifest(directory, manifest | {"files": interim})
        final = manifest | {"files": files | new}
    for name in REPLACED_FILES:
        if name in staged:
            staged[name].replace(directory / name)
    fsync_path(directory)
    if final is None:  # an index written before checksums: it gets them with its next snapshot file
        log.info("%s: recording checksums of its files from now on", directory)
        final = manifest | {"files": record_files(directory, new)}
    return final


def drop_file(directory: Path, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Stop recording ``name`` (written at once), then delete it; returns the manifest written."""
    dropped = manifest | {"files": {k: v for k, v in manifest.get("files", {}).items() if k != name}}
    write_manifest(directory, dropped)
    (directory / name).unlink(missing_ok=True)
    fsync_path(directory)
    return dropped


def settle(directory: Path, manifest: dict[str, Any], checked: Checked) -> dict[str, Any]:
    """After a crash mid-replacement, record only the files that are in place (writer only)."""
    files = manifest["files"]
    unsettled = [name for name in checked if "replacing" in files.get(name, {})]
    if not unsettled:
        return manifest
    names = ", ".join(unsettled)
    log.info("%s: settling the record of %s after an interrupted replacement", directory, names)
    settled = manifest | {"files": files | {name: checked[name][1] for name in unsettled}}
    write_manifest(directory, settled)
    return settled


def remove_stale_temps(directory: Path) -> None:
    """Temp files a killed writer left (only the writer, holding the lock, may call this)."""
    for pattern in (f".{INDEX_FILE}*", f"..{INDEX_FILE}*", f".{RESCORE_FILE}*", ".manifest.json.*"):
        for path in directory.glob(pattern):
            with contextlib.suppress(OSError):
                path.unlink()


def refuse_existing(out: Path, overwrite: bool, what: str = "replace it") -> None:
    if out.exists() and not overwrite:
        raise UserError(f"output exists: {out} (pass --overwrite to {what})")


@contextmanager
def claim_output(out: Path, overwrite: bool, what: str = "replace it") -> Iterator[None]:
    """Refuse an existing ``out`` without ``overwrite``; with it, hold ``out``'s writer lock until
    it is replaced (a service writing it would checkpoint old vectors into the new directory)."""
    refuse_existing(out, overwrite, what)
    with writer_lock_held(out) if out.is_dir() else nullcontext():
        yield


# One writer a directory: two would each checkpoint without the other's vectors and drop its log rows.
@contextmanager
def writer_lock_held(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s writer lock for a block, or refuse as a second writer would be refused."""
    with writer_lock(directory):
        yield


def writer_lock(directory: Path) -> IO[str]:
    """Hold the directory's writer lock (released by the kernel if the process dies) or refuse."""
    handle = (directory / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise UserError(
            f"{directory} is already open for writing (pid {holder}): "
            "stop that writer, or write through it (e.g. the service's HTTP API)"
        ) from None
    handle.truncate(0)
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def read_index_manifest(
    directory: Path, kinds: Collection[str] = ("index",), hints: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The index manifest at ``directory``, or a UserError naming what is there instead."""
    if not (directory / "manifest.json").is_file():
        raise UserError(f"not an index directory (no manifest.json): {directory}")
    manifest = read_manifest(directory)
    if (kind := manifest.get("kind")) not in kinds:
        hint = (hints or {}).get(kind, "") if isinstance(kind, str) else ""
        raise UserError(f"{directory} is a {kind!r}, not an index{hint}")
    return manifest
