"""index build --engine ray on a local Ray cluster: the same index as the local build, a killed
encoder actor retried without loss or duplicates, a killed driver resumed, on-disk IVF lists."""

import gzip
import os
import signal
from dataclasses import replace

import numpy as np
import pytest

from distilembed.errors import UserError
from index import ray_build
from index.build import BuildConfig, build
from index.corpus import CorpusSpec
from index.live import LiveIndex
from index.vectors import held_vectors, on_disk
from tests.tiny_models import tiny_sentences

ray = pytest.importorskip("ray")
N_DOCS = 3000


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, object_store_memory=200 * 1024 * 1024, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two files, one gzip-compressed, with a blank line and a duplicate id across files."""
    folder = tmp_path_factory.mktemp("ray-corpus")
    texts = tiny_sentences(N_DOCS, seed=5)
    (folder / "a.tsv").write_text("id\ttext\n" + "".join(f"d{i}\t{t}\n" for i, t in enumerate(texts[:2000])))
    tail = "".join(f"d{i}\t{t}\n" for i, t in enumerate(texts[2000:], 2000))
    (folder / "b.tsv.gz").write_bytes(gzip.compress(f"id\ttext\n\nd5\tthe last d5 wins .\n{tail}".encode()))
    return CorpusSpec(folder)


def _config(bundle, out, **kwargs):
    return BuildConfig(
        bundle=str(bundle), out=str(out), nlist=8, flat_below=100, shard_size=256, batch_size=32, **kwargs
    )


def _contents(directory):
    live = LiveIndex(directory, writable=False)
    ids, vectors = held_vectors(live.index)
    order = np.argsort(ids)
    docs = live.store.get_many(ids.tolist())
    return ids[order], vectors[order], [docs[i].id for i in ids[order]], live


@pytest.fixture(scope="module")
def local_build(tiny_bundle, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "idx"
    return build(_config(tiny_bundle, out), corpus), out


def test_ray_build_equals_local_build(cluster, tiny_bundle, corpus, local_build, tmp_path) -> None:
    local_manifest, local_dir = local_build
    manifest = build(_config(tiny_bundle, tmp_path / "idx", engine="ray", actors=2), corpus)
    assert manifest["engine"] == "ray" and manifest["ntotal"] == local_manifest["ntotal"] == N_DOCS
    assert manifest["corpus"]["duplicates"] == 1 and manifest["index_type"] == "ivf"
    a_ids, a_vec, a_ext, a = _contents(local_dir)
    b_ids, b_vec, b_ext, b = _contents(tmp_path / "idx")
    assert np.array_equal(a_ids, b_ids) and a_ext == b_ext and np.array_equal(a_vec, b_vec)
    assert b.get("d5").text == "the last d5 wins ."
    queries = a_vec[::97]
    assert [[h.id for h in row] for row in a.search(queries, 10)] == [
        [h.id for h in row] for row in b.search(queries, 10)
    ]
    assert (local_dir / "vectors.faiss").read_bytes() == (tmp_path / "idx" / "vectors.faiss").read_bytes()


def _dying_encoder_factory(marker):
    real = ray_build._split_encoder

    def factory(*args):
        base = real(*args)

        class DiesOnce(base):
            def __call__(self, batch):
                try:  # the first call anywhere claims the marker, then kill -9s its own actor
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    return super().__call__(batch)
                os.kill(os.getpid(), signal.SIGKILL)
                return None

        return DiesOnce

    return factory


def test_killed_actor_is_retried_without_loss_or_duplicates(
    cluster, tiny_bundle, corpus, local_build, tmp_path, monkeypatch
) -> None:
    marker = tmp_path / "killed"
    monkeypatch.setattr(ray_build, "_split_encoder", _dying_encoder_factory(str(marker)))
    manifest = build(_config(tiny_bundle, tmp_path / "idx", engine="ray", actors=2), corpus)
    assert marker.exists()  # an actor really was killed
    assert manifest["ntotal"] == N_DOCS and manifest["docs_encoded_this_run"] == N_DOCS + 1
    a_ids, a_vec, a_ext, _ = _contents(local_build[1])
    b_ids, b_vec, b_ext, _ = _contents(tmp_path / "idx")
    assert np.array_equal(a_ids, b_ids) and a_ext == b_ext and np.array_equal(a_vec, b_vec)


class DriverKilledError(Exception):
    pass


def test_killed_driver_resumes_from_written_shards(
    cluster, tiny_bundle, corpus, local_build, tmp_path, monkeypatch
) -> None:
    real_save, saved = ray_build.save_shard, []

    def dying_save(work, split, vectors):
        if len(saved) == 3:
            raise DriverKilledError
        saved.append(len(vectors))
        real_save(work, split, vectors)

    monkeypatch.setattr(ray_build, "save_shard", dying_save)
    cfg = _config(tiny_bundle, tmp_path / "idx", engine="ray")
    with pytest.raises(DriverKilledError):
        build(cfg, corpus)
    assert len(list((tmp_path / "idx.partial" / "shards").glob("*.npy"))) == 3
    monkeypatch.setattr(ray_build, "save_shard", real_save)
    manifest = build(cfg, corpus)
    assert manifest["docs_encoded_this_run"] == N_DOCS + 1 - sum(saved)
    assert np.array_equal(_contents(tmp_path / "idx")[1], _contents(local_build[1])[1])


def test_on_disk_lists_serve_the_same_results(tiny_bundle, corpus, local_build, tmp_path) -> None:
    manifest = build(replace(_config(tiny_bundle, tmp_path / "built"), on_disk=True), corpus)
    assert manifest["on_disk"] and (tmp_path / "built" / "vectors.ivfdata").is_file()
    (tmp_path / "built").rename(tmp_path / "moved")  # the lists file is found beside the index
    a_ids, a_vec, _, a = _contents(local_build[1])
    b_ids, b_vec, _, b = _contents(tmp_path / "moved")
    assert on_disk(b.index) and not on_disk(a.index)
    assert np.array_equal(a_ids, b_ids) and np.array_equal(a_vec, b_vec)
    queries = a_vec[::50]
    assert [[h.id for h in r] for r in a.search(queries, 10)] == [
        [h.id for h in r] for r in b.search(queries, 10)
    ]
    with pytest.raises(UserError, match="needs an IVF index"):
        build(replace(_config(tiny_bundle, tmp_path / "flat"), on_disk=True, flat_below=10**6), corpus)


def test_without_ray_the_engine_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    with pytest.raises(UserError, match=r"pip install 'distilembed\[ray\]'"):
        ray_build.import_ray()


def test_on_disk_index_refuses_writes(tiny_bundle, corpus, tmp_path) -> None:
    from distilembed.errors import BusyError
    from index.store import Document

    build(replace(_config(tiny_bundle, tmp_path / "idx"), on_disk=True), corpus)
    before = (tmp_path / "idx" / "vectors.ivfdata").read_bytes()
    live = LiveIndex(tmp_path / "idx")
    with pytest.raises(BusyError, match="on disk"):
        live.upsert([Document("new", "a new text .")], np.ones((1, 8), np.float32))
    with pytest.raises(BusyError, match="on disk"):
        live.delete(["d1"])
    with pytest.raises(BusyError, match="on disk"):
        live.retrain(nlist=4)
    live.close()
    assert (tmp_path / "idx" / "vectors.ivfdata").read_bytes() == before
