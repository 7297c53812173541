import gzip
import json
import logging

import pytest

from distilembed.errors import UserError
from index.corpus import CorpusSpec, CorpusStats
from index.splits import iter_documents


def test_txt_lines_get_stable_ids_and_bad_bytes_are_skipped(tmp_path, caplog) -> None:
    path = tmp_path / "c.txt"
    path.write_bytes(b"first text\n\nsecond \xe2\x80 broken\nthird text\n")
    stats = CorpusStats()
    with caplog.at_level(logging.WARNING):
        docs = list(iter_documents(CorpusSpec(path), stats))
    assert [(d.id, d.text) for d in docs] == [("line-1", "first text"), ("line-4", "third text")]
    assert stats.rows == 2 and stats.skipped == 1 and stats.skipped_lines == [3]
    assert f"{path}:3: skipped: invalid UTF-8" in caplog.text


def test_jsonl_with_metadata_columns(tmp_path) -> None:
    path = tmp_path / "c.jsonl.gz"
    rows = [
        {"doc": "a", "body": "alpha", "lang": "en", "x": 1},
        {"doc": "b", "body": "beta", "lang": "de"},
        "oops",
    ]
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    stats = CorpusStats()
    spec = CorpusSpec(path, id_column="doc", text_column="body", metadata_columns=("lang",))
    docs = list(iter_documents(spec, stats))
    assert [(d.id, d.text, d.metadata) for d in docs] == [
        ("a", "alpha", {"lang": "en"}),
        ("b", "beta", {"lang": "de"}),
    ]
    assert stats.skipped == 2 and stats.skipped_lines == [3, 4]


def test_jsonl_nan_metadata_is_null_and_lone_surrogates_are_skipped(tmp_path) -> None:
    """What Python's JSON parser lets through but strict JSON has not: NaN / Infinity metadata (a
    missing value) become null; a row whose id, text or metadata holds a lone surrogate is skipped,
    as invalid UTF-8 bytes are (the tokenizer and SQLite refuse it)."""
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"id": "a", "text": "alpha", "lang": NaN, "tags": [1, Infinity]}\n'
        '{"id": "b", "text": "beta \\ud800", "lang": "de"}\n'
        '{"id": "c", "text": "gamma", "lang": {"\\udfff": 1}}\n'
        '{"id": "d", "text": "delta", "lang": "en"}\n'
    )
    stats = CorpusStats()
    spec = CorpusSpec(path, metadata_columns=("lang", "tags"))
    docs = list(iter_documents(spec, stats))
    kept = [(d.id, d.metadata) for d in docs]
    assert kept == [("a", {"lang": None, "tags": [1, None]}), ("d", {"lang": "en"})]
    assert (stats.rows, stats.skipped, stats.skipped_lines) == (2, 2, [2, 3])


def test_tsv_and_csv(tmp_path) -> None:
    tsv = tmp_path / "c.tsv"
    tsv.write_text("id\ttext\tsource\n1\thello world\tweb\n2\tonly two\n3\t\tweb\n")
    stats = CorpusStats()
    docs = list(iter_documents(CorpusSpec(tsv, metadata_columns=("source",)), stats))
    assert [(d.id, d.metadata) for d in docs] == [("1", {"source": "web"})]
    assert stats.skipped == 2  # wrong field count, empty text
    csv_path = tmp_path / "c.csv"
    csv_path.write_text('id,text\nq1,"a, quoted ""text"""\n')
    assert [d.text for d in iter_documents(CorpusSpec(csv_path))] == ['a, quoted "text"']


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.txt", None, "corpus not found"),
        ("c.parquet", b"PAR1", "not a readable Parquet file"),
        ("c.xml", b"<a/>", "unknown corpus format"),
        ("c.tsv", b"key\tbody\n1\thi\n", "no column 'id', 'text'"),
        ("c.jsonl", b'{"id": "1", "body": "x"}\n', "no column 'text'"),
    ],
)
def test_bad_corpus_errors(tmp_path, name, content, message) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        list(iter_documents(CorpusSpec(path)))
