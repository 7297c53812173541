"""Embedding routes: OpenAI ``/v1/embeddings``, TEI ``/embed`` and ``/similarity`` (+ pairs mode).

Responses are built as plain JSON by orjson (no response-model validation of thousands of floats);
the declared response models still describe them in the OpenAPI schema.
"""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Depends, Request

from service.errors import documented, payload_too_large, require_json, took_ms, validation
from service.responses import FastJSONResponse
from service.schemas import EmbeddingRequest, EmbeddingResponse, EmbedRequest, SimilarityRequest
from service.state import State

# Every route takes a JSON body; create_app adds the read-key check when keys are set.
router = APIRouter(dependencies=[Depends(require_json)], responses=documented(400, 413, 415, 422, 429, 503))


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def shorten(vectors: np.ndarray, dimensions: int | None, dim: int) -> np.ndarray:
    """Keep the first ``dimensions`` coordinates and re-normalise (Matryoshka-style truncation)."""
    if dimensions is None or dimensions == dim:
        return vectors
    if dimensions > dim:
        raise validation(f"dimensions={dimensions} exceeds the model's {dim}")
    cut = vectors[:, :dimensions]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)


def to_base64(vector: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


@router.post("/v1/embeddings", response_model=EmbeddingResponse, tags=["embeddings"])
async def openai_embeddings(body: EmbeddingRequest, request: Request, state: State) -> FastJSONResponse:
    """OpenAI-compatible embeddings."""
    encoder, _ = state.require_encoder()
    if body.dimensions is not None and body.dimensions > encoder.dim:
        raise validation(f"dimensions={body.dimensions} exceeds the model's {encoder.dim}")
    texts = state.check_texts(_as_list(body.input))
    embedded = await state.embed(texts)
    vectors = shorten(embedded.vectors, body.dimensions, encoder.dim)
    rows = (
        [to_base64(v) for v in vectors]
        if body.encoding_format == "base64"
        else list(np.ascontiguousarray(vectors))
    )
    tokens = sum(embedded.tokens)
    return FastJSONResponse(
        {
            "object": "list",
            "data": [{"object": "embedding", "embedding": row, "index": i} for i, row in enumerate(rows)],
            "model": state.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "took_ms": took_ms(request),
        }
    )


@router.post("/embed", response_model=list[list[float]], tags=["embeddings"])
async def tei_embed(body: EmbedRequest, state: State) -> FastJSONResponse:
    """TEI-compatible: a list of vectors (always unit length). ``took_ms`` is in the X-Took-Ms header."""
    texts = state.check_texts(_as_list(body.inputs), body.truncate)
    embedded = await state.embed(texts)
    return FastJSONResponse(np.ascontiguousarray(embedded.vectors))


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
