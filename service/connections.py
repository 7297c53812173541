"""Our uvicorn protocol: connection deadlines and a connection budget (docs/decisions.md, 61), over
one socket write per response (decision 15).

uvicorn times nothing before a connection's first response, and its ``limit_concurrency`` counts idle
sockets: a few hundred silent or trickling clients turned every request, ``/health`` included, into a
plain-text 503. Here each phase has a deadline: the head (``header_timeout_s``, from the opening, then
from each later request's first byte), the body (``body_timeout_s`` from the end of the head), the
wait between requests (``keep_alive_s``); then the connection closes, after a JSON 408 if a request
had begun. Past ``max_connections`` a new connection closes the one idle longest (none idle: it gets a
JSON 503); past ``max_concurrency`` requests in flight a request gets a JSON 503 with ``Retry-After``.
One timer per connection, never sleeping past the shortest timeout, serves every phase: a phase only
moves the deadline, so nothing is scheduled or cancelled per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import math
from dataclasses import dataclass, field, fields
from http import HTTPStatus
from typing import Any, ClassVar

from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.middleware import error_body
from service.settings import Settings

log = logging.getLogger("distilembed.service")

RETRY_AFTER_S = 1


class Phase(enum.Enum):
    WAITING = "waiting for the first byte of a request (idle: may be evicted)"
    HEAD = "receiving a request line and headers"
    BODY = "receiving a request body"
    HANDLING = "the app has the request; no deadline"


def _closing_response(status: int, message: str, kind: str, retry: bool = False) -> bytes:
    """A whole response written straight to the socket, outside any request cycle."""
    body = json.dumps(error_body(message, kind, 0.0)).encode()
    head = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        *([f"retry-after: {RETRY_AFTER_S}"] if retry else []),
        "connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class CoalescingTransport:
    """Forwards everything to ``transport``, but joins the writes made within one event-loop callback
    and sends them when it ends, before the next poll: uvicorn writes a response's head and body
    apart, and two sends (and wake-ups of the client) were a third of the loop's time (py-spy)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(p) for p in self._pending)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """Pass as ``uvicorn.Config(http=...)``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]


@dataclass(eq=False)
class ConnectionBudget:
    """One server's limits, and the bookkeeping its connections share (one event loop: no lock)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 75.0
    max_connections: int = 4096
    max_concurrency: int = 256
    open: int = field(default=0, init=False)
    # idle connections, longest idle first (a dict keeps insertion order; pop + insert moves to the end)
    idle: dict[GuardedHttpToolsProtocol, None] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.tick = min(self.header_timeout_s, self.body_timeout_s, self.keep_alive_s)
        self.refusal = _closing_response(
            503, f"{self.max_connections} connections are open and none is idle; retry", "unavailable", True
        )
        self.head_timeout, self.body_timeout = (
            _closing_response(408, f"the request {part} took longer than {limit:g} s", "request_timeout")
            for part, limit in (("head", self.header_timeout_s), ("body", self.body_timeout_s))
        )
        overloaded = f"more than {self.max_concurrency} requests in flight; retry after Retry-After"
        self._overloaded_body = json.dumps(error_body(overloaded, "unavailable", 0.0)).encode()

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionBudget:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls) if f.init})

    async def overloaded(self, _scope: Scope, _receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        """The answer to a request over ``max_concurrency``: the connection stays open."""
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(self._overloaded_body)),
            (b"retry-after", b"%d" % RETRY_AFTER_S),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": self._overloaded_body, "more_body": False})


class GuardedHttpToolsProtocol(CoalescingHttpToolsProtocol):
    """The coalescing protocol with deadlines and the budget; ``protocol_for`` makes one per server."""

    budget: ClassVar[ConnectionBudget]
    _phase = Phase.WAITING
    _deadline = math.inf
    _timer: asyncio.TimerHandle | None = None
    _counted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        budget = self.budget
        if budget.open >= budget.max_connections:
            if not budget.idle:
                self.transport.write(budget.refusal)
                self.transport.close()
                return
            next(iter(budget.idle)).close_now()  # the one idle longest
        budget.open += 1
        self._counted = True
        now = self.loop.time()
        self._deadline = now + budget.header_timeout_s
        self._arm(now)
        budget.idle[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._release()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.budget.idle.pop(self, None)
        if self.cycle is not None:  # the first request's head is timed from the connection's opening
            self._deadline = self.loop.time() + self.budget.header_timeout_s
        self._phase = Phase.HEAD

    def on_headers_complete(self) -> None:
        if len(self.tasks) < self.budget.max_concurrency:
            super().on_headers_complete()
        else:  # uvicorn starts (or queues) ``self.app``: the refusal, for this request only
            app, self.app = self.app, self.budget.overloaded
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        self._phase = Phase.BODY
        # a pipelined request waits, its body unread (uvicorn pauses reading): timed once it starts
        self._deadline = math.inf if self.pipeline else self.loop.time() + self.budget.body_timeout_s

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.cycle.response_complete and not self.pipeline and not self.transport.is_closing():
            self._wait_for_next_request()  # answered before its body was in (a 413, a 503)
        else:
            self._phase = Phase.HANDLING
            self._deadline = math.inf

    def on_response_complete(self) -> None:
        if self.pipeline:  # uvicorn's starts the next request, and arms no keep-alive timer then
            started = self.pipeline[-1][0]
            super().on_response_complete()
            if started.more_body:
                self._deadline = self.loop.time() + self.budget.body_timeout_s
            return
        # uvicorn's, without its keep-alive timer: ours covers that phase
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self._phase is Phase.HANDLING:  # not when the next request has begun
            self._wait_for_next_request()

    def _wait_for_next_request(self) -> None:
        self._phase = Phase.WAITING
        self._deadline = self.loop.time() + self.budget.keep_alive_s
        self.budget.idle[self] = None

    def _arm(self, now: float) -> None:
        # never past the shortest timeout, so that no later phase's deadline comes before the timer
        self._timer = self.loop.call_at(min(self._deadline, now + self.budget.tick), self._on_timer)

    def _on_timer(self) -> None:
        now = self.loop.time()
        if now < self._deadline:
            self._arm(now)
            return
        if self._phase is Phase.HEAD and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(self.budget.head_timeout)
        elif self._phase is Phase.BODY and not self.cycle.response_started:
            self.transport.write(self.budget.body_timeout)
        self.close_now()

    def close_now(self) -> None:
        """Close, and free the place in the budget at once (``connection_lost`` comes a callback later)."""
        self._release()
        self.transport.close()

    def _release(self) -> None:
        self.budget.idle.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
        if self._counted:
            self._counted = False
            self.budget.open -= 1


def protocol_for(shared: ConnectionBudget) -> type[GuardedHttpToolsProtocol]:
    """A protocol class bound to ``shared``, for ``uvicorn.Config(http=...)`` (which takes a class)."""

    class Bound(GuardedHttpToolsProtocol):
        budget = shared

    return Bound


def raise_open_file_limit(wanted: int) -> None:
    """Raise the soft limit on open files to the hard one (often 1024 against 1M+), so that
    ``max_connections`` sockets fit; one warning if it stays below ``wanted``."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # macOS refuses an unlimited hard limit: keep the soft one
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "the open-file limit is %d, below max_connections plus the service's own files (%d): "
            "connections past it fail to open; raise it (ulimit -n) or lower DISTILEMBED_MAX_CONNECTIONS",
            soft,
            wanted,
        )
