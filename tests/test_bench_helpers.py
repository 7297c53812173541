"""Pure helpers of the bench scripts: Quora distractors, the methods table's comparisons, and the
blocks of docs/results.md that the scripts rewrite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import encode
import numpy as np
from binary_codes import code_variants, itq_rotation
from binary_lists import parse_config
from dimensions import block_name as dimensions_block
from harness import (
    BlockError,
    QuoraRetrieval,
    add_distractors,
    caption,
    interleaved_seconds,
    markdown_table,
    replace_block,
    rewrite_block,
)
from ivf_width import fixed_and_per_dim, pca_widths
from methods import parse_args, train_command
from methods_report import END, START, add_comparisons, doc_note, merge_reports
from prefix_rotation import nested_whitening
from quora_sr import drop_self, mrr10, retrieval_scores, verdict
from rescore_k import render as render_rescore_k
from rescore_k import teacher_exact
from teacher_ensemble import render as render_ensemble
from teacher_whitening import render as render_whitening


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


def test_rows_keeps_only_the_named_rows_and_refuses_unknown_ones() -> None:
    variant = ["--variant", "ibkd-random=ibkd --init-projection random"]
    args = parse_args([*variant, "--rows", "ibkd-random", "hpd"])
    assert args.rows == ["hpd", "ibkd-random"]  # the table's order, not the flag's
    with pytest.raises(SystemExit):
        parse_args(["--rows", "nonesuch"])


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


def test_the_note_above_the_table_is_read_back(tmp_path: Path) -> None:
    doc = tmp_path / "methods.md"
    doc.write_text(f"# M\n\n{START}\nMeasured by x.\n\n| a |\n{END}\n")
    assert doc_note(doc) == "Measured by x."
    assert doc_note(tmp_path / "missing.md") == ""


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


@pytest.mark.parametrize(("alternate", "order"), [(False, "abab"), (True, "abba")])
def test_interleaved_rounds_run_every_call_once_per_round(alternate: bool, order: str) -> None:
    calls: list[str] = []
    seconds = interleaved_seconds(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, alternate=alternate
    )
    assert "".join(calls) == order
    assert {name: len(s) for name, s in seconds.items()} == {"a": 2, "b": 2}


def test_width_line_and_pca_cuts() -> None:
    fixed, per_dim = fixed_and_per_dim([0, 10, 20], [1.0, 2.0, 3.0])
    assert (fixed, per_dim) == (pytest.approx(1.0), pytest.approx(0.1))
    vectors = np.random.default_rng(0).normal(size=(200, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cuts = pca_widths(vectors, [4, 16], fit_on=100, seed=0)
    assert cuts[4].shape == (200, 4)
    np.testing.assert_allclose(np.linalg.norm(cuts[4], axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(cuts[16], vectors, rtol=1e-5)  # the full width is kept as it is


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
    encode.main(["--render-from", str(saved), "--doc", str(doc)])
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
        encode.main(["--render-from", str(saved), "--doc", str(doc)])
    args = ["--run-command", "python bench/encode.py --x", "--run-date", "2026-11-22", "--run-machine", "m"]
    encode.main(["--render-from", str(saved), "--doc", str(doc), *args])
    assert "Measured by `python bench/encode.py --x` on m, 2026-11-22" in doc.read_text()
    before = doc.read_text()
    encode.main(["--render-from", str(saved), "--doc", str(tmp_path / "absent.md"), "--no-doc", *args])
    assert doc.read_text() == before and not (tmp_path / "absent.md").exists()


def test_render_into_a_doc_without_the_block_fails_in_one_line(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("# nothing here\n")
    saved = tmp_path / "encode.json"
    saved.write_text(json.dumps(ENCODE_RESULT))
    with pytest.raises(SystemExit, match="no block 'encode'"):
        encode.main(["--render-from", str(saved), "--doc", str(doc), "--run-command", "c", "--run-date", "d"])


def test_dimensions_block_is_named_after_the_bundle() -> None:
    assert dimensions_block({"bundle": "runs/bundles/congen-mrl-e8"}) == "dimensions-congen-mrl-e8"


def test_stage1_dev_reads_step_zero_and_the_best_stage1_evaluation(tmp_path: Path) -> None:
    from methods import stage1_dev

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


def test_teacher_ensemble_table_names_the_best_weight_on_dev() -> None:
    result = {
        "splits": ["dev", "test"],
        "spearman": {"a": {"dev": 88.11, "test": 83.42}, "a 0.7 + b 0.3": {"dev": 88.41, "test": 83.73}},
        "best_on_dev": "a 0.7 + b 0.3",
    }
    lines = render_ensemble(result).splitlines()
    assert lines[0] == "| teacher | STS-B dev | STS-B test |"
    assert lines[3] == "| a 0.7 + b 0.3 | 88.41 | 83.73 |"
    assert lines[-1] == "Best weight on STS-B dev: **a 0.7 + b 0.3**."


def test_teacher_whitening_table_names_the_best_power_on_dev_per_teacher() -> None:
    result = {
        "spearman": {
            "a, whitening 0": {"dev": 87.75, "test": 83.21},
            "a, whitening 0.25": {"dev": 87.74, "test": 83.71},
        },
        "best_on_dev": {"a": "a, whitening 0"},
    }
    lines = render_whitening(result).splitlines()
    assert lines[0] == "| teacher, PCA | STS-B dev | STS-B test |"
    assert lines[3] == "| a, whitening 0.25 | 87.74 | 83.71 |"
    assert lines[-1] == "Best on STS-B dev: a: **a, whitening 0**."


def test_itq_rotation_is_orthogonal_and_lowers_the_quantisation_loss() -> None:
    rng = np.random.default_rng(3)
    # anisotropic data: a few directions carry most of the variance, where ITQ has work to do
    centred = (rng.standard_normal((400, 16)) * np.linspace(4, 0.2, 16)).astype(np.float32)
    centred -= centred.mean(axis=0)

    def loss(rotated: np.ndarray) -> float:
        return float(np.square(np.where(rotated >= 0, 1.0, -1.0) - rotated).sum())

    start, learned = itq_rotation(centred, 0, seed=0), itq_rotation(centred, 30, seed=0)
    np.testing.assert_allclose(learned @ learned.T, np.eye(16), atol=1e-5)
    assert loss(centred @ learned) < loss(centred @ start)


def test_code_variants_keep_the_raw_vectors_first_and_centre_the_others() -> None:
    vectors = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32) + 1.0
    variants = code_variants(vectors, iterations=2, seed=0)
    assert next(iter(variants)) == "sign(x)" and variants["sign(x)"] is vectors
    for name, projected in list(variants.items())[1:]:
        assert projected.shape == vectors.shape
        np.testing.assert_allclose(projected.mean(axis=0), 0.0, atol=1e-5, err_msg=name)


def test_mrr10_drops_the_query_itself_before_ranking() -> None:
    data = QuoraRetrieval(corpus=["a", "b", "c", "d"], queries=[0, 1], relevant=[2, 3])
    # query 0 finds itself first, then b, then its relevant c: rank 2 once itself is dropped
    ids = np.array([[0, 1, 2, *[-1] * 8], [3, 1, 0, *[-1] * 8]])
    assert mrr10(ids, data) == pytest.approx(100 * (1 / 2 + 1 / 1) / 2)


def test_binary_lists_configs_take_an_optional_rescore_k() -> None:
    assert parse_config("191/8", 20) == (191, 8, 20)
    assert parse_config("191/8/50", 20) == (191, 8, 50)
    with pytest.raises(SystemExit, match="nlist/nprobe"):
        parse_config("191", 20)


def test_rescore_k_table_reads_the_teacher_and_marks_the_default(tmp_path: Path) -> None:
    compression = tmp_path / "compression.json"
    rows = [
        {"model": "teacher", "storage": "exact", "corpus": 100, "mrr10": 70.0},
        {"model": "teacher", "storage": "float32", "corpus": 100, "mrr10": 69.0},
        {"model": "default", "storage": "exact", "corpus": 100, "mrr10": 60.0},
    ]
    compression.write_text(json.dumps({"rows": rows}))
    assert teacher_exact(compression) == {100: 70.0}
    result = {
        "bundle": "models/default",
        "rows": [
            {"storage": "binary", "docs": 100, "rescore_k": k}
            | {"pct_of_teacher_exact": p, "time_vs_largest": t}
            for k, p, t in ((20, 96.5, 0.6), (50, 97.0, 1.0))
        ],
        "nlist": {"binary": {"100": 10}},
        "nprobe": {"binary": 8},
        "threads": 2,
        "default_rescore_k": 20,
    }
    table = render_rescore_k(result)
    assert "binary 10 lists at nprobe 8" in table
    assert "| binary | **20** (default) | 96.50% | 0.60 |" in table
    assert "| binary | 50 | 97.00% | 1.00 |" in table


def test_nested_whitening_keeps_prefixes_and_whitens_each_at_full_power() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 8)) @ rng.normal(size=(8, 8))
    cov = np.cov(x, rowvar=False)
    widths = (8, 4, 2)
    mapping = nested_whitening(cov, 1.0, widths)
    for width in widths:
        # the first `width` outputs read only the first `width` inputs ...
        assert not mapping[width:, :width].any()
        # ... and at p = 1 they are white: unit covariance
        cut = mapping[:width, :width]
        np.testing.assert_allclose(cut.T @ cov[:width, :width] @ cut, np.eye(width), atol=1e-8)
    # below full power the narrowest prefix gets its own symmetric partial whitening
    half = nested_whitening(cov, 0.5, widths)
    values, vectors = np.linalg.eigh(cov[:2, :2])
    np.testing.assert_allclose(half[:2, :2], (vectors * values**-0.25) @ vectors.T, atol=1e-10)
