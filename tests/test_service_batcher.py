"""Micro-batching: merging, fairness, the fast path, the bounded queue (429), cancellation and draining.

Synchronisation is by events (the fake encoder's gate, queue-depth listeners), never by sleeping.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.batcher import SPLIT_FROM, Batcher, BatcherClosedError, QueueFullError, _Request
from service.settings import Settings
from service.testing import FakeEncoder

REFERENCE = FakeEncoder()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DISTILEMBED_{name.upper()}", raising=False)


def settings(**overrides) -> Settings:
    base = {
        "bundle": "fake-bundle",
        "warmup": False,
        "max_items": 8,
        "max_queue": 64,
        "max_batch": 8,
        "workers": 1,
    }
    return Settings(**(base | {"max_wait_ms": 0} | overrides))


def gated() -> tuple[FakeEncoder, threading.Event]:
    gate = threading.Event()
    return FakeEncoder(gate=gate), gate


async def busy_worker(batcher: Batcher, encoder: FakeEncoder) -> asyncio.Task:
    """Start a one-text request and return once the worker is inside the (gated) encoder call."""
    task = asyncio.create_task(batcher.embed(["first"]))
    assert await asyncio.to_thread(encoder.entered.wait, 10)
    return task


async def enqueue(batcher: Batcher, *requests: list[str]) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(batcher.embed(texts)) for texts in requests]
    await asyncio.sleep(0)  # one loop turn: each task runs up to its await, i.e. it is queued
    return tasks


def check(result, texts: list[str]) -> None:
    np.testing.assert_allclose(result.vectors, REFERENCE.encode(texts), atol=1e-6)
    assert result.tokens == [len(ids) for ids in REFERENCE.tokenize(texts)]


def test_fast_path_runs_at_once_when_idle():
    async def main() -> list[float]:
        batcher = Batcher(FakeEncoder(), max_batch=8, max_wait_ms=60_000, max_queue=16)
        batcher.start()
        took = []
        for _ in range(3):  # each finds the worker idle: none may wait for the 60 s fill window
            start = time.perf_counter()
            check(await asyncio.wait_for(batcher.embed(["hello world"]), 30), ["hello world"])
            took.append(time.perf_counter() - start)
        await batcher.aclose()
        return took

    assert max(asyncio.run(main())) < 10


def test_requests_queued_during_a_batch_merge_and_a_full_batch_does_not_wait():
    async def main() -> None:
        encoder, gate = gated()
        batcher = Batcher(encoder, max_batch=3, max_wait_ms=60_000, max_queue=16)
        batcher.start()
        first = await busy_worker(batcher, encoder)
        tasks = await enqueue(batcher, ["b"], ["c d"], ["e"])
        assert batcher.depth == 3
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(first, *tasks), 30)
        for result, texts in zip(results, (["first"], ["b"], ["c d"], ["e"]), strict=True):
            check(result, texts)
        assert encoder.calls == [1, 3]
        await batcher.aclose()

    asyncio.run(main())


def test_under_concurrent_load_a_batch_waits_to_fill():
    async def main() -> None:
        encoder, gate = gated()
        batcher = Batcher(encoder, max_batch=4, max_wait_ms=60_000, max_queue=16)
        batcher.start()
        first = await busy_worker(batcher, encoder)
        early = await enqueue(batcher, ["b"], ["c"])  # two requests waiting: concurrent load
        gate.set()
        late = await enqueue(batcher, ["d"], ["e"])  # the worker holds the batch open for these
        await asyncio.wait_for(asyncio.gather(first, *early, *late), 30)
        assert encoder.calls == [1, 4]
        await batcher.aclose()

    asyncio.run(main())


def test_big_request_is_split_and_does_not_starve_a_small_one():
    async def main() -> None:
        encoder, gate = gated()
        batcher = Batcher(encoder, max_batch=4, max_wait_ms=0, max_queue=64)
        batcher.start()
        first = await busy_worker(batcher, encoder)
        big_texts = [f"text number {i}" for i in range(10)]
        big, small = await enqueue(batcher, big_texts, ["small one"])
        finished: list[str] = []
        big.add_done_callback(lambda _: finished.append("big"))
        small.add_done_callback(lambda _: finished.append("small"))
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, big, small), 30)
        assert encoder.calls == [1, 4, 4, 3]  # big 0-3 | small + big 4-6 | big 7-9
        assert finished == ["small", "big"]
        check(big.result(), big_texts)
        check(small.result(), ["small one"])
        await batcher.aclose()

    asyncio.run(main())


def test_bounded_queue_refuses_and_cancellation_frees_room():
    async def main() -> None:
        encoder, gate = gated()
        batcher = Batcher(encoder, max_batch=8, max_wait_ms=0, max_queue=4)
        batcher.start()
        first = await busy_worker(batcher, encoder)
        (queued,) = await enqueue(batcher, ["a", "b", "c"])
        with pytest.raises(QueueFullError) as refused:
            await batcher.embed(["d", "e"])
        assert refused.value.retry_after >= 1
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        assert batcher.depth == 0
        (fits,) = await enqueue(batcher, ["d", "e", "f", "g"])
        gate.set()
        check(await asyncio.wait_for(fits, 30), ["d", "e", "f", "g"])
        await first
        assert encoder.calls == [1, 4]  # the cancelled texts were never encoded
        await batcher.aclose()

    asyncio.run(main())


def test_close_drains_queued_work_then_refuses():
    async def main() -> None:
        encoder, gate = gated()
        batcher = Batcher(encoder, max_batch=8, max_wait_ms=0, max_queue=16)
        batcher.start()
        first = await busy_worker(batcher, encoder)
        (queued,) = await enqueue(batcher, ["queued before shutdown"])
        closing = asyncio.create_task(batcher.aclose(timeout=30))
        await asyncio.sleep(0)
        with pytest.raises(BatcherClosedError):
            await batcher.embed(["too late"])
        gate.set()
        await asyncio.wait_for(closing, 30)
        check(first.result(), ["first"])
        check(queued.result(), ["queued before shutdown"])
        assert not any(t.is_alive() for t in batcher._threads)

    asyncio.run(main())


def test_close_timeout_fails_what_is_left():
    async def main() -> None:
        encoder, gate = gated()
        batcher = Batcher(encoder, max_batch=8, max_wait_ms=0, max_queue=16)
        batcher.start()
        first = await busy_worker(batcher, encoder)
        (queued,) = await enqueue(batcher, ["never served"])
        await batcher.aclose(timeout=0.01)  # the worker is stuck in the encoder
        with pytest.raises(BatcherClosedError):
            await queued
        gate.set()
        check(await asyncio.wait_for(first, 30), ["first"])

    asyncio.run(main())


def test_encoder_error_reaches_every_request_of_the_batch():
    async def main() -> None:
        encoder, gate = gated()
        batcher = Batcher(encoder, max_batch=8, max_wait_ms=0, max_queue=16)
        batcher.start()
        first = await busy_worker(batcher, encoder)
        tasks = await enqueue(batcher, ["a"], ["b"])
        encoder.fail_with = RuntimeError("onnxruntime failed")
        gate.set()
        results = await asyncio.gather(first, *tasks, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        encoder.fail_with = None
        check(await batcher.embed(["after"]), ["after"])  # the worker survives
        await batcher.aclose()

    asyncio.run(main())


# ---- the same through HTTP


def _when_depth(batcher: Batcher, depth: int) -> threading.Event:
    reached = threading.Event()

    def listener(now: int) -> None:
        if now == depth:
            reached.set()

    batcher.add_listener(listener)
    return reached


def test_http_concurrent_requests_share_one_encoder_call():
    encoder, gate = gated()
    app = create_app(settings(max_batch=8), encoder)
    texts = [f"text {i}" for i in range(5)]
    with TestClient(app) as client, ThreadPoolExecutor(6) as pool:
        five_queued = _when_depth(app.state.service.batcher, 5)
        first = pool.submit(client.post, "/v1/embeddings", json={"input": "first"})
        assert encoder.entered.wait(10)
        rest = [pool.submit(client.post, "/v1/embeddings", json={"input": t}) for t in texts]
        assert five_queued.wait(10)
        gate.set()
        responses = [f.result(30) for f in [first, *rest]]
    assert [r.status_code for r in responses] == [200] * 6
    assert encoder.calls == [1, 5]
    for response, text in zip(responses[1:], texts, strict=True):
        got = np.array(response.json()["data"][0]["embedding"])
        np.testing.assert_allclose(got, REFERENCE.encode([text])[0], atol=1e-6)
    batch_count = app.state.service.metrics.registry.get_sample_value("distilembed_batch_size_count")
    assert batch_count == 2


def test_http_queue_full_is_429_with_retry_after():
    encoder, gate = gated()
    app = create_app(settings(max_queue=3, max_items=3), encoder)
    with TestClient(app) as client, ThreadPoolExecutor(2) as pool:
        three_queued = _when_depth(app.state.service.batcher, 3)
        first = pool.submit(client.post, "/embed", json={"inputs": "a"})
        assert encoder.entered.wait(10)
        second = pool.submit(client.post, "/embed", json={"inputs": ["b", "c", "d"]})
        assert three_queued.wait(10)
        r = client.post("/embed", json={"inputs": "e"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["type"] == "overloaded"
        gate.set()
        assert first.result(30).status_code == 200 and second.result(30).status_code == 200
    registry = app.state.service.metrics.registry
    assert registry.get_sample_value("distilembed_queue_rejected_total") == 1
    assert registry.get_sample_value("distilembed_internal_errors_total") == 0


def test_a_call_is_cut_into_model_runs_of_run_batch_rows():
    async def main() -> tuple[FakeEncoder, FakeEncoder]:
        encoders = FakeEncoder(), FakeEncoder()
        for encoder, run_batch in zip(encoders, (4, None), strict=True):
            batcher = Batcher(encoder, max_batch=16, max_wait_ms=0, max_queue=32, run_batch=run_batch)
            batcher.start()
            texts = [f"text number {i}" for i in range(10)]
            check(await asyncio.wait_for(batcher.embed(texts), 30), texts)
            await batcher.aclose()
        return encoders

    split, whole = asyncio.run(main())
    assert (split.calls, split.run_batches) == ([10], [4])  # one call, sorted and run 4 rows at a time
    assert (whole.calls, whole.run_batches) == ([10], [10])  # without run_batch: one run of the call


class Overlapping(FakeEncoder):
    """Each call waits until a second call is inside the encoder at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.both_inside = threading.Barrier(2, timeout=10)

    def encode_ids(self, ids: list[list[int]], batch_size: int | None = None) -> np.ndarray:
        self.both_inside.wait()  # a BrokenBarrierError after 10 s if the calls do not overlap
        return super().encode_ids(ids, batch_size)


def test_two_workers_run_two_encoder_calls_at_once():
    async def main() -> list:
        batcher = Batcher(Overlapping(), max_batch=1, max_wait_ms=0, workers=2)
        batcher.start()
        results = await asyncio.gather(batcher.embed(["a b"]), batcher.embed(["c d"]))
        await batcher.aclose()
        return results

    first, second = asyncio.run(main())
    check(first, ["a b"])
    check(second, ["c d"])


def test_workers_split_the_threads():
    assert Settings(bundle="b", threads=4).encoder_threads() == (4, 1)
    assert Settings(bundle="b", threads=4, workers=2).encoder_threads() == (2, 2)
    assert Settings(bundle="b", threads=2, workers=1).encoder_threads() == (1, 2)
    assert Settings(bundle="b", threads=2, workers=8).encoder_threads() == (2, 1)


def test_two_workers_share_one_large_request():
    async def main() -> tuple:
        encoder = Overlapping()
        batcher = Batcher(encoder, max_batch=8, max_wait_ms=0, workers=2)
        batcher.start()
        result = await batcher.embed([f"text {i}" for i in range(8)])
        await batcher.aclose()
        return result, encoder.calls

    result, calls = asyncio.run(main())
    check(result, [f"text {i}" for i in range(8)])
    assert sorted(calls) == [4, 4]  # each worker took half the queue, at the same time (the barrier)


def test_a_slice_hook_runs_on_the_encoder_thread_of_each_slice_and_its_results_come_back():
    texts = [f"text {i}" for i in range(8)]
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def hook(vectors: np.ndarray) -> object:
        with lock:
            seen.append((threading.current_thread().name, len(vectors)))
            second = len(seen) == 2
        if second:
            raise ValueError("the second slice's hook fails")
        return float(vectors.sum())

    async def main() -> object:
        batcher = Batcher(Overlapping(), max_batch=8, max_wait_ms=0, workers=2)
        batcher.start()
        result = await batcher.embed(texts, then=hook)
        await batcher.aclose()
        return result

    result = asyncio.run(main())
    check(result, texts)
    assert sorted(name for name, _ in seen) == ["distilembed-encoder-0", "distilembed-encoder-1"]
    parts = sorted(result.parts, key=lambda part: part[0])
    assert [(lo, hi) for lo, hi, _ in parts] == [(0, 4), (4, 8)]  # one part a slice, each encoded once
    values = [value for _, _, value in parts]
    assert values.count(None) == 1  # the failing hook's slice: the caller does that work itself
    lo, hi, value = next(part for part in parts if part[2] is not None)
    assert value == pytest.approx(float(result.vectors[lo:hi].sum()))


def test_with_many_requests_waiting_a_free_worker_leaves_a_busy_one_its_share():
    loop = asyncio.new_event_loop()

    def taken(requests: list[int], busy: int) -> int:
        """Texts one free worker takes from a queue of requests of these sizes, ``busy`` workers busy."""
        batcher = Batcher(FakeEncoder(), max_batch=64, workers=2)  # not started: _take by hand
        for n in requests:
            batcher._pending.append(_Request([f"t{i}" for i in range(n)], loop.create_future(), loop, 0.0))
            batcher._queued += n
        batcher._busy = busy
        with batcher._cond:  # as the worker holds it
            return sum(s.stop - s.start for s in batcher._take())

    try:
        assert taken([1] * 10, busy=1) == 5  # the busy worker comes back for the other half
        assert taken([1] * (SPLIT_FROM - 1), busy=1) == SPLIT_FROM - 1  # too few to cut
        assert taken([10], busy=1) == 10  # one request: all of it to the only free worker
        assert taken([10], busy=0) == 5  # ... or half of it to each of two
    finally:
        loop.close()


def test_the_worker_that_went_idle_last_is_woken_first():
    batcher = Batcher(FakeEncoder(), workers=3)  # not started: the idle stack by hand
    batcher._idle[:] = [2, 0, 1]  # went idle in this order
    with batcher._cond:
        batcher._notify()  # wakes worker 1, whose caches are warmest
    assert batcher._idle == [2, 0]


def test_lone_requests_one_after_another_are_all_answered_by_two_workers():
    async def main() -> list:
        batcher = Batcher(FakeEncoder(), max_wait_ms=0, workers=2)
        batcher.start()
        results = [await batcher.embed([f"text {i}"]) for i in range(20)]
        await batcher.aclose()
        return results

    for i, result in enumerate(asyncio.run(main())):
        check(result, [f"text {i}"])
