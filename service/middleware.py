"""Pure ASGI middleware (BaseHTTPMiddleware costs too much on the single-request fast path), and the
Prometheus metrics in text-embeddings-inference style, one registry per app (prometheus-client adds
``_total`` to counters: ``distilembed_request_count_total``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("distilembed.service")
BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_memory_bytes() -> float:
    """RSS of this process from /proc/self/statm (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as handle:
            return float(int(handle.read().split()[1]) * PAGE_SIZE)
    except (OSError, IndexError, ValueError):
        return 0.0


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_count = Counter(
            "distilembed_request_count", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.request_duration = self._latency(
            "request_duration", "HTTP request duration by route and status", ["route", "status"]
        )
        self.queue_duration = self._latency("queue_duration", "Time a text waits before the encoder takes it")
        self.tokenization_duration = self._latency("tokenization_duration", "Tokenization time per batch")
        self.inference_duration = self._latency("inference_duration", "Encoder (onnxruntime) time per batch")
        self.batch_size = Histogram(
            "distilembed_batch_size", "Texts per encoder call", buckets=BATCH_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("distilembed_queue_depth", "Texts waiting for the encoder", registry=r)
        self.queue_rejected = Counter(
            "distilembed_queue_rejected", "Requests refused with 429 because the queue was full", registry=r
        )
        self.search_duration = self._latency("search_duration", "Index search time per request")
        self.index_vectors = Gauge("distilembed_index_vectors", "Vectors in the live index", registry=r)
        self.rss = Gauge("distilembed_process_resident_memory_bytes", "Resident memory (RSS)", registry=r)
        self.rss.set_function(resident_memory_bytes)
        self.bundle_size = Gauge("distilembed_bundle_size_bytes", "Bundle size on disk", registry=r)
        self.ready = Gauge("distilembed_ready", "1 when the service is ready", registry=r)
        self.internal_errors = Counter(
            "distilembed_internal_errors", "Unhandled exceptions answered with 500", registry=r
        )

    def _latency(self, name: str, doc: str, labels: Sequence[str] = ()) -> Histogram:
        return Histogram(
            f"distilembed_{name}_seconds", doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry
        )


def elapsed_ms(scope: Scope) -> float:
    """Milliseconds since ObservabilityMiddleware saw the request (0 before it did)."""
    start = scope.get("state", {}).get("start")
    return round((time.perf_counter() - start) * 1000, 3) if start is not None else 0.0


def error_json(
    scope: Scope, status: int, message: str, kind: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The error body of service/errors.py, for answers given outside FastAPI's handlers."""
    return JSONResponse(error_body(message, kind, elapsed_ms(scope)), status_code=status, headers=headers)


def error_body(message: str, kind: str, took_ms: float) -> dict[str, Any]:
    """The body of every error this service answers (``ErrorBody`` in service/schemas.py)."""
    return {"error": message, "type": kind, "took_ms": took_ms}


class ObservabilityMiddleware:
    """Request count and duration by route template and status; ``X-Took-Ms`` on every response."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Sequence[BaseRoute] = ()) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    def _route(self, scope: Scope) -> str:
        """The matched route's template; for requests answered before routing (413), match it here."""
        route = scope.get("route")
        if route is None:
            route = next((r for r in self.routes if r.matches(scope)[0] != Match.NONE), None)
        return str(getattr(route, "path", "unmatched"))  # never the raw path: unbounded label values

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        scope.setdefault("state", {})["start"] = start
        status = 500  # if the app raises, the outer error middleware answers 500

        async def send_timed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                took = (time.perf_counter() - start) * 1000
                MutableHeaders(scope=message).append("X-Took-Ms", f"{took:.3f}")
            await send(message)

        try:
            await self.app(scope, receive, send_timed)
        finally:
            labels = (self._route(scope), str(status))
            self.metrics.request_count.labels(*labels).inc()
            self.metrics.request_duration.labels(*labels).observe(time.perf_counter() - start)


class PayloadLimitMiddleware:
    """413 for a body over ``limit`` bytes, by Content-Length or as it streams: the body is read (up
    to the limit) before the app sees it, then replayed, so no chunked or lying upload gets past."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        message = f"request body {size} exceeds the limit of {self.limit} bytes"
        close = {"Connection": "close"}
        await error_json(scope, 413, message, "payload_too_large", close)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in BODYLESS:
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._too_large(scope, receive, send, f"of {length} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(scope, receive, send, "streamed past it")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)


class InternalErrorMiddleware:
    """A bug's JSON 500, the connection kept (Starlette's ServerErrorMiddleware raises again: uvicorn
    closes the connection). Once a response has begun, the exception goes on to it."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_watched)
        except Exception:
            if started:
                raise
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            self.metrics.internal_errors.inc()
            await error_json(scope, 500, "internal server error", "internal_error")(scope, receive, send)
