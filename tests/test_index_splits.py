"""Corpus splits: every format, a directory or glob of files, seeking to a split gives the same
documents as streaming the file, and the split boundaries fall on the planned lines."""

import gzip
import json

import pytest

from distilembed.errors import UserError
from index.corpus import CorpusSpec, CorpusStats
from index.splits import iter_documents, iter_split_documents, plan_corpus, read_split, stage_decompressed


def _txt(tmp_path, name="c.txt"):
    lines = [b"first", b"", b"bad \xe2\x80 bytes", *[f"text {i}".encode() for i in range(20)], b"no newline"]
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines))  # no newline after the last line
    return path


def _all_docs(spec, plan, **kwargs):
    return [
        (d.id, d.text, d.metadata) for _, docs in iter_split_documents(spec, plan, **kwargs) for d in docs
    ]


@pytest.mark.parametrize("lines_per_split", [1, 3, 7, 100])
def test_seeking_to_each_split_equals_streaming(tmp_path, lines_per_split) -> None:
    tsv = tmp_path / "c.tsv"
    tsv.write_text("id\ttext\tg\n" + "".join(f"d{i}\ttext {i}\t{i % 2}\n" for i in range(17)) + "x\n")
    for spec in [CorpusSpec(_txt(tmp_path)), CorpusSpec(tsv, metadata_columns=("g",))]:
        plan = plan_corpus(spec, lines_per_split)
        streamed = [
            [(d.id, d.text) for d in docs] for _, docs in iter_split_documents(spec, plan, CorpusStats())
        ]
        seeked = [[(d.id, d.text) for d in read_split(spec, plan, s, CorpusStats())] for s in plan.splits]
        assert streamed == seeked
        info = plan.files[0]
        assert [s.first_line for s in plan.splits] == list(range(info.first, info.lines + 1, lines_per_split))
        assert sum(s.lines for s in plan.splits) == info.lines - info.first + 1


def test_txt_line_numbers_and_skips_survive_splitting(tmp_path) -> None:
    path = _txt(tmp_path)
    stats = CorpusStats()
    docs = _all_docs(CorpusSpec(path), plan_corpus(CorpusSpec(path), 4), stats=stats)
    assert docs[0] == ("line-1", "first", {}) and docs[1][0] == "line-4"
    assert docs[-1] == ("line-24", "no newline", {}) and len(docs) == 22
    assert stats.skipped == 1 and stats.skipped_lines == [3]


def test_gzip_streams_and_stages_to_the_same_splits(tmp_path) -> None:
    plain = _txt(tmp_path)
    packed = tmp_path / "z.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    spec = CorpusSpec(packed)
    plan = plan_corpus(spec, 5)
    assert _all_docs(spec, plan) == _all_docs(CorpusSpec(plain), plan_corpus(CorpusSpec(plain), 5))
    staged = stage_decompressed(plan, tmp_path / "staged")
    assert staged[0].read_bytes() == plain.read_bytes()
    seeked = [
        (d.id, d.text, d.metadata)
        for s in plan.splits
        for d in read_split(spec, plan, s, CorpusStats(), staged[0])
    ]
    unstaged = [
        (d.id, d.text, d.metadata) for s in plan.splits for d in read_split(spec, plan, s, CorpusStats())
    ]
    assert seeked == unstaged == _all_docs(spec, plan)


def test_parquet_row_ranges_across_row_groups(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ids = [f"p{i}" for i in range(25)]
    texts = [f"text {i}" if i != 7 else None for i in range(25)]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts, "lang": ["en"] * 25}), path, row_group_size=6)
    spec = CorpusSpec(path, metadata_columns=("lang",))
    stats = CorpusStats()
    plan = plan_corpus(spec, 4)
    docs = _all_docs(spec, plan, stats=stats)
    assert [d[0] for d in docs] == [i for i in ids if i != "p7"]
    assert docs[0] == ("p0", "text 0", {"lang": "en"}) and stats.skipped_lines == [8]
    assert [len(read_split(spec, plan, s, CorpusStats())) for s in plan.splits] == [4, 3, 4, 4, 4, 4, 1]


def test_directory_and_glob_read_every_file_in_name_order(tmp_path) -> None:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("bee\n")
    (folder / "a.jsonl").write_text(json.dumps({"id": "j1", "text": "jay"}) + "\n")
    (folder / "sub" / "c.txt").write_text("sea\nsee\n")
    (folder / "notes.md").write_text("ignored\n")
    docs = [(d.id, d.text) for d in iter_documents(CorpusSpec(folder))]
    assert docs == [
        ("j1", "jay"),
        ("b.txt:line-1", "bee"),
        ("sub/c.txt:line-1", "sea"),
        ("sub/c.txt:line-2", "see"),
    ]
    globbed = [d.id for d in iter_documents(CorpusSpec(folder / "**" / "*.txt"))]
    assert globbed == ["b.txt:line-1", "sub/c.txt:line-1", "sub/c.txt:line-2"]
    with pytest.raises(UserError, match="no corpus files"):
        plan_corpus(CorpusSpec(tmp_path / "nothing-*.txt"))


def test_plan_identity_changes_with_content(tmp_path) -> None:
    path = _txt(tmp_path)
    before = plan_corpus(CorpusSpec(path)).identity()
    path.write_bytes(path.read_bytes() + b"\nmore")
    after = plan_corpus(CorpusSpec(path)).identity()
    assert before["files"][0]["sha256"] != after["files"][0]["sha256"]
