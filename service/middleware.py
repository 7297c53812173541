"""Pure ASGI middleware (BaseHTTPMiddleware costs too much on the single-request fast path)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import Metrics

log = logging.getLogger("distilembed.service")
BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})


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
    """Refuse bodies over ``limit`` bytes with 413, from Content-Length and from the streamed body.

    The body is read (up to the limit) before the app sees it and then replayed, so a chunked or
    lying upload cannot grow past the limit either.
    """

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
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


class InternalErrorMiddleware:
    """A bug's JSON 500, and the connection kept. Starlette's ServerErrorMiddleware sends the same
    answer but then raises again, and uvicorn closes any connection whose app raised: one bug's
    request would cost its client the connection. Once a response has begun the exception goes on
    to ServerErrorMiddleware, which logs it and counts it, and the connection closes (the response
    is cut short)."""

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
