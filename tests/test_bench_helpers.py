"""Pure parts of the bench scripts and their harness: Quora scoring and distractors, the methods
table's rows and comparisons, and the blocks of docs/results.md that the scripts rewrite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import encode
from harness import (
    BlockError,
    QuoraRetrieval,
    add_distractors,
    caption,
    drop_self,
    interleaved_seconds,
    markdown_table,
    replace_block,
    retrieval_scores,
    rewrite_block,
)
from methods import add_comparisons, merge_reports, parse_args, stage1_dev, train_command
from quality import dimensions_block
from retrieval import mrr10, verdict


def test_distractors_go_after_the_questions_without_repeats() -> None:
    data = QuoraRetrieval(["a?", "b?", "c?"], queries=[0], relevant=[2])
    grown, kept = add_distractors(data, ["x.", "b?", "y.", "x.", "z."])
    assert grown.corpus == ["a?", "b?", "c?", "x.", "y.", "z."]
    assert kept == [0, 2, 4]  # the question and the repeat are skipped
    assert (grown.queries, grown.relevant) == ([0], [2])


def test_comparisons_against_hpd_and_the_minilm_bundle() -> None:
    rows = [
        {"method": "hpd", "stsb_test": 80.0},
        {"method": "simtde", "stsb_test": 78.5},
        {"method": "congen"},  # failed: no scores, no bundle
    ]
    add_comparisons(rows, {"sent_per_s": {"all-MiniLM-L6-v2": 500.0, "hpd": 510.0, "simtde": 1000.0}})
    assert rows[0]["speedup_vs_minilm"] == pytest.approx(1.02)
    assert rows[1]["speedup_vs_minilm"] == pytest.approx(2.0)
    assert rows[1]["stsb_test_vs_hpd"] == pytest.approx(-1.5)
    assert rows[0]["stsb_test_vs_hpd"] == 0.0
    assert rows[2]["int8_sent_per_s"] is None and "stsb_test_vs_hpd" not in rows[2]


def test_variant_rows_train_their_method_with_extra_flags_last() -> None:
    args = parse_args(
        [
            "--methods",
            "hpd",
            "--lr",
            "5e-5",
            "--variant",
            "congen-simtde=congen --student-arch simtde --lr 1.5e-4",
        ]
    )
    assert args.rows == ["hpd", "congen-simtde"]
    cmd = train_command("congen-simtde", args, Path("runs/x/congen-simtde"))
    assert cmd[cmd.index("--method") + 1] == "congen"
    assert cmd[cmd.index("--out") + 1] == str(Path("runs/x/congen-simtde"))
    assert cmd[-4:] == ["--student-arch", "simtde", "--lr", "1.5e-4"]  # last wins over the shared --lr
    assert train_command("hpd", args, Path("o"))[-2:] == ["--lr", "5e-05"]


def test_methods_choose_the_rows_and_variants_always_run() -> None:
    variant = ["--variant", "ibkd-random=ibkd --init-projection random"]
    assert parse_args([*variant, "--methods", "congen", "hpd"]).rows == ["congen", "hpd", "ibkd-random"]
    assert parse_args([*variant, "--methods"]).rows == ["ibkd-random"]  # the variant alone
    assert parse_args([]).rows == ["hpd", "ibkd", "distilcse-kd", "distilcse-ckd", "simtde", "congen"]
    with pytest.raises(SystemExit):
        parse_args(["--methods", "nonesuch"])


def test_runs_merge_by_row_name_and_rows_keep_their_own_speeds() -> None:
    first = {
        "command": "one",
        "rows": [
            {"method": "hpd", "stsb_test": 80.0, "speedup_vs_minilm": 1.0},
            {"method": "ibkd", "stsb_test": 79.0, "speedup_vs_minilm": 0.9},
        ],
    }
    second = {"command": "two", "rows": [{"method": "ibkd", "stsb_test": 81.0, "speedup_vs_minilm": 1.1}]}
    merged = merge_reports([first, second])
    assert [r["method"] for r in merged["rows"]] == ["hpd", "ibkd"]
    assert merged["rows"][1]["stsb_test_vs_hpd"] == pytest.approx(1.0)  # the later run's ibkd
    assert [r["speedup_vs_minilm"] for r in merged["rows"]] == [1.0, 1.1]
    assert [run["command"] for run in merged["runs"]] == ["one", "two"]


@pytest.mark.parametrize("spec", ["no-equals", "x=", "x=nomethod", "hpd=congen", "y=congen", "y=hpd"])
def test_bad_variants_are_refused(spec: str) -> None:
    extra = ["--variant", "y=congen"] if spec.startswith("y=") else []
    with pytest.raises(SystemExit):
        parse_args([*extra, "--variant", spec])


def test_quora_scores_drop_the_query_itself() -> None:
    ids = drop_self(np.array([[7, 3, 5], [2, 9, 4]]), np.array([7, 4]), k=2)
    assert ids.tolist() == [[3, 5], [2, 9]]
    mrr, recall = retrieval_scores(ids, np.array([5, 8]))  # rank 2, then missed
    assert (mrr, recall) == (pytest.approx(25.0), pytest.approx(50.0))


def test_quora_verdict_compares_nprobe_5_rows_round_by_round() -> None:
    keys = ("model", "index", "nprobe", "mrr10", "ms_per_1000", "ms_per_1000_min", "mb")

    def row(*values: object) -> dict:
        return dict(zip(keys, values, strict=True))

    rows = [
        row("teacher", "exact", None, 70.0, 200.0, 190.0, 100.0),
        row("teacher", "IVF1024", 5, 69.0, 20.0, 18.0, 110.0),
        row("teacher", "IVF1024", 10, 69.5, 30.0, 29.0, 110.0),
        row("student", "exact", None, 68.0, 40.0, 39.0, 20.0),
        row("student", "IVF1024", 5, 66.5, 4.0, 3.0, 22.0),
    ]
    times = [[1.0], [2.0, 3.0], [9.0, 9.0], [1.0], [0.5, 1.0]]
    result = verdict(rows, times, nprobe=5)
    assert result["student_ivf_mrr_vs_teacher_exact_pct"] == pytest.approx(95.0)
    assert result["search_time_ratio_teacher_ivf_over_student_ivf"] == pytest.approx(5.0)
    assert result["search_time_ratio_of_fastest_rounds"] == pytest.approx(6.0)
    assert result["search_time_ratio_per_round"] == [4.0, 3.0]
    assert result["memory_ratio_teacher_ivf_over_student_ivf"] == pytest.approx(5.0)


def test_interleaved_rounds_run_every_call_once_per_round() -> None:
    calls: list[str] = []
    seconds = interleaved_seconds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2)
    assert "".join(calls) == "abab"
    assert {name: len(s) for name, s in seconds.items()} == {"a": 2, "b": 2}


DOC = """# Results

intro

<!-- results:speed:start -->
old table
<!-- results:speed:end -->

<!-- results:other:start -->
keep me
<!-- results:other:end -->
tail
"""


def test_rewrite_block_replaces_only_its_block(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text(DOC)
    rewrite_block(doc, "speed", "| a |\n| --- |\n| 1 |\n")
    text = doc.read_text()
    assert "old table" not in text
    assert "<!-- results:speed:start -->\n| a |\n| --- |\n| 1 |\n<!-- results:speed:end -->" in text
    assert text.replace("| a |\n| --- |\n| 1 |", "old table") == DOC  # nothing else moved
    rewrite_block(doc, "speed", "| a |\n| --- |\n| 1 |")
    assert doc.read_text() == text  # idempotent
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]  # no temp file left


@pytest.mark.parametrize(
    "text",
    [
        "no markers at all\n",
        "<!-- results:speed:start -->\nonly the start\n",
        "<!-- results:speed:end -->\n<!-- results:speed:start -->\n",  # out of order
        DOC + "<!-- results:speed:start -->\n",  # twice
    ],
)
def test_missing_or_broken_markers_are_refused_and_the_doc_kept(tmp_path: Path, text: str) -> None:
    doc = tmp_path / "results.md"
    doc.write_text(text)
    with pytest.raises(BlockError, match="results:speed:start"):
        rewrite_block(doc, "speed", "new")
    assert doc.read_text() == text


def test_block_names_are_checked() -> None:
    with pytest.raises(BlockError, match="bad block name"):
        replace_block(DOC, "Speed Table", "x")


def test_markdown_table_and_caption() -> None:
    table = markdown_table(("setup", "sent/s"), [("a", "1.0"), ("b", 2)])
    assert table == "| setup | sent/s |\n| --- | ---: |\n| a | 1.0 |\n| b | 2 |"
    assert markdown_table(("x", "y"), [], "ll").splitlines()[1] == "| --- | --- |"
    run = {"command": "python bench/x.py --n 3", "machine": "AMD EPYC, 2 CPUs", "date": "2026-11-25"}
    line = caption(run, Path(__file__).resolve().parents[1] / "docs" / "results" / "x.json")
    assert line == (
        "Measured by `python bench/x.py --n 3` on AMD EPYC, 2 CPUs, 2026-11-25; JSON `docs/results/x.json`."
    )


ENCODE_RESULT = {
    "meta": {"sentences": 10, "repeats": 3, "latency_n": 5, "threads": 2},
    "rows": [
        {"setup": "teacher t (PyTorch)", "sent_per_s": 50.0, "ratio": 1.0, "p50_ms": 40.0, "p99_ms": 60.0},
        {"setup": "student ONNX int8", "sent_per_s": 1000.0, "ratio": 20.0, "p50_ms": 1.5, "p99_ms": 2.25},
    ],
}


def test_render_from_rewrites_the_block_without_measuring(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\n<!-- results:encode:start -->\n<!-- results:encode:end -->\n")
    saved = tmp_path / "encode.json"
    saved.write_text(json.dumps(ENCODE_RESULT | {"run": {"command": "python bench/encode.py", "machine": "m",
                                                          "date": "2026-11-23"}}))  # fmt: skip
    encode.main(["speed", "--render-from", str(saved), "--doc", str(doc)])
    text = doc.read_text()
    assert f"Measured by `python bench/encode.py` on m, 2026-11-23; JSON `{saved}`." in text
    assert "| student ONNX int8 | 1,000.0 | 20.00 | 1.50 | 2.25 |" in text
    assert "| setup | sent/s (bs 32) | x teacher |" in text


def test_render_from_a_json_without_a_run_record(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("<!-- results:encode:start -->\n<!-- results:encode:end -->\n")
    saved = tmp_path / "encode.json"
    saved.write_text(json.dumps(ENCODE_RESULT))
    with pytest.raises(SystemExit, match="--run-command and --run-date"):
        encode.main(["speed", "--render-from", str(saved), "--doc", str(doc)])
    args = ["--run-command", "python bench/encode.py --x", "--run-date", "2026-11-22", "--run-machine", "m"]
    encode.main(["speed", "--render-from", str(saved), "--doc", str(doc), *args])
    assert "Measured by `python bench/encode.py --x` on m, 2026-11-22" in doc.read_text()
    before = doc.read_text()
    encode.main(
        ["speed", "--render-from", str(saved), "--doc", str(tmp_path / "absent.md"), "--no-doc", *args]
    )
    assert doc.read_text() == before and not (tmp_path / "absent.md").exists()


def test_render_into_a_doc_without_the_block_fails_in_one_line(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("# nothing here\n")
    saved = tmp_path / "encode.json"
    saved.write_text(json.dumps(ENCODE_RESULT))
    with pytest.raises(SystemExit, match="no block 'encode'"):
        encode.main(
            ["speed", "--render-from", str(saved), "--doc", str(doc), "--run-command", "c", "--run-date", "d"]
        )


def test_dimensions_block_is_named_after_the_bundle() -> None:
    assert dimensions_block({"bundle": "runs/bundles/congen-mrl-e8"}) == "dimensions-congen-mrl-e8"


def test_stage1_dev_reads_step_zero_and_the_best_stage1_evaluation(tmp_path: Path) -> None:
    curve = [
        {"step": 0, "dev_spearman": 85.41, "stage": "train"},
        {"step": 20, "loss": 0.3, "stage": "train"},
        {"step": 100, "dev_spearman": 85.21, "stage": "train"},
        {"step": 200, "dev_spearman": 85.62, "stage": "train"},
        {"step": 0, "dev_spearman": 86.9, "stage": "finetune"},
    ]
    (tmp_path / "training_curve.json").write_text(json.dumps(curve))
    got = stage1_dev(tmp_path)
    assert got["stage1_dev"] == "85.41 -> 85.62 (step 200)" and got["stage1_improved"] is True
    curve[3]["dev_spearman"] = 85.0
    (tmp_path / "training_curve.json").write_text(json.dumps(curve))
    assert stage1_dev(tmp_path)["stage1_improved"] is False
    assert stage1_dev(tmp_path / "missing") == {}


def test_mrr10_drops_the_query_itself_before_ranking() -> None:
    data = QuoraRetrieval(corpus=["a", "b", "c", "d"], queries=[0, 1], relevant=[2, 3])
    # query 0 finds itself first, then b, then its relevant c: rank 2 once itself is dropped
    ids = np.array([[0, 1, 2, *[-1] * 8], [3, 1, 0, *[-1] * 8]])
    assert mrr10(ids, data) == pytest.approx(100 * (1 / 2 + 1 / 1) / 2)
