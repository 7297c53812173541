"""scripts/gpu_runs_summary.py: one row per run that a lent-GPU job brought back, whether the run
trained a student, fine-tuned one, or averaged several (a soup, scored by ``distilembed eval``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "gpu_runs_summary", Path(__file__).resolve().parents[1] / "scripts" / "gpu_runs_summary.py"
)
assert _SPEC is not None and _SPEC.loader is not None
summary = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(summary)

MATRYOSHKA = {"scores": {"32": {"STS-B": 80.0}}, "selection": "mean STS-B dev over the widths"}


def test_a_finetuning_reports_its_own_stage_and_flags() -> None:
    manifest = {
        "config": {"dim": 128, "finetune_lr": 2e-5, "seed": 43, "lr": 1e-4},
        "training": {"steps": 450, "best_step": 350, "best_dev_spearman": 84.0},
        "stages": [
            {"steps": 450, "best_step": 350, "best_dev_spearman": 84.0, "train_seconds": 900.0},
            {"steps": 182, "best_step": 40, "best_dev_spearman": 85.5, "train_seconds": 30.0},
        ],
        "finetune": {},
        "scores": {"STS-B": 83.0},
        "matryoshka": MATRYOSHKA,
        "seconds": {},
    }
    run = summary.summarise(manifest)
    assert (run["steps"], run["best_step"], run["best_dev"], run["train_seconds"]) == (182, 40, 85.5, 30.0)
    assert run["flags"]["finetune_lr"] == 2e-5 and run["flags"]["seed"] == 43 and "lr" not in run["flags"]
    assert run["stsb_test_by_width"] == {"128": 83.0, "32": 80.0}
    assert run["share_of_widest"]["32"] == 96.4


def test_a_soup_takes_its_test_score_from_eval_json(tmp_path: Path) -> None:
    manifest = {
        "config": {"dim": 128},
        "average": {"recipe": "uniform", "chosen": ["/tmp/w/ft/a", "/tmp/w/ft/b"], "dev_spearman": 87.4},
    }
    run = summary.summarise(manifest, {"scores": {"STS-B": 83.4321}})
    assert run == {
        "soup": "uniform",
        "sources": ["a", "b"],
        "best_dev": 87.4,
        "stsb_test_by_width": {"128": 83.43},
    }
