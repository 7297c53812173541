"""The filter language over HTTP: crafted filters get the right results or a 4xx naming the place,
counts, payload indexes, and the OpenAPI schema that describes the language exactly."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from index.live import LiveIndex
from service.filter_schema import components
from tests.service_client import empty_index_dir, error

DOCS = [
    {"id": "quote", "text": "a quoted key", "metadata": {'a"b': 1}},
    {"id": "nested", "text": "a nested key", "metadata": {"c": {"d": 3}, "n": 1 << 62}},
    {"id": "dotted", "text": "a dotted key", "metadata": {"c.d": 3, "tags": ["x", "y"]}},
    {"id": "big", "text": "a big number", "metadata": {"n": -(1 << 63), "lang": "en"}},
]


@pytest.fixture(params=["fake", "live"])
def client(request: pytest.FixtureRequest, make_client: Any, tmp_path: Path) -> TestClient:
    index = None
    if request.param == "live":
        index = LiveIndex(empty_index_dir(tmp_path / "index", dim=8))
    made = make_client(index=index, max_payload_bytes=1 << 20)
    if index is None:
        from service.testing import FakeIndex

        made.app.state.service.index = FakeIndex(dim=8)
    assert made.post("/documents", json={"documents": DOCS}).status_code == 200
    return made


def found(client: TestClient, flt: Any) -> list[str]:
    response = client.post("/search", json={"query": "key", "top_k": 10, "filter": flt})
    assert response.status_code == 200, response.text
    return sorted(hit["id"] for hit in response.json()["results"])


@pytest.mark.parametrize(
    ("flt", "ids"),
    [
        ({'a"b': 1}, ["quote"]),  # a quote in a key is just a character
        ({'c"."d': 3}, []),  # and never a way out of the path
        ({"c.d": 3}, ["nested"]),  # a nested key
        ({"c\\.d": 3}, ["dotted"]),  # a key with a dot in it
        ({"n": -(1 << 63) - 1}, []),  # past 64 bits: compared exactly (no float rounds it to -2^63)
        ({"n": {"$gt": -(1 << 63) - 1}}, ["big", "nested"]),
        ({"n": {"$lte": -(1 << 63) - 1}}, []),
        ({"tags": {"$in": ["y", "z"]}}, ["dotted"]),
        ({"$or": [{"lang": "en"}, {"c.d": {"$exists": True}}]}, ["big", "nested"]),
        ({"$not": {"lang": {"$exists": True}}, "n": {"$ne": None}}, ["nested"]),
        ({}, ["big", "dotted", "nested", "quote"]),
    ],
)
def test_crafted_filters_get_the_right_documents(client: TestClient, flt: Any, ids: list[str]) -> None:
    assert found(client, flt) == ids
    count = client.post("/index/count", json={"filter": flt})
    assert count.status_code == 200 and count.json()["count"] == len(ids)


@pytest.mark.parametrize(
    ("flt", "status", "message"),
    [
        ({f"k{i}": i for i in range(1000)}, 422, "filter: 1000 clauses in one object; the limit is 16"),
        ({"a": {"$regex": "."}}, 422, "filter.a.$regex: unknown operator"),
        ({"$where": "1"}, 422, "filter.$where: unknown operator"),
        ({"a": [1]}, 422, "filter.a: a list is not a value"),
        ({"a": 10**400}, 422, "filter.a: numbers are finite and at most"),
        ({"a": {"$not": {"$not": {"$not": {"$not": {}}}}}}, 422, "unknown operator"),
        ({"$not": {"$not": {"$not": {"$not": {"a": 1}}}}}, 422, "nest at most 4 levels deep"),
        ({f"f{i}": {"$in": list(range(256))} for i in range(5)}, 413, "more than 1024 conditions"),
    ],
)
def test_bad_filters_are_a_4xx_naming_the_place(
    client: TestClient, flt: Any, status: int, message: str
) -> None:
    for path in ("/search", "/index/count"):
        body = {"filter": flt} | ({"query": "x"} if path == "/search" else {})
        assert message in error(client.post(path, json=body), status)["error"]


def test_a_payload_index_is_declared_listed_and_idempotent(client: TestClient) -> None:
    made = client.post("/index/fields", json={"field": "c.d"})
    assert made.status_code == 200 and made.json()["created"] and made.json()["indexed_fields"] == ["c.d"]
    assert not client.post("/index/fields", json={"field": "c.d"}).json()["created"]
    assert client.get("/info").json()["index"]["indexed_fields"] == ["c.d"]
    assert found(client, {"c.d": 3}) == ["nested"]  # same answers, now from the payload index
    assert "field" in error(client.post("/index/fields", json={"field": "a..b"}), 422)["error"]


def test_the_openapi_schema_states_the_language(make_client: Any) -> None:
    schema = make_client().get("/openapi.json").json()
    filters = schema["components"]["schemas"]
    assert filters["Filter"] == components()["Filter"]
    names = filters["Filter"]["propertyNames"]["pattern"]
    for ok in ("$and", "lang", "a.b", "a\\.b", "é"):
        assert re.fullmatch(names, ok), ok
    for bad in ("$where", "a..b", ".a", "a\\x"):
        assert not re.fullmatch(names, bad), bad
    deepest = filters["Filter4"]
    assert "properties" not in deepest  # no logic below the last level
    assert not re.fullmatch(deepest["propertyNames"]["pattern"], "$and")
