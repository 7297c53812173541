"""The ridge warm start of the student's projection (training/student.py)."""

import json

import numpy as np
import pytest
import torch

from tests.test_pipeline import _cfg
from tests.tiny_models import tiny_sentences
from training.pipeline import run_training
from training.student import (
    build_student,
    init_projection,
    pooled_features,
    projected,
    ridge_projection,
    tokenize,
)


def test_ridge_recovers_an_exact_linear_map() -> None:
    # t = 2x + 1 on x = 0, 1, 2: without a penalty the fit is exact.
    x = np.array([[0.0], [1.0], [2.0]])
    weight, bias = ridge_projection(x, 2 * x + 1, l2=0.0)
    assert weight.shape == (1, 1) and bias.shape == (1,)
    assert weight[0, 0] == pytest.approx(2.0) and bias[0] == pytest.approx(1.0)


def test_ridge_penalty_by_hand() -> None:
    # var(x) = 2/3, cov(x, t) = 4/3; penalty l2 * var(x): w = (4/3) / (2/3 * (1 + l2)) = 1 for l2 = 1,
    # b = mean(t) - mean(x) * w = 3 - 1 = 2.
    x = np.array([[0.0], [1.0], [2.0]])
    weight, bias = ridge_projection(x, 2 * x + 1, l2=1.0)
    assert weight[0, 0] == pytest.approx(1.0) and bias[0] == pytest.approx(2.0)


def test_ridge_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="must be"):
        ridge_projection(np.zeros((3, 2)), np.zeros((4, 2)))


def test_init_projection_sets_the_dense_to_the_fit(tiny_bert) -> None:
    torch.manual_seed(0)
    student = build_student(str(tiny_bert), dim=4, max_seq_len=24)
    texts = tiny_sentences(64)
    features = pooled_features(student, texts)
    # Targets that are an exact linear function of the pooled features: the fit must find it.
    true_w = np.random.default_rng(0).normal(size=(4, features.shape[1])).astype(np.float32)
    targets = features @ true_w.T + 0.5
    report = init_projection(student, texts, targets, l2=0.0)
    assert report["mse_ridge"] < 1e-4 * report["mse_random_init"]
    assert report["r2"] == pytest.approx(1.0, abs=1e-4)
    with torch.no_grad():
        out = projected(student.eval(), tokenize(student, texts[:8])).numpy()
    np.testing.assert_allclose(out, targets[:8], atol=1e-3)


def test_pipeline_records_the_warm_start(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_teacher, tiny_bert, init_projection="ridge", projection_sample=50, max_steps=3)
    manifest = run_training(cfg, tmp_path / "ckpt", data_dir=str(tiny_data))
    report = manifest["projection_init"]
    assert report["sample"] == 50 and report["mse_ridge"] < report["mse_random_init"]
    saved = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert saved["projection_init"] == report and "projection_init" in saved["seconds"]
    curve = json.loads((tmp_path / "ckpt" / "training_curve.json").read_text())
    assert next(p["step"] for p in curve if "dev_spearman" in p) == 0  # the warm start is scored too
