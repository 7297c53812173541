"""Counting documents by filter, and payload indexes on metadata fields (index/filters.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from service.errors import documented, require_json, took_ms
from service.filter_schema import CountRequest, CountResponse, FieldIndexRequest, FieldIndexResponse
from service.state import State

# create_app adds the key checks: read keys for read_router, write keys for write_router.
read_router = APIRouter(tags=["index"])
write_router = APIRouter(tags=["index"])
JSON_BODY = [Depends(require_json)]


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
