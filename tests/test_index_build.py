"""index build on a tiny bundle: end to end, resume after a crash, duplicates, bad input."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from distilembed.errors import UserError
from export.runtime import Encoder
from index.build import BuildConfig, build
from index.corpus import CorpusSpec
from index.live import LiveIndex as IndexReader
from tests.tiny_models import tiny_sentences


class KilledError(Exception):
    pass


def _corpus(tmp_path, n=300):
    path = tmp_path / "corpus.tsv"
    rows = [f"doc{i}\t{text}\t{i % 3}" for i, text in enumerate(tiny_sentences(n, seed=21))]
    path.write_text("id\ttext\tgroup\n" + "\n".join(rows) + "\n")
    return CorpusSpec(path, metadata_columns=("group",))


def test_build_then_search_finds_each_document(tiny_bundle, tmp_path) -> None:
    spec = _corpus(tmp_path)
    manifest = build(BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx"), shard_size=64), spec)
    assert manifest["ntotal"] == 300 and manifest["index_type"] == "flat" and manifest["dim"] == 8
    reader = IndexReader(tmp_path / "idx")
    encoder = Encoder(tiny_bundle)
    texts = [line.split("\t")[1] for line in spec.path.read_text().splitlines()[1:6]]
    hits = reader.search(encoder.encode(texts), k=3)
    for i, row in enumerate(hits):
        assert any(h.id == f"doc{i}" for h in row)  # identical texts may tie at score 1
        assert row[0].score == pytest.approx(1.0, abs=1e-5)  # static int8: the same vector as built
    assert reader.get("doc7").metadata == {"group": "1"}
    assert not (tmp_path / "idx.partial").exists()


def test_killed_build_resumes_without_reencoding(tiny_bundle, tmp_path, monkeypatch) -> None:
    spec = _corpus(tmp_path)
    calls = []
    real_encode = Encoder.encode

    def dying_encode(self, texts, batch_size=None):
        calls.append(len(texts))
        if len(calls) == 3:
            raise KilledError  # stands in for kill -9 after two shards
        return real_encode(self, texts, batch_size)

    monkeypatch.setattr(Encoder, "encode", dying_encode)
    cfg = BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx"), shard_size=64)
    with pytest.raises(KilledError):
        build(cfg, spec)
    assert not (tmp_path / "idx").exists()
    assert len(list((tmp_path / "idx.partial" / "shards").glob("*.npy"))) == 2
    calls.clear()
    monkeypatch.setattr(
        Encoder,
        "encode",
        lambda self, t, batch_size=None: (calls.append(len(t)), real_encode(self, t, batch_size))[1],
    )
    manifest = build(cfg, spec)
    assert calls == [64, 64, 44]  # only the three missing shards
    assert manifest["docs_encoded_this_run"] == 172
    uninterrupted = build(
        BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "ref"), shard_size=64), spec
    )
    assert manifest["ntotal"] == uninterrupted["ntotal"] == 300
    assert uninterrupted["docs_encoded_this_run"] == 300
    a, b = IndexReader(tmp_path / "idx"), IndexReader(tmp_path / "ref")
    ids_a = sorted(d.id for d in a.store.get_many(list(range(1, 301))).values())
    ids_b = sorted(d.id for d in b.store.get_many(list(range(1, 301))).values())
    assert ids_a == ids_b and len(set(ids_a)) == 300
    for int_id in (1, 150, 300):
        np.testing.assert_allclose(a.index.reconstruct(int_id), b.index.reconstruct(int_id), atol=1e-6)


def test_duplicates_last_wins(tiny_bundle, tmp_path) -> None:
    path = tmp_path / "dups.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"id": i, "text": t})
            for i, t in [("a", "a dog ."), ("b", "a cat ."), ("a", "the man plays guitar .")]
        )
        + "\n"
    )
    manifest = build(BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx")), CorpusSpec(path))
    assert manifest["ntotal"] == 2 and manifest["corpus"]["duplicates"] == 1
    assert IndexReader(tmp_path / "idx").get("a").text == "the man plays guitar ."


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "distilembed.cli", "index", *args],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
        timeout=120,
    )


@pytest.mark.parametrize(
    ("corpus", "content", "message"),
    [
        ("missing.txt", None, "corpus not found"),
        ("empty.txt", "\n\n", "no usable rows"),
        ("cols.tsv", "key\tbody\n1\thi\n", "no column 'id'"),
        ("bad.txt", b"\xff\xfe\n", "no usable rows"),
    ],
)
def test_build_cli_bad_input(tiny_bundle, tmp_path, corpus, content, message) -> None:
    path = tmp_path / corpus
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_bytes(content)
    result = _cli(
        "build", "--bundle", str(tiny_bundle), "--corpus", str(path), "--out", str(tmp_path / "idx")
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "idx").exists()


def test_sq8_build_and_unknown_storage(tiny_bundle, tmp_path) -> None:
    spec = _corpus(tmp_path)
    cfg = BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx"), nlist=4, flat_below=100)
    manifest = build(replace(cfg, storage="sq8"), spec)
    assert (manifest["index_type"], manifest["nlist"], manifest["ntotal"]) == ("ivf_sq8", 4, 300)
    args = ("build", "--bundle", str(tiny_bundle), "--corpus", str(spec.path), "--out", str(tmp_path / "x"))
    refused = _cli(*args, "--storage", "opq")
    assert refused.returncode == 2 and "--storage must be one of float32, sq8, pq, binary" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_overwrite_refused_while_a_writer_holds_the_index(tiny_bundle, tmp_path) -> None:
    """A service still writing to the old directory would later checkpoint into the new one."""
    spec = _corpus(tmp_path, n=50)
    cfg = BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx"))
    build(cfg, spec)
    writer = IndexReader(tmp_path / "idx")  # opened for writing, as the service does
    with pytest.raises(UserError, match="already open for writing"):
        build(cfg, spec, overwrite=True)
    assert writer.get("doc3") is not None and not (tmp_path / "idx.partial").exists()
    writer.close()
    assert build(cfg, spec, overwrite=True)["ntotal"] == 50


def test_search_cli_and_dim_mismatch(tiny_bundle, tmp_path) -> None:
    spec = _corpus(tmp_path, n=50)
    build(BuildConfig(bundle=str(tiny_bundle), out=str(tmp_path / "idx")), spec)
    ok = _cli("search", "--index", str(tmp_path / "idx"), "--query", "a man is playing", "-k", "3")
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.strip().splitlines()) == 3
    reader = IndexReader(tmp_path / "idx")
    with pytest.raises(UserError, match="8-d vectors"):
        reader.search(np.zeros((1, 5), dtype=np.float32))


def test_empty_index_takes_upserts(tiny_bundle, tmp_path) -> None:
    from index.build import create_empty
    from index.store import Document

    out = tmp_path / "empty"
    manifest = create_empty(BuildConfig(bundle=str(tiny_bundle), out=str(out)))
    assert (manifest["ntotal"], manifest["dim"], manifest["index_type"]) == (0, 8, "flat")
    live = IndexReader(out)
    assert live.ntotal == 0 and live.search(np.ones((1, 8), np.float32) / np.sqrt(8), k=3) == [[]]
    texts = tiny_sentences(3, 4)
    vectors = Encoder(tiny_bundle, threads=1).encode(texts)
    live.upsert([Document(f"d{i}", t, {}) for i, t in enumerate(texts)], vectors)
    assert [h.id for h in live.search(vectors[1:2], k=1)[0]] == ["d1"]
    live.close()
    assert IndexReader(out).ntotal == 3  # durable across a reopen
    with pytest.raises(UserError, match="output exists"):
        create_empty(BuildConfig(bundle=str(tiny_bundle), out=str(out)))
    with pytest.raises(UserError, match="not a bundle"):
        create_empty(BuildConfig(bundle=str(tmp_path), out=str(tmp_path / "other")))
