"""Pure helpers of the bench scripts: Quora distractors and the methods table's comparisons."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from methods import add_comparisons, parse_args, train_command
from quora_data import QuoraRetrieval, add_distractors


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


@pytest.mark.parametrize("spec", ["no-equals", "x=", "x=nomethod", "hpd=congen", "y=congen", "y=hpd"])
def test_bad_variants_are_refused(spec: str) -> None:
    extra = ["--variant", "y=congen"] if spec.startswith("y=") else []
    with pytest.raises(SystemExit):
        parse_args([*extra, "--variant", spec])
