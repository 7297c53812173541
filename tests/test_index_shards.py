"""index shard: N shard directories whose merged top-k equals the whole index's."""

import numpy as np
import pytest

from distilembed.errors import BusyError, UserError
from index.build import BuildConfig, build
from index.corpus import CorpusSpec
from index.live import Hit, LiveIndex
from index.shards import is_sharded, merge_hits, open_sharded, shard_index, shard_of
from index.vectors import held_vectors
from tests.tiny_models import tiny_sentences


@pytest.fixture(scope="module")
def whole(tiny_bundle, tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    corpus = folder / "c.jsonl"
    texts = tiny_sentences(2000, seed=9)
    corpus.write_text(
        "".join(f'{{"id": "t{i}", "text": "{t}", "n": {i % 4}}}\n' for i, t in enumerate(texts))
    )
    cfg = BuildConfig(bundle=str(tiny_bundle), out=str(folder / "idx"), nlist=8, nprobe=3, flat_below=100)
    build(cfg, CorpusSpec(corpus, metadata_columns=("n",)))
    return folder / "idx"


def test_merge_hits_keeps_the_k_best_of_all_shards() -> None:
    a = [[Hit("a1", 0.9, "", {}), Hit("a2", 0.5, "", {})]]
    b = [[Hit("b1", 0.7, "", {}), Hit("b2", 0.6, "", {})]]
    assert [h.id for h in merge_hits([a, b], 3)[0]] == ["a1", "b1", "b2"]


@pytest.mark.parametrize("count", [2, 3])
def test_sharded_search_equals_the_whole_index(whole, tmp_path, count) -> None:
    manifest = shard_index(whole, count, tmp_path / "sharded")
    assert is_sharded(tmp_path / "sharded") and manifest["ntotal"] == 2000
    reference = LiveIndex(whole, writable=False)
    sharded = open_sharded(tmp_path / "sharded", 8)
    sizes = [LiveIndex(tmp_path / "sharded" / name, writable=False).ntotal for name in manifest["shards"]]
    assert sum(sizes) == 2000 and min(sizes) > 0
    _, vectors = held_vectors(reference.index)
    queries = vectors[::40] + np.float32(0.01)
    for where in (None, {"n": "1"}):
        expected = [
            [(h.id, round(h.score, 5)) for h in row] for row in reference.search(queries, 10, where=where)
        ]
        got = [[(h.id, round(h.score, 5)) for h in row] for row in sharded.search(queries, 10, where=where)]
        assert got == expected
    assert sharded.get("t17").text == reference.get("t17").text
    assert shard_of("t17", count) == next(
        i
        for i, n in enumerate(manifest["shards"])
        if LiveIndex(tmp_path / "sharded" / n, writable=False).get("t17")
    )
    with pytest.raises(BusyError, match="read-only"):
        sharded.upsert([], np.zeros((0, 8), np.float32))
    sharded.close()


def test_shard_refuses_bad_counts_and_existing_output(whole, tmp_path) -> None:
    with pytest.raises(UserError, match="at least 2"):
        shard_index(whole, 1, tmp_path / "x")
    (tmp_path / "x").mkdir()
    with pytest.raises(UserError, match="output exists"):
        shard_index(whole, 2, tmp_path / "x")


def test_service_serves_a_sharded_directory(tiny_bundle, whole, tmp_path) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    shard_index(whole, 2, tmp_path / "sharded")
    query = {"query": "the man plays a guitar", "top_k": 5}
    answers = []
    for directory in (whole, tmp_path / "sharded"):
        settings = Settings(bundle=tiny_bundle, index_dir=directory, threads=1, warmup=False)
        with TestClient(create_app(settings)) as client:
            answers.append(
                [
                    (r["id"], round(r["score"], 5))
                    for r in client.post("/search", json=query).json()["results"]
                ]
            )
            if directory != whole:
                assert client.get("/info").json()["index"]["type"] == "ivf_sharded"
                assert client.get("/documents/t3").json()["id"] == "t3"
                refused = client.post("/documents", json={"documents": [{"id": "x", "text": "new text"}]})
                assert refused.status_code == 409 and "read-only" in refused.json()["error"]
    assert answers[0] == answers[1] and len(answers[0]) == 5


def test_cli_searches_a_sharded_directory_and_refuses_writes(whole, tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from distilembed.cli import _register, app

    shard_index(whole, 2, tmp_path / "sharded")
    _register()
    runner = CliRunner()
    reference = LiveIndex(whole, writable=False).get("t5").text
    searched = runner.invoke(app, ["index", "search", "--index", str(whole), "--query", reference, "-k", "3"])
    sharded = runner.invoke(
        app, ["index", "search", "--index", str(tmp_path / "sharded"), "--query", reference, "-k", "3"]
    )
    assert sharded.exit_code == 0, sharded.output
    assert sharded.output == searched.output and "t5" in sharded.output
    docs = tmp_path / "more.jsonl"
    docs.write_text(json.dumps({"id": "new", "text": "new text"}) + "\n")
    added = runner.invoke(app, ["index", "add", "--index", str(tmp_path / "sharded"), "--corpus", str(docs)])
    assert isinstance(added.exception, UserError) and "read-only" in str(added.exception)
