"""Checksums of index files: damaged files refused at open and by ``index verify``, old indexes
without checksums still open, and the Faiss file's record right after a kill -9 at every step of
a checkpoint or a retrain."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from distilembed.artifacts import atomic_write_json, read_manifest
from distilembed.errors import UserError
from index.integrity import INDEX_FILE, IVFDATA_FILE, STORE_FILE, with_files
from index.live import LiveIndex
from index.store import Document
from index.verify import verify_index
from tests.test_index_live import make_index, unit

ROOT = Path(__file__).parents[1]


def sealed_index(directory: Path, n: int = 2000, flat: bool = False) -> None:
    """A built index whose manifest records its files, as builds write it."""
    make_index(directory, n=n, flat=flat)
    atomic_write_json(directory / "manifest.json", with_files(directory, read_manifest(directory)))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distilembed.cli", "index", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )


def truncate(path: Path, unit: int = 1) -> None:
    os.truncate(path, path.stat().st_size // 2 // unit * unit)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_checksum(directory: Path) -> None:
    manifest = read_manifest(directory)
    manifest["files"][INDEX_FILE]["sha256"] = "0" * 64
    atomic_write_json(directory / "manifest.json", manifest)


DAMAGE = {
    "truncated faiss": (
        lambda d: truncate(d / INDEX_FILE),
        r"vectors\.faiss is [\d,]+ bytes, the manifest records [\d,]+ \(truncated\?\)",
    ),
    "altered faiss byte": (
        lambda d: flip_byte(d / INDEX_FILE),
        r"vectors\.faiss has sha256 \w+\.\.\., the manifest records",
    ),
    "truncated sqlite": (
        lambda d: truncate(d / STORE_FILE, unit=4096),  # whole pages lost: SQLite reads them as zeros
        r"docs\.sqlite is [\d,]+ bytes, its header records [\d,]+ \(truncated\?\)",
    ),
    "sqlite cut mid-page": (
        lambda d: truncate(d / STORE_FILE, unit=1000),
        r"docs\.sqlite is [\d,]+ bytes, not a whole number of 4096-byte pages \(truncated\?\)",
    ),
    "wrong checksum in manifest": (
        edit_checksum,
        r"vectors\.faiss has sha256 \w+\.\.\., the manifest records 0000",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_files_are_refused_at_open_and_by_verify(tmp_path, damage: str) -> None:
    sealed_index(tmp_path / "idx")
    apply, message = DAMAGE[damage]
    apply(tmp_path / "idx")
    for writable in (True, False):
        with pytest.raises(UserError, match=message) as refused:
            LiveIndex(tmp_path / "idx", writable=writable)
        assert "\n" not in str(refused.value) and str(refused.value).startswith(f"index {tmp_path / 'idx'}: ")
    result = cli("verify", str(tmp_path / "idx"))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: index ") and "Traceback" not in result.stderr
    assert (STORE_FILE if "sqlite" in damage else INDEX_FILE) in lines[0]


def test_a_refused_open_releases_the_writer_lock(tmp_path) -> None:
    sealed_index(tmp_path / "idx")
    good = (tmp_path / "idx" / INDEX_FILE).read_bytes()
    flip_byte(tmp_path / "idx" / INDEX_FILE)
    with pytest.raises(UserError, match="sha256"):
        LiveIndex(tmp_path / "idx")
    (tmp_path / "idx" / INDEX_FILE).write_bytes(good)
    LiveIndex(tmp_path / "idx").close()


def test_verify_passes_on_a_sound_index_and_checks_ids_against_documents(tmp_path) -> None:
    sealed_index(tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx")
    live.upsert([Document("new", "logged, not yet in the Faiss file")], unit(1))
    live.delete(["doc3"])
    result = cli("verify", str(tmp_path / "idx"))  # while the writer holds the lock
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sound"] and report["checksums"] == "recorded"
    assert report["files"] == {INDEX_FILE: "sha256 ok", STORE_FILE: "integrity_check ok"}
    assert (report["ntotal"], report["documents"], report["logged_changes"]) == (2000, 2000, 2)
    live.close()
    # A document row removed behind the index's back leaves a vector without a document.
    db = sqlite3.connect(tmp_path / "idx" / STORE_FILE)
    db.execute("DELETE FROM docs WHERE ext_id = 'doc7'")
    db.commit()
    db.close()
    with pytest.raises(
        UserError, match=r"holds 2,000 vectors and the store 1,999 documents .* 1 vectors without"
    ):
        verify_index(tmp_path / "idx")


def test_an_index_without_checksums_still_opens(tmp_path, caplog) -> None:
    make_index(tmp_path / "idx")  # written as before checksums were kept
    assert "files" not in read_manifest(tmp_path / "idx")
    reader = LiveIndex(tmp_path / "idx", writable=False)
    assert reader.ntotal == 3000 and "carries no checksums" in caplog.text
    reader.close()
    report = verify_index(tmp_path / "idx")
    assert report["checksums"].startswith("none") and report["ntotal"] == 3000
    result = cli("verify", str(tmp_path / "idx"))
    assert result.returncode == 0 and json.loads(result.stdout)["checksums"].startswith("none")
    writer = LiveIndex(tmp_path / "idx")
    writer.upsert([Document("x", "x")], unit(2))
    writer.close()  # its checkpoint records the checksums from now on
    assert (
        read_manifest(tmp_path / "idx")["files"][INDEX_FILE]["bytes"]
        == (tmp_path / "idx" / INDEX_FILE).stat().st_size
    )
    assert verify_index(tmp_path / "idx")["checksums"] == "recorded"


def test_a_missing_or_emptied_store_is_refused(tmp_path) -> None:
    sealed_index(tmp_path / "idx", n=500, flat=True)
    (tmp_path / "idx" / STORE_FILE).write_bytes(b"")
    with pytest.raises(UserError, match=r"docs\.sqlite is empty \(0 bytes\)"):
        LiveIndex(tmp_path / "idx", writable=False)
    (tmp_path / "idx" / STORE_FILE).unlink()
    with pytest.raises(UserError, match=r"docs\.sqlite is missing"):
        LiveIndex(tmp_path / "idx")
    assert not (tmp_path / "idx" / STORE_FILE).exists()  # not silently recreated empty


CRASH_SCRIPT = """
import os, signal
import index.integrity, index.retrain
from index.live import LiveIndex
from index.store import Document
from tests.test_index_live import unit
point = {point!r}
live = LiveIndex({directory!r})
live.upsert([Document("acked", "acknowledged before the crash")], unit(9))
live.delete(["doc4"])
print("acknowledged", flush=True)
{prepare}
calls = []
real_write, real_final = index.integrity.write_manifest, index.retrain.atomic_write_json
real_drop = live.store.drop_changes
def die():
    os.kill(os.getpid(), signal.SIGKILL)
def write_manifest(directory, manifest):
    calls.append(1)
    if point == "before the rename" and len(calls) == 1:
        real_write(directory, manifest)  # the manifest on disk now accepts both files
        die()
    if point == "after the rename" and len(calls) == 2:
        die()  # a checkpoint's: the new file is in place and the log dropped
    return real_write(directory, manifest)
def final_write(*args, **kwargs):
    if point == "after the rename":
        die()  # a retrain's: the new file is in place, its labels not yet written
    return real_final(*args, **kwargs)
def drop_changes(seq):
    if point == "before the log is dropped":
        die()
    return real_drop(seq)
index.integrity.write_manifest, index.retrain.atomic_write_json = write_manifest, final_write
live.store.drop_changes = drop_changes
{action}
"""

CRASH_CASES = [
    ("checkpoint", "before the rename"),
    ("checkpoint", "before the log is dropped"),
    ("checkpoint", "after the rename"),
    ("retrain", "before the rename"),
    ("retrain", "after the rename"),
]


@pytest.mark.parametrize(("step", "point"), CRASH_CASES)
def test_kill_9_while_the_faiss_file_is_replaced_keeps_its_checksum_right(tmp_path, step, point) -> None:
    """Whichever file a crash leaves in place, the manifest on disk accepts it, and every
    acknowledged write is kept. A retrain's writes are checkpointed before it (unhooked)."""
    sealed_index(tmp_path / "idx", n=2000, flat=step == "retrain")
    script = CRASH_SCRIPT.format(
        directory=str(tmp_path / "idx"),
        point=point,
        prepare="live.checkpoint()" if step == "retrain" else "",
        action="live.retrain(nlist=16, flat_below=100)" if step == "retrain" else "live.checkpoint()",
    )
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert child.returncode == -signal.SIGKILL and "acknowledged" in child.stdout, child.stderr
    assert "replacing" in read_manifest(tmp_path / "idx")["files"][INDEX_FILE]  # died mid-replacement
    reader = LiveIndex(tmp_path / "idx", writable=False)  # a reader accepts either file
    assert reader.ntotal == 2000 and reader.search(unit(9), k=1, nprobe=32)[0][0].id == "acked"
    reader.close()
    live = LiveIndex(tmp_path / "idx")  # the writer settles the record to the file in place
    assert "replacing" not in read_manifest(tmp_path / "idx")["files"][INDEX_FILE]
    assert live.ntotal == 2000 and live.get("doc4") is None and live.get("acked") is not None
    assert live.search(unit(9), k=1, nprobe=32)[0][0].id == "acked"
    assert not list((tmp_path / "idx").glob(f".{INDEX_FILE}*"))  # the staged file was cleaned up
    live.close()
    assert verify_index(tmp_path / "idx")["ntotal"] == 2000


def test_builds_and_shards_record_their_files(tiny_bundle, tmp_path) -> None:
    from index.build import BuildConfig, build, create_empty
    from index.corpus import CorpusSpec
    from index.shards import shard_index
    from tests.tiny_models import tiny_sentences

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny_sentences(300, seed=5)) + "\n")
    cfg = BuildConfig(
        bundle=str(tiny_bundle), out=str(tmp_path / "ondisk"), nlist=4, flat_below=100, on_disk=True
    )
    manifest = build(cfg, CorpusSpec(corpus))
    assert set(manifest["files"]) == {INDEX_FILE, IVFDATA_FILE, STORE_FILE}
    assert manifest["files"][IVFDATA_FILE]["bytes"] == (tmp_path / "ondisk" / IVFDATA_FILE).stat().st_size
    assert verify_index(tmp_path / "ondisk")["files"][IVFDATA_FILE] == "sha256 ok"
    empty = create_empty(BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "empty")))
    assert set(empty["files"]) == {INDEX_FILE, STORE_FILE} and verify_index(tmp_path / "empty")["ntotal"] == 0
    build(replace(cfg, out=str(tmp_path / "mem"), on_disk=False), CorpusSpec(corpus))
    sharded = shard_index(tmp_path / "mem", 2, tmp_path / "sharded")
    reports = verify_index(tmp_path / "sharded")["shards"]
    assert [r["ntotal"] for r in reports] == [
        LiveIndex(tmp_path / "sharded" / n, writable=False).ntotal for n in sharded["shards"]
    ]
    assert sum(r["ntotal"] for r in reports) == 300
    os.truncate(tmp_path / "ondisk" / IVFDATA_FILE, 4096)  # the mapped lists: checked by size at open
    with pytest.raises(UserError, match=r"vectors\.ivfdata is 4,096 bytes, the manifest records"):
        LiveIndex(tmp_path / "ondisk", writable=False)
