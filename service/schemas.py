"""Request and response models (they make the OpenAPI schema).

Limits that come from settings (items per request, characters per text, top_k) are checked in the
routes, so the pydantic models only hold what is true for every deployment.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Text = Annotated[str, Field(min_length=1)]
Texts = Annotated[list[Text], Field(min_length=1)]
MetaValue = str | int | float | bool | None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # our own routes: a misspelt field is an error


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI/TEI clients send fields this server does not use


# OpenAI /v1/embeddings
class EmbeddingRequest(Lenient):
    input: Text | Texts = Field(description="A text or a list of texts.")
    model: str | None = Field(None, description="Accepted for compatibility; the served model answers.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`base64`: little-endian float32 bytes, base64-encoded."
    )
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first N dimensions (N <= model dim), then re-normalise."
    )


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
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


class SimilarityInputs(Lenient):
    source_sentence: Text
    sentences: Texts


class SimilarityRequest(Lenient):
    inputs: SimilarityInputs | None = Field(None, description="TEI shape: one source against sentences.")
    pairs: Annotated[list[tuple[Text, Text]], Field(min_length=1)] | None = Field(
        None, description="Pairs mode: the cosine of each [a, b]."
    )
    truncate: bool = False

    @model_validator(mode="after")
    def _one_mode(self) -> SimilarityRequest:
        if (self.inputs is None) == (self.pairs is None):
            raise ValueError("give exactly one of `inputs` or `pairs`")
        return self


# search and documents
class SearchRequest(Strict):
    query: Text | None = None
    vector: Annotated[list[float], Field(min_length=1)] | None = None
    top_k: int | None = Field(None, description="1..max_top_k (default from settings).")
    nprobe: int | None = Field(None, ge=1, le=1 << 16, description="IVF lists to probe (default: index's).")
    filter: dict[str, MetaValue] | None = Field(None, description="Metadata equality filter.")
    with_text: bool = True
    truncate: bool = False

    @model_validator(mode="after")
    def _one_query(self) -> SearchRequest:
        if (self.query is None) == (self.vector is None):
            raise ValueError("give exactly one of `query` or `vector`")
        return self


class SearchResult(BaseModel):
    id: str
    score: float
    text: str | None
    metadata: dict[str, Any]


class SearchResponse(BaseModel):
    results: list[SearchResult]
    took_ms: float


class DocumentIn(Strict):
    id: Annotated[str, Field(min_length=1, max_length=1024)]
    text: Text
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
    metadata: dict[str, Any]
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


class RetrainRequest(BaseModel):
    nlist: int = Field(1024, ge=1, le=1 << 16, description="lists wanted; lowered for a small index")
    storage: Literal["float32", "sq8"] | None = Field(None, description="default: keep the current one")
    flat_below: int = Field(10_000, ge=0, description="fewer vectors than this: exact search")


class RetrainResponse(BaseModel):
    index: IndexInfo
    retrained: dict[str, Any]
    took_ms: float


class Info(BaseModel):
    model: str
    dim: int
    max_seq_len: int
    variant: str
    bundle: str
    bundle_sha256: str | None
    index: IndexInfo | None
    limits: dict[str, int | float]
    versions: dict[str, str]
    took_ms: float


class ErrorBody(BaseModel):
    error: str
    type: str
    took_ms: float
