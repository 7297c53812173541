"""Embedding routes: OpenAI ``/v1/embeddings``, TEI ``/embed`` and ``/similarity`` (+ pairs mode).
Responses are plain JSON by orjson (no response-model validation of thousands of floats; the models
still describe them in OpenAPI); ``encoding_format`` quantises as sentence-transformers does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.types import Scope

from export import quantize
from service.errors import documented, payload_too_large, require_json, validation
from service.middleware import elapsed_ms
from service.schemas import EmbeddingRequest, EmbeddingResponse, EmbedRequest, SimilarityRequest, Vector
from service.state import ServiceState, State

# Every route takes a JSON body; create_app adds the read-key check when keys are set.
router = APIRouter(dependencies=[Depends(require_json)], responses=documented(400, 413, 415, 422, 429, 503))


class FastJSONResponse(JSONResponse):
    """numpy arrays by orjson at float32 precision: for a 128-d vector ~20x faster than ``tolist()`` +
    ``json.dumps`` (float64, ~70% more bytes), a few percent of a one-sentence request's CPU time."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def served_encodings(encoder: Any, width: int | None = None) -> list[str]:
    """The encodings served at ``width`` (at some width when None): int8/uint8 need calibrated ranges."""
    widths = quantize.int8_widths(getattr(encoder, "manifest", {}))
    calibrated = widths if width is None else [w for w in widths if w == width]
    return [e for e in quantize.ENCODINGS if e not in quantize.CALIBRATED or calibrated]


def _ranges(encoder: Any, encoding: str, width: int) -> np.ndarray | None:
    """The calibration ranges ``encoding`` needs at ``width``; 422 when the bundle has none."""
    if encoding not in quantize.CALIBRATED:
        return None
    manifest = getattr(encoder, "manifest", {})
    ranges = quantize.int8_ranges(manifest, width)
    if ranges is None:
        widths = ", ".join(map(str, quantize.int8_widths(manifest))) or "none"
        raise validation(
            f"encoding_format={encoding} needs int8 ranges calibrated at {width} dimensions; this bundle "
            f"has them for widths: {widths} (add them with `{quantize.CALIBRATE_HINT}`)"
        )
    return ranges


def encode_rows(vectors: np.ndarray, encoding: str, ranges: np.ndarray | None) -> np.ndarray | list[str]:
    """Rows in ``encoding``: an array orjson writes as lists of numbers, or base64 strings."""
    if encoding == "base64":
        return [quantize.pack_base64(v) for v in vectors]
    return np.ascontiguousarray(quantize.quantize(vectors, encoding, ranges))


async def openai_content(body: EmbeddingRequest, state: ServiceState, scope: Scope) -> dict[str, Any]:
    """The body of a ``/v1/embeddings`` answer (the route and service/fast_path.py both serve it)."""
    encoder, _ = state.require_encoder()
    if body.dimensions is not None and body.dimensions > encoder.dim:
        raise validation(f"dimensions={body.dimensions} exceeds the model's {encoder.dim}")
    ranges = _ranges(encoder, body.encoding_format, body.dimensions or encoder.dim)
    texts = state.check_texts(_as_list(body.input))
    embedded = await state.embed(texts)
    vectors = embedded.vectors
    if body.dimensions not in (None, encoder.dim):  # the first N coordinates, re-normalised
        vectors = quantize.prefix(vectors, body.dimensions)
    rows = encode_rows(vectors, body.encoding_format, ranges)
    tokens = sum(embedded.tokens)
    return {
        "object": "list",
        "data": [{"object": "embedding", "embedding": row, "index": i} for i, row in enumerate(rows)],
        "model": state.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "took_ms": elapsed_ms(scope),
    }


async def tei_content(body: EmbedRequest, state: ServiceState, _scope: Scope) -> np.ndarray | list[str]:
    """The body of an ``/embed`` answer (the route and service/fast_path.py both serve it)."""
    encoder, _ = state.require_encoder()
    ranges = _ranges(encoder, body.encoding_format, encoder.dim)
    texts = state.check_texts(_as_list(body.inputs), body.truncate)
    embedded = await state.embed(texts)
    return encode_rows(embedded.vectors, body.encoding_format, ranges)


@router.post("/v1/embeddings", response_model=EmbeddingResponse, tags=["embeddings"])
async def openai_embeddings(body: EmbeddingRequest, request: Request, state: State) -> FastJSONResponse:
    """OpenAI-compatible embeddings, optionally cut (``dimensions``) and quantised (``encoding_format``)."""
    return FastJSONResponse(await openai_content(body, state, request.scope))


@router.post("/embed", response_model=list[Vector], tags=["embeddings"])
async def tei_embed(body: EmbedRequest, request: Request, state: State) -> FastJSONResponse:
    """TEI-compatible: a list of vectors (always unit length) in ``encoding_format``. ``took_ms`` is in
    the X-Took-Ms header."""
    return FastJSONResponse(await tei_content(body, state, request.scope))


def with_encodings(schema: dict[str, Any], encoder: Any) -> dict[str, Any]:
    """The bundle's encodings in the request schemas (in place): int8/uint8 only where it has ranges."""
    models = schema.get("components", {}).get("schemas", {})
    if encoder is None:
        return schema
    dim = encoder.dim
    if "EmbedRequest" in models:
        models["EmbedRequest"]["properties"]["encoding_format"]["enum"] = served_encodings(encoder, dim)
    openai = models.get("EmbeddingRequest")
    if openai is None:
        return schema
    openai["properties"]["encoding_format"]["enum"] = served_encodings(encoder)
    openai.pop("allOf", None)
    widths = quantize.int8_widths(getattr(encoder, "manifest", {}))
    if widths and set(range(1, dim + 1)) - set(widths):
        # null (or no `dimensions`) asks for the full width
        then: dict[str, Any] = {"properties": {"dimensions": {"enum": [*widths, None]}}}
        if dim not in widths:
            then = {"properties": {"dimensions": {"enum": widths}}, "required": ["dimensions"]}
        calibrated = {"enum": list(quantize.CALIBRATED)}
        condition = {"properties": {"encoding_format": calibrated}, "required": ["encoding_format"]}
        openai["allOf"] = [{"if": condition, "then": then}]
    return schema


@router.post("/similarity", response_model=list[float], tags=["embeddings"])
async def similarity(body: SimilarityRequest, state: State) -> FastJSONResponse:
    """Cosine similarities: TEI ``{inputs: {source_sentence, sentences}}`` or ``{pairs: [[a, b], ...]}``."""
    if body.inputs is not None:
        left = [body.inputs.source_sentence] * len(body.inputs.sentences)
        right, sent = body.inputs.sentences, 1 + len(body.inputs.sentences)
    else:
        assert body.pairs is not None
        left, right, sent = [a for a, _ in body.pairs], [b for _, b in body.pairs], 2 * len(body.pairs)
    if sent > state.settings.max_items:  # the limit is on what the client sent, before de-duplication
        raise payload_too_large(f"{sent} texts in one request; the limit is {state.settings.max_items}")
    unique = list(dict.fromkeys([*left, *right]))
    row = {text: i for i, text in enumerate(unique)}
    embedded = await state.embed(state.check_texts(unique, body.truncate))
    a = embedded.vectors[[row[t] for t in left]]
    b = embedded.vectors[[row[t] for t in right]]
    return FastJSONResponse(np.einsum("ij,ij->i", a, b))
