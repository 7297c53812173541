"""The lexical (BM25, SQLite FTS5) index beside the vectors: kept in step by every write, filtered,
fused with dense search, through snapshots, shards and kill -9, safe on hostile text, and checked."""

import json
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from distilembed.errors import UserError
from index import lexical
from index.integrity import STORE_FILE
from index.live import LiveIndex
from index.shards import shard_index
from index.snapshot import restore_snapshot
from index.store import Document, DocumentStore
from index.verify import verify_index
from tests.test_index_live import make_index, unit

ROOT = Path(__file__).parents[1]


def lexical_index(directory: Path, n: int = 300) -> LiveIndex:
    """A flat index of ``n`` documents ("text {i}", group i % 3) with its lexical index, open to write."""
    make_index(directory, n=n, flat=True)
    live = LiveIndex(directory)
    assert not live.lexical and live.enable_lexical() and live.lexical
    return live


def ids(hits: list) -> list[str]:
    return [h.id for h in hits]


def test_upsert_delete_and_edit_keep_the_lexical_index_in_step(tmp_path) -> None:
    live = lexical_index(tmp_path / "idx")
    assert json.loads((tmp_path / "idx" / "manifest.json").read_text())["lexical"] is True
    assert ids(live.search_lexical("text 17", k=1)) == ["doc17"]  # built from the documents already there
    live.upsert([Document("rare", "the serial number XJ-4471 of the Zürich unit")], unit(1))
    [hit] = live.search_lexical("xj 4471", k=5)
    assert (hit.id, hit.text) == ("rare", "the serial number XJ-4471 of the Zürich unit") and hit.score > 0
    assert ids(live.search_lexical("ZURICH", k=5)) == ["rare"]  # case and diacritics folded
    int_id = live.store.int_ids(["rare"])["rare"]
    live.upsert([Document("rare", "now it names Oslo")], unit(2))  # the text moves: old words gone
    assert live.search_lexical("zurich", k=5) == [] and ids(live.search_lexical("oslo", k=5)) == ["rare"]
    assert live.store.int_ids(["rare"])["rare"] == int_id
    assert live.delete(["rare"]) == ["rare"] and live.search_lexical("oslo", k=5) == []
    assert live.search_lexical("?!*", k=5) == [] and live.search_lexical("text", k=0) == []
    assert lexical.check(live.store.db) == []
    live.close()


@pytest.mark.parametrize("indexed", [False, True])
def test_filters_apply_to_lexical_and_hybrid_search(tmp_path, indexed) -> None:
    live = lexical_index(tmp_path / "idx")
    if indexed:
        live.add_field_index("group")
    docs = [Document(f"z{g}", f"zanzibar report {g}", {"group": g}) for g in (1, 2)]
    live.upsert(docs, unit(5, 2))
    assert ids(live.search_lexical("zanzibar", k=10)) == ["z1", "z2"]  # equal BM25: ties by int id
    assert ids(live.search_lexical("zanzibar", k=10, where={"group": 2})) == ["z2"]
    assert live.search_lexical("zanzibar", k=10, where={"group": 7}) == []
    hits = live.search_hybrid(unit(5, 2)[0], "zanzibar", k=20, where={"group": 1})
    assert hits and all(h.metadata["group"] == 1 for h in hits)
    assert "z1" in ids(hits) and "z2" not in ids(hits)


def test_hybrid_fuses_both_sides_and_says_which_matched(tmp_path) -> None:
    live = lexical_index(tmp_path / "idx", n=500)
    query = unit(11)[0]
    live.upsert(
        [Document("both", "quokka sighting report"), Document("lex", "quokka")], np.stack([query, -query])
    )
    hits = live.search_hybrid(query, "quokka", k=5, fusion="rrf")
    by_id = {h.id: h for h in hits}
    assert hits[0].id == "both" and by_id["both"].matched == ("dense", "lexical")
    # dense rank 1 (its own vector) and lexical rank 2 (the shorter "quokka" ranks first): 1/61 + 1/62
    assert by_id["both"].score == pytest.approx(0.03252247488101534)
    assert by_id["both"].dense_score == pytest.approx(1.0, abs=1e-5) and by_id["both"].lexical_score > 0
    assert by_id["lex"].matched == ("lexical",) and by_id["lex"].dense_score is None  # -query: never near
    assert by_id["lex"].score == pytest.approx(1 / 61)
    dense_only = [h for h in hits if h.matched == ("dense",)]
    assert dense_only and all(h.lexical_score is None and h.id.startswith("doc") for h in dense_only)
    weighted = live.search_hybrid(query, "quokka", k=3, fusion="weighted", weights=(0.0, 1.0))
    assert weighted[0].id == "lex" and weighted[0].score == pytest.approx(1.0)  # "both": BM25's minimum
    with pytest.raises(UserError, match="fusion must be one of rrf, weighted"):
        live.search_hybrid(query, "quokka", fusion="max")
    with pytest.raises(UserError, match="weights must be two finite numbers"):
        live.search_hybrid(query, "quokka", weights=(0.0, 0.0))
    no_words = live.search_hybrid(query, "!!!", k=3)  # the dense side alone
    assert ids(no_words)[0] == "both" and all(h.matched == ("dense",) for h in no_words)


def test_a_lexical_side_found_ahead_fuses_as_the_search_finds_it_itself(tmp_path) -> None:
    live = lexical_index(tmp_path / "idx", n=200)
    query = unit(11)[0]
    live.upsert(
        [Document("both", "quokka sighting report"), Document("lex", "quokka")], np.stack([query, -query])
    )
    for where in (None, {"group": 1}):
        side = live.lexical_side("quokka text", k=5, where=where)
        assert side and side == sorted(side, key=lambda hit: -hit[1])  # (int id, BM25), best first
        alone = live.search_hybrid(query, "quokka text", k=5, where=where)
        assert live.search_hybrid(query, "quokka text", k=5, where=where, lexical=side) == alone
    side = live.lexical_side("quokka", k=5)
    live.delete(["lex"])  # between the two sides: left out, not an error
    assert "lex" not in ids(live.search_hybrid(query, "quokka", k=5, lexical=side))
    live.close()


def test_without_the_lexical_index_a_one_line_error_says_how_to_add_it(tmp_path) -> None:
    make_index(tmp_path / "idx", n=200, flat=True)
    live = LiveIndex(tmp_path / "idx")
    for search in (lambda: live.search_lexical("text"), lambda: live.search_hybrid(unit(1)[0], "text")):
        with pytest.raises(
            UserError, match=r"has no lexical index: add it with 'distilembed index lexical "
        ) as e:
            search()
        assert "\n" not in str(e.value)


def test_snapshot_restore_and_shards_keep_the_lexical_index(tmp_path) -> None:
    live = lexical_index(tmp_path / "idx")
    live.upsert([Document("snap", "pelican crossing")], unit(3))  # logged, not yet checkpointed
    live.snapshot(tmp_path / "snap")
    live.upsert([Document("late", "pelican after the snapshot")], unit(4))
    live.close()
    restore_snapshot(tmp_path / "snap", tmp_path / "restored")
    restored = LiveIndex(tmp_path / "restored", writable=False)
    assert ids(restored.search_lexical("pelican", k=5)) == ["snap"] and restored.lexical
    manifest = shard_index(tmp_path / "idx", 2, tmp_path / "sharded")
    found = []
    for name in manifest["shards"]:
        shard = LiveIndex(tmp_path / "sharded" / name, writable=False)
        assert shard.lexical and lexical.check(DocumentStore(shard.dir / STORE_FILE).db) == []
        found += ids(shard.search_lexical("pelican", k=5))
    assert sorted(found) == ["late", "snap"]


def test_acknowledged_upserts_are_found_lexically_after_kill_9(tmp_path) -> None:
    lexical_index(tmp_path / "idx", n=100).close()
    script = textwrap.dedent(
        f"""
        import numpy as np
        from index.live import LiveIndex
        from index.store import Document
        live = LiveIndex({str(tmp_path / "idx")!r})
        rng = np.random.default_rng(0)
        i = 0
        while True:
            vector = rng.normal(size=(1, live.dim)).astype(np.float32)
            live.upsert([Document(f"k{{i}}", f"entry marker{{i:05d}} of the loop")], vector)
            print(f"k{{i}}", flush=True)
            i += 1
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT, bufsize=1
    )
    acknowledged = []
    try:
        assert child.stdout is not None
        while len(acknowledged) < 25:
            line = child.stdout.readline()
            assert line.endswith("\n"), "the writer died before 25 acknowledgements"
            acknowledged.append(line.strip())
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        acknowledged += [line.strip() for line in child.stdout if line.endswith("\n")]  # read after kill
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    live = LiveIndex(tmp_path / "idx", writable=False)
    for ext in acknowledged:
        assert ids(live.search_lexical(f"marker{int(ext[1:]):05d}", k=2)) == [ext]
    assert lexical.check(DocumentStore(tmp_path / "idx" / STORE_FILE).db) == []


HOSTILE = [
    '"unbalanced quote',
    'he said ""hello""',
    "NEAR(a b, 3)",
    "a AND b OR NOT c",
    "a + b",
    "prefix*",
    "^start",
    "text: colon filter",
    "{text}: column set",
    "- text : minus",
    "(((nested)))",
    "NEAR",
    "AND",
    "x" * 10_000,
    "word " * 5_000,
    "nul\x00inside",
    "lone \ud800 surrogate",
    "ünïcödé ½ x² 東京都 हिन्दी",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_only_ever_searched_as_text(tmp_path, text) -> None:
    store = DocumentStore(tmp_path / STORE_FILE)
    store.upsert([Document("a", "near and not text column nested start prefix word x²")])
    store.enable_lexical()
    query = lexical.match_query(lexical.query_terms(text))
    assert query is not None and query.count(" OR ") < lexical.MAX_TERMS
    found = store.lexical_search(text, 10)  # no sqlite3 error, whatever it finds
    if text in ("NEAR", "AND", "NEAR(a b, 3)", "text: colon filter", "{text}: column set", "prefix*"):
        assert [i for i, _ in found] == [1]  # operators and column names are words of the text


@pytest.mark.parametrize("text", ['"', ")", "", "   ", "!?*^():\"'-+{}[]", "_ _ __", "\x00\x01", "\ud800"])
def test_text_without_a_word_gives_no_query(text) -> None:
    assert lexical.match_query(lexical.query_terms(text)) is None


def test_random_operator_soup_never_raises(tmp_path) -> None:
    store = DocumentStore(tmp_path / STORE_FILE)
    store.upsert([Document("a", "alpha beta gamma")])
    store.enable_lexical()
    rng = random.Random(0)
    pieces = [
        '"',
        "'",
        "(",
        ")",
        "*",
        "^",
        ":",
        "-",
        "+",
        "{",
        "}",
        " ",
        "NEAR",
        "AND",
        "OR",
        "NOT",
        "alpha",
        "é",
    ]
    for _ in range(300):
        store.lexical_search("".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))), 5)
    assert lexical.query_terms('alpha "beta" ALPHA Zürich') == ["alpha", "beta", "zurich"]  # distinct, folded
    assert lexical.match_query(['a"b', "c"]) == '"a""b" OR "c"'  # quoted, quotes doubled, OR'ed


@pytest.mark.parametrize("damage", ["text edited behind the index", "index rows deleted"])
def test_verify_refuses_a_damaged_lexical_index_and_index_lexical_repairs_it(
    tmp_path, run_cli, damage
) -> None:
    lexical_index(tmp_path / "idx").close()
    assert verify_index(tmp_path / "idx")["lexical"] == "integrity-check ok"
    db = sqlite3.connect(tmp_path / "idx" / STORE_FILE)  # no store: nothing keeps the index in step
    if damage == "index rows deleted":
        db.execute(f"DELETE FROM {lexical.TABLE}_data WHERE id > 10")
    else:
        db.execute("UPDATE docs SET text = 'rewritten' WHERE ext_id = 'doc5'")
    db.commit()
    db.close()
    result = run_cli("index", "verify", str(tmp_path / "idx"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and result.stdout == "" and len(lines) == 1
    assert "lexical index (docs_fts) fails FTS5's integrity-check" in lines[0]
    assert f"distilembed index lexical {tmp_path / 'idx'}" in lines[0]
    repaired = run_cli("index", "lexical", str(tmp_path / "idx"))
    assert repaired.returncode == 0 and json.loads(repaired.stdout) == {
        "lexical": "rebuilt",
        "documents": 300,
    }
    assert verify_index(tmp_path / "idx")["sound"]


def test_cli_build_without_lexical_then_add_it_and_search_each_mode(tiny_bundle, tmp_path, run_cli) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": f"t{i}", "text": f"plain sentence number {i}", "n": i % 2} for i in range(60)]
    rows.append({"id": "code", "text": "part QX-9917 replaces the valve", "n": 1})
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "idx"
    built = run_cli(
        "index", "build", "--bundle", str(tiny_bundle), "--corpus", str(corpus), "--out", str(out),
        "--metadata-column", "n", "--no-lexical",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["lexical"] is False
    search = ("index", "search", "--index", str(out), "--query", "QX-9917 valve")
    wide = ("index", "search", "--index", str(out), "--query", "QX-9917 valve sentence", "-k", "50")
    refused = run_cli(*search, "--mode", "lexical")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert f"has no lexical index: add it with 'distilembed index lexical {out}'" in refused.stderr
    writer = LiveIndex(out)  # as a service holds it
    busy = run_cli("index", "lexical", str(out))
    assert busy.returncode == 2 and "already open for writing" in busy.stderr
    writer.close()
    added = run_cli("index", "lexical", str(out))
    assert added.returncode == 0 and json.loads(added.stdout) == {"lexical": "added", "documents": 61}
    lexical_hits = run_cli(*search, "--mode", "lexical", "-k", "3")
    assert lexical_hits.returncode == 0, lexical_hits.stderr
    assert lexical_hits.stdout.splitlines()[0].split()[2] == "code"
    assert run_cli(*wide, "--mode", "lexical").stdout.splitlines()[0].split()[2] == "code"
    filtered = run_cli(*wide, "--mode", "lexical", "--filter", '{"n": 0}').stdout.splitlines()
    assert len(filtered) == 30 and all(line.split()[2] != "code" for line in filtered)
    for fusion in ("rrf", "weighted"):
        hybrid = run_cli(*search, "--mode", "hybrid", "--fusion", fusion, "-k", "3")
        assert hybrid.returncode == 0, hybrid.stderr
        lines = hybrid.stdout.splitlines()
        assert len(lines) == 3 and all("[" in line for line in lines) and "code" in hybrid.stdout
    assert run_cli(*search, "--mode", "sparse").returncode == 2
    assert LiveIndex(out, writable=False).manifest["lexical"] is True


def test_build_keeps_the_lexical_index_by_default(tiny_bundle, tmp_path) -> None:
    from index.build import BuildConfig, build, create_empty
    from index.corpus import CorpusSpec

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i} about kestrels\n" if i == 7 else f"line {i}\n" for i in range(40)))
    manifest = build(BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx")), CorpusSpec(corpus))
    assert manifest["lexical"] is True
    live = LiveIndex(tmp_path / "idx")
    [seventh] = live.search_lexical("kestrels", k=3)
    assert seventh.text == "line 7 about kestrels"
    live.upsert([Document("new", "more kestrels here and kestrels there")], np.ones((1, 8), np.float32))
    assert sorted(ids(live.search_lexical("kestrels", k=3))) == sorted(["new", seventh.id])
    live.close()
    empty = create_empty(BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "empty")), lexical=False)
    assert empty["lexical"] is False and not LiveIndex(tmp_path / "empty", writable=False).lexical


def test_plan_with_counts_cut_at_the_budget_plans_as_exact_counts_would(tmp_path) -> None:
    store = DocumentStore(tmp_path / STORE_FILE)
    rng = random.Random(3)
    words = [f"w{i}" for i in range(30)]  # w0 in about every document, w29 in a handful
    store.upsert(
        [
            Document(f"d{n}", " ".join(w for i, w in enumerate(words) if rng.random() < 0.9**i))
            for n in range(400)
        ]
    )
    store.enable_lexical()
    exact = {
        w: int(
            store.db.execute(
                f"SELECT count(*) FROM {lexical.TABLE} WHERE {lexical.TABLE} MATCH ?", (f'"{w}"',)
            ).fetchone()[0]
        )
        for w in words
    }

    def reference(text: str, budget: int) -> list[str]:  # the plan from full counts
        common = max(0.05 * 400, budget)
        kept: list[str] = []
        for term in sorted(
            (t for t in lexical.query_terms(text) if 0 < exact.get(t, 0) <= common), key=lambda t: exact[t]
        ):
            if kept and sum(exact[t] for t in kept) + exact[term] > budget:
                break
            kept.append(term)
        return kept

    shared: dict[str, lexical.TermCount] = {}
    for _ in range(200):
        text, budget = " ".join(rng.sample([*words, "absent"], rng.randint(1, 6))), rng.choice([4, 16, 64])
        assert lexical.plan(store.db, text, shared, budget) == reference(text, budget)
        assert lexical.plan(store.db, text, {}, budget) == reference(text, budget)


def test_plan_keeps_the_rarest_terms_within_the_budget_and_drops_stopwords(tmp_path) -> None:
    store = DocumentStore(tmp_path / STORE_FILE)
    docs = [
        Document(f"d{i}", f"the cat {'sat' if i < 3 else 'ran'} {'zebra' if i == 7 else ''}")
        for i in range(200)
    ]
    store.upsert(docs)
    store.enable_lexical()
    counts: dict[str, lexical.TermCount] = {}
    # the: 200 documents, over 5% of 200 and over the budget of 4: a stopword; zebra 1, sat 3, cat 200
    assert lexical.plan(store.db, "The zebra sat; the cat", counts, budget=4) == ["zebra", "sat"]
    # zebra is kept: terms over the budget can no longer join, so they were counted only that far
    assert counts["the"] == lexical.TermCount(5, exact=False) and counts["sat"] == lexical.TermCount(3, True)
    assert lexical.plan(store.db, "the cat", counts, budget=4) == []  # only stopwords: nothing to search
    # every term over the budget: counted up to max(5% of 200, 4) + 1, not through the posting list
    assert counts["the"] == lexical.TermCount(11, exact=False)
    assert lexical.plan(store.db, "the cat sat", counts, budget=4) == ["sat"]
    assert store.lexical_search("the zebra", 5)[0][0] == 8  # a small index keeps "the", ranked below zebra
