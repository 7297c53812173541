"""The filter language: parsing and its errors, the Python evaluator on hand-worked cases, and the
SQL compilation held to the evaluator on generated documents and filters (indexed and not)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distilembed.errors import TooLargeError
from index.filters import FilterError, FilterLimits, join_path, matches, parse, split_path
from index.store import Document, DocumentStore

DOC = {
    "lang": "en",
    "n": 3,
    "price": 9.5,
    "draft": False,
    "tags": ["news", "sport"],
    "author": {"name": "Ada", "born": 1815},
    "refs": [{"id": 1}, {"id": 2}],
    "a.b": "dotted",
    "none": None,
    "empty": [],
}


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({}, True),
        ({"lang": "en"}, True),
        ({"lang": "fr"}, False),
        ({"n": 3.0}, True),  # numbers compare as numbers
        ({"n": "3"}, False),  # never across types
        ({"draft": 0}, False),  # false is not 0
        ({"draft": False}, True),
        ({"tags": "news"}, True),  # a list matches any of its elements
        ({"tags": {"$in": ["x", "sport"]}}, True),
        ({"tags": {"$nin": ["news"]}}, False),
        ({"author.name": "Ada"}, True),
        ({"author.born": {"$gte": 1815, "$lt": 1816}}, True),
        ({"author.born": {"$gt": 1815}}, False),
        ({"refs.id": 2}, True),  # into a list of objects
        ({"a\\.b": "dotted"}, True),  # an escaped dot is part of the key
        ({"a.b": "dotted"}, False),  # a path: key "a", then "b"
        ({"none": None}, True),
        ({"missing": None}, True),  # null matches a missing field, as in MongoDB
        ({"missing": {"$ne": 1}}, True),
        ({"none": {"$exists": True}}, True),
        ({"empty": {"$exists": True}}, True),
        ({"missing": {"$exists": False}}, True),
        ({"lang": {"$gt": "dz", "$lt": "fa"}}, True),  # strings by code point
        ({"price": {"$lt": "z"}}, False),  # a number is not below a string
        ({"$or": [{"lang": "fr"}, {"n": 3}]}, True),
        ({"$and": [{"lang": "en"}, {"$not": {"n": 3}}]}, False),
        ({"$not": {"tags": {"$exists": True}}}, False),
    ],
)
def test_matches_hand_worked(flt: dict[str, Any], expected: bool) -> None:
    assert matches(parse(flt), DOC) is expected


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ([1], "filter: a filter is a JSON object"),
        ({"$foo": 1}, "filter.$foo: unknown operator"),
        ({"a": {"$regex": "x"}}, "filter.a.$regex: unknown operator"),
        ({"a": [1, 2]}, "filter.a: a list is not a value"),
        ({"a": {}}, "filter.a: give at least one operator"),
        ({"a": 10**309}, "filter.a: numbers are finite and at most 1.7e+308 in size"),
        ({"a": {"$in": [1, -(10**309)]}}, "filter.a.$in.1: numbers are finite and at most"),
        ({"a": "\ud800"}, "filter.a: holds a lone surrogate"),
        ({"\ud800": 1}, "filter.\\ud800: holds a lone surrogate"),
        ({"a": {"$gt": None}}, "filter.a.$gt: compares with a number or a string"),
        ({"a": {"$gt": True}}, "filter.a.$gt: compares with a number or a string"),
        ({"a": {"$exists": 1}}, "filter.a.$exists: takes true or false"),
        ({"$and": []}, "filter.$and: takes a non-empty list"),
        ({"a..b": 1}, "filter.a..b: a field path has an empty segment"),
        ({"a\\b": 1}, "escapes only"),
        ({"a": {"x": 1}}, "filter.a.x: unknown operator"),
        ({"$not": {"$not": {"$not": {"$not": {"a": 1}}}}}, "nest at most 4 levels"),
    ],
)
def test_parse_errors_name_the_place(flt: Any, message: str) -> None:
    with pytest.raises(FilterError, match=re.escape(message)):
        parse(flt)


def test_integers_past_64_bits_compare_exactly() -> None:
    low = -(1 << 63) - 1  # no float equals it: the nearest is -2^63, which must not match
    assert not matches(parse({"a": low}), {"a": -(1 << 63)})
    assert matches(parse({"a": {"$gt": low}}), {"a": -(1 << 63)})
    assert not matches(parse({"a": {"$lte": low}}), {"a": -(1 << 63)})
    assert matches(parse({"a": {"$lt": low}}), {"a": -1e19})
    assert matches(parse({"a": {"$ne": low}}), {"a": -(1 << 63)})
    assert matches(parse({"a": 1 << 63}), {"a": float(1 << 63)})  # 2^63 is a float exactly
    assert matches(parse({"a": {"$gt": 1 << 70}}), {"a": 1e22})


def test_a_filter_past_its_total_size_is_too_large_not_malformed() -> None:
    limits = FilterLimits(total=10)
    parse({"a": {"$in": list(range(9))}}, limits)
    with pytest.raises(TooLargeError):
        parse({"a": {"$in": list(range(10))}, "b": 1}, limits)


@pytest.mark.parametrize("key", ["a", "a.b", "x\\.y", "back\\\\slash", 'q"uote', "\\$ref", "a.$b"])
def test_paths_round_trip(key: str) -> None:
    assert join_path(split_path(key)) == key


def test_many_clauses_compile_without_sqlite_expression_depth_errors(tmp_path: Path) -> None:
    store = DocumentStore(tmp_path / "docs.sqlite")
    store.upsert([Document("x", "t", {"k0": 0})])
    wide = {"$or": [{f"k{i}.{j}": {"$ne": j} for j in range(15)} | {"k0": 0} for i in range(16)]}
    assert store.ids_matching(parse(wide)).tolist() == [1]
    store.add_field_index("k0")
    assert store.ids_matching(parse(wide)).tolist() == [1]
    store.close()


# --- generated documents and filters: SQL (indexed and not) == the Python evaluator -------------

KEYS = st.sampled_from(["a", "b", "c.d", 'q"', "\\", "$k"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([-(1 << 63), (1 << 63) - 1, 2.5, -0.0, 1.0, 1e300]),
    st.sampled_from([1 << 63, -(1 << 63) - 1, float(1 << 63), -float(1 << 63), (1 << 64) + 1]),
    st.sampled_from(["", "x", "y", "é", "1"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
METADATA = st.dictionaries(KEYS, VALUES, max_size=4)
PATHS = st.lists(KEYS, min_size=1, max_size=2).map(lambda p: join_path(tuple(p)))
OPERATORS = st.one_of(
    st.builds(lambda v: {"$eq": v}, SCALARS),
    st.builds(lambda v: {"$ne": v}, SCALARS),
    st.builds(lambda v: {"$in": v}, st.lists(SCALARS, max_size=3)),
    st.builds(lambda v: {"$nin": v}, st.lists(SCALARS, max_size=3)),
    st.builds(
        lambda op, v: {op: v},
        st.sampled_from(["$gt", "$gte", "$lt", "$lte"]),
        st.one_of(st.integers(-3, 3), st.sampled_from([2.5, "", "x", "é"])),
    ),
    st.builds(lambda v: {"$exists": v}, st.booleans()),
)
CONDITIONS = st.builds(lambda p, o: {p: o}, PATHS, OPERATORS | SCALARS)
FILTERS = st.recursive(
    CONDITIONS,
    lambda inner: st.one_of(
        st.builds(lambda fs: {"$and": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$or": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda f: {"$not": f}, inner),
    ),
    max_leaves=4,
)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[DocumentStore, DocumentStore]:
    """Two stores (no payload index, and every generated path indexed), refilled per example."""
    root = tmp_path_factory.mktemp("filters")
    plain, indexed = DocumentStore(root / "plain.sqlite"), DocumentStore(root / "indexed.sqlite")
    for key in ["a", "b", "c.d", 'q"', "\\", "$k"]:
        for second in [None, "a", "b", "c.d", 'q"', "\\", "$k"]:
            path = (key,) if second is None else (key, second)
            indexed.add_field_index(join_path(path))
    return plain, indexed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(METADATA, min_size=1, max_size=6), flt=FILTERS)
def test_sql_agrees_with_the_evaluator(
    stores: tuple[DocumentStore, DocumentStore], docs: list[dict[str, Any]], flt: dict[str, Any]
) -> None:
    node = parse(flt)
    expected = [i for i, meta in enumerate(docs) if matches(node, meta)]
    for store in stores:
        store.db.execute("DELETE FROM docs")
        store.db.execute("DELETE FROM field_values")
        ids, _ = store.upsert([Document(str(i), "t", meta) for i, meta in enumerate(docs)])
        position = {int_id: i for i, int_id in enumerate(ids)}
        found = sorted(position[i] for i in store.ids_matching(node).tolist())
        assert found == expected, (store.path.name, flt, docs)
        assert store.count_matching(node) == len(expected)
        among_even = sorted(position[i] for i in store.which_match(node, ids[::2]))
        assert among_even == [e for e in expected if e % 2 == 0]
