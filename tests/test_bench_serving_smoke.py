"""The serving-side benchmarks run for real at tiny sizes (models/default, a few hundred documents,
phases of a second): bench/serve.py (standard and --load), soak.py, filters.py, index_build.py (both
measurements) and the part of scale.py that needs no Ray cluster (plain ``serve`` of ``all --parts
serve``). Each writes only under tmp_path, and its JSON renders into a block of a copy of the results
doc. ``--render-from`` of every JSON named in docs/results.md gives back its block."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bench_hostile import ROOT, repo_outputs
from tests.tiny_models import tiny_sentences

sys.path.insert(0, str(ROOT / "bench"))

import filters
import hostile
import index_build
import scale
import serve
import soak

BUNDLE = str(ROOT / "models" / "default")
DOC = ROOT / "docs" / "results.md"
BLOCK = re.compile(r"<!-- results:([a-z0-9._-]+):start -->\n(.*?)\n<!-- results:\1:end -->", re.S)


def block(doc: Path, name: str) -> str:
    return dict(BLOCK.findall(doc.read_text()))[name]


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    """A copy of docs/results.md for runs to rewrite."""
    return Path(shutil.copy(DOC, tmp_path / "results.md"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "wiki.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write("\n".join(tiny_sentences(400)) + "\n")
    return path


@pytest.fixture(scope="module")
def index(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("index") / "index"
    cmd = [sys.executable, "-m", "distilembed.cli", "index", "build", "--bundle", BUNDLE]
    subprocess.run(
        [*cmd, "--corpus", str(corpus), "--out", str(out)], check=True, capture_output=True, timeout=120
    )
    return out


@pytest.fixture(scope="module")
def sts(tiny_data: Path) -> str:
    return str(tiny_data / "sts" / "stsbenchmark" / "sts-test.csv")


def test_serve_measures_every_phase_and_renders_its_block(tmp_path, doc, index, sts) -> None:
    before, out = repo_outputs(), tmp_path / "serve.json"
    sizes = ["--requests", "20", "--duration", "1", "--concurrency", "1,32", "--sts-file", sts]
    serve.main(["--bundle", BUNDLE, "--index", str(index), *sizes, "--no-doc", "--json", str(out)])
    result = json.loads(out.read_text())
    phases = ["embed_1_sentence_c1", "embed_1_sentence_c32", "embed_16_sentences_c32", "search_c8"]
    assert all(result[p]["ok"] > 0 and set(result[p]["statuses"]) == {"200"} for p in phases)
    assert result["in_process_sent_per_s"] > 0 and result["run"]["command"].startswith("python bench/serve.")
    assert result["in_process_core_ms"] > 0  # the server's CPU a request, and its event loop's share
    # /proc counts CPU in 10 ms ticks: a 20-request phase may round to 0, all four together do not
    assert all(0 <= result[p]["loop_core_ms"] <= result[p]["server_core_ms"] for p in phases)
    assert sum(result[p]["server_core_ms"] for p in phases) > 0
    paired = result["search_vs_embed_c8"]  # /search and embed back to back, order alternating
    assert len(paired["ratios"]) == 3 and paired["median"] == sorted(paired["ratios"])[1] > 0
    assert len(result["search32_vs_search_c1"]["ratios"]) == 3
    against_encoder = result["c32_vs_in_process"]  # concurrency 32 and the in-process encoder, paired
    assert len(against_encoder["ratios"]) == 3 and against_encoder["median"] > 0
    serve.main(["--render-from", str(out), "--doc", str(doc)])
    rendered = block(doc, "serve")
    assert "| 1 sentence, concurrency 32 |" in rendered and "| /search, concurrency 8 |" in rendered
    assert "CPU ms (loop)" in rendered
    assert repo_outputs() == before


def test_serve_load_restarts_after_kill9_and_finds_every_document(tmp_path, doc, index, sts) -> None:
    out = tmp_path / "load.json"
    sizes = ["--duration", "2", "--load-warmup", "0.5", "--sts-file", sts]
    serve.main(["--bundle", BUNDLE, "--index", str(index), "--load", *sizes, "--no-doc", "--json", str(out)])
    result = json.loads(out.read_text())
    restart = result["restart_after_kill9"]
    load = result["load_c32"]
    assert load["5xx"] == 0 and {"embed", "search", "upsert"} <= set(load["by_kind"])
    assert restart["documents_before"] > 0 and restart["found_again"] == restart["documents_before"]
    serve.main(["--render-from", str(out), "--doc", str(doc)])
    assert "| documents held before `kill -9` / found again after restart |" in block(doc, "serve-load")


def test_the_peer_model_maker_imports_nothing_but_the_standard_library() -> None:
    probe = (
        "import runpy, sys; sys.argv = ['serve.py', 'make-infinity-model', '--help']\n"
        "try: runpy.run_path('bench/serve.py', run_name='__main__')\n"
        "except SystemExit: print(sorted({'httpx', 'numpy', 'harness'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "--out" in done.stdout and done.stdout.strip().endswith("[]")


def test_soak_checks_every_write_after_kill9_and_plots_its_samples(tmp_path, sts, capsys) -> None:
    out = tmp_path / "soak.json"
    sizes = ["--minutes", "0.06", "--concurrency", "4", "--sample", "0.5", "--warmup", "0", "--docs", "40"]
    soak.main(["--bundle", BUNDLE, *sizes, "--ids-per-client", "3", "--sts-file", sts, "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["samples"]) >= 2 and result["samples"][-1]["documents"] >= 40
    check = result["after_kill9_restart"]
    assert check["upserts_checked"] > 0 and check["lost_or_stale"] == 0
    assert result["criteria"]["acknowledged writes lost after kill -9"]["met"]
    out.with_suffix(".png").unlink()
    soak.main(["--render-from", str(out)])
    assert out.with_suffix(".png").is_file() and "| 5xx responses | 0 | 0 |" in capsys.readouterr().out


def test_filters_saves_its_figures_and_renders_them(tmp_path, doc, capsys) -> None:
    out = tmp_path / "filters.json"
    sizes = ["--docs", "3000", "--nlist", "16", "--queries", "4", "--rounds", "1"]
    filters.main([*sizes, "--dir", str(tmp_path / "ix"), "--no-doc", "--json", str(out)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "x**" in line]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == list(filters.CANDIDATES)
    assert all(row.rstrip(" |").endswith("10.0") and row.count("x**") == 3 for row in rows)
    result = json.loads(out.read_text())
    assert result["meta"]["docs"] == 3000 and set(result["http"]) == {"vector", "text"}
    filters.main(["--render-from", str(out), "--doc", str(doc)])
    assert "3,000 random 128-d vectors, IVF 16 lists" in block(doc, "filters")


def test_index_build_and_ondisk_rss(tmp_path, doc, corpus, index) -> None:
    before, out = repo_outputs(), tmp_path / "index_build.json"
    index_build.main(["--source", str(corpus), "--n", "200", "--out", str(out), "--no-doc"])
    result = json.loads(out.read_text())
    assert result["n"] == result["index"]["ntotal"] == 200 and result["build_over_encoder"] > 0
    index_build.main(["--render-from", str(out), "--doc", str(doc)])
    assert "First 200 Wikipedia sentences" in block(doc, "index-build")
    out = tmp_path / "ondisk.json"
    dirs = ["--in-ram", str(index), "--on-disk", str(index), "--source", str(corpus), "--searches", "3", "6"]
    index_build.main(["ondisk-rss", *dirs, "--out", str(out), "--no-doc"])
    result = json.loads(out.read_text())
    assert [s["searches"] for s in result["on disk"]["samples"]] == [0, 3, 6]
    assert all(s["VmRSS"] >= s["RssAnon"] > 0 for s in result["in RAM"]["samples"])
    index_build.main(["ondisk-rss", "--render-from", str(out), "--doc", str(doc)])
    assert "| in RAM | 400 |" in block(doc, "ondisk-rss")
    assert repo_outputs() == before


def test_scale_serve_part_alone_measures_plain_serve_and_rewrites_no_block(tmp_path, sts, capsys) -> None:
    before, out = repo_outputs(), tmp_path / "scale_serve.json"
    sizes = ["--rounds", "1", "--requests", "20", "--duration", "1", "--serve-docs", "20"]
    options = ["--parts", "serve", "--setups", "plain", "--sts-file", sts, "--work", str(tmp_path / "work")]
    scale.main(["all", *sizes, *options, "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result) == {"meta", "serve", "run"} and len(result["serve"]["rounds"]) == 1
    plain = result["serve"]["summary"]["plain"]
    assert plain["c1_p50_vs_plain"] == 1.0 and plain["non_2xx"] == 0 and plain["c8_rps"] > 0
    assert "| serve | plain | c1 p50 ms / c8 req/s |" in capsys.readouterr().out
    assert repo_outputs() == before and not (tmp_path / "work").exists()


SCRIPTS = {  # block: the main that renders it
    "serve": serve.main,
    "serve-load": serve.main,
    "hostile": hostile.main,
    "index-build": index_build.main,
    "scale-build": lambda argv: scale.main(["ray-build", *argv]),
    "scale-build-faults": lambda argv: scale.main(["ray-build", *argv]),
    "scale": lambda argv: scale.main(["all", *argv]),
    "ondisk-rss": lambda argv: index_build.main(["ondisk-rss", *argv]),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_render_from_gives_back_the_block_in_the_results_doc(name, doc) -> None:
    """The caption names the JSON; a JSON without a run record takes the caption's command and date."""
    caption = re.match(r"Measured by `(.*?)` on (.*), (\d{4}-\d\d-\d\d); JSON `(.*?)`\.", block(DOC, name))
    assert caption, f"block {name} has no caption"
    command, machine, date, source = caption.groups()
    argv = ["--render-from", str(ROOT / source), "--doc", str(doc)]
    if "run" not in json.loads((ROOT / source).read_text()):
        argv += ["--run-command", command, "--run-machine", machine, "--run-date", date]
    SCRIPTS[name](argv)
    assert block(doc, name) == block(DOC, name)
