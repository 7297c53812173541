"""Checkpoint averaging (uniform and greedy model soups) on hand-made tensors and tiny checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from distilembed.errors import UserError
from tests.tiny_models import make_tiny_sentence_model
from training.checkpoint import average_checkpoints, average_state_dicts, mixing_weights, own_dev

PROBE = "embeddings.LayerNorm.bias"


def test_mean_of_float_tensors_on_a_hand_computed_case() -> None:
    ids = torch.arange(3)
    states = [
        {"w": torch.tensor([1.0, 2.0]), "ids": ids},
        {"w": torch.tensor([3.0, 6.0]), "ids": ids},
        {"w": torch.tensor([2.0, 1.0]), "ids": ids},
    ]
    out = average_state_dicts(states)
    assert torch.equal(out["w"], torch.tensor([2.0, 3.0]))
    assert torch.equal(out["ids"], ids)


def test_weighted_mean_is_wise_ft_interpolation_on_a_hand_computed_case() -> None:
    start, tuned = {"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([4.0, 6.0])}
    out = average_state_dicts([start, tuned], [0.25, 0.75])  # alpha 0.75 of the way to the fine-tuning
    assert torch.allclose(out["w"], torch.tensor([3.0, 5.0]))
    assert mixing_weights([1, 3], 2) == [0.25, 0.75]  # scaled to sum 1
    assert mixing_weights(None, 4) == [0.25] * 4


@pytest.mark.parametrize(
    ("weights", "message"), [([1.0], "1 values for 2"), ([-1.0, 2.0], ">= 0"), ([0, 0], "not all 0")]
)
def test_bad_weights_are_a_user_error(weights: list[float], message: str) -> None:
    with pytest.raises(UserError, match=message):
        mixing_weights(weights, 2)


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ({"w": torch.zeros(3)}, "shape"),
        ({"v": torch.zeros(2)}, "different weights"),
        ({"w": torch.zeros(2, dtype=torch.int64)}, "non-float weights differ"),
    ],
)
def test_mismatched_checkpoints_are_a_user_error(other: dict, message: str) -> None:
    first = {"w": torch.ones(2, dtype=other["w"].dtype if "w" in other else torch.float32)}
    with pytest.raises(UserError, match=message):
        average_state_dicts([first, other])


def _checkpoint(root: Path, name: str, value: float) -> Path:
    """A tiny sentence model whose PROBE tensor is the constant ``value``."""
    path = make_tiny_sentence_model(root / name, hidden=16, seed=1)
    weights = load_file(str(path / "model.safetensors"))
    weights[PROBE] = torch.full_like(weights[PROBE], value)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _probe(path: Path) -> float:
    return float(load_file(str(path / "model.safetensors"))[PROBE].mean())


def test_uniform_average_writes_a_loadable_checkpoint_with_the_mean(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    sources = [_checkpoint(tmp_path, "a", 0.0), _checkpoint(tmp_path, "b", 3.0)]
    out = tmp_path / "soup"
    manifest = average_checkpoints(sources, out)
    assert _probe(out) == pytest.approx(1.5)
    assert manifest["average"]["recipe"] == "uniform"
    assert manifest["average"]["chosen"] == [str(s) for s in sources]
    assert SentenceTransformer(str(out), device="cpu").encode(["a cat ."]).shape == (1, 16)


def test_weighted_average_writes_the_interpolation_and_records_its_weights(tmp_path: Path) -> None:
    sources = [_checkpoint(tmp_path, "a", 0.0), _checkpoint(tmp_path, "b", 4.0)]
    manifest = average_checkpoints(sources, tmp_path / "wise", weights=[3, 1])
    assert _probe(tmp_path / "wise") == pytest.approx(1.0)
    assert manifest["average"]["recipe"] == "weighted"
    assert manifest["average"]["weights"] == [0.75, 0.25]
    with pytest.raises(UserError, match="greedy soup chooses its own"):
        average_checkpoints(sources, tmp_path / "g", score=_probe, greedy=True, weights=[1, 1])


def test_a_soup_of_matryoshka_students_keeps_their_trained_widths(tmp_path: Path) -> None:
    sources = [_checkpoint(tmp_path, "a", 0.0), _checkpoint(tmp_path, "b", 1.0)]
    for source, weights in zip(sources, ([1, 1, 8], [0, 0, 1]), strict=True):
        record = {"widths": [16, 8, 4], "weights": weights, "scores": {"8": {"STS-B": 80.0}}}
        (source / "manifest.json").write_text(json.dumps({"kind": "checkpoint", "matryoshka": record}))
    manifest = average_checkpoints(sources, tmp_path / "soup")
    assert manifest["matryoshka"] == {
        "widths": [16, 8, 4],
        "weights": [1, 1, 8],
    }  # the sources' scores dropped
    (sources[1] / "manifest.json").write_text(json.dumps({"kind": "checkpoint"}))
    assert "matryoshka" not in average_checkpoints(sources, tmp_path / "mixed")


def test_a_rotated_student_is_refused(tmp_path: Path) -> None:
    sources = [_checkpoint(tmp_path, "a", 0.0), _checkpoint(tmp_path, "b", 1.0)]
    (sources[1] / "manifest.json").write_text(json.dumps({"kind": "checkpoint", "rotate": {"best_step": 5}}))
    with pytest.raises(UserError, match="average the sources, then rotate"):
        average_checkpoints(sources, tmp_path / "soup")
    assert not (tmp_path / "soup").exists()


def test_greedy_soup_keeps_an_ingredient_only_when_the_score_does_not_drop(tmp_path: Path) -> None:
    # Score: closeness of the probe to 0.4. Own scores rank a (0) > b (1) > c (10). The soup a+b
    # (0.5) scores better than a alone and is kept; adding c (mean 3.67) scores worse and is dropped.
    a, b, c = (_checkpoint(tmp_path, n, v) for n, v in (("a", 0.0), ("b", 1.0), ("c", 10.0)))
    manifest = average_checkpoints(
        [c, b, a], tmp_path / "soup", score=lambda p: -abs(_probe(p) - 0.4), greedy=True
    )
    summary = manifest["average"]
    assert summary["chosen"] == [str(a), str(b)]
    assert [step["kept"] for step in summary["greedy_steps"]] == [True, True, False]
    assert summary["dev_spearman"] == pytest.approx(-0.1, abs=1e-6)
    assert _probe(tmp_path / "soup") == pytest.approx(0.5)


def test_cli_bad_input_is_one_line(tmp_path: Path, run_cli) -> None:
    real = _checkpoint(tmp_path, "a", 0.0)
    result = run_cli(
        "average", str(real), str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), "--no-dev"
    )
    assert result.returncode == 2, result.stderr
    assert "checkpoint not found" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()
    other = _checkpoint(tmp_path, "b", 1.0)
    for weights, message in (("1", "1 values for 2"), ("a,b", "--weights takes comma-separated floats")):
        result = run_cli(
            "average", str(real), str(other), "--out", str(tmp_path / "o"), "--no-dev", "--weights", weights
        )
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr


def test_keep_snapshots_saves_every_dev_evaluation_for_a_soup(
    tiny_teacher, tiny_bert, tiny_data, tmp_path: Path
) -> None:
    from tests.test_pipeline import _cfg
    from training.pipeline import run_training

    out = tmp_path / "ckpt"
    cfg = _cfg(tiny_teacher, tiny_bert, keep_snapshots=True)  # 6 steps, dev every 3
    manifest = run_training(cfg, out, data_dir=str(tiny_data))
    snapshots = sorted((tmp_path / "ckpt.snapshots").glob("*/step-*"))
    assert [p.name for p in snapshots] == ["step-000000", "step-000003", "step-000006"]
    best = snapshots[manifest["training"]["best_step"] // 3]
    kept, final = (load_file(str(d / "model.safetensors")) for d in (best, out))
    # The snapshot of the best evaluation holds exactly the weights of the written checkpoint.
    assert kept.keys() == final.keys()
    assert all(torch.equal(kept[k], final[k]) for k in kept)
    soup = average_checkpoints(snapshots, tmp_path / "soup")
    assert len(soup["average"]["chosen"]) == 3


@pytest.mark.parametrize(
    ("manifest", "dev"),
    [
        ({"training": {"best_dev_spearman": 87.07}}, 87.07),
        ({"training": {"best_dev_spearman": 87.07}, "whiten": {"dev_spearman": 87.2}}, 87.2),
        (  # a fine-tuned whitened checkpoint: the fine-tuning came last
            {
                "training": {"best_dev_spearman": 87.07},
                "whiten": {"dev_spearman": 87.2},
                "finetune": {"best_dev_spearman": 87.42},
            },
            87.42,
        ),
        ({"method": "average", "average": {"dev_spearman": 87.43}}, 87.43),
        ({"method": "average", "average": {"dev_spearman": None}}, None),
        ({}, None),
    ],
)
def test_a_source_is_recorded_at_the_dev_of_its_last_step(manifest: dict, dev: float | None) -> None:
    assert own_dev(manifest) == dev
