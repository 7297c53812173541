"""Run the app under uvicorn: one worker, readiness off as soon as a stop signal arrives, then drain."""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn

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


def run(settings: Settings) -> None:
    # Load before the server starts so a bad bundle or index fails with one line, not a traceback.
    encoder = load_encoder(settings)
    index = load_index(settings, encoder.dim, bundle_sha256(settings.bundle))
    app = create_app(settings, encoder=encoder, index=index)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_level=settings.log_level,
        access_log=settings.access_log,
        limit_concurrency=settings.max_concurrency,
        timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]
        lifespan="on",
        http=CoalescingHttpToolsProtocol,
    )
    server = _Server(config, app.state.service)
    server.run()
    if not server.started:
        raise UserError("the server did not start (see the log above)")
