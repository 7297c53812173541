"""The filter language (index/filters.py) as a request field and as JSON Schema.

The schema says exactly what the parser accepts, so a client generated from ``/openapi.json``, and
the contract fuzzer, build real filters: one component per nesting level (``Filter``, ``Filter2``
...), as a recursive reference could not bound the depth. The total size is a documented 413.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from index.filters import DEFAULT_LIMITS, FilterError, FilterLimits, parse

REF = "#/components/schemas/"
SEGMENT = r"(?:[^.\\]|\\[.\\$])+"
# a field path: segments joined by dots, not starting with a bare "$" (operators do)
PATH = rf"(?:[^$.\\]|\\[.\\$])(?:[^.\\]|\\[.\\$])*(?:\.{SEGMENT})*"
LOGIC = r"\$and|\$or|\$not"
DESCRIPTION = (
    "A metadata filter: every clause must hold. `{field: value}` is equality; "
    "`{field: {op: value, ...}}` applies operators (`$eq $ne $in $nin $gt $gte $lt $lte $exists`); "
    "`$and`/`$or` take lists of filters, `$not` one filter. A field is a path of keys joined by "
    "dots (`author.name`; a dot or backslash inside a key is escaped with a backslash). "
    "See docs/serving.md, Filters."
)


def _level(n: int) -> str:
    return "Filter" if n == 1 else f"Filter{n}"


def components(limits: FilterLimits = DEFAULT_LIMITS) -> dict[str, dict[str, Any]]:
    """The schema components of the language under ``limits``."""
    number = {"type": "number", "minimum": -1.7e308, "maximum": 1.7e308}
    string = {"type": "string", "maxLength": limits.string_chars}
    value = {"anyOf": [string, number, {"type": "boolean"}, {"type": "null"}]}
    values = {"type": "array", "maxItems": limits.values, "items": {"$ref": REF + "FilterValue"}}
    operators = {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {
            "$eq": {"$ref": REF + "FilterValue"},
            "$ne": {"$ref": REF + "FilterValue"},
            "$in": values,
            "$nin": values,
            **{op: {"anyOf": [string, number]} for op in ("$gt", "$gte", "$lt", "$lte")},
            "$exists": {"type": "boolean"},
        },
    }
    out: dict[str, dict[str, Any]] = {
        "FilterValue": value,
        "FilterOperators": operators,
        "FilterCondition": {"anyOf": [{"$ref": REF + "FilterValue"}, {"$ref": REF + "FilterOperators"}]},
    }
    for n in range(1, limits.depth + 1):
        deeper = n < limits.depth
        level: dict[str, Any] = {
            "type": "object",
            "maxProperties": limits.clauses,
            "propertyNames": {
                "maxLength": limits.path_chars,
                "pattern": f"^(?:{LOGIC}|{PATH})$" if deeper else f"^{PATH}$",
            },
            "additionalProperties": {"$ref": REF + "FilterCondition"},
        }
        if deeper:
            child = {"$ref": REF + _level(n + 1)}
            many = {"type": "array", "minItems": 1, "maxItems": limits.items, "items": child}
            level["properties"] = {"$and": many, "$or": many, "$not": child}
        if n == 1:
            level["description"] = DESCRIPTION
        out[_level(n)] = level
    return out


def _checked(value: dict[str, Any]) -> dict[str, Any]:
    """Parsed once here for the 422 (naming the place) or 413; the index parses it again."""
    try:
        parse(value)
    except FilterError as exc:
        raise ValueError(str(exc)) from None
    return value


Filter = Annotated[dict[str, Any], AfterValidator(_checked), WithJsonSchema({"$ref": REF + "Filter"})]


class CountRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    filter: Filter | None = Field(None, description="Count only documents that pass this filter.")


class CountResponse(BaseModel):
    count: int
    took_ms: float


class FieldIndexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    field: Annotated[str, Field(min_length=1, max_length=DEFAULT_LIMITS.path_chars, pattern=f"^{PATH}$")] = (
        Field(description="A metadata field path, as filters name it (`lang`, `author.name`).")
    )


class FieldIndexResponse(BaseModel):
    field: str
    created: bool = Field(description="false: the field was indexed already.")
    indexed_fields: list[str]
    took_ms: float
