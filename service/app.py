"""The FastAPI app factory. Imports no torch: onnxruntime, tokenizers and faiss only (the ``[serve]`` extra).

Lifespan: load the bundle and the index (unless given), start the encoder worker, warm up, then
``/ready`` turns true. On shutdown ``/ready`` turns false, queued work drains, the index closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Security
from fastapi.middleware.cors import CORSMiddleware
from starlette.routing import Route

from distilembed.artifacts import tool_versions
from distilembed.errors import UserError
from index.searcher import IndexLike
from service import errors, middleware, openapi, routes_embed, routes_index, routes_ops
from service.auth import Access, AccessMiddleware, AccessTable, KeyRing, require_read, require_write
from service.batcher import Batcher, EncoderLike
from service.fast_path import FAST_ROUTES, FastPathMiddleware
from service.settings import Settings
from service.state import ServiceState, bundle_path

log = logging.getLogger("distilembed.service")
VERSIONED = ("distilembed", "onnxruntime", "tokenizers", "faiss-cpu", "numpy", "fastapi", "uvicorn")


def load_encoder(s: Settings) -> EncoderLike:
    from export.runtime import Encoder

    # Each encoder worker tokenises its own batch on its own core; the tokeniser's thread pool only
    # adds hand-offs between the two (decision 64). A value the operator set is kept.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _, threads = s.encoder_threads()
    return Encoder(
        s.bundle, variant=s.variant, threads=threads, batch_size=s.run_batch, spin_wait=s.spin_wait
    )


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


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
        state.metrics.index_vectors.set_function(lambda: float(index.ntotal))
    workers = s.encoder_threads()[0]
    batcher = Batcher(
        encoder,
        s.max_batch,
        s.max_wait_ms,
        s.max_queue,
        state.metrics,
        run_batch=s.run_batch,
        workers=workers,
    )
    batcher.start()
    state.batcher = batcher
    if s.warmup:
        # A short text, then one model run (run_batch rows at most) of longest texts: it sizes the buffers
        longest = " ".join(["warm"] * (2 * encoder.max_seq_len))
        for texts in (["warm up"], [longest] * min(s.max_batch, s.run_batch)):
            warm = await batcher.embed(texts)
        if index is not None and index.ntotal:
            await asyncio.to_thread(index.search, warm.vectors[:1], 1)
    state.ready = True
    state.metrics.ready.set(1)
    held = f"{index.kind} with {index.ntotal} vectors" if index is not None else "none"
    variant = getattr(encoder, "variant", s.variant)
    log.info("ready: model %s (%d-d, %s), index %s", state.model, encoder.dim, variant, held)


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
        yield
    finally:  # a failed start is shut down too
        await _shutdown(state)


def create_app(
    settings: Settings | None = None, encoder: EncoderLike | None = None, index: IndexLike | None = None
) -> FastAPI:
    """Build the app; a given ``encoder``/``index`` is used instead of loading one (the app closes it)."""
    settings = settings or Settings()
    metrics = middleware.Metrics()
    app = FastAPI(
        title="distilembed",
        summary="Compact sentence embeddings: embed, similarity and search on a CPU.",
        version=tool_versions("distilembed").get("distilembed", "0"),
        lifespan=lifespan,
    )
    app.state.service = ServiceState(settings=settings, metrics=metrics, encoder=encoder, index=index)
    errors.install(app)
    served = [settings.bundle, *(d for d in (settings.index_dir, settings.snapshots) if d is not None)]
    app.state.scrub = errors.PathScrubber(served)
    # Key checks only when keys are set: the hot routes should not resolve, on every request, a check
    # that cannot fail, nor the OpenAPI document promise a 401 that never comes.
    app.state.keys = keys = KeyRing.from_settings(settings)
    options: dict[Access | None, dict[str, Any]] = {None: {}, "read": {}, "write": {}}
    if keys.enabled:
        options["read"] = {"dependencies": [Security(require_read)], "responses": errors.documented(401)}
        write = {"dependencies": [Security(require_write)], "responses": errors.documented(401, 403)}
        options["write"] = write
    metrics_access: Access | None = "read" if settings.metrics_require_key else None
    needs: list[tuple[APIRouter, Access | None]] = [
        (routes_ops.router, None),
        (routes_ops.info_router, "read"),
        (routes_ops.metrics_router, metrics_access),
        (routes_embed.router, "read"),
        (routes_index.read_router, "read"),
        (routes_index.write_router, "write"),
    ]
    for router, access in needs:
        app.include_router(router, **options[access])
    openapi.install(app, settings)
    # Outermost last: observability, CORS, the 500 guard, the key check (before the body is read), body
    # limit, the embedding routes' fast path.
    fast_routes = [*routes_embed.router.routes, *routes_index.read_router.routes]
    fast = {
        r.path: r
        for r in fast_routes
        if isinstance(r, Route) and r.path in FAST_ROUTES and "POST" in (r.methods or ())
    }
    app.add_middleware(FastPathMiddleware, state=app.state.service, routes=fast, keys=keys.enabled)
    app.add_middleware(middleware.PayloadLimitMiddleware, limit=settings.max_payload_bytes)
    if keys.enabled:
        table = AccessTable((r, a) for router, a in needs if a is not None for r in router.routes)
        app.add_middleware(AccessMiddleware, keys=keys, table=table)
    app.add_middleware(middleware.InternalErrorMiddleware, metrics=metrics)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-API-Key"],
            expose_headers=["X-Took-Ms", "Retry-After"],
        )
    routes = [r for router, _ in needs for r in router.routes]
    app.add_middleware(middleware.ObservabilityMiddleware, metrics=metrics, routes=routes)
    return app
