"""What one app serves: settings, encoder, batcher, optional live index, metrics; helpers the routes share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import numpy as np
from fastapi import Depends, Request

from service.batcher import Batcher, BatcherClosedError, Embedded, EncoderLike, QueueFullError
from service.errors import ApiError, payload_too_large
from service.metrics import Metrics
from service.schemas import IndexInfo
from service.settings import Settings

if TYPE_CHECKING:
    from index.live import Hit
    from index.store import Document


class IndexLike(Protocol):
    """The interface of ``index.live.LiveIndex`` that the service uses."""

    # Read-only here: the service never sets them (a replica's or a sharded index's are properties).
    @property
    def dim(self) -> int: ...

    @property
    def nprobe(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def nlist(self) -> int: ...

    @property
    def manifest(self) -> dict[str, Any]: ...

    @property
    def ntotal(self) -> int: ...

    def search(
        self,
        queries: np.ndarray,
        k: int,
        nprobe: int | None = None,
        where: dict[str, Any] | None = None,
        rescore_k: int | None = None,
    ) -> list[list[Hit]]: ...

    def get(self, ext_id: str) -> Document | None: ...

    def count(self, where: dict[str, Any] | None = None) -> int: ...

    @property
    def indexed_fields(self) -> tuple[str, ...]: ...

    def add_field_index(self, field: str) -> bool: ...

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray) -> tuple[int, int]: ...

    def delete(self, ext_ids: Sequence[str]) -> list[str]: ...

    def checkpoint(self) -> None: ...

    def retrain(
        self, nlist: int = 1024, storage: str | None = None, flat_below: int = 10_000, seed: int = 0
    ) -> dict[str, Any]: ...

    def snapshot(self, out: Path) -> dict[str, Any]: ...

    def close(self) -> None: ...


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

    async def embed(self, texts: Sequence[str]) -> Embedded:
        _, batcher = self.require_encoder()
        try:
            return await batcher.embed(texts)
        except QueueFullError as exc:
            raise ApiError(
                429,
                "too many texts waiting; retry later",
                "overloaded",
                {"Retry-After": str(exc.retry_after)},
            ) from exc
        except BatcherClosedError as exc:
            raise ApiError(503, str(exc), "unavailable", {"Retry-After": "1"}) from exc


def get_state(request: Request) -> ServiceState:
    return request.app.state.service


async def _state_dependency(request: Request) -> ServiceState:
    """Async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop
    per request for one attribute lookup."""
    return get_state(request)


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
