"""The FastAPI app factory. Imports no torch: onnxruntime, tokenizers and faiss only (the ``[serve]`` extra).

Lifespan: load the bundle and the index (unless given), start the encoder worker, warm up, then
``/ready`` turns true. On shutdown ``/ready`` turns false, queued work drains, the index closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict

from fastapi import APIRouter, FastAPI, Security, params
from fastapi.middleware.cors import CORSMiddleware

from distilembed.artifacts import tool_versions
from distilembed.errors import UserError
from index.searcher import IndexLike
from service import errors, openapi
from service.auth import Access, AccessMiddleware, AccessTable, KeyRing, require_read, require_write
from service.batcher import Batcher, EncoderLike
from service.metrics import Metrics, directory_size
from service.middleware import InternalErrorMiddleware, ObservabilityMiddleware, PayloadLimitMiddleware
from service.routes_embed import router as embed_router
from service.routes_fields import read_router as fields_read_router
from service.routes_fields import write_router as fields_write_router
from service.routes_index import read_router as index_read_router
from service.routes_index import write_router as index_write_router
from service.routes_ops import info_router, metrics_router
from service.routes_ops import router as ops_router
from service.settings import Settings
from service.state import ServiceState, bundle_path

log = logging.getLogger("distilembed.service")
VERSIONED = ("distilembed", "onnxruntime", "tokenizers", "faiss-cpu", "numpy", "fastapi", "uvicorn")


class RouterOptions(TypedDict, total=False):
    """The ``include_router`` keywords a router's key check adds."""

    dependencies: Sequence[params.Depends]
    responses: dict[int | str, dict[str, Any]]


def load_encoder(settings: Settings) -> EncoderLike:
    from export.runtime import Encoder

    return Encoder(
        settings.bundle,
        variant=settings.variant,
        threads=settings.threads,
        batch_size=settings.run_batch,
        spin_wait=settings.spin_wait,
    )


def bundle_sha256(bundle: Path) -> str | None:
    """What an index records as the bundle it was built with (export/runtime.py bundle_identity)."""
    from export.runtime import bundle_identity

    return bundle_identity(bundle)


def load_index(settings: Settings, dim: int, bundle_sha: str | None) -> IndexLike | None:
    """Open the live index, refusing one built with another bundle or for another dimension."""
    if settings.index_dir is None:
        return None
    if not Path(settings.index_dir).is_dir():
        if not settings.create_index:
            raise UserError(
                f"index directory does not exist: {settings.index_dir} "
                "(run 'distilembed index build', or serve with --create-index)"
            )
        from index.build import BuildConfig, create_empty

        try:
            create_empty(BuildConfig(bundle=str(settings.bundle), out=str(settings.index_dir)))
        except OSError as exc:
            raise UserError(f"cannot create the index at {settings.index_dir}: {exc.strerror}") from exc
    from index.shards import open_index

    return open_index(settings.index_dir, dim, bundle_sha, settings.nprobe, rescore_k=settings.rescore_k)


def warmup_texts(encoder: EncoderLike, rows: int) -> list[list[str]]:
    """A short text alone, then a full batch of longest texts (sizes onnxruntime's buffers once)."""
    longest = " ".join(["warm"] * (2 * encoder.max_seq_len))
    return [["warm up"], [longest] * rows]


async def _startup(state: ServiceState) -> None:
    s = state.settings
    if state.encoder is None:
        state.encoder = await asyncio.to_thread(load_encoder, s)
    encoder = state.encoder
    bundle = bundle_path(encoder, s)
    state.bundle_sha256 = await asyncio.to_thread(bundle_sha256, bundle)
    if state.index is None:
        state.index = await asyncio.to_thread(load_index, s, encoder.dim, state.bundle_sha256)
        state.owns_index = state.index is not None
    index = state.index
    if index is not None and index.dim != encoder.dim:
        raise UserError(f"the bundle gives {encoder.dim}-d vectors but the index holds {index.dim}-d vectors")
    state.metrics.bundle_size.set(await asyncio.to_thread(directory_size, bundle))
    state.model = s.model_name or bundle.resolve().name
    state.versions = tool_versions(*VERSIONED)
    if index is not None:
        state.metrics.track_index(lambda: index.ntotal)
    batcher = Batcher(encoder, s.max_batch, s.max_wait_ms, s.max_queue, state.metrics, run_batch=s.run_batch)
    batcher.start()
    state.batcher = batcher
    if s.warmup:
        # One model run of longest texts sizes onnxruntime's buffers; a call is cut into such runs.
        for texts in warmup_texts(encoder, min(s.max_batch, s.run_batch)):
            warm = await batcher.embed(texts)
        if index is not None and index.ntotal:
            await asyncio.to_thread(index.search, warm.vectors[:1], 1)
    state.ready = True
    state.metrics.ready.set(1)
    log.info(
        "ready: model %s (%d-d, %s), index %s",
        state.model,
        encoder.dim,
        getattr(encoder, "variant", s.variant),
        f"{index.kind} with {index.ntotal} vectors" if index is not None else "none",
    )


async def _shutdown(state: ServiceState) -> None:
    state.ready = False
    state.metrics.ready.set(0)
    if state.batcher is not None:
        await state.batcher.aclose(state.settings.shutdown_timeout_s)
    if state.index is not None:
        await asyncio.to_thread(state.index.close)
        if state.owns_index:  # a later start (a restarted lifespan) opens it again
            state.index, state.owns_index = None, False
    log.info("shut down")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServiceState = app.state.service
    try:
        await _startup(state)
    except BaseException:
        await _shutdown(state)
        raise
    try:
        yield
    finally:
        await _shutdown(state)


def create_app(
    settings: Settings | None = None, encoder: EncoderLike | None = None, index: IndexLike | None = None
) -> FastAPI:
    """Build the app; a given ``encoder``/``index`` is used instead of loading one (the app closes it)."""
    settings = settings or Settings()
    metrics = Metrics()
    app = FastAPI(
        title="distilembed",
        summary="Compact sentence embeddings: embed, similarity and search on a CPU.",
        version=tool_versions("distilembed").get("distilembed", "0"),
        lifespan=lifespan,
    )
    state = ServiceState(settings=settings, metrics=metrics, encoder=encoder, index=index)
    app.state.service = state
    errors.install(app)
    served = [settings.bundle, *(d for d in (settings.index_dir, settings.snapshots) if d is not None)]
    app.state.scrub = errors.PathScrubber(served)
    # The key checks (AccessMiddleware, and the dependencies that document them) exist only when keys
    # are set: FastAPI resolves dependencies on every request, the hot routes should not pay for a
    # check that cannot fail, and the OpenAPI document should not promise a 401 that never comes.
    app.state.keys = keys = KeyRing.from_settings(settings)
    read: RouterOptions = {"dependencies": [Security(require_read)], "responses": errors.documented(401)}
    write: RouterOptions = {
        "dependencies": [Security(require_write)],
        "responses": errors.documented(401, 403),
    }
    if not keys.enabled:
        read = write = {}
    options: dict[Access | None, RouterOptions] = {"read": read, "write": write, None: {}}
    metrics_access: Access | None = "read" if settings.metrics_require_key else None
    needs: list[tuple[APIRouter, Access | None]] = [
        (ops_router, None),
        (info_router, "read"),
        (metrics_router, metrics_access),
        (embed_router, "read"),
        (index_read_router, "read"),
        (index_write_router, "write"),
        (fields_read_router, "read"),
        (fields_write_router, "write"),
    ]
    for router, access in needs:
        app.include_router(router, **options[access])
    openapi.install(app, settings, lambda: state.encoder.dim if state.encoder is not None else None)
    # Outermost last: observability, CORS, the 500 guard, the key check, then the body limit (the key
    # check comes before anything reads the body).
    app.add_middleware(PayloadLimitMiddleware, limit=settings.max_payload_bytes)
    if keys.enabled:
        table = AccessTable((r, a) for router, a in needs if a is not None for r in router.routes)
        app.add_middleware(AccessMiddleware, keys=keys, table=table)
    app.add_middleware(InternalErrorMiddleware, metrics=metrics)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-API-Key"],
            expose_headers=["X-Took-Ms", "Retry-After"],
        )
    routes = [r for router, _ in needs for r in router.routes]
    app.add_middleware(ObservabilityMiddleware, metrics=metrics, routes=routes)
    return app
