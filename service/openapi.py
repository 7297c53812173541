"""The OpenAPI document as this deployment's contract (docs/decisions.md, 24): the limits from the
settings and the model are written into the request schemas, so a generated client knows them; what
JSON Schema cannot say (a body's bytes; a text's length, which ``truncate`` lifts) is a documented 413.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from service import filter_schema
from service.metadata import INT64_MAX, INT64_MIN, MetadataLimits
from service.routes_embed import with_encodings
from service.settings import Settings


def metadata_schemas(limits: MetadataLimits) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A document's ``metadata`` as JSON Schema, and its components: one per level of nesting (a list
    or an object at level n: ``MetadataLevel<n>``), so the depth limit is in the schema. The totals
    (keys, values, bytes) are beyond JSON Schema: the description states them. A number is bounded
    whole, integer or not: JSON Schema cannot tell ``1e20`` from ``100000000000000000000``."""

    def ref(name: str) -> dict[str, str]:
        return {"$ref": f"#/components/schemas/{name}"}

    def holding(value: dict[str, Any]) -> dict[str, Any]:
        keys = {"maxProperties": limits.keys, "propertyNames": {"maxLength": limits.key_chars}}
        return {"type": "object", **keys, "additionalProperties": value}

    components: dict[str, dict[str, Any]] = {
        "MetadataScalar": {
            "anyOf": [
                {"type": "string", "maxLength": limits.string_chars},
                {"type": "number", "minimum": INT64_MIN, "maximum": INT64_MAX},
                {"type": "boolean"},
                {"type": "null"},
            ]
        }
    }
    inner = "MetadataScalar"
    for level in range(limits.depth, 1, -1):
        array = {"type": "array", "maxItems": limits.items, "items": ref(inner)}
        components[f"MetadataLevel{level}"] = {"anyOf": [ref("MetadataScalar"), array, holding(ref(inner))]}
        inner = f"MetadataLevel{level}"
    return holding(ref(inner)) | {"description": limits.describe()}, components


def with_limits(
    schema: dict[str, Any], settings: Settings, dim: int | None, lexical: bool = True
) -> dict[str, Any]:
    """Write the limits into the request schemas (in place: setting the same values is idempotent);
    ``lexical`` False: the index has no lexical table, so a search's ``mode`` is dense only."""
    models = schema.get("components", {}).get("schemas", {})

    def prop(model: str, name: str, kind: str) -> dict[str, Any]:
        """The property's ``kind`` branch (of an ``anyOf``), or itself; {} for a model the app lacks."""
        found = models[model]["properties"][name] if model in models else {}
        return next((b for b in found.get("anyOf", []) if b.get("type") == kind), found)

    items = settings.max_items
    prop("EmbeddingRequest", "input", "array")["maxItems"] = items
    prop("EmbedRequest", "inputs", "array")["maxItems"] = items
    prop("UpsertRequest", "documents", "array")["maxItems"] = items
    prop("SimilarityRequest", "pairs", "array")["maxItems"] = items // 2  # the limit counts every text sent
    prop("SimilarityInputs", "sentences", "array")["maxItems"] = items - 1
    prop("SearchRequest", "queries", "array")["maxItems"] = items
    prop("SearchRequest", "top_k", "integer")["maximum"] = settings.max_top_k
    prop("SearchRequest", "mode", "string")["enum"] = ["dense", "lexical", "hybrid"] if lexical else ["dense"]
    for param in schema.get("paths", {}).get("/documents", {}).get("get", {}).get("parameters", []):
        if param["name"] == "limit":
            param["schema"]["anyOf"][0]["maximum"] = settings.max_top_k  # [integer, null]
    if dim is not None:
        vector = prop("SearchRequest", "vector", "array")
        vector["minItems"] = vector["maxItems"] = dim
        prop("EmbeddingRequest", "dimensions", "integer")["maximum"] = dim
    schema.setdefault("components", {}).setdefault("schemas", {}).update(filter_schema.components())
    if "DocumentIn" in models:
        metadata, components = metadata_schemas(MetadataLimits.from_settings(settings))
        prop("DocumentIn", "metadata", "object").update(metadata)
        models |= components
    return schema


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the document with this deployment's limits and, once it is loaded, the model's width and
    encodings (int8/uint8 only where the bundle has calibrated ranges)."""
    generate = app.openapi  # FastAPI's, which caches the generated document

    def openapi() -> dict[str, Any]:
        encoder, index = app.state.service.encoder, app.state.service.index
        dim = encoder.dim if encoder is not None else None
        lexical = index is None or index.lexical
        return with_encodings(with_limits(generate(), settings, dim, lexical), encoder)

    app.openapi = openapi  # type: ignore[method-assign]
