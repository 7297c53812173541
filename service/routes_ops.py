"""Operational routes: ``/health`` (liveness), ``/ready``, ``/info`` and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from export.quantize import bundle_widths, int8_widths
from service.errors import documented, retry_after, shown, took_ms
from service.routes_embed import served_encodings
from service.schemas import Health, Info, Ready
from service.state import State, bundle_path, index_info

router = APIRouter(tags=["operations"])  # always open: probes carry no key
info_router = APIRouter(tags=["operations"])  # a read key, when keys are set
metrics_router = APIRouter(tags=["operations"])  # a read key with metrics_require_key


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
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def trained_widths(encoder: Any) -> list[int]:
    """The bundle manifest's ``trained_widths`` (export records the student's), else just ``dim``."""
    return bundle_widths({"dim": encoder.dim} | getattr(encoder, "manifest", {}))


@info_router.get("/info", response_model=Info, responses=documented(503))
async def info(request: Request, state: State) -> Info:
    """The model, the index and this server's limits."""
    encoder, _ = state.require_encoder()
    index = None
    if state.index is not None:
        index = index_info(state.index)
    s = state.settings
    return Info(
        model=state.model,
        dim=encoder.dim,
        trained_widths=trained_widths(encoder),
        encodings=served_encodings(encoder),
        int8_widths=int8_widths(getattr(encoder, "manifest", {})),
        max_seq_len=encoder.max_seq_len,
        variant=str(getattr(encoder, "variant", s.variant)),
        bundle=shown(bundle_path(encoder, s)),
        bundle_sha256=state.bundle_sha256,
        index=index,
        limits={
            "max_items": s.max_items,
            "max_chars": s.max_chars,
            "max_queue": s.max_queue,
            "max_batch": s.max_batch,
            "max_wait_ms": s.max_wait_ms,
            "max_payload_bytes": s.max_payload_bytes,
            "default_top_k": s.default_top_k,
            "max_top_k": s.max_top_k,
            "max_metadata_depth": s.max_metadata_depth,
            "max_metadata_keys": s.max_metadata_keys,
            "max_metadata_key_chars": s.max_metadata_key_chars,
            "max_metadata_string_chars": s.max_metadata_string_chars,
            "max_metadata_items": s.max_metadata_items,
            "max_metadata_bytes": s.max_metadata_bytes,
        },
        versions=state.versions,
        took_ms=took_ms(request),
    )
