"""Filtered search on a live index: the exact top-k among the documents that pass, whichever plan
answers it (post-filter for common filters, pre-filter for rare ones), indexed field or not."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from index.filtered_search import id_selector
from index.filters import matches, parse
from index.live import LiveIndex
from index.store import Document, DocumentStore
from tests.test_index_live import make_index, unit

N = 3000
FILTERS = [
    {"group": 1},  # a third: post-filtered
    {"rare": True},  # 1%: pre-filtered
    {"n": {"$lt": 600}, "group": {"$ne": 0}},
    {"$or": [{"rare": True}, {"n": {"$gte": 2990}}]},
    {"n": -1},  # nothing
]


def metadata(i: int) -> dict[str, Any]:
    return {"group": i % 3, "rare": i % 100 == 0, "n": i}


@pytest.fixture
def live(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[LiveIndex, np.ndarray]:
    flat, storage = request.param
    vectors = make_index(tmp_path / "idx", n=N, flat=flat, storage=storage)
    index = LiveIndex(tmp_path / "idx")
    index.upsert([Document(f"doc{i}", f"text {i}", metadata(i)) for i in range(N)], vectors)
    yield index, vectors
    index.close()


def exact_top(vectors: np.ndarray, query: np.ndarray, flt: dict[str, Any], k: int) -> list[str]:
    node = parse(flt)
    allowed = [i for i in range(N) if matches(node, metadata(i))]
    scores = vectors[allowed] @ query
    return [f"doc{allowed[j]}" for j in np.argsort(-scores, kind="stable")[:k]]


@pytest.mark.parametrize("live", [(True, "float32"), (False, "float32")], indirect=True)
@pytest.mark.parametrize("indexed", [False, True])
def test_filtered_search_is_the_exact_top_k_of_the_matches(live, indexed: bool) -> None:
    index, vectors = live
    if indexed:
        assert index.add_field_index("group") and index.add_field_index("rare")
        assert not index.add_field_index("group")
        assert index.indexed_fields == ("group", "rare")
    queries = unit(7, 4)
    for flt, again in itertools.product(FILTERS, (False, True)):  # again: its match set is cached
        hits = index.search(queries, 10, nprobe=32, where=flt)  # every list: exact
        for query, row in zip(queries, hits, strict=True):
            assert [h.id for h in row] == exact_top(vectors, query, flt, 10), (flt, again)
        assert index.count(flt) == sum(matches(parse(flt), metadata(i)) for i in range(N))


@pytest.mark.parametrize("live", [(False, "sq8"), (False, "pq"), (False, "binary")], indirect=True)
def test_compressed_lists_return_only_matches_best_first(live) -> None:
    index, _ = live
    for flt in FILTERS:
        node = parse(flt)
        wanted = min(10, index.count(flt))
        for row in index.search(unit(3, 3), 10, where=flt):
            assert len(row) == wanted and all(matches(node, h.metadata) for h in row), flt
            assert [h.score for h in row] == sorted((h.score for h in row), reverse=True)


@pytest.mark.parametrize("live", [(False, "float32")], indirect=True)
def test_a_rare_filter_at_the_default_nprobe_still_fills_top_k(live) -> None:
    """1% of documents match: the pre-filter probes more lists, so ten come back, not the few
    that the default five of 32 lists hold."""
    index, _ = live
    for row in index.search(unit(11, 5), 10, where={"rare": True}):
        assert len(row) == 10 and all(h.metadata["rare"] for h in row)


@pytest.mark.parametrize("live", [(True, "float32")], indirect=True)
def test_the_payload_index_follows_writes(live) -> None:
    index, vectors = live
    index.add_field_index("group")
    index.upsert([Document("doc1", "moved", {"group": 7})], vectors[1:2])
    assert [h.id for h in index.search(vectors[1:2], 5, where={"group": 7})[0]] == ["doc1"]
    assert index.count({"group": 1}) == N // 3 - 1
    index.delete(["doc1"])
    assert index.count({"group": 7}) == 0
    rows = index.store.db.execute("SELECT COUNT(*) FROM field_values").fetchone()[0]
    assert rows == N - 1  # one value per document left, none for the deleted one


@pytest.mark.parametrize("count", [3, 5000])
def test_id_selectors_hold_exactly_the_ids(count: int) -> None:
    ids = np.unique(np.random.default_rng(count).integers(0, 40_000, size=count))
    selector, _bits = id_selector(ids)
    members = [i for i in range(40_001) if selector.is_member(i)]
    assert members == ids.tolist()


def test_a_cached_match_set_sees_another_connections_writes(tmp_path: Path) -> None:
    writer = DocumentStore(tmp_path / "docs.sqlite")
    writer.add_field_index("lang")
    writer.upsert([Document("a", "t", {"lang": "en"})])
    reader = DocumentStore(tmp_path / "docs.sqlite", readonly=True)
    node = parse({"lang": "en"})
    first = reader.ids_matching(node).tolist()
    assert reader.known_matches(node)[0] == 1
    writer.upsert([Document("b", "t", {"lang": "en"})])  # another connection: data_version moves
    assert reader.known_matches(node) is None
    assert len(reader.ids_matching(node)) == len(first) + 1
    writer.delete_logged(["a", "b"])
    assert reader.count_matching(node) == 0
    writer.close()
    reader.close()
