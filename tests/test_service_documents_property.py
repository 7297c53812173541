"""Generated documents through the HTTP API on a real index: whatever the door accepts can be read
back as sent, found by search, filtered on each of its values, and is identical after a snapshot
is restored; whatever it refuses is a 4xx JSON error and stores nothing."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from index.filters import join_path
from index.live import LiveIndex
from index.snapshot import restore_snapshot
from service.app import create_app
from service.testing import FakeEncoder
from tests.service_client import empty_index_dir, make_settings

INT64 = (-(1 << 63), (1 << 63) - 1)
TEXT = st.characters(codec="utf-8", exclude_categories=("Cs",))
KEYS = st.text(TEXT, min_size=1, max_size=6) | st.sampled_from(["a", "a.b", 'q"', "\\", "$x", "a\\.b"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(*INT64),
    st.sampled_from([INT64[0], INT64[1], 0, -1]),
    st.floats(-9e18, 9e18, allow_nan=False),
    st.text(max_size=12),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)
# past the default depth of 8 now and then (a tenth of the values): refused whole, nothing stored
DEEP = st.builds(
    lambda n, v: functools.reduce(lambda inner, _: {"d": inner}, range(n), v), st.integers(5, 8), SCALARS
)
METADATA = st.dictionaries(KEYS, st.one_of(*[VALUES] * 9, DEEP), max_size=5)
DOCS = st.lists(st.tuples(st.text(min_size=1, max_size=40), METADATA), min_size=1, max_size=6)

SEEN: dict[str, int] = {"generated": 0, "accepted": 0, "refused": 0}
STORED: dict[str, dict[str, Any]] = {}  # id -> the document as sent
COUNTER = itertools.count()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, Path]:
    root = tmp_path_factory.mktemp("property")
    index = LiveIndex(empty_index_dir(root / "index", dim=8))
    settings_ = make_settings(index_dir=root / "index", max_payload_bytes=1 << 20, max_top_k=100)
    client = TestClient(create_app(settings_, FakeEncoder(), index), raise_server_exceptions=True)
    with client:
        yield client, root


def leaves(value: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, scalar) for every scalar reached through objects (lists: their scalar elements)."""
    if isinstance(value, dict):
        return [leaf for key, v in value.items() for leaf in leaves(v, (*path, key))]
    if isinstance(value, list):
        return [(path, v) for v in value if not isinstance(v, (dict, list))]
    return [(path, value)] if path else []


@settings(max_examples=200, deadline=None, derandomize=True)  # the same documents every run
@given(docs=DOCS)
def test_accepted_documents_are_readable_searchable_and_filterable(
    served: tuple[TestClient, Path], docs: list[tuple[str, dict[str, Any]]]
) -> None:
    client, _ = served
    batch = []
    for text, meta in docs:
        n = next(COUNTER)
        batch.append({"id": f"doc-{n}", "text": text, "metadata": meta | {"uid": n}})
    SEEN["generated"] += len(batch)
    answer = client.post("/documents", json={"documents": batch})
    if answer.status_code != 200:
        assert answer.status_code in (413, 422), answer.text
        assert set(answer.json()) == {"error", "type", "took_ms"}
        assert all(client.get(f"/documents/{d['id']}").status_code == 404 for d in batch)
        SEEN["refused"] += len(batch)
        return
    SEEN["accepted"] += len(batch)
    for doc in batch:
        STORED[doc["id"]] = doc
        got = client.get(f"/documents/{doc['id']}").json()
        assert (got["id"], got["text"], got["metadata"]) == (doc["id"], doc["text"], doc["metadata"])
        uid = {"uid": doc["metadata"]["uid"]}
        found = client.post("/search", json={"query": doc["text"], "top_k": 1, "filter": uid}).json()
        assert [hit["id"] for hit in found["results"]] == [doc["id"]]
        for path, value in leaves(doc["metadata"]):
            flt = {"$and": [uid, {join_path(path): value}]}
            hits = client.post("/search", json={"query": "x", "filter": flt})
            assert hits.status_code == 200, (flt, hits.text)
            assert [hit["id"] for hit in hits.json()["results"]] == [doc["id"]], flt


def test_enough_documents_and_a_restored_snapshot_holds_them_all(served: tuple[TestClient, Path]) -> None:
    """Runs after the property test (file order)."""
    client, root = served
    print(f"\ngenerated documents: {SEEN}")
    assert SEEN["generated"] >= 500 and SEEN["accepted"] >= 200 and SEEN["refused"], SEEN
    snapshot = client.post("/index/snapshot")
    assert snapshot.status_code == 200, snapshot.text
    taken = next((root / "index-snapshots").iterdir())
    restore_snapshot(taken, root / "restored")
    restored = LiveIndex(root / "restored", writable=False)
    try:
        assert restored.ntotal == len(STORED)
        for doc_id, doc in STORED.items():
            got = restored.get(doc_id)
            assert got is not None and (got.text, got.metadata) == (doc["text"], doc["metadata"])
            assert restored.count({"uid": doc["metadata"]["uid"]}) == 1
    finally:
        restored.close(checkpoint=False)
