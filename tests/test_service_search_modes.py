"""POST /search's modes (dense, lexical, hybrid), batches of queries, pages, thresholds and returned
fields, and GET /documents: on the fake index (fast), then end to end on a real LiveIndex."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from index.live import LiveIndex
from service.testing import FakeEncoder, FakeIndex
from tests.service_client import empty_index_dir, error

pytestmark = pytest.mark.usefixtures("clean_service_env")
DOCS = [
    {"id": f"d{i}", "text": f"word{i} shared text {'even' if i % 2 == 0 else 'odd'}", "metadata": {"n": i}}
    for i in range(12)
]


@pytest.fixture
def fake(make_client: Any) -> TestClient:
    client = make_client(index=FakeIndex(), max_payload_bytes=1 << 20)
    assert client.post("/documents", json={"documents": DOCS[:8]}).status_code == 200
    assert client.post("/documents", json={"documents": DOCS[8:]}).status_code == 200
    return client


def search(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/search", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def ids(hits: list[dict[str, Any]]) -> list[str]:
    return [h["id"] for h in hits]


def test_dense_answers_as_before(fake: TestClient) -> None:
    hits = search(fake, query="word3 shared", top_k=3)["results"]
    assert len(hits) == 3 and all(set(h) == {"id", "score", "text", "metadata"} for h in hits)
    assert set(search(fake, query="word3", with_text=False)["results"][0]) == {
        "id",
        "score",
        "text",
        "metadata",
    }


def test_lexical_scores_are_bm25_and_the_filter_applies(fake: TestClient) -> None:
    index = fake.app.state.service.index
    hits = search(fake, query="word4 even", mode="lexical", top_k=20)["results"]
    assert (hits[0]["id"], hits[0]["score"]) == ("d4", 2.0) and {h["score"] for h in hits[1:]} == {1.0}
    assert {h["id"] for h in hits} == {d["id"] for d in DOCS if "even" in d["text"]}
    assert all(set(h) == {"id", "score", "text", "metadata"} for h in hits)
    assert index.searches[-1] == {"text": "word4 even", "k": 20, "where": None}
    odd = search(fake, query="word3 even", mode="lexical", filter={"n": {"$in": [1, 3, 5]}})["results"]
    assert ids(odd) == ["d3"]


def test_hybrid_hits_carry_both_sides(fake: TestClient) -> None:
    for fusion in ("rrf", "weighted"):
        hits = search(fake, query="word5 odd", mode="hybrid", fusion=fusion, weights=[1, 2], top_k=12)[
            "results"
        ]
        assert hits[0]["id"] == "d5" and hits[0]["matched"] == ["dense", "lexical"]
        assert all({"dense_score", "lexical_score", "matched"} <= set(h) for h in hits)
        only_dense = [h for h in hits if h["matched"] == ["dense"]]
        assert only_dense and all(h["lexical_score"] is None for h in only_dense)  # the even ones
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    weighted = search(fake, query="word5 odd", mode="hybrid", fusion="weighted", weights=[0, 1])["results"]
    assert weighted[0]["score"] == pytest.approx(1.0)  # the lexical side alone: its best scaled to 1


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"vector": [0.1] * 8, "mode": "lexical"}, 422, "mode lexical searches text"),
        ({"vector": [0.1] * 8, "mode": "hybrid"}, 422, "give `query` or `queries`"),
        ({"query": "a", "queries": ["b"]}, 422, "exactly one of `query`, `queries` or `vector`"),
        ({"queries": ["b"], "vector": [0.1] * 8}, 422, "exactly one of"),
        ({"queries": []}, 422, "queries"),
        ({"query": "a", "mode": "sparse"}, 422, "mode"),
        ({"query": "a", "mode": "hybrid", "fusion": "max"}, 422, "fusion"),
        ({"query": "a", "mode": "hybrid", "weights": [0, 0]}, 422, "one weight at least must be above 0"),
        ({"query": "a", "mode": "hybrid", "weights": [1]}, 422, "weights"),
        ({"query": "a", "mode": "hybrid", "weights": [-1, 1]}, 422, "weights.0"),
        ({"query": "a", "offset": -1}, 422, "offset"),
        ({"query": "a", "offset": 15}, 413, "offset + top_k is 25; the limit is max_top_k, 20"),
        ({"query": "a", "offset": 19, "top_k": 2}, 413, "max_top_k, 20"),
        ({"query": "a", "fields": ["vectors"]}, 422, "fields.0"),
        ({"query": "a", "score_threshold": "high"}, 422, "score_threshold"),
        ({"queries": ["a"] * 9}, 413, "9 texts in one request; the limit is 8"),
        ({"queries": ["a", "x" * 101]}, 413, "text 1 has 101 characters"),
    ],
)
def test_bad_combinations_are_refused(fake: TestClient, body: dict, status: int, says: str) -> None:
    assert says in error(fake.post("/search", json=body), status)["error"]


def test_an_index_without_the_lexical_table_is_a_422_naming_the_command(fake: TestClient) -> None:
    fake.app.state.service.index.lexical = False
    for mode in ("lexical", "hybrid"):
        body = error(fake.post("/search", json={"query": "word1", "mode": mode}), 422, "validation_error")
        assert "distilembed index lexical" in body["error"]
    assert search(fake, query="word1")["results"]  # dense goes on
    modes = fake.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]["properties"]["mode"]
    assert modes["enum"] == ["dense"]  # the served document says so


def test_queries_answer_one_batch_each_in_order(fake: TestClient) -> None:
    texts = ["word1 odd", "word4 even", "word9"]
    for mode in ("dense", "lexical", "hybrid"):
        body = search(fake, queries=texts, mode=mode, top_k=4)
        assert set(body) == {"batches", "took_ms"} and len(body["batches"]) == 3
        for text, batch in zip(texts, body["batches"], strict=True):
            assert batch["results"] == search(fake, query=text, mode=mode, top_k=4)["results"]


def test_32_queries_are_one_encoder_call_and_one_index_call(make_client: Any) -> None:
    encoder, index = FakeEncoder(), FakeIndex()
    client = make_client(encoder, index, max_items=32, max_batch=32, max_payload_bytes=1 << 20, workers=1)
    client.post("/documents", json={"documents": DOCS})
    encoder.calls.clear()
    index.searches.clear()
    body = search(client, queries=[f"word{i} text" for i in range(32)], top_k=2)
    assert len(body["batches"]) == 32 and encoder.calls == [32] and len(index.searches) == 1
    encoder.calls.clear()
    assert len(search(client, queries=["word1"] * 32, mode="hybrid")["batches"]) == 32
    assert encoder.calls == [32]


def test_threshold_offset_and_pages(fake: TestClient) -> None:
    for mode in ("dense", "lexical", "hybrid"):
        whole = search(fake, query="word2 even shared", mode=mode, top_k=9)["results"]
        pages = [
            search(fake, query="word2 even shared", mode=mode, top_k=3, offset=o)["results"]
            for o in (0, 3, 6)
        ]
        assert [h for page in pages for h in page] == whole
        floor = whole[4]["score"]
        kept = search(fake, query="word2 even shared", mode=mode, top_k=9, score_threshold=floor)["results"]
        assert kept == [h for h in whole if h["score"] >= floor] and len(kept) >= 5


def test_returned_fields(fake: TestClient) -> None:
    [hit] = search(fake, query="word3", top_k=1, fields=["vector"])["results"]
    assert hit["text"] is None and hit["metadata"] is None
    np.testing.assert_allclose(hit["vector"], FakeEncoder().encode([DOCS[3]["text"]])[0], atol=1e-6)
    [hit] = search(fake, query="word3", top_k=1, fields=["metadata", "text"], with_text=False)["results"]
    assert (hit["text"], hit["metadata"]) == (None, {"n": 3}) and "vector" not in hit
    [hit] = search(fake, query="word3", top_k=1, fields=[])["results"]
    assert (hit["text"], hit["metadata"]) == (None, None)


def walk(client: TestClient, limit: int, between: Any = None) -> list[str]:
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": limit} | ({"cursor": cursor} if cursor is not None else {})
        page = client.get("/documents", params=params)
        assert page.status_code == 200, page.text
        assert all(set(d) == {"id", "text", "metadata"} for d in page.json()["documents"])
        seen += [d["id"] for d in page.json()["documents"]]
        cursor, pages = page.json()["next_cursor"], pages + 1
        if pages == 1 and between is not None:
            between()
        if cursor is None:
            return seen


def test_documents_are_listed_by_cursor(fake: TestClient) -> None:
    assert walk(fake, 5) == [d["id"] for d in DOCS]
    assert walk(fake, 12) == walk(fake, 100 // 5) == [d["id"] for d in DOCS]

    def write() -> None:  # a replaced document keeps its place, a new one comes last
        docs = [
            DOCS[0] | {"text": "changed"},
            DOCS[11] | {"text": "changed"},
            {"id": "new", "text": "new one"},
        ]
        assert fake.post("/documents", json={"documents": docs}).status_code == 200

    assert walk(fake, 5, write) == [d["id"] for d in DOCS] + ["new"]
    first = fake.get("/documents", params={"limit": 1}).json()
    assert first["documents"] == [{"id": "d0", "text": "changed", "metadata": {"n": 0}}]
    end = fake.get("/documents", params={"cursor": "9" * 20}).json()
    assert (end["documents"], end["next_cursor"]) == ([], None)
    assert fake.get("/documents", params={"cursor": ""}).json()["documents"][0]["id"] == "d0"
    for params in ({"cursor": "abc"}, {"cursor": "-1"}, {"cursor": "1" * 21}, {"limit": 0}, {"limit": "x"}):
        error(fake.get("/documents", params=params), 422, "validation_error")
    assert (
        "limit must be between 1 and 20" in error(fake.get("/documents", params={"limit": 21}), 422)["error"]
    )
    assert fake.get("/documents/d1").json()["text"] == DOCS[1]["text"]  # by id, as before


def test_the_openapi_document_lists_the_new_fields_and_route(fake: TestClient) -> None:
    schema = fake.get("/openapi.json").json()
    request = schema["components"]["schemas"]["SearchRequest"]
    assert {"queries", "mode", "fusion", "weights", "offset", "score_threshold", "fields"} <= set(
        request["properties"]
    )
    assert request["properties"]["queries"]["maxItems"] == 8
    assert request["properties"]["mode"]["enum"] == ["dense", "lexical", "hybrid"]
    listing = schema["paths"]["/documents"]["get"]
    limit = next(p for p in listing["parameters"] if p["name"] == "limit")["schema"]["anyOf"][0]
    assert limit["maximum"] == 20 and "422" in listing["responses"]
    assert "SearchBatchesResponse" in str(schema["paths"]["/search"]["post"]["responses"]["200"])


# ---- end to end: a real LiveIndex (flat, with the lexical table) behind the app, the fake encoder

FILLER = [f"alpha{i} beta{i} gamma{i} delta{i} sentence number {i}" for i in range(40)]
RARE = "in the quarterly report the board mentions among many other ordinary words zyxwvut too"


@pytest.fixture
def live(make_client: Any, tmp_path: Path) -> TestClient:
    index = LiveIndex(empty_index_dir(tmp_path / "index", dim=8, lexical=True))
    client = make_client(index=index, max_payload_bytes=1 << 20, max_items=16)
    docs = [{"id": f"f{i}", "text": t, "metadata": {"n": i % 3}} for i, t in enumerate(FILLER)]
    docs.append({"id": "rare", "text": RARE, "metadata": {"n": 1}})
    for lo in range(0, len(docs), 16):
        assert client.post("/documents", json={"documents": docs[lo : lo + 16]}).status_code == 200
    return client


def test_hybrid_finds_by_a_rare_word_what_dense_ranks_low(live: TestClient) -> None:
    dense = ids(search(live, query="zyxwvut", top_k=20)["results"])
    assert "rare" not in dense[:10]  # the precondition: dense alone ranks it low (19th)
    assert ids(search(live, query="zyxwvut", mode="lexical")["results"]) == ["rare"]
    hybrid = search(live, query="zyxwvut", mode="hybrid", top_k=3)["results"]
    assert hybrid[0]["id"] == "rare" and hybrid[0]["matched"] == ["dense", "lexical"]
    assert hybrid[0]["lexical_score"] > 0 and hybrid[1]["lexical_score"] is None
    assert ids(search(live, query="zyxwvut", mode="hybrid", filter={"n": 0})["results"])[0] != "rare"


def test_queries_pages_and_vectors_on_a_live_index(live: TestClient) -> None:
    texts = ["alpha3 beta3", "zyxwvut report", "sentence number 7"]
    for mode in ("dense", "lexical", "hybrid"):
        batches = search(live, queries=texts, mode=mode, top_k=5)["batches"]
        assert [b["results"] for b in batches] == [
            search(live, query=t, mode=mode, top_k=5)["results"] for t in texts
        ]
        whole = search(live, query="sentence number 7", mode=mode, top_k=12)["results"]
        pages = [
            search(live, query="sentence number 7", mode=mode, top_k=4, offset=o)["results"]
            for o in (0, 4, 8)
        ]
        assert [h for page in pages for h in page] == whole and len({h["id"] for h in whole}) == 12
    hits = search(live, query="alpha3", top_k=3, fields=["vector", "text"])["results"]
    vectors = FakeEncoder().encode([h["text"] for h in hits])
    np.testing.assert_allclose([h["vector"] for h in hits], vectors, atol=1e-6)


def test_documents_walk_a_live_index_once_with_writes_between(live: TestClient) -> None:
    everything = [f"f{i}" for i in range(40)] + ["rare"]

    def write() -> None:
        docs = [{"id": "f1", "text": "replaced text"}, {"id": "late", "text": "added during the walk"}]
        assert live.post("/documents", json={"documents": docs}).status_code == 200
        assert live.delete("/documents/f30").status_code == 200

    seen = walk(live, 7, write)
    assert seen == [i for i in everything if i != "f30"] + ["late"] and len(set(seen)) == len(seen)
    count = live.post("/index/count", json={"filter": {"n": 1}}).json()["count"]
    assert count == sum(1 for i in range(40) if i % 3 == 1 and i != 1) + 1  # f1 lost its metadata


def test_lexical_on_a_live_index_without_the_table(make_client: Any, tmp_path: Path) -> None:
    index = LiveIndex(empty_index_dir(tmp_path / "plain", dim=8))
    client = make_client(index=index, index_dir=tmp_path / "plain")  # the directory its errors name
    client.post("/documents", json={"documents": [{"id": "a", "text": "some text"}]})
    says = error(client.post("/search", json={"query": "text", "mode": "hybrid"}), 422)["error"]
    assert says == "plain has no lexical index: add it with 'distilembed index lexical plain'"
    assert str(tmp_path) not in says


def test_plain_dense_queries_skip_the_thread_pool_and_answer_alike(
    live: TestClient, make_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.routes_index as routes

    handed: list[str] = []
    real = routes.run_in_threadpool

    async def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        handed.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(routes, "run_in_threadpool", counting)
    inline = search(live, query="alpha3 beta3", top_k=5)["results"]
    batches = search(live, queries=["alpha3 beta3", "gamma1", "alpha2 delta"], top_k=5)["batches"]
    assert handed == []  # searched by the encoder threads as they encoded the queries
    assert ids(batches[0]["results"]) == ids(inline)
    everything = {"n": {"$in": [0, 1, 2]}}  # a filter every document passes: the thread pool
    threaded = search(live, query="alpha3 beta3", top_k=5, filter=everything)["results"]
    assert handed == ["_run_search"] and ids(threaded) == ids(inline)
    assert [h["score"] for h in threaded] == pytest.approx([h["score"] for h in inline])
    off = make_client(index=LiveIndex(empty_index_dir(tmp_path / "off", dim=8)), inline_search=False)
    search(off, query="anything", top_k=3)
    assert handed == ["_run_search", "_run_search"]


def test_hybrid_finds_its_lexical_side_while_the_encoder_runs(
    make_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    index = LiveIndex(empty_index_dir(tmp_path / "index", dim=8, lexical=True))
    encoder = FakeEncoder(gate=gate)
    client = make_client(encoder=encoder, index=index, max_payload_bytes=1 << 20, max_items=16)
    gate.set()
    docs = [{"id": f"f{i}", "text": t, "metadata": {"n": i % 3}} for i, t in enumerate(FILLER[:16])]
    assert client.post("/documents", json={"documents": docs}).status_code == 200
    real = LiveIndex.lexical_side

    def opens_the_gate(self: LiveIndex, *args: Any, **kwargs: Any) -> list[tuple[int, float]]:
        found = real(self, *args, **kwargs)
        gate.set()  # the encoder, waiting at the gate, goes on only once the lexical side is found
        return found

    monkeypatch.setattr(LiveIndex, "lexical_side", opens_the_gate)
    gate.clear()
    for body in ({"query": "alpha3 gamma5"}, {"queries": ["alpha3 gamma5", "delta7"], "filter": {"n": 1}}):
        answer = search(client, mode="hybrid", top_k=4, **body)
        texts, where = body.get("queries") or [body["query"]], body.get("filter")
        vectors = FakeEncoder().encode(texts)
        expected = [index.search_hybrid(v, t, 4, where) for v, t in zip(vectors, texts, strict=True)]
        got = [b["results"] for b in answer["batches"]] if "batches" in answer else [answer["results"]]
        assert [ids(hits) for hits in got] == [[h.id for h in hits] for hits in expected]
        scores = [h["score"] for hits in got for h in hits]
        assert scores == pytest.approx([h.score for hits in expected for h in hits])
        gate.clear()
