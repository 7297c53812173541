"""The OpenAPI document as this deployment's contract: the limits that come from settings and from
the model (texts and documents per request, top_k, the vector's dimension) are written into the
request schemas, so a client generated from ``/openapi.json`` knows them. What JSON Schema cannot
say (a body's bytes; a text's length, which ``truncate`` lifts) is answered with a documented 413.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from service import filter_schema
from service.metadata import INT64_MAX, INT64_MIN, MetadataLimits
from service.routes_embed import with_encodings
from service.settings import Settings


def _branch(prop: dict[str, Any], kind: str) -> dict[str, Any]:
    """The ``kind`` branch of a property (``anyOf`` of a text or a list, or nullable), or itself."""
    return next((b for b in prop.get("anyOf", []) if b.get("type") == kind), prop)


def metadata_schemas(limits: MetadataLimits) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A document's ``metadata`` as JSON Schema, and the components it refers to: one per level of
    nesting (``MetadataLevel<n>`` may be a list or an object at level n), so the depth limit is in
    the schema, down to ``MetadataScalar``. The totals (keys over every object, values, bytes) are
    beyond JSON Schema: the description states them. A number is bounded whole, integer or not, as
    JSON Schema cannot tell ``1e20`` from ``100000000000000000000``."""

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


def with_limits(schema: dict[str, Any], settings: Settings, dim: int | None) -> dict[str, Any]:
    """Write the limits into the request schemas (in place: setting the same values is idempotent)."""
    models = schema.get("components", {}).get("schemas", {})

    def prop(model: str, name: str, kind: str) -> dict[str, Any]:
        return _branch(models[model]["properties"][name], kind) if model in models else {}

    items = settings.max_items
    for model, name in (
        ("EmbeddingRequest", "input"),
        ("EmbedRequest", "inputs"),
        ("UpsertRequest", "documents"),
    ):
        if model in models:
            prop(model, name, "array")["maxItems"] = items
    if "SimilarityRequest" in models:  # the limit counts every text sent
        prop("SimilarityRequest", "pairs", "array")["maxItems"] = items // 2
        prop("SimilarityInputs", "sentences", "array")["maxItems"] = items - 1
    if "SearchRequest" in models:
        prop("SearchRequest", "top_k", "integer")["maximum"] = settings.max_top_k
        if dim is not None:
            vector = prop("SearchRequest", "vector", "array")
            vector["minItems"] = vector["maxItems"] = dim
    if dim is not None and "EmbeddingRequest" in models:
        prop("EmbeddingRequest", "dimensions", "integer")["maximum"] = dim
    filter_schema.install(schema)
    if "DocumentIn" in models:
        metadata, components = metadata_schemas(MetadataLimits.from_settings(settings))
        prop("DocumentIn", "metadata", "object").update(metadata)
        models |= components
    return schema


def install(app: FastAPI, settings: Settings, dim: Callable[[], int | None]) -> None:
    """Serve the document with this deployment's limits; ``dim`` is the model's, once it is loaded."""
    generate = app.openapi  # FastAPI's, which caches the generated document

    def openapi() -> dict[str, Any]:
        # and the bundle's encodings: int8/uint8 only where it has calibrated ranges
        encoder = getattr(getattr(app.state, "service", None), "encoder", None)
        return with_encodings(with_limits(generate(), settings, dim()), encoder)

    app.openapi = openapi  # type: ignore[method-assign]
