"""What one app serves: settings, encoder, batcher, optional live index, metrics; helpers the routes share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from index.searcher import IndexLike
from service.batcher import Batcher, BatcherClosedError, Embedded, EncoderLike, QueueFullError, SliceHook
from service.errors import ApiError, payload_too_large
from service.middleware import Metrics
from service.schemas import IndexInfo
from service.settings import Settings


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics
    encoder: EncoderLike | None = None
    index: IndexLike | None = None
    owns_index: bool = False  # opened by the lifespan (not given): closed and dropped at shutdown
    batcher: Batcher | None = None
    ready: bool = False
    model: str = ""
    bundle_sha256: str | None = None
    versions: dict[str, str] = field(default_factory=dict)

    def require_encoder(self) -> tuple[EncoderLike, Batcher]:
        if self.encoder is None or self.batcher is None:
            raise ApiError(503, "the service is not ready", "unavailable", {"Retry-After": "1"})
        return self.encoder, self.batcher

    def require_index(self) -> IndexLike:
        if self.index is None:
            raise ApiError(404, "no index configured (set DISTILEMBED_INDEX_DIR)", "no_index")
        return self.index

    def check_texts(self, texts: list[str], truncate: bool = False) -> list[str]:
        """Apply the per-request limits: too many texts or a text too long = 413 (or cut with truncate)."""
        limits = self.settings
        if len(texts) > limits.max_items:
            raise payload_too_large(f"{len(texts)} texts in one request; the limit is {limits.max_items}")
        if truncate:
            return [t[: limits.max_chars] for t in texts]
        for i, text in enumerate(texts):
            if len(text) > limits.max_chars:
                raise payload_too_large(
                    f"text {i} has {len(text)} characters; the limit is {limits.max_chars} "
                    "(pass truncate: true to cut it)"
                )
        return texts

    async def embed(self, texts: Sequence[str], then: SliceHook | None = None) -> Embedded:
        _, batcher = self.require_encoder()
        try:
            return await batcher.embed(texts, then)
        except QueueFullError as exc:
            retry = {"Retry-After": str(exc.retry_after)}
            raise ApiError(429, "too many texts waiting; retry later", "overloaded", retry) from exc
        except BatcherClosedError as exc:
            raise ApiError(503, str(exc), "unavailable", {"Retry-After": "1"}) from exc


async def _state_dependency(request: Request) -> ServiceState:
    """Async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop
    per request for one attribute lookup."""
    return request.app.state.service


State = Annotated[ServiceState, Depends(_state_dependency)]


def bundle_path(encoder: EncoderLike, settings: Settings) -> Path:
    return Path(getattr(encoder, "bundle", settings.bundle))


def index_info(index: IndexLike) -> IndexInfo:
    return IndexInfo(
        type=index.kind,
        ntotal=index.ntotal,
        nlist=index.nlist,
        nprobe=index.nprobe,
        dim=index.dim,
        indexed_fields=list(index.indexed_fields),
    )
