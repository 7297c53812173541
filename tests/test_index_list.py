"""Reading documents back (pages by cursor, stored vectors), lexical and hybrid search over shards, and
the CLI: ``index search`` with several queries, pages, a threshold and fields; ``index list``."""

from __future__ import annotations

import json
import shutil

import faiss
import numpy as np
import pytest

from distilembed.errors import UserError
from index.browse import after_cursor, documents_page, stored_vectors
from index.build import BuildConfig, build
from index.corpus import CorpusSpec
from index.live import INDEX_FILE, LiveIndex
from index.rescore import Rescorer, write_rows
from index.shards import open_sharded, shard_index
from index.store import Document
from index.vectors import IndexPlan, add, binary_lists, build_index, held_vectors
from tests.tiny_models import tiny_sentences

RARE = "a zyxwvut appears in this sentence only"


@pytest.fixture(scope="module")
def built(tiny_bundle, tmp_path_factory):
    """An IVF index (float32, lexical table) of 300 documents and its 2 shards."""
    folder = tmp_path_factory.mktemp("listing")
    rows = [{"id": f"t{i}", "text": t, "n": i % 3} for i, t in enumerate(tiny_sentences(299, seed=4))]
    rows.append({"id": "rare", "text": RARE, "n": 1})
    (folder / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = BuildConfig(bundle=str(tiny_bundle), out=str(folder / "idx"), nlist=8, nprobe=8, flat_below=100)
    build(cfg, CorpusSpec(folder / "c.jsonl", metadata_columns=("n",)))
    shard_index(folder / "idx", 2, folder / "sharded")
    return folder


def walk(lister, limit: int) -> list[str]:
    seen, cursor = [], None
    while True:
        docs, cursor = documents_page(lister, cursor, limit)
        seen += [d.id for d in docs]
        if cursor is None:
            return seen


def test_pages_walk_every_document_once_whole_or_sharded(built) -> None:
    whole, sharded = LiveIndex(built / "idx", writable=False), open_sharded(built / "sharded", 8)
    ids = walk(whole.list_documents, 7)
    assert len(ids) == len(set(ids)) == 300 and ids == walk(whole.list_documents, 300)
    assert walk(sharded.list_documents, 7) == ids  # the source's int ids: one order over the shards
    assert documents_page(whole.list_documents, "9" * 20, 5) == ([], None)
    for bad in ("x", "-1", "1.5", "١", "1" * 21):
        with pytest.raises(UserError, match="next_cursor unchanged"):
            after_cursor(bad)
    sharded.close()


def test_vectors_come_back_from_every_storage(built, tmp_path) -> None:
    whole, sharded = LiveIndex(built / "idx", writable=False), open_sharded(built / "sharded", 8)
    assert whole.kind == "ivf"
    int_ids, vectors = held_vectors(whole.index)
    by_id = {whole.store.get_many([int(i)])[int(i)].id: v for i, v in zip(int_ids, vectors, strict=True)}
    some = ["t3", "rare", "t250", "nope"]
    for index in (whole, sharded):
        got = index.vectors(some)
        assert set(got) == {"t3", "rare", "t250"}
        np.testing.assert_allclose(
            np.stack([got[i] for i in some[:3]]), np.stack([by_id[i] for i in some[:3]])
        )
    assert whole.index.direct_map.type == faiss.DirectMap.Hashtable  # built once, kept for the next
    rows = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    ids = np.arange(10, 510, dtype=np.int64)
    sq8 = build_index(rows, IndexPlan("ivf", 4, "test", "sq8"))
    add(sq8, rows, ids)
    np.testing.assert_allclose(stored_vectors(sq8, None, ids[[0, 7]]), rows[[0, 7]], atol=0.02)
    rescorer = Rescorer(write_rows(tmp_path / "r.f32", ids, rows, 8), 8)
    np.testing.assert_array_equal(stored_vectors(binary_lists(8, 4), rescorer, ids[[3]]), rows[[3]])
    with pytest.raises(UserError, match="sign bits"):
        stored_vectors(binary_lists(8, 4), None, ids[[3]])
    sharded.close()


def test_the_kept_direct_map_follows_writes_and_stays_out_of_the_file(built, tmp_path) -> None:
    shutil.copytree(built / "idx", tmp_path / "idx")
    live = LiveIndex(tmp_path / "idx")
    assert set(live.vectors(["t3"])) == {"t3"}  # builds the map
    fresh = np.eye(live.dim, dtype=np.float32)[:2]
    live.upsert([Document("new", "a new one"), Document("t3", "t3 replaced")], fresh)
    live.delete(["t5"])
    got = live.vectors(["new", "t3", "t5"])
    assert set(got) == {"new", "t3"}
    np.testing.assert_allclose(np.stack([got["new"], got["t3"]]), fresh)
    live.checkpoint()
    assert live.index.direct_map.type == faiss.DirectMap.Hashtable
    assert faiss.read_index(str(tmp_path / "idx" / INDEX_FILE)).direct_map.type == faiss.DirectMap.NoMap
    np.testing.assert_allclose(live.vectors(["new"])["new"], fresh[0])
    live.close()
    reopened = LiveIndex(tmp_path / "idx", writable=False)
    np.testing.assert_allclose(reopened.vectors(["t3"])["t3"], fresh[1])
    reopened.close()


def test_lexical_and_hybrid_over_shards(built) -> None:
    whole, sharded = LiveIndex(built / "idx", writable=False), open_sharded(built / "sharded", 8)
    assert sharded.lexical and whole.lexical
    assert [h.id for h in sharded.search_lexical("zyxwvut", 5)] == ["rare"]
    word = whole.get("t7").text.split()[1]
    merged = {h.id for h in sharded.search_lexical(word, 300)}
    assert merged == {h.id for h in whole.search_lexical(word, 300)}  # the same matches; BM25 per shard
    vector = held_vectors(whole.index)[1][0]
    for fusion in ("rrf", "weighted"):
        hits = sharded.search_hybrid(vector, "zyxwvut", 10, fusion=fusion)
        assert "rare" in [h.id for h in hits] and all(h.matched for h in hits)
        filtered = sharded.search_hybrid(vector, "zyxwvut", 10, {"n": 0}, fusion=fusion)
        assert "rare" not in [h.id for h in filtered] and filtered
    dense = [
        (h.id, h.score) for h in sharded.search_hybrid(vector, "zyxwvut", 5, weights=(1, 0)) if h.dense_score
    ]
    assert [i for i, _ in dense] == [h.id for h in whole.search(vector[None], 5)[0]]
    with pytest.raises(UserError, match="weights"):
        sharded.search_hybrid(vector, "x", weights=(0, 0))
    sharded.close()


def test_cli_searches_several_queries_in_pages_with_fields(built, run_cli, tmp_path) -> None:
    index = str(built / "idx")
    whole = LiveIndex(built / "idx", writable=False)
    texts = [whole.get("t5").text, whole.get("t9").text]
    base = ("index", "search", "--index", index, "--query", texts[0], "--query", texts[1])
    both = run_cli(*base, "-k", "6")
    assert both.returncode == 0, both.stderr
    lines = both.stdout.splitlines()
    assert lines[0] == f"# {texts[0]}" and lines[7] == f"# {texts[1]}" and len(lines) == 14
    assert lines[1].split()[2] == "t5" and lines[8].split()[2] == "t9"
    first = run_cli("index", "search", "--index", index, "--query", texts[0], "-k", "3").stdout.splitlines()
    second = run_cli("index", "search", "--index", index, "--query", texts[0], "-k", "3", "--offset", "3")
    assert first + second.stdout.splitlines() == lines[1:7]  # ranks 4..6 on the second page
    third, fourth = float(lines[3].split()[1]), float(lines[4].split()[1])
    assert third > fourth
    kept = run_cli(
        "index", "search", "--index", index, "--query", texts[0], "--threshold", str((third + fourth) / 2)
    )
    assert kept.stdout.splitlines() == first
    queries = tmp_path / "q.txt"
    queries.write_text(f"{texts[1]}\n\nzyxwvut\n")
    hybrid = run_cli("index", "search", "--index", index, "--queries-file", str(queries), "--mode", "hybrid",
                     "--fields", "metadata,vector", "-k", "2")  # fmt: skip
    assert hybrid.returncode == 0, hybrid.stderr
    out = hybrid.stdout.splitlines()
    assert out[0] == f"# {texts[1]}" and out[3] == "# zyxwvut" and len(out) == 6
    [line] = [line for line in out[4:] if " rare " in line]  # tied first with the dense side's first
    _, _, sides, _, metadata, vector = line.split()
    assert json.loads(metadata) == {"n": 1} and sides.endswith("lexical]")
    assert len(json.loads(vector)) == 8
    lexical = run_cli(
        "index", "search", "--index", str(built / "sharded"), "--query", "zyxwvut", "--mode", "lexical"
    )
    assert lexical.returncode == 0 and lexical.stdout.split()[2] == "rare", lexical.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--fields", "text,score"), "--fields takes text, metadata, vector (comma-separated), not 'score'"),
        (("--queries-file", "/nonexistent/q.txt"), "--queries-file /nonexistent/q.txt"),
        ((), "give a query: --query TEXT (repeatable) or --queries-file FILE"),
        (("--query", " "), "--query is empty"),
    ],
)
def test_cli_search_refusals_are_one_line(built, run_cli, args, says) -> None:
    query = ("--query", "x") if args[:1] == ("--fields",) else ()
    refused = run_cli("index", "search", "--index", str(built / "idx"), *query, *args)
    assert refused.returncode == 2 and says in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert (
        run_cli("index", "search", "--index", str(built / "idx"), "--query", "x", "--offset", "-1").returncode
        == 2
    )


def test_cli_lists_every_document_by_cursor(built, run_cli) -> None:
    for where in ("idx", "sharded"):
        seen, cursor = [], None
        while True:
            args = ("index", "list", str(built / where), "--limit", "120") + (
                ("--cursor", cursor) if cursor else ()
            )
            page = run_cli(*args)
            assert page.returncode == 0, page.stderr
            body = json.loads(page.stdout)
            seen += [d["id"] for d in body["documents"]]
            if (cursor := body["next_cursor"]) is None:
                break
        assert len(seen) == len(set(seen)) == 300 and "rare" in seen
    bad = run_cli("index", "list", str(built / "idx"), "--cursor", "abc")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "cursor 'abc' is not one a page gave" in bad.stderr
