"""The examples in examples/ against a real service on models/default (the OpenAI SDK, requests) and
in-process (a folder of text files indexed and searched)."""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service_client import free_port, serve_process

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "models" / "default"
sys.path.insert(0, str(ROOT / "examples"))

pytestmark = pytest.mark.skipif(not (BUNDLE / "manifest.json").is_file(), reason="models/default not present")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``distilembed serve`` on models/default with an empty index, on a free port."""
    port = free_port()
    index_dir = tmp_path_factory.mktemp("live") / "idx"
    args = ["--bundle", str(BUNDLE), "--index", str(index_dir), "--create-index"]
    with serve_process([*args, "--threads", "1", "--log-level", "warning"], port):
        yield f"http://127.0.0.1:{port}"


def test_openai_sdk_gets_128_d_embeddings(service: str) -> None:
    from openai_embeddings import embed

    texts = ["A man is playing a guitar.", "Someone plays an instrument.", "The weather is cold."]
    vectors = embed(texts, f"{service}/v1")
    assert [len(v) for v in vectors] == [128, 128, 128]
    assert all(math.isclose(sum(x * x for x in v), 1.0, abs_tol=1e-4) for v in vectors)
    cosine = [sum(a * b for a, b in zip(vectors[0], v, strict=True)) for v in vectors[1:]]
    assert cosine[0] > cosine[1]  # the guitar is closer to the instrument than to the weather
    assert [len(v) for v in embed(texts[:1], f"{service}/v1", dimensions=64)] == [64]


def test_requests_client_adds_searches_gets_and_deletes(service: str) -> None:
    from search_documents import DOCS, Client

    client = Client(service)
    assert client.upsert(DOCS)["added"] == len(DOCS)
    hits = client.search("a kitten naps on the couch", where={"topic": "pets"})
    assert [h["id"] for h in hits] == ["cat", "dog"]
    assert client.get("rain")["metadata"] == {"topic": "weather"}
    assert client.delete("rain")["deleted"] == "rain"
    with pytest.raises(RuntimeError, match="GET /documents/rain: 404"):
        client.get("rain")


def test_index_folder_finds_the_paragraph(tmp_path: Path) -> None:
    from index_folder import index_folder, search

    folder = tmp_path / "notes"
    (folder / "pets").mkdir(parents=True)
    (folder / "pets" / "cats.txt").write_text("A cat sleeps all afternoon.\n\nCats purr when content.\n")
    (folder / "money.txt").write_text("Interest rates rose again.\n\n\n\nThe bank raised its fees.\n")
    assert index_folder(folder, tmp_path / "idx", BUNDLE) == 4
    hits = search(tmp_path / "idx", "my kitten naps during the day", k=2)
    assert hits[0].id == "pets/cats.txt#0" and hits[0].metadata == {"file": "pets/cats.txt"}


def test_index_folder_runs_as_its_docstring_shows(tmp_path: Path) -> None:
    """The command in index_folder.py's docstring, as written, from a directory holding this checkout's
    docs/, examples/ and models/ (its runs/ lands there); a second run searches without rebuilding."""
    import index_folder

    usage = index_folder.__doc__.split("\n\n")[1].replace("\\\n", " ")
    argv = shlex.split(usage)
    assert argv[:2] == ["python", "examples/index_folder.py"]
    for name in ("docs", "examples", "models"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = os.environ | {"PYTHONPATH": str(ROOT)}

    def run() -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, *argv[1:]]
        done = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    first = run()
    assert re.match(r"indexed [1-9]\d* paragraphs\n", first.stdout)
    hits = re.findall(r"^\d\.\d{3}  \S+\.md#\d+  ", first.stdout, flags=re.MULTILINE)
    assert len(hits) == 5 and "shard" in first.stdout.lower()
    assert (tmp_path / "runs" / "docs-index" / "manifest.json").is_file()
    assert run().stdout == first.stdout.split("\n", 1)[1]  # the same hits, nothing indexed
