"""Graceful stop: on SIGTERM readiness turns off, no request in flight is cut, every acknowledged
write is in the checkpointed index, and the process exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from index.live import LiveIndex
from service.app import create_app
from service.server import server_for
from service.settings import Settings
from service.testing import FakeEncoder
from tests.service_client import empty_index_dir, free_port, serve_process, wait_until

ROOT = Path(__file__).resolve().parents[1]


def _in_index(index_dir: Path, ids: list[str]) -> tuple[list[str], int]:
    live = LiveIndex(index_dir, writable=False)
    try:
        return [i for i in ids if live.get(i) is None], len(live.store.changes())
    finally:
        live.close(checkpoint=False)


def test_sigterm_finishes_the_requests_in_flight_and_loses_no_write(tmp_path: Path) -> None:
    gate = threading.Event()
    encoder = FakeEncoder(gate=gate)
    index_dir = empty_index_dir(tmp_path / "idx", dim=8)
    port = free_port()
    settings = Settings(
        bundle="fake-bundle",
        index_dir=index_dir,
        warmup=False,
        port=port,
        log_level="warning",
        max_batch=4,
        workers=1,
    )
    app = create_app(settings, encoder)
    state = app.state.service
    server = server_for(app, settings)
    runner = threading.Thread(target=server.run)
    runner.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: server.started, "the server to start", runner)
    gate.set()
    for i in range(5):  # acknowledged before the stop
        doc = {"id": f"a{i}", "text": f"before the stop {i}"}
        assert httpx.post(f"{base}/documents", json={"documents": [doc]}).status_code == 200
    gate.clear()
    encoder.entered.clear()

    answers: dict[str, int] = {}

    def request(name: str, path: str, body: dict) -> None:
        try:
            answers[name] = httpx.post(f"{base}{path}", json=body, timeout=60).status_code
        except httpx.HTTPError as exc:  # a cut request
            answers[name] = -1
            raise AssertionError(f"{name}: {exc!r}") from exc

    clients = [threading.Thread(target=request, args=("first", "/v1/embeddings", {"input": "held"}))]
    clients[0].start()
    assert encoder.entered.wait(30)  # the first request is in the encoder; the gate holds it there
    queued = threading.Event()
    state.batcher.add_listener(lambda depth: depth == 6 and queued.set())
    for i in range(6):
        doc = {"id": f"b{i}", "text": f"in flight {i}"}
        args = (
            (f"b{i}", "/documents", {"documents": [doc]}) if i % 2 else (f"e{i}", "/embed", {"inputs": "x"})
        )
        clients.append(threading.Thread(target=request, args=args))
        clients[-1].start()
    assert queued.wait(30), "six requests never queued behind it"

    server.handle_exit(signal.SIGTERM, None)  # what uvicorn's handler does on the signal
    assert state.ready is False
    wait_until(
        lambda: not server.servers or all(not s.is_serving() for s in server.servers), "the listener to close"
    )
    gate.set()
    for client in clients:
        client.join(60)
    runner.join(60)
    assert not runner.is_alive()
    assert answers == {"first": 200, **{f"b{i}": 200 for i in (1, 3, 5)}, **{f"e{i}": 200 for i in (0, 2, 4)}}
    missing, logged = _in_index(index_dir, [f"a{i}" for i in range(5)] + [f"b{i}" for i in (1, 3, 5)])
    assert missing == [] and logged == 0  # every write is there, checkpointed into the Faiss file


def test_a_sigterm_stop_exits_0_with_the_index_checkpointed(tiny_bundle: Path, tmp_path: Path) -> None:
    port = free_port()
    index_dir = tmp_path / "idx"
    args = ["--bundle", str(tiny_bundle), "--index", str(index_dir), "--create-index"]
    with serve_process([*args, "--log-level", "warning", "--threads", "1"], port) as proc:
        docs = [{"id": f"d{i}", "text": f"a document number {i}"} for i in range(20)]
        base = f"http://127.0.0.1:{port}"
        assert httpx.post(f"{base}/documents", json={"documents": docs}, timeout=60).status_code == 200
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    missing, logged = _in_index(index_dir, [d["id"] for d in docs])
    assert missing == [] and logged == 0


@pytest.mark.parametrize("damage", ["truncated faiss", "truncated sqlite", "wrong checksum"])
def test_serve_refuses_a_damaged_index_in_one_line(tiny_bundle: Path, tmp_path: Path, damage: str) -> None:
    from index.build import BuildConfig, build
    from index.corpus import CorpusSpec
    from index.integrity import INDEX_FILE, STORE_FILE
    from tests.test_index_integrity import edit_checksum, truncate
    from tests.tiny_models import tiny_sentences

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(tiny_sentences(300, seed=5)) + "\n")
    index_dir = tmp_path / "idx"
    build(BuildConfig(bundle=str(tiny_bundle), out=str(index_dir), flat_below=10_000), CorpusSpec(corpus))
    if damage == "truncated faiss":
        truncate(index_dir / INDEX_FILE)
    elif damage == "truncated sqlite":
        truncate(index_dir / STORE_FILE, unit=4096)
    else:
        edit_checksum(index_dir)
    cmd = [
        sys.executable,
        "-m",
        "distilembed.cli",
        "serve",
        "--bundle",
        str(tiny_bundle),
        "--index",
        str(index_dir),
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert (STORE_FILE if "sqlite" in damage else INDEX_FILE) in lines[0] and "Traceback" not in result.stderr
