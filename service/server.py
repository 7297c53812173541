"""Run the app under uvicorn: one worker; on SIGTERM or SIGINT readiness turns off at once, uvicorn
stops accepting, the requests in flight finish (up to ``shutdown_timeout_s``), the lifespan drains
the encoder queue and checkpoints the index, and a SIGTERM stop exits 0."""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from distilembed.errors import UserError
from service.app import bundle_sha256, create_app, load_encoder, load_index
from service.settings import Settings
from service.state import ServiceState
from service.write_coalescing import CoalescingHttpToolsProtocol

log = logging.getLogger("distilembed.service")


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


def build_server(settings: Settings) -> _Server:
    """Load the bundle and the index, then the server (not started): a bad bundle or index fails
    here with one line, not in a traceback from the lifespan."""
    encoder = load_encoder(settings)
    index = load_index(settings, encoder.dim, bundle_sha256(settings.bundle))
    return server_for(create_app(settings, encoder=encoder, index=index), settings)


def server_for(app: FastAPI, settings: Settings) -> _Server:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_level=settings.log_level,
        access_log=settings.access_log,
        limit_concurrency=settings.max_concurrency,
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]
        lifespan="on",
        http=CoalescingHttpToolsProtocol,
    )
    return _Server(config, app.state.service)


def run(settings: Settings) -> None:
    server = build_server(settings)
    server.run()
    if not server.started:
        raise UserError("the server did not start (see the log above)")
