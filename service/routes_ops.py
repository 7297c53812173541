"""Operational routes: ``/health`` (liveness), ``/ready``, ``/info`` and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

from dataclasses import fields

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from export.quantize import bundle_widths, int8_widths
from service.errors import documented, retry_after, shown, took_ms
from service.metadata import MetadataLimits
from service.routes_embed import served_encodings
from service.schemas import Health, Info, Ready
from service.state import State, bundle_path, index_info

router = APIRouter(tags=["operations"])  # always open: probes carry no key
info_router = APIRouter(tags=["operations"])  # a read key, when keys are set
metrics_router = APIRouter(tags=["operations"])  # a read key with metrics_require_key
INFO_LIMITS = [  # the settings /info reports
    *("max_items", "max_chars", "max_queue", "max_batch", "max_wait_ms", "max_payload_bytes"),
    *("default_top_k", "max_top_k", *(f"max_metadata_{f.name}" for f in fields(MetadataLimits))),
]


@router.get("/health", response_model=Health)
async def health(request: Request) -> Health:
    """The process answers. Open even when an API key is set."""
    return Health(took_ms=took_ms(request))


@router.get(
    "/ready",
    response_model=Ready,
    responses={503: {"model": Ready, "description": "Not ready yet, or stopping.", "headers": retry_after()}},
)
async def ready(request: Request, state: State) -> JSONResponse:
    """200 once the bundle (and index) are loaded and warmed up; 503 before that and while shutting down."""
    body = Ready(ready=state.ready, took_ms=took_ms(request))
    if state.ready:
        return JSONResponse(body.model_dump())
    return JSONResponse(body.model_dump(), status_code=503, headers={"Retry-After": "1"})


@metrics_router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}},
)
async def metrics(state: State) -> Response:
    """Prometheus text format."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@info_router.get("/info", response_model=Info, responses=documented(503))
async def info(request: Request, state: State) -> Info:
    """The model, the index and this server's limits."""
    encoder, _ = state.require_encoder()
    s = state.settings
    return Info(
        model=state.model,
        dim=encoder.dim,
        trained_widths=bundle_widths({"dim": encoder.dim} | getattr(encoder, "manifest", {})),
        encodings=served_encodings(encoder),
        int8_widths=int8_widths(getattr(encoder, "manifest", {})),
        max_seq_len=encoder.max_seq_len,
        variant=str(getattr(encoder, "variant", s.variant)),
        bundle=shown(bundle_path(encoder, s)),
        bundle_sha256=state.bundle_sha256,
        index=index_info(state.index) if state.index is not None else None,
        limits={name: getattr(s, name) for name in INFO_LIMITS},
        versions=state.versions,
        took_ms=took_ms(request),
    )
