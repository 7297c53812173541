"""Run the app under uvicorn: one worker; on SIGTERM or SIGINT readiness turns off at once, uvicorn
stops accepting, the requests in flight finish (up to ``shutdown_timeout_s``), the lifespan drains
the encoder queue and checkpoints the index, and a SIGTERM stop exits 0. Connections are timed and
budgeted by our protocol (service/connections.py), not by uvicorn's ``limit_concurrency``."""

from __future__ import annotations

import errno
import ipaddress
import logging
import signal
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from distilembed.errors import UserError
from service.app import bundle_sha256, create_app, load_encoder, load_index
from service.auth import KeyRing
from service.connections import ConnectionBudget, protocol_for, raise_open_file_limit
from service.settings import Settings
from service.state import ServiceState

log = logging.getLogger("distilembed.service")

OWN_FILES = 256  # open files besides the connections: the index, its store, logs, the model


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServiceState) -> None:
        super().__init__(config)
        self.service_state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # /ready answers 503 from now on while uvicorn drains the requests in flight
        self.service_state.ready = False
        self.service_state.metrics.ready.set(0)
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            # uvicorn raises a captured signal again once it has shut down, which would end the
            # process by SIGTERM (exit 143) after a clean drain; a SIGTERM stop is a normal exit.
            captured = getattr(self, "_captured_signals", [])
            while signal.SIGTERM in captured:
                captured.remove(signal.SIGTERM)


def server_for(app: FastAPI, settings: Settings) -> _Server:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_level=settings.log_level,
        access_log=settings.access_log,
        limit_concurrency=None,  # it counts idle connections; our protocol bounds requests instead
        timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]
        lifespan="on",
        ws="none",  # no WebSocket routes; an upgraded socket would leave the connection budget
        http=protocol_for(ConnectionBudget.from_settings(settings)),
    )
    return _Server(config, app.state.service)


def warn_if_exposed(settings: Settings) -> None:
    """One warning when the service listens beyond this machine with every route open."""
    host = settings.host
    try:
        loopback = host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        loopback = False
    if loopback or KeyRing.from_settings(settings).enabled:
        return
    host = f"[{host}]" if ":" in host else host
    log.warning(
        "serving on %s:%d with no API key: anyone who can reach this address can read and write; "
        "set DISTILEMBED_API_KEY (or DISTILEMBED_READ_KEYS / DISTILEMBED_WRITE_KEYS)",
        host,
        settings.port,
    )


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` as uvicorn will (each address it resolves to, ``SO_REUSEADDR``, IPv6 only on
    IPv6), then let go: a busy port is one line at once, not an error after the model has loaded."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
    except OSError as exc:
        where = f"port {port} on {host}"
        message = f"cannot listen on {where}: {exc.strerror or exc}"
        if exc.errno == errno.EADDRINUSE:
            message = f"{where} is in use: stop what holds it, or pass --port / DISTILEMBED_PORT"
        raise UserError(message) from None


def run(settings: Settings) -> None:
    check_port_free(settings.host, settings.port)
    warn_if_exposed(settings)
    raise_open_file_limit(settings.max_connections + OWN_FILES)
    # The bundle and the index load here: a bad one fails in one line, not a traceback from the lifespan.
    encoder = load_encoder(settings)
    index = load_index(settings, encoder.dim, bundle_sha256(settings.bundle))
    server = server_for(create_app(settings, encoder=encoder, index=index), settings)
    server.run()
    if not server.started:
        raise UserError("the server did not start (see the log above)")
