"""Dynamic micro-batching: concurrent requests share encoder calls made by one worker thread.

* The queue is bounded in texts (``max_queue``); a request that does not fit is refused (429).
* The worker takes up to ``max_batch`` texts round-robin over the waiting requests: a request with
  many texts is split into chunks, and a small one waits for at most one chunk of it.
* A worker that was idle runs what it finds at once; it waits for a batch to fill (up to
  ``max_wait_ms`` after the oldest waiting text arrived) only under concurrent load (its last batch
  served several requests, or several are queued): a lone client never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from service.middleware import Metrics


class EncoderLike(Protocol):
    """What the service needs of ``export.runtime.Encoder`` (a fake in tests)."""

    dim: int
    max_seq_len: int

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_ids(self, ids: list[list[int]], batch_size: int | None = None) -> np.ndarray: ...


# Fewer waiting texts than this go to the first free worker whole: cut further, batches of two or
# three texts cost more per text than the idle time they save (-3% to -5% at concurrency 8).
SPLIT_FROM = 8


class QueueFullError(Exception):
    def __init__(self, retry_after: int) -> None:
        super().__init__(f"queue full, retry after {retry_after}s")
        self.retry_after = retry_after


class BatcherClosedError(Exception):
    pass


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray  # (n, dim) float32, L2-normalised
    tokens: list[int]  # tokens per text after truncation, special tokens included
    # (start, stop, what ``then`` returned for those rows' vectors), one per slice encoded
    parts: list[tuple[int, int, object]] = field(default_factory=list)


# Called by the worker on each slice of a request's vectors as soon as it is encoded; what it returns
# comes back in Embedded.parts (None if it raised: the caller does that work itself).
SliceHook = Callable[[np.ndarray], object]


@dataclass(eq=False)
class _Request:
    texts: Sequence[str]
    future: asyncio.Future[Embedded]
    loop: asyncio.AbstractEventLoop
    enqueued: float
    then: SliceHook | None = None
    taken: int = 0
    done: int = 0
    dead: bool = False  # cancelled or failed: its remaining texts are dropped
    vectors: np.ndarray | None = None
    tokens: list[int] = field(default_factory=list)
    parts: list[tuple[int, int, object]] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return len(self.texts) - self.taken

    def store(self, start: int, vectors: np.ndarray, tokens: list[int], part: object) -> Embedded | None:
        """Keep a slice's vectors (and ``part``, what ``then`` made of them); the request's result once
        it has all of them. Under the queue's lock: two workers may finish slices of one request at once."""
        if self.dead:
            return None
        if self.then is not None:
            self.parts.append((start, start + len(vectors), part))
        if self.vectors is None:
            self.vectors = np.empty((len(self.texts), vectors.shape[1]), dtype=np.float32)
            self.tokens = [0] * len(self.texts)
        self.vectors[start : start + len(vectors)] = vectors
        self.tokens[start : start + len(tokens)] = tokens
        self.done += len(vectors)
        return Embedded(self.vectors, self.tokens, self.parts) if self.done == len(self.texts) else None


def _apply(then: SliceHook, vectors: np.ndarray) -> object:
    try:
        return then(vectors)
    except Exception:  # the caller finds None and does the work itself, where its error is reported
        return None


def _fail(requests: list[_Request], exc: BaseException) -> None:
    """Fail every request (the rest of their texts are dropped)."""
    for request in requests:
        request.dead = True
    _settle([(request, exc) for request in requests])


def _apply_all(settled: list[tuple[_Request, Embedded | BaseException]]) -> None:
    """Resolve the futures (in their event loop)."""
    for request, result in settled:
        if request.future.done():
            continue
        if isinstance(result, BaseException):
            request.future.set_exception(result)
        else:
            request.future.set_result(result)


def _settle(settled: list[tuple[_Request, Embedded | BaseException]]) -> None:
    """Hand results to their event loops: one wake-up per loop and batch, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Request, Embedded | BaseException]]] = {}
    for item in settled:
        by_loop.setdefault(item[0].loop, []).append(item)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting any more
            loop.call_soon_threadsafe(_apply_all, items)


class _Slice(NamedTuple):
    request: _Request
    start: int
    stop: int


class Batcher:
    def __init__(
        self,
        encoder: EncoderLike,
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
        max_queue: int = 2048,
        metrics: Metrics | None = None,
        *,
        run_batch: int | None = None,
        workers: int = 1,
    ) -> None:
        """``run_batch``: rows per model run; a call of more texts is sorted by length and split into
        runs of this size, so one long text does not pad the whole call (default: one run).
        ``workers``: threads that each take a batch and call the encoder, so that calls overlap."""
        self.encoder, self.max_batch, self.max_queue = encoder, max_batch, max_queue
        self.run_batch, self.max_wait = run_batch, max_wait_ms / 1000
        self.metrics = metrics or Metrics()  # a registry of its own when none is given
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # the queue's lock; a worker holding a batch open waits on it
        # Idle workers wait on their own condition (the same lock) and the one that went idle last is
        # woken first: its caches hold the model, and at concurrency 1 a request is not handed to the
        # other core each time (Condition.notify wakes the longest waiter; decision 64).
        self._wakers = [threading.Condition(lock) for _ in range(workers)]
        self._idle: list[int] = []
        self._pending: deque[_Request] = deque()
        self._queued = 0
        self._busy = 0  # workers inside an encoder call
        self._closed = False
        self._batch_seconds = 0.01  # moving average, for Retry-After
        self._listeners: list[Callable[[int], None]] = [self.metrics.queue_depth.set]
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"distilembed-encoder-{i}", daemon=True)
            for i in range(workers)
        ]

    @property
    def depth(self) -> int:
        """Texts waiting for the encoder (not counting the batch being encoded)."""
        return self._queued

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Called (under the queue lock, keep it quick) with the queue depth after every change."""
        self._listeners.append(listener)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def retry_after(self) -> int:
        return max(1, math.ceil(self._queued / self.max_batch * self._batch_seconds))

    async def embed(self, texts: Sequence[str], then: SliceHook | None = None) -> Embedded:
        """The texts' vectors; ``then``: run by the worker on each slice's vectors the moment they are
        encoded, on the core that encoded them, while the other workers still encode the rest."""
        if not texts:
            return Embedded(np.zeros((0, self.encoder.dim), dtype=np.float32), [])
        loop = asyncio.get_running_loop()
        request = _Request(texts, loop.create_future(), loop, time.perf_counter(), then)
        with self._cond:
            if self._closed:
                raise BatcherClosedError("the encoder is shutting down")
            if self._queued + len(texts) > self.max_queue:
                self.metrics.queue_rejected.inc()
                raise QueueFullError(self.retry_after())
            self._pending.append(request)
            self._queued += len(texts)
            self._changed()
            self._notify()
        try:
            return await request.future
        except asyncio.CancelledError:
            self._drop(request)
            raise

    def _drop(self, request: _Request) -> None:
        with self._cond:
            request.dead = True
            if request in self._pending:
                self._pending.remove(request)
                self._queued -= request.remaining
                self._changed()

    def _changed(self) -> None:
        for listener in self._listeners:
            listener(self._queued)

    async def aclose(self, timeout: float = 10.0) -> None:
        """Stop taking requests, finish the queued ones (up to ``timeout`` s), fail what is left."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            for waker in self._wakers:
                waker.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                await asyncio.to_thread(thread.join, max(0.0, deadline - time.monotonic()))
        with self._cond:
            left, self._pending = list(self._pending), deque()
            self._queued = 0
            self._changed()
        _fail(left, BatcherClosedError("the encoder shut down before this request was served"))

    def _notify(self) -> None:
        """Wake the worker that went idle last, else one holding a batch open (the lock held)."""
        if self._idle:
            self._wakers[self._idle.pop()].notify()
        else:
            self._cond.notify()

    def _run(self, me: int) -> None:
        idle, last_requests = True, 0
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    idle = True
                    self._idle.append(me)
                    self._wakers[me].wait()
                    if me in self._idle:  # woken by the close, not by _notify
                        self._idle.remove(me)
                if not self._pending:
                    return  # closed and drained
                concurrent = last_requests > 1 or len(self._pending) > 1
                if concurrent and not idle and self.max_wait > 0:
                    deadline = min(r.enqueued for r in self._pending) + self.max_wait
                    while self._queued < self.max_batch and not self._closed:
                        left = deadline - time.perf_counter()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                slices = self._take()
                idle, last_requests = False, len(slices)
                self._busy += 1
            try:
                if slices:
                    self._encode(slices)
            except Exception as exc:  # the waiting requests re-raise it; the worker lives on
                _fail([s.request for s in slices], exc)
            finally:
                with self._cond:
                    self._busy -= 1

    def _take(self) -> list[_Slice]:
        out: list[_Slice] = []
        # A share of the queue per free worker: one request of 32 texts keeps both cores busy, not one.
        # Several requests and SPLIT_FROM texts waiting: busy workers get a share too, or one comes back
        # to an empty queue while its last batch's clients send their next requests (decision 64).
        sharing = len(self._threads) - self._busy
        if len(self._pending) > 1 and self._queued >= SPLIT_FROM:
            sharing = len(self._threads)
        space = min(self.max_batch, max(1, -(-self._queued // sharing)))
        while space and self._pending:
            request = self._pending.popleft()
            if request.dead:
                self._queued -= request.remaining
                continue
            n = min(space, request.remaining)
            out.append(_Slice(request, request.taken, request.taken + n))
            request.taken += n
            self._queued -= n
            space -= n
            if request.remaining:
                self._pending.append(request)  # round-robin: the others go first next time
        if self._pending:
            self._notify()  # a free worker takes the rest
        self._changed()
        return out

    def _encode(self, slices: list[_Slice]) -> None:
        texts = [t for s in slices for t in s.request.texts[s.start : s.stop]]
        start = time.perf_counter()
        for s in slices:
            self.metrics.queue_duration.observe(start - s.request.enqueued)
        ids = self.encoder.tokenize(texts)
        tokenized = time.perf_counter()
        vectors = self.encoder.encode_ids(ids, batch_size=self.run_batch or len(ids))
        if vectors.shape[0] != len(texts):
            raise RuntimeError(f"the encoder returned {vectors.shape[0]} vectors for {len(texts)} texts")
        end = time.perf_counter()
        self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * (end - start)
        self.metrics.tokenization_duration.observe(tokenized - start)
        self.metrics.inference_duration.observe(end - tokenized)
        self.metrics.batch_size.observe(len(texts))
        bounds = list(itertools.accumulate((s.stop - s.start for s in slices), initial=0))
        rows = [slice(lo, hi) for lo, hi in itertools.pairwise(bounds)]
        parts = [
            _apply(s.request.then, vectors[r]) if s.request.then and not s.request.dead else None
            for s, r in zip(slices, rows, strict=True)
        ]
        settled: list[tuple[_Request, Embedded | BaseException]] = []
        with self._cond:
            for s, r, part in zip(slices, rows, parts, strict=True):
                result = s.request.store(s.start, vectors[r], [len(i) for i in ids[r]], part)
                if result is not None:
                    settled.append((s.request, result))
        _settle(settled)
