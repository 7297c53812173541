"""bench/checkpoint_quora.py end to end on a tiny sentence model: with one IVF list every query's
duplicate is in the list searched, so IVF is exact search."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import checkpoint_quora
from checkpoint_quora import score_checkpoint, without_head
from harness import QuoraRetrieval

from tests.tiny_models import tiny_sentences
from training.data.sts import STSPair


def test_one_list_ivf_is_exact_search(tiny_teacher: Path) -> None:
    corpus = tiny_sentences(24, seed=7)
    data = QuoraRetrieval(corpus, queries=[0, 2, 4], relevant=[1, 3, 5])
    sts = {"dev": [STSPair(corpus[i], corpus[i + 1], float(i % 5)) for i in range(0, 20, 2)]}
    args = argparse.Namespace(
        batch_size=8, nlist=1, nprobe=1, train_sample=100, seed=0, kmeans_niter=10, width=None
    )
    row = score_checkpoint(str(tiny_teacher), data, sts, args, seeds=[0, 1])
    assert set(row) == {"sts", "exact", "ivf", "probed", "duplicate_cosine", "random_cosine"}
    assert -100.0 <= row["sts"]["dev"] <= 100.0
    assert 0.0 <= row["exact"] <= 100.0
    assert row["ivf"] == pytest.approx([row["exact"]] * 2)
    assert row["probed"] == [100.0, 100.0]
    for cosine in (row["duplicate_cosine"], row["random_cosine"]):
        assert -1.0 - 1e-6 <= cosine <= 1.0 + 1e-6


def test_body_scores_the_input_of_the_dense_head(tiny_dense_student: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from training.student import models  # sentence-transformers' modules, under either path

    model = SentenceTransformer(str(tiny_dense_student), device="cpu")
    body = without_head(model)
    assert not any(isinstance(module, models.Dense) for module in body)
    head = next(module for module in model if isinstance(module, models.Dense))
    sentences = tiny_sentences(3, seed=2)
    pooled = body.encode(sentences, convert_to_tensor=True)
    assert pooled.shape[1] == head.linear.in_features
    full = model.encode(sentences, convert_to_tensor=True)
    with torch.inference_mode():
        expected = torch.nn.functional.normalize(head.linear(pooled), dim=-1)
    assert torch.allclose(full, expected, atol=1e-5)


def test_body_needs_a_head(tiny_teacher: Path) -> None:
    from sentence_transformers import SentenceTransformer

    with pytest.raises(SystemExit, match="no Dense head"):
        without_head(SentenceTransformer(str(tiny_teacher), device="cpu"))


def test_width_scores_the_normalised_prefix(
    tiny_dense_student: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sentence_transformers import SentenceTransformer

    corpus = tiny_sentences(12, seed=5)
    data = QuoraRetrieval(corpus, queries=[0, 2], relevant=[1, 3])
    searched: list[np.ndarray] = []

    def capture(vectors: np.ndarray, *_: object) -> argparse.Namespace:
        searched.append(vectors)
        return argparse.Namespace(exact=0.0, ivf=[0.0], probed=[100.0])

    monkeypatch.setattr(checkpoint_quora, "search_mrrs", capture)
    args = argparse.Namespace(batch_size=4, seed=0, width=3)
    score_checkpoint(str(tiny_dense_student), data, {}, args, seeds=[0])
    full = SentenceTransformer(str(tiny_dense_student), device="cpu").encode(corpus, convert_to_numpy=True)
    prefix = full[:, :3] / np.linalg.norm(full[:, :3], axis=1, keepdims=True)
    assert searched[0].shape == (12, 3)
    np.testing.assert_allclose(searched[0], prefix, atol=1e-5)
