"""Search, document, count and field-index routes over the live index. Index calls run in the thread
pool (they block)."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Annotated, Any, cast

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from index.browse import documents_page
from index.hits import Hit, HybridHit
from index.live import LiveIndex
from index.searcher import IndexLike
from index.store import Document
from service.errors import ApiError, documented, payload_too_large, require_json, shown, took_ms, validation
from service.filter_schema import CountRequest, CountResponse, FieldIndexRequest, FieldIndexResponse
from service.metadata import MetadataLimits, check_documents, returnable
from service.middleware import elapsed_ms
from service.routes_embed import FastJSONResponse
from service.schemas import (
    DeleteResponse,
    DocumentOut,
    DocumentPage,
    ListedDocument,
    RetrainRequest,
    RetrainResponse,
    SearchBatchesResponse,
    SearchRequest,
    SearchResponse,
    SnapshotResponse,
    UpsertRequest,
    UpsertResponse,
)
from service.state import ServiceState, State, index_info

# create_app adds the key checks: read keys for read_router, write keys for write_router.
read_router = APIRouter(tags=["index"])
write_router = APIRouter(tags=["index"])
JSON_BODY = [Depends(require_json)]
# Unfiltered dense queries this small are searched by the encoder thread that encoded them, or a lone
# one on the event loop (_plain): at most this many vectors scanned a query (IVF lists at the default
# nprobe, or a flat index) and k rows read, under 0.5 ms a query.
INLINE_MAX_K, INLINE_MAX_SCANNED = 100, 50_000
# An encoder thread whose slice's search finds another slice's search holding the index waits for it
# this long at most: bounded work, and the slices of one request finish together.
PEER_WAIT_S = 0.02


def _not_found(doc_id: str) -> ApiError:
    return ApiError(404, f"no document with id {doc_id!r}", "not_found")


def _vector(body: SearchRequest, dim: int) -> np.ndarray:
    """The request's own query vector, normalised: any finite JSON number, even 1e300, without overflow."""
    assert body.vector is not None
    if len(body.vector) != dim:
        raise validation(f"vector has {len(body.vector)} dimensions; the index holds {dim}-d vectors")
    vector = np.asarray([body.vector], dtype=np.float64)
    scale = float(np.abs(vector).max())
    if scale == 0:
        return vector.astype(np.float32)  # all zeros: every score is 0
    vector /= scale
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def _plain(index: IndexLike, body: SearchRequest, k: int, allowed: bool) -> LiveIndex | None:
    """The index, if this request's queries are unfiltered dense ones at the default nprobe without
    rescoring, over a local index: bounded work that may run without a thread hand-off (decision 64)."""
    plain = body.mode == "dense" and not body.filter and body.nprobe is None and body.rescore_k is None
    if allowed and plain and k <= INLINE_MAX_K and isinstance(index, LiveIndex):
        return index
    return None


async def _embedded_search(
    live: LiveIndex | None, texts: list[str], state: ServiceState, k: int
) -> tuple[np.ndarray, list[list[Hit] | None]]:
    """The queries' vectors (every query in one batch), and the hits of those whose search the encoder
    threads ran as each slice of vectors was ready, on the core that encoded it; None for the rest."""
    metrics = state.metrics

    def search_slice(vectors: np.ndarray) -> list[list[Hit]] | None:
        start = time.perf_counter()
        found = live.try_search(vectors, k, INLINE_MAX_SCANNED, PEER_WAIT_S) if live else None
        if found is not None:
            metrics.search_duration.observe(time.perf_counter() - start)
        return found

    embedded = await state.embed(texts, search_slice if live else None)
    found: list[list[Hit] | None] = [None] * len(texts)
    for start, stop, part in embedded.parts:
        if isinstance(part, list):
            found[start:stop] = part
    return embedded.vectors, found


async def _search_rest(
    state: ServiceState,
    body: SearchRequest,
    live: LiveIndex | None,
    *,
    texts: list[str],
    vectors: np.ndarray | None,
    found: list[list[Hit] | None],
    k: int,
    ahead: Ahead | None = None,
) -> list[list[Hit]]:
    """``found`` completed: the queries without hits yet searched on the event loop (a lone one, when
    ``live`` can answer at once) or in the thread pool; ``ahead``: hybrid queries' lexical sides."""
    if missing := [i for i, hits in enumerate(found) if hits is None]:
        start = time.perf_counter()
        rest = None if vectors is None else vectors[missing]
        got: list[list[Hit]] | None = None
        if ahead is not None and rest is not None:
            lexical, seconds = await ahead
            start -= seconds  # the search's time includes its lexical side's
            index, subset = cast("LiveIndex", state.require_index()), [texts[i] for i in missing]
            sides = [lexical[i] for i in missing]
            got = await run_in_threadpool(_hybrid_after, index, body, subset, rest, k, sides=sides)
        elif live and rest is not None and len(missing) == 1:
            got = live.try_search(rest, k, INLINE_MAX_SCANNED)
        if got is None:
            subset = [texts[i] for i in missing] if texts else []
            got = await run_in_threadpool(_run_search, state.require_index(), body, subset, rest, k)
        state.metrics.search_duration.observe(time.perf_counter() - start)
        for i, hits in zip(missing, got, strict=True):
            found[i] = hits
    return cast("list[list[Hit]]", found)


def _run_search(
    index: IndexLike, body: SearchRequest, texts: list[str], vectors: np.ndarray | None, k: int
) -> list[list[Hit]]:
    """The top-k hits of each query in the request's mode (dense: one call for every query)."""
    where = body.filter or None
    if vectors is not None and body.mode == "dense":
        return index.search(vectors, k, body.nprobe, where, body.rescore_k)
    if vectors is None:
        return [index.search_lexical(text, k, where) for text in texts]
    options = _hybrid_options(body)
    return [list(index.search_hybrid(v, t, k, where, **options)) for v, t in zip(vectors, texts, strict=True)]


def _hybrid_options(body: SearchRequest) -> dict[str, Any]:
    """``search_hybrid``'s fusion, weights and nprobe as the request gives them."""
    return {"fusion": body.fusion, "weights": tuple(body.weights or (1.0, 1.0)), "nprobe": body.nprobe}


Sides = list[list[tuple[int, float]]]  # per query, the lexical side's (id, BM25) candidates
Ahead = asyncio.Future[tuple[Sides, float]]  # those sides, and the seconds they took


def _lexical_ahead(index: IndexLike, body: SearchRequest, texts: list[str], k: int) -> Ahead | None:
    """A hybrid search's lexical sides over a local index, found in the thread pool while the encoder
    makes the query vectors (decision 65); None for other searches."""
    if body.mode != "hybrid" or not texts or not isinstance(index, LiveIndex):
        return None

    def sides() -> tuple[Sides, float]:
        start = time.perf_counter()
        found = [index.lexical_side(text, k, body.filter or None) for text in texts]
        return found, time.perf_counter() - start

    ahead = asyncio.ensure_future(run_in_threadpool(sides))
    # Retrieved where it is awaited; this keeps a failure from being logged as never retrieved when the
    # request fails first (the encoder's queue full, say).
    ahead.add_done_callback(lambda done: done.cancelled() or done.exception())
    return ahead


def _hybrid_after(
    index: LiveIndex, body: SearchRequest, texts: list[str], vectors: np.ndarray, k: int, *, sides: Sides
) -> list[list[Hit]]:
    """Hybrid queries whose lexical sides were found ahead (``_lexical_ahead``): their dense sides, fused."""
    where, options = body.filter or None, _hybrid_options(body)
    return [
        list(index.search_hybrid(v, t, k, where, lexical=lexical, **options))
        for v, t, lexical in zip(vectors, texts, sides, strict=True)
    ]


def _result(hit: Hit, shown: frozenset[str], vectors: dict[str, np.ndarray]) -> dict[str, Any]:
    """One hit as JSON (a ``SearchResult``): vector and the hybrid scores only where they apply."""
    out: dict[str, Any] = {
        "id": hit.id,
        "score": hit.score,
        "text": hit.text if "text" in shown else None,
        "metadata": returnable(hit.id, hit.metadata) if "metadata" in shown else None,
    }
    if "vector" in shown:
        out["vector"] = vectors.get(hit.id)
    if isinstance(hit, HybridHit):
        out |= {"dense_score": hit.dense_score, "lexical_score": hit.lexical_score}
        out["matched"] = list(hit.matched)
    return out


async def search_content(body: SearchRequest, state: ServiceState, scope: Scope) -> dict[str, Any]:
    """The body of a ``/search`` answer (the route and service/fast_path.py both serve it)."""
    index = state.require_index()
    limits = state.settings
    top_k = body.top_k if body.top_k is not None else limits.default_top_k
    if not 1 <= top_k <= limits.max_top_k:
        raise validation(f"top_k must be between 1 and {limits.max_top_k}, got {top_k}")
    if body.offset + top_k > limits.max_top_k:
        raise payload_too_large(
            f"offset + top_k is {body.offset + top_k}; the limit is max_top_k, {limits.max_top_k}"
        )
    texts = [] if body.vector is not None else body.queries or [body.query or ""]
    texts = state.check_texts(texts, body.truncate)
    k = body.offset + top_k
    vectors: np.ndarray | None = None
    found: list[list[Hit] | None] = [None] * max(1, len(texts))
    live = _plain(index, body, k, limits.inline_search)
    ahead = None
    if body.vector is not None:
        vectors = _vector(body, index.dim)
    elif body.mode != "lexical":
        ahead = _lexical_ahead(index, body, texts, k)
        vectors, found = await _embedded_search(live, texts, state, k)
    hits = await _search_rest(state, body, live, texts=texts, vectors=vectors, found=found, k=k, ahead=ahead)
    floor = body.score_threshold
    pages = [[h for h in row[body.offset :] if floor is None or h.score >= floor] for row in hits]
    wanted = body.returned()
    stored = {}
    if "vector" in wanted:
        stored = await run_in_threadpool(index.vectors, [h.id for hits in pages for h in hits])
    results = [[_result(h, wanted, stored) for h in hits] for hits in pages]
    if body.queries is None:
        return {"results": results[0], "took_ms": elapsed_ms(scope)}
    return {"batches": [{"results": r} for r in results], "took_ms": elapsed_ms(scope)}


@read_router.post(
    "/search",
    response_model=SearchResponse | SearchBatchesResponse,
    dependencies=JSON_BODY,
    responses=documented(400, 404, 413, 415, 422, 429, 503),
)
async def search(body: SearchRequest, request: Request, state: State) -> FastJSONResponse:
    """Top-k documents for a query text, several texts (`queries`: a batch of results each) or a vector,
    by dense vectors (scores are cosines), BM25 (`lexical`) or both fused (`hybrid`), with an optional
    metadata filter, `offset` pages and a `score_threshold`."""
    return FastJSONResponse(await search_content(body, state, request.scope))


@write_router.post(
    "/documents",
    response_model=UpsertResponse,
    dependencies=JSON_BODY,
    responses=documented(400, 404, 409, 413, 415, 422, 429, 503),
)
async def upsert_documents(body: UpsertRequest, request: Request, state: State) -> UpsertResponse:
    """Embed and insert or replace documents by id. The answer comes after the index made them durable."""
    index = state.require_index()
    # A pass over every value sent (a tenth of a second for the largest body): off the event loop.
    await run_in_threadpool(check_documents, body.documents, MetadataLimits.from_settings(state.settings))
    texts = state.check_texts([d.text for d in body.documents])
    embedded = await state.embed(texts)
    docs = [Document(d.id, d.text, d.metadata) for d in body.documents]
    added, replaced = await run_in_threadpool(index.upsert, docs, embedded.vectors)
    return UpsertResponse(added=added, replaced=replaced, took_ms=took_ms(request))


CURSOR = Query(
    pattern=r"^[0-9]{0,20}$",
    description="Where a page starts: the `next_cursor` of the page before (opaque); none: the first.",
)


@read_router.get("/documents", response_model=DocumentPage, responses=documented(404, 422, 503))
async def list_documents(
    request: Request,
    state: State,
    cursor: Annotated[str | None, CURSOR] = None,
    limit: Annotated[int | None, Query(ge=1, description="1..max_top_k (default: default_top_k).")] = None,
) -> DocumentPage:
    """Every document, a page at a time, in a stable order (keyset pagination): a walk with each
    page's `next_cursor` returns every document present throughout exactly once, writes or not."""
    index = state.require_index()
    limit = limit if limit is not None else state.settings.default_top_k
    if limit > state.settings.max_top_k:
        raise validation(f"limit must be between 1 and {state.settings.max_top_k}, got {limit}")
    docs, after = await run_in_threadpool(documents_page, index.list_documents, cursor, limit)
    listed = [ListedDocument(id=d.id, text=d.text, metadata=d.metadata) for d in docs]
    return DocumentPage(documents=listed, next_cursor=after, took_ms=took_ms(request))


@read_router.get("/documents/{doc_id:path}", response_model=DocumentOut, responses=documented(404, 503))
async def get_document(doc_id: str, request: Request, state: State) -> DocumentOut:
    """A document by id: its text and metadata."""
    index = state.require_index()
    doc = await run_in_threadpool(index.get, doc_id)
    if doc is None:
        raise _not_found(doc_id)
    return DocumentOut(id=doc.id, text=doc.text, metadata=doc.metadata, took_ms=took_ms(request))


@write_router.delete(
    "/documents/{doc_id:path}", response_model=DeleteResponse, responses=documented(404, 409, 503)
)
async def delete_document(doc_id: str, request: Request, state: State) -> DeleteResponse:
    """Delete a document by id; durable when answered."""
    index = state.require_index()
    deleted = await run_in_threadpool(index.delete, [doc_id])
    if doc_id not in deleted:
        raise _not_found(doc_id)
    return DeleteResponse(deleted=doc_id, took_ms=took_ms(request))


@write_router.post(
    "/index/retrain",
    response_model=RetrainResponse,
    dependencies=JSON_BODY,
    responses=documented(400, 404, 409, 413, 415, 422, 503),
)
async def retrain_index(body: RetrainRequest, request: Request, state: State) -> RetrainResponse:
    """Train a new IVF on the vectors the index holds and swap it in (same ids, nothing re-encoded).
    Searches and writes go on meanwhile; a second retrain while one runs gets 409."""
    index = state.require_index()
    manifest = await run_in_threadpool(index.retrain, body.nlist, body.storage, body.flat_below)
    return RetrainResponse(index=index_info(index), retrained=manifest["retrained"], took_ms=took_ms(request))


@write_router.post("/index/snapshot", response_model=SnapshotResponse, responses=documented(404, 409, 503))
async def snapshot_index(request: Request, state: State) -> SnapshotResponse:
    """A consistent copy of the index, taken while it serves and is written: every write acknowledged
    before this request is in it, none acknowledged after its answer. Restore it with
    ``distilembed index restore``. 409 while a retrain runs."""
    index = state.require_index()
    root = state.settings.snapshots
    assert root is not None  # an index is configured
    name = f"snapshot-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
    await run_in_threadpool(root.mkdir, parents=True, exist_ok=True)
    manifest = await run_in_threadpool(index.snapshot, root / name)
    size = sum(int(f.get("bytes", 0)) for f in manifest.get("files", {}).values())
    return SnapshotResponse(
        name=name,
        path=f"{shown(root)}/{name}",
        created=str(manifest.get("created", "")),
        ntotal=int(manifest.get("ntotal", 0)),
        bytes=size,
        took_ms=took_ms(request),
    )


@read_router.post(
    "/index/count",
    response_model=CountResponse,
    dependencies=JSON_BODY,
    responses=documented(400, 404, 413, 415, 422, 503),
)
async def count_documents(body: CountRequest, request: Request, state: State) -> CountResponse:
    """How many documents pass a filter (all of them without one)."""
    index = state.require_index()
    count = await run_in_threadpool(index.count, body.filter or None)
    return CountResponse(count=count, took_ms=took_ms(request))


@write_router.post(
    "/index/fields",
    response_model=FieldIndexResponse,
    dependencies=JSON_BODY,
    responses=documented(400, 404, 409, 413, 415, 422, 503),
)
async def index_field(body: FieldIndexRequest, request: Request, state: State) -> FieldIndexResponse:
    """Keep a payload index of a metadata field, so that filters on it cost what their matches cost
    (filters on other fields read every document's metadata). Built from the stored documents, then
    kept in step with every write; it travels with snapshots. Idempotent."""
    index = state.require_index()
    created = await run_in_threadpool(index.add_field_index, body.field)
    fields = list(index.indexed_fields)
    return FieldIndexResponse(
        field=body.field, created=created, indexed_fields=fields, took_ms=took_ms(request)
    )
