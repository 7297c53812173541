"""Request and response models (they make the OpenAPI schema). They hold what is true for every
deployment: the limits from settings are checked in the routes and written in by service/openapi.py.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from service.filter_schema import Filter
from service.metadata import returnable

T = TypeVar("T")
Text = Annotated[str, Field(min_length=1)]
Texts = Annotated[list[Text], Field(min_length=1)]


def _not_null(value: object) -> object:
    if value is None:
        raise ValueError("must not be null (leave the field out for its default)")
    return value


def _integral(value: object) -> object:
    """JSON Schema's integer includes 3.0; strict pydantic would refuse it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _finite(values: list[float]) -> list[float]:
    if not all(math.isfinite(v) for v in values):
        raise ValueError("must hold finite numbers (no NaN or Infinity)")
    return values


def _returnable(metadata: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """A stored document's metadata, made safe to serialize; ``id`` is validated before it."""
    return returnable(str(info.data.get("id")), metadata)


Integer = Annotated[int, BeforeValidator(_integral)]
ReturnedMetadata = Annotated[dict[str, Any], AfterValidator(_returnable)]
Positive = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
Probes = Annotated[int, Field(ge=1, le=1 << 16), BeforeValidator(_integral)]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # "default": null would contradict the field's non-null type


# A field that may be left out but is never null: the schema says so, and validation agrees.
Omittable = Annotated[
    T | SkipJsonSchema[None], BeforeValidator(_not_null), Field(json_schema_extra=_no_default)
]
Pair = Annotated[list[Text], Field(min_length=2, max_length=2)]


def exactly_one_of(*fields: str) -> dict[str, Any]:
    return {"oneOf": [{"required": [name]} for name in fields]}


# strict: no coercion (`"truncate": 0` is not `false`, `"top_k": "5"` is not 5), as the schema says.
class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # our own routes: a misspelt field is an error


class Lenient(BaseModel):
    # OpenAI/TEI clients send fields this server does not use
    model_config = ConfigDict(extra="ignore", strict=True)


# export/quantize.py ENCODINGS; the OpenAPI document lists int8/uint8 only where the bundle has ranges
EncodingFormat = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]
ENCODING_HELP = (
    "`float`: float32 numbers; `base64`: little-endian float32 bytes, base64-encoded; `int8`/`uint8`: "
    "one integer per dimension, scaled by the bundle's calibrated per-dimension ranges; "
    "`binary`/`ubinary`: sign bits packed 8 to an integer (int8 offset by -128, or uint8), "
    "ceil(width / 8) of them. As sentence-transformers' `quantize_embeddings`."
)
# A vector as JSON: floats, integers (the quantised encodings), or a base64 string.
Vector = list[float] | list[int] | str


# OpenAI /v1/embeddings
class EmbeddingRequest(Lenient):
    input: Text | Texts = Field(description="A text or a list of texts.")
    model: str | None = Field(None, description="Accepted for compatibility; the served model answers.")
    encoding_format: EncodingFormat = Field("float", description=ENCODING_HELP)
    dimensions: Positive | None = Field(
        None,
        description="Keep the first N dimensions (N <= model dim), then re-normalise; the encoding "
        "applies to the result (int8/uint8 only at widths with calibrated ranges: /info int8_widths).",
    )


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: Vector
    index: int


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: Usage
    took_ms: float


# TEI /embed and /similarity
class EmbedRequest(Lenient):
    inputs: Text | Texts
    normalize: bool = Field(True, description="Vectors are always unit length; `false` is accepted.")
    truncate: bool = Field(False, description="Cut texts over the character limit instead of refusing them.")
    encoding_format: EncodingFormat = Field("float", description=ENCODING_HELP)


class SimilarityInputs(Lenient):
    source_sentence: Text
    sentences: Texts


class SimilarityRequest(Lenient):
    """Exactly one of `inputs` (TEI) or `pairs`."""

    model_config = ConfigDict(json_schema_extra=exactly_one_of("inputs", "pairs"))
    inputs: Omittable[SimilarityInputs] = Field(None, description="TEI shape: one source against sentences.")
    pairs: Omittable[Annotated[list[Pair], Field(min_length=1)]] = Field(
        None, description="Pairs mode: the cosine of each [a, b]."
    )
    truncate: bool = False

    @model_validator(mode="after")
    def _one_mode(self) -> SimilarityRequest:
        if (self.inputs is None) == (self.pairs is None):
            raise ValueError("give exactly one of `inputs` or `pairs`")
        return self


# search and documents
# exactly one of the three, and a vector in dense mode only
SEARCH_ONE_OF = exactly_one_of("query", "queries", "vector") | {
    "anyOf": [
        {"required": ["query"]},
        {"required": ["queries"]},
        {"properties": {"mode": {"const": "dense"}}},
    ]
}
Weight = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]


def _a_weight_above_zero(weights: list[float]) -> list[float]:
    if not any(weights):
        raise ValueError("one weight at least must be above 0")
    return weights


Weights = Annotated[
    list[Weight],
    Field(min_length=2, max_length=2, json_schema_extra={"contains": {"exclusiveMinimum": 0}}),
    AfterValidator(_a_weight_above_zero),
]
ReturnedField = Literal["text", "metadata", "vector"]


class SearchRequest(Strict):
    """Exactly one of `query` (a text), `queries` (texts, answered in `batches`, one per query) or
    `vector` (dense mode only; normalised)."""

    model_config = ConfigDict(json_schema_extra=SEARCH_ONE_OF)
    query: Omittable[Text] = None
    queries: Omittable[Texts] = Field(
        None,
        description="Several query texts, embedded in one batch: the answer's `batches` hold one "
        "`results` list per query, in order (at most max_items).",
    )
    vector: Omittable[Annotated[list[float], Field(min_length=1), AfterValidator(_finite)]] = Field(
        None, description="A query vector of the index's dimension."
    )
    mode: Literal["dense", "lexical", "hybrid"] = Field(
        "dense",
        description="`dense`: by vector (score: cosine); `lexical`: by BM25 over the words (score: "
        "BM25); `hybrid`: both, fused (score: the fused one; each hit adds `dense_score`, "
        "`lexical_score` and `matched`). lexical and hybrid need the index's lexical table.",
    )
    fusion: Literal["rrf", "weighted"] = Field(
        "weighted", description="hybrid: `weighted` (min-max scaled scores) or `rrf` (reciprocal ranks)."
    )
    weights: Omittable[Weights] = Field(None, description="hybrid: [dense, lexical] (default [1, 1]).")
    top_k: Positive | None = Field(None, description="1..max_top_k (default from settings).")
    offset: Integer = Field(
        0, ge=0, description="Skip the first N hits (pages); offset + top_k over max_top_k is a 413."
    )
    score_threshold: Omittable[Annotated[float, Field(allow_inf_nan=False)]] = Field(
        None, description="Drop hits whose `score` (of the mode) is below this."
    )
    nprobe: Probes | None = Field(None, description="IVF lists to probe (default: index's).")
    rescore_k: Probes | None = Field(
        None,
        description="pq and binary indexes: candidates rescored exactly (default: the setting, else the "
        "index's); ignored by float32 and sq8 indexes.",
    )
    filter: Filter | None = Field(None, description="Only documents that pass this metadata filter.")
    fields: Annotated[list[ReturnedField], Field(max_length=3)] = Field(
        ["text", "metadata"],
        description="What each hit carries besides id and score (one left out is null). `vector`: "
        "the vector the index holds (sq8: decoded).",
    )
    with_text: bool = Field(True, description="false: no text, whatever `fields` says.")
    truncate: bool = False

    @model_validator(mode="after")
    def _one_query(self) -> SearchRequest:
        if sum(given is not None for given in (self.query, self.queries, self.vector)) != 1:
            raise ValueError("give exactly one of `query`, `queries` or `vector`")
        if self.vector is not None and self.mode != "dense":
            raise ValueError(f"mode {self.mode} searches text: give `query` or `queries`, not `vector`")
        return self

    def returned(self) -> frozenset[str]:
        return frozenset(set(self.fields) - (set() if self.with_text else {"text"}))


class SearchResult(BaseModel):
    id: str
    score: float
    text: str | None
    metadata: ReturnedMetadata | None
    vector: list[float] | None = Field(None, description="With `fields` naming it.")
    dense_score: float | None = Field(None, description="hybrid: the cosine; null if dense missed it.")
    lexical_score: float | None = Field(None, description="hybrid: BM25; null if lexical missed it.")
    matched: list[Literal["dense", "lexical"]] | None = Field(
        None, description="hybrid: the sides whose candidates hold it."
    )


class SearchResponse(BaseModel):
    results: list[SearchResult]
    took_ms: float


class SearchBatch(BaseModel):
    results: list[SearchResult]


class SearchBatchesResponse(BaseModel):
    """The answer to `queries`: a batch of results per query, in order."""

    batches: list[SearchBatch]
    took_ms: float


class DocumentIn(Strict):
    id: Annotated[str, Field(min_length=1, max_length=1024)]
    text: Text
    # Its limits come from settings: the route checks them, the served schema states them (openapi.py).
    metadata: dict[str, Any] = Field(default_factory=dict)


class UpsertRequest(Strict):
    documents: Annotated[list[DocumentIn], Field(min_length=1)]


class UpsertResponse(BaseModel):
    added: int
    replaced: int
    took_ms: float


class DocumentOut(BaseModel):
    id: str
    text: str
    metadata: ReturnedMetadata
    took_ms: float


class ListedDocument(BaseModel):
    id: str
    text: str
    metadata: ReturnedMetadata


class DocumentPage(BaseModel):
    documents: list[ListedDocument]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: the last.")
    took_ms: float


class DeleteResponse(BaseModel):
    deleted: str
    took_ms: float


# operations
class Health(BaseModel):
    status: Literal["ok"] = "ok"
    took_ms: float


class Ready(BaseModel):
    ready: bool
    took_ms: float


class IndexInfo(BaseModel):
    type: str
    ntotal: int
    nlist: int
    nprobe: int
    dim: int
    indexed_fields: list[str] = Field(description="Metadata fields with a payload index (fast filters).")


class RetrainRequest(Strict):
    nlist: Integer = Field(1024, ge=1, le=1 << 16, description="lists wanted; lowered for a small index")
    storage: Omittable[Literal["float32", "sq8", "pq", "binary"]] = Field(
        None, description="left out: keep the current one (pq: its m and bits too)"
    )
    flat_below: Integer = Field(10_000, ge=0, description="fewer vectors than this: exact search")


class RetrainResponse(BaseModel):
    index: IndexInfo
    retrained: dict[str, Any]
    took_ms: float


class SnapshotResponse(BaseModel):
    name: str = Field(description="The snapshot's directory name under the snapshot directory.")
    path: str = Field(
        description="`<snapshot directory's name>/<name>`: relative, as no response names a path on the "
        "server; `distilembed index verify` and `restore` take it under the snapshot directory's parent."
    )
    created: str
    ntotal: int
    bytes: int = Field(description="Total size of the snapshot's files.")
    took_ms: float


class Info(BaseModel):
    model: str
    dim: int
    trained_widths: list[int] = Field(
        description="Widths the model was trained at, widest first (Matryoshka students list several): "
        "`dimensions` accepts any width from 1 to `dim`; these keep the most quality."
    )
    encodings: list[str] = Field(
        description="The `encoding_format` values served (int8/uint8 only with calibrated ranges)."
    )
    int8_widths: list[int] = Field(
        description="Widths (`dimensions`) with calibrated int8/uint8 ranges, widest first; [] if none."
    )
    max_seq_len: int
    variant: str
    bundle: str = Field(description="The bundle directory's name (no response names a path on the server).")
    bundle_sha256: str | None
    index: IndexInfo | None
    limits: dict[str, int | float]
    versions: dict[str, str]
    took_ms: float


class ErrorBody(BaseModel):
    error: str
    type: str
    took_ms: float
