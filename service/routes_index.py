"""Search and document routes over the live index. Index calls run in the thread pool (they block)."""

from __future__ import annotations

import time

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from index.store import Document
from service.errors import ApiError, took_ms, validation
from service.schemas import (
    DeleteResponse,
    DocumentOut,
    ErrorBody,
    RetrainRequest,
    RetrainResponse,
    SearchRequest,
    SearchResponse,
    SearchResult,
    UpsertRequest,
    UpsertResponse,
)
from service.state import ServiceState, State, index_info

ERRORS: dict[int | str, dict] = {code: {"model": ErrorBody} for code in (401, 404, 409, 413, 422, 429, 503)}
router = APIRouter(responses=ERRORS, tags=["index"])  # create_app adds the API-key dependency


def _not_found(doc_id: str) -> ApiError:
    return ApiError(404, f"no document with id {doc_id!r}", "not_found")


async def _query_vector(body: SearchRequest, state: ServiceState, dim: int) -> np.ndarray:
    if body.vector is not None:
        if len(body.vector) != dim:
            raise validation(f"vector has {len(body.vector)} dimensions; the index holds {dim}-d vectors")
        vector = np.asarray([body.vector], dtype=np.float32)
        norm = float(np.linalg.norm(vector))
        if not np.isfinite(norm) or norm == 0:
            raise validation("vector must be finite and non-zero")
        return vector / norm
    assert body.query is not None
    embedded = await state.embed(state.check_texts([body.query], body.truncate))
    return embedded.vectors


@router.post("/search", response_model=SearchResponse)
async def search(body: SearchRequest, request: Request, state: State) -> SearchResponse:
    """Top-k documents for a query text or a vector (scores are cosines), with an optional metadata filter."""
    index = state.require_index()
    top_k = body.top_k if body.top_k is not None else state.settings.default_top_k
    if not 1 <= top_k <= state.settings.max_top_k:
        raise validation(f"top_k must be between 1 and {state.settings.max_top_k}, got {top_k}")
    queries = await _query_vector(body, state, index.dim)
    start = time.perf_counter()
    hits = await run_in_threadpool(index.search, queries, top_k, body.nprobe, body.filter or None)
    state.metrics.search_duration.observe(time.perf_counter() - start)
    results = [
        SearchResult(id=h.id, score=h.score, text=h.text if body.with_text else None, metadata=h.metadata)
        for h in hits[0]
    ]
    return SearchResponse(results=results, took_ms=took_ms(request))


@router.post("/documents", response_model=UpsertResponse)
async def upsert_documents(body: UpsertRequest, request: Request, state: State) -> UpsertResponse:
    """Embed and insert or replace documents by id. The answer comes after the index made them durable."""
    index = state.require_index()
    texts = state.check_texts([d.text for d in body.documents])
    embedded = await state.embed(texts)
    docs = [Document(d.id, d.text, d.metadata) for d in body.documents]
    added, replaced = await run_in_threadpool(index.upsert, docs, embedded.vectors)
    return UpsertResponse(added=added, replaced=replaced, took_ms=took_ms(request))


@router.get("/documents/{doc_id:path}", response_model=DocumentOut)
async def get_document(doc_id: str, request: Request, state: State) -> DocumentOut:
    index = state.require_index()
    doc = await run_in_threadpool(index.get, doc_id)
    if doc is None:
        raise _not_found(doc_id)
    return DocumentOut(id=doc.id, text=doc.text, metadata=doc.metadata, took_ms=took_ms(request))


@router.delete("/documents/{doc_id:path}", response_model=DeleteResponse)
async def delete_document(doc_id: str, request: Request, state: State) -> DeleteResponse:
    index = state.require_index()
    deleted = await run_in_threadpool(index.delete, [doc_id])
    if doc_id not in deleted:
        raise _not_found(doc_id)
    return DeleteResponse(deleted=doc_id, took_ms=took_ms(request))


@router.post("/index/retrain", response_model=RetrainResponse)
async def retrain_index(body: RetrainRequest, request: Request, state: State) -> RetrainResponse:
    """Train a new IVF on the vectors the index holds and swap it in (same ids, nothing re-encoded).
    Searches and writes go on meanwhile; a second retrain while one runs gets 409."""
    index = state.require_index()
    manifest = await run_in_threadpool(index.retrain, body.nlist, body.storage, body.flat_below)
    return RetrainResponse(index=index_info(index), retrained=manifest["retrained"], took_ms=took_ms(request))
