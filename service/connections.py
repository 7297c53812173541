"""Timers on every connection and a budget of connections, in our uvicorn protocol.

uvicorn runs no timer before a connection's first request is complete, and stops its keep-alive
timer at the first byte of the next one, so a client that sends nothing, or trickles a request,
holds its socket forever. Its ``limit_concurrency`` counts such idle sockets, so a few hundred of
them turned every other client's request, ``/health`` included, into a plain-text 503. Here:

- each phase of a connection has a deadline: the request head (``header_timeout_s``, from the
  connection's opening, then from each later request's first byte), the body (``body_timeout_s``
  from the end of the head), and the wait between requests (``keep_alive_s``). At a deadline the
  connection is closed; a client that had begun a request first gets a JSON 408.
- at ``max_connections`` a new connection closes the one idle longest (idle: waiting for the first
  byte of a request); with none idle, the new one gets a JSON 503 and is closed.
- beyond ``max_concurrency`` requests in flight a request gets a JSON 503 with ``Retry-After``, and
  its connection stays open.

One timer per connection serves every phase: a phase only moves its deadline, and the timer, which
never sleeps past the shortest timeout, re-arms itself until the deadline passes. That keeps
``call_later``/``cancel`` off the per-request path.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import math
from dataclasses import dataclass, field, fields
from http import HTTPStatus
from typing import ClassVar

from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope

from service.middleware import error_body
from service.settings import Settings
from service.write_coalescing import CoalescingHttpToolsProtocol

log = logging.getLogger("distilembed.service")

RETRY_AFTER_S = 1


class Phase(enum.Enum):
    WAITING = "waiting for the first byte of a request (idle: may be evicted)"
    HEAD = "receiving a request line and headers"
    BODY = "receiving a request body"
    HANDLING = "the app has the request; no deadline"


def _error_body(message: str, kind: str) -> bytes:
    return json.dumps(error_body(message, kind, 0.0)).encode()


def _closing_response(status: int, message: str, kind: str, retry: bool = False) -> bytes:
    """A whole response written straight to the socket, outside any request cycle."""
    body = _error_body(message, kind)
    head = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        *([f"retry-after: {RETRY_AFTER_S}"] if retry else []),
        "connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


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
        self.head_timeout = _closing_response(
            408, f"the request head took longer than {self.header_timeout_s:g} s", "request_timeout"
        )
        self.body_timeout = _closing_response(
            408, f"the request body took longer than {self.body_timeout_s:g} s", "request_timeout"
        )
        self._overloaded_body = _error_body(
            f"more than {self.max_concurrency} requests in flight; retry after Retry-After", "unavailable"
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionBudget:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls) if f.init})

    def evict_idle(self) -> bool:
        """Close the connection idle longest; False if none is idle."""
        if not self.idle:
            return False
        next(iter(self.idle)).close_now()
        return True

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
        if budget.open >= budget.max_connections and not budget.evict_idle():
            self.transport.write(budget.refusal)
            self.transport.close()
            return
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


def protocol_for(budget: ConnectionBudget) -> type[GuardedHttpToolsProtocol]:
    """A protocol class bound to ``budget``, for ``uvicorn.Config(http=...)`` (which takes a class)."""

    class Bound(GuardedHttpToolsProtocol):
        pass

    Bound.budget = budget
    return Bound


def raise_open_file_limit(wanted: int) -> None:
    """Raise the soft limit on open files to the hard one (often 1024 against 1M+), so that
    ``max_connections`` sockets fit; one warning if it stays below ``wanted``."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    except (ValueError, OSError):  # macOS refuses an unlimited hard limit; keep the soft one
        pass
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "the open-file limit is %d, below max_connections plus the service's own files (%d): "
            "connections past it fail to open; raise it (ulimit -n) or lower DISTILEMBED_MAX_CONNECTIONS",
            soft,
            wanted,
        )
