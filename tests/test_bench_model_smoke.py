"""Each model-side bench script run for real on tiny inputs: the tiny exported student, the tiny
sentence-transformers teacher, a data root of a few hundred Quora-style pairs, "Wikipedia" sentences
and SNLI pairs. Every run writes under tmp_path with --no-doc (methods.py: a doc in tmp_path); each
test reads back the JSON and the table it wrote."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import compression
import encode
import hybrid
import methods
import quality
import retrieval

from distilembed.artifacts import sha256_file
from export.bundle import quantize_graph
from export.runtime import MODEL_FILES
from tests.tiny_models import tiny_sentences
from training.config import METHODS

LABELS = ("entailment", "neutral", "contradiction")


@pytest.fixture(scope="module")
def bench_data(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_data's STS-B and corpus, 2 x 150 Quora pairs (every other one a duplicate: 600 distinct
    questions, enough to train pq codes), 400 distractor sentences and 2 x 60 SNLI pairs."""
    root = tmp_path_factory.mktemp("bench-data")
    shutil.copytree(tiny_data / "sts", root / "sts")
    shutil.copy(tiny_data / "corpus.txt", root / "corpus.txt")
    (root / "quora").mkdir()
    for seed, name in enumerate(("quora_pairs_dev.tsv", "quora_pairs_test.tsv")):
        pairs = zip(tiny_sentences(150, 40 + seed), tiny_sentences(150, 50 + seed), strict=True)
        lines = [f"{i % 2}\t{a[:-2]}?\t{b[:-2]}?\t{i}\n" for i, (a, b) in enumerate(pairs)]
        (root / "quora" / name).write_text("".join(lines))
    anchors, positives, negatives = (tiny_sentences(40, seed) for seed in (21, 22, 23))
    (root / "nli").mkdir()
    rows = [f"{a},{p},{n}" for a, p, n in zip(anchors, positives, negatives, strict=True)]
    (root / "nli" / "triplets.csv").write_text("\n".join(["sent0,sent1,hard_neg", *rows]) + "\n")
    (root / "unlabeled").mkdir()
    with gzip.open(root / "unlabeled" / "enwiki2015_1m_sentences.txt.gz", "wt") as handle:
        handle.write("\n".join(tiny_sentences(400, 60)) + "\n")
    snli = root / "nli" / "snli_senteval"
    snli.mkdir()
    for split in ("dev", "test"):
        (snli / f"s1.{split}").write_text("\n".join(tiny_sentences(60, 70)) + "\n")
        (snli / f"s2.{split}").write_text("\n".join(tiny_sentences(60, 71)) + "\n")
        (snli / f"labels.{split}").write_text("\n".join(LABELS[i % 3] for i in range(60)) + "\n")
    return root


def test_encode_speed_and_batch_invariance(
    bench_data: Path, tiny_bundle: Path, tiny_teacher: Path, tmp_path: Path
) -> None:
    common = ["--data-dir", str(bench_data), "--no-doc"]
    speed = ["speed", "--skip-teacher", "--minilm", str(tiny_teacher), "--minilm-bundle", str(tiny_bundle)]
    speed += ["--student-bundle", str(tiny_bundle), "--limit", "20", "--latency-n", "3", "--repeats", "1"]
    encode.main([*speed, "--out", str(tmp_path / "encode.json"), *common])
    result = json.loads((tmp_path / "encode.json").read_text())
    assert [r["setup"] for r in result["rows"]][1:] == [
        f"{tiny_teacher} int8 bundle",
        "student ONNX fp32",
        "student ONNX int8",
    ]
    assert result["meta"]["sentences"] == 20 and all(r["sent_per_s"] > 0 for r in result["rows"])
    assert result["rows"][0]["ratio"] == 1.0 and result["run"]["command"].startswith(
        "python bench/encode.py speed"
    )
    dynamic = dynamic_twin(tiny_bundle, tmp_path / "dynamic")
    invariance = ["batch-invariance", "--bundle", f"static={tiny_bundle}", "--bundle", f"dynamic={dynamic}"]
    invariance += ["--sentences", "16", "--rounds", "1", "--out", str(tmp_path / "batch.json")]
    encode.main([*invariance, *common])
    rows = {r["name"]: r for r in json.loads((tmp_path / "batch.json").read_text())["rows"]}
    assert list(rows) == ["static", "dynamic"] and rows["static"]["speed_ratio"] == 1.0
    assert rows["static"]["identical"] == 1.0 and rows["static"]["cos_min"] == pytest.approx(1.0, abs=1e-6)
    assert rows["dynamic"]["identical"] < 1.0  # per-batch scales: some vectors move with their batch


def dynamic_twin(bundle: Path, out: Path) -> Path:
    """A copy of ``bundle`` whose int8 graph keeps onnxruntime's per-batch activation scales."""
    shutil.copytree(bundle, out)
    quantize_graph(bundle / MODEL_FILES["fp32"], out / MODEL_FILES["int8"])
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"][MODEL_FILES["int8"]] = sha256_file(out / MODEL_FILES["int8"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def quora_args(bench_data: Path, tiny_teacher: Path) -> list[str]:
    """A 700-document corpus (600 questions, 100 distractors) with IVF of 8 lists."""
    args = ["--data-dir", str(bench_data), "--teacher", str(tiny_teacher), "--distractors", "100"]
    return [*args, "--nlist", "8", "--threads", "1"]


def test_retrieval_sr_and_seeds(
    bench_data: Path, tiny_bundle: Path, tiny_teacher: Path, tmp_path: Path
) -> None:
    sr = ["sr", "--bundle", str(tiny_bundle), "--nprobes", "5,8", "--sq8", "--repeats", "2"]
    retrieval.main(
        [*sr, *quora_args(bench_data, tiny_teacher), "--out", str(tmp_path / "sr.json"), "--no-doc"]
    )
    result = json.loads((tmp_path / "sr.json").read_text())
    assert (result["corpus"], result["queries"], result["distractors"]["added"]) == (700, 150, 100)
    assert [(r["model"], r["index"], r["nprobe"]) for r in result["rows"]][:4] == [
        ("teacher", "exact", None), ("teacher", "IVF8", 5), ("teacher", "IVF8", 8), ("teacher", "IVF8,SQ8", 5)
    ]  # fmt: skip
    assert all(r["vs_exact"] == 100.0 for r in result["rows"] if r["index"] == "exact")
    assert result["acceptance"]["memory_ratio_teacher_ivf_over_student_ivf"] > 1  # 48-d against 8-d
    table = retrieval.render(result)
    assert "| index | nprobe | teacher 48-d MRR@10 |" in table and "700 documents (100 Wikipedia" in table
    assert retrieval.block_name(result) == "quora-sr-d100"
    seeds = ["seeds", "--bundle", f"a={tiny_bundle}", "--bundle", f"b={tiny_bundle}", "--seeds", "2"]
    retrieval.main([*seeds, *quora_args(bench_data, tiny_teacher), "--out", str(tmp_path / "seeds.json")])
    result = json.loads((tmp_path / "seeds.json").read_text())
    assert result["seeds"] == [0, 1] and list(result["rows"]) == ["a", "b"]
    assert result["rows"]["b"]["diff_mean"] == 0.0 and len(result["rows"]["a"]["ivf"]) == 2  # the same bundle


def test_compression_table(bench_data: Path, tiny_bundle: Path, tiny_teacher: Path, tmp_path: Path) -> None:
    out = tmp_path / "compression.json"
    args = [
        "--bundle",
        f"tiny={tiny_bundle}",
        "--widths",
        "8",
        "--repeats",
        "1",
        "--out",
        str(out),
        "--no-doc",
    ]
    compression.main([*quora_args(bench_data, tiny_teacher), *args])
    result = json.loads(out.read_text())
    storages = ["exact", "float32", "float32", "sq8", "pq", "pq+rescore", "binary", "binary+rescore"]
    assert [r["storage"] for r in result["rows"] if r["corpus"] == 600] == storages
    assert {r["corpus"] for r in result["rows"]} == {600, 700}  # the questions, then with distractors
    assert result["args"]["bundles"] == f"tiny={tiny_bundle}"
    rescored = {f"tiny 8 {s} ({n} docs)" for n in (600, 700) for s in ("pq+rescore", "binary+rescore")}
    assert set(result["acceptance"]) == rescored
    table = compression.render(result)
    assert "| tiny | 8 | binary+rescore | 9 |" in table and "| tiny 8 pq+rescore | 700 |" in table


def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """methods.py's ``distilembed`` commands through the same entry point in this process: a new
    interpreter per command would spend most of the test importing torch."""
    from distilembed import cli

    def run(cmd: list[str], log: Path, args: object) -> tuple[int, float]:
        assert tuple(cmd[:3]) == methods.CLI
        monkeypatch.setattr(sys, "argv", ["distilembed", *cmd[3:]])
        try:
            cli.main()
        except SystemExit as exit_:
            return int(exit_.code or 0), 0.0
        return 0, 0.0

    monkeypatch.setattr(methods, "run_logged", run)


def test_methods_trains_exports_and_compares_every_method(
    bench_data: Path,
    tiny_bert: Path,
    tiny_teacher: Path,
    tiny_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """All six methods and a variant, two steps each (two-stage methods: two more on the triplets),
    then exported and timed against a reference bundle (the tiny one standing in for MiniLM)."""
    in_process(monkeypatch)
    monkeypatch.setenv("DISTILEMBED_DATA_DIR", str(bench_data))
    doc = tmp_path / "methods.md"
    doc.write_text("# Methods\n\n<!-- methods-results:start -->\nold\n<!-- methods-results:end -->\ntail\n")
    budget = ["--teacher", str(tiny_teacher), "--student", str(tiny_bert), "--corpus", "corpus.txt"]
    budget += ["--n-sentences", "64", "--max-steps", "2", "--batch-size", "16", "--eval-every", "2"]
    budget += ["--max-seq-len", "16", "--device", "cpu", "--speed-repeats", "1"]
    small = (
        "--dim 8 --pca-sample 64 --queue-size 40 --token-dim 8 --layers 1 --finetune-data nli/triplets.csv"
    )
    budget += [
        "--train-arg",
        f"{small} --finetune-batch-size 8 --finetune-max-steps 2 --finetune-eval-every 2",
    ]
    budget += ["--export-arg", "--int8-mean-cosine 0 --int8-max-sts-drop 100"]
    rows = ["--variant", "hpd-lr=hpd --lr 1e-3", "--reference-bundle", str(tiny_bundle)]
    paths = ["--data-dir", str(bench_data), "--runs-dir", str(tmp_path / "runs"), "--doc", str(doc)]
    assert methods.main([*budget, *rows, *paths, "--out", str(tmp_path / "methods.json")]) == 0
    report = json.loads((tmp_path / "methods.json").read_text())
    assert [r["method"] for r in report["rows"]] == [*METHODS, "hpd-lr"]
    assert all(r["export"] == "ok" and r["dim"] == 8 and r["int8_sent_per_s"] > 0 for r in report["rows"])
    hpd, variant = report["rows"][0], report["rows"][-1]
    assert variant["stsb_test_vs_hpd"] == pytest.approx(variant["stsb_test"] - hpd["stsb_test"], abs=0.011)
    assert [len(r["stages"]) for r in report["rows"]] == [1, 2, 2, 2, 1, 1, 1]
    assert set(report["speed"]["sent_per_s"]) == {"all-MiniLM-L6-v2", *METHODS, "hpd-lr"}
    text = doc.read_text()
    assert "old" not in text and text.endswith("<!-- methods-results:end -->\ntail\n")
    assert "| method | STS-B test (PyTorch) | vs hpd |" in text and "| hpd-lr | " in text


def test_quality_dimensions_and_transfer(
    bench_data: Path, tiny_bundle: Path, tiny_teacher: Path, tmp_path: Path
) -> None:
    common = ["--data-dir", str(bench_data), "--no-doc"]
    quality.main(
        [
            "dimensions",
            "--bundle",
            str(tiny_bundle),
            "--dims",
            "8,4",
            "--out",
            str(tmp_path / "d.json"),
            *common,
        ]
    )
    result = json.loads((tmp_path / "d.json").read_text())
    assert list(result["spearman"]) == ["8", "4"] and result["pairs"] == 40
    assert quality.dimensions_block(result) == f"dimensions-{tiny_bundle.name}"
    transfer = [
        "transfer",
        "--bundle",
        f"a={tiny_bundle}",
        "--bundle",
        f"b={tiny_bundle}",
        "--teacher",
        str(tiny_teacher),
    ]
    quality.main(
        [*transfer, "--snli-trained", "b", "--bootstrap", "10", "--out", str(tmp_path / "t.json"), *common]
    )
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["sets"]["snli"] == 120 and result["sets"]["quora"] == 300
    a, b, teacher = result["rows"]
    assert (a["delta_ci95"], b["delta_ci95"], b["quora_delta_ci95"]) == (None, [0.0, 0.0], [0.0, 0.0])
    assert (
        teacher["kind"] == "teacher" and teacher["dim"] == 48 and b["snli_trained"] and not a["snli_trained"]
    )
    assert f"| b (`{tiny_bundle}`) | 8 |" in quality.render_transfer(result)
    assert "(trained on)" in quality.render_transfer(result).splitlines()[3]


def test_hybrid_quality_and_speed(bench_data: Path, tiny_bundle: Path, tmp_path: Path) -> None:
    args = ["--bundle", str(tiny_bundle), "--data-dir", str(bench_data), "--distractors", "100"]
    args += ["--large", "300", "--known", "10", "--held-back", "300", "--timed", "5", "--nlist", "4"]
    args += ["--served-rounds", "2", "--served-seconds", "1"]
    hybrid.main([*args, "--work", str(tmp_path / "work"), "--out", str(tmp_path / "h.json"), "--no-doc"])
    result = json.loads((tmp_path / "h.json").read_text())
    assert result["quality"][0]["set"] == "Quora"
    known = result["quality"][-1]
    assert known["queries"] >= 1 and known["lexical"]["recall10"] == 100.0  # its own rarest words
    assert all(0 <= row[m]["mrr10"] <= 100 for row in result["quality"] for m in hybrid.MODES)
    assert [s["documents"] for s in result["speed"]][1] > result["speed"][0]["documents"]
    assert all(s["lexical_bytes_per_doc"] > 0 and s["p50_ms"]["hybrid"] > 0 for s in result["speed"])
    served = result["speed"][1]["served"]  # the larger index through `distilembed serve`, over HTTP
    assert len(served["rounds"]) == 2 and served["p50_ms"]["hybrid"] > 0 and served["p50_ms"]["dense"] > 0
    assert "served" not in result["speed"][0] and "Through `distilembed serve`" in hybrid.render(result)
