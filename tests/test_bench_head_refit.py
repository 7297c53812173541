"""bench/head_refit.py: the head refit lowers the neighbourhood loss, an anchor holds it to the
trained head, and a saved refit is a checkpoint that computes with the new head."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from checkpoint_quora import without_head
from head_refit import project, refit_head, save_refit

from tests.tiny_models import tiny_sentences
from training.losses.neighbourhood import neighbourhood_loss


def _loss(body: torch.Tensor, head: tuple[torch.Tensor, torch.Tensor]) -> float:
    out = body @ head[0].T + head[1]
    unit = F.normalize(body, dim=-1)
    return float(neighbourhood_loss(unit, unit, out, out, 0.05))


def test_refit_lowers_the_loss_and_the_anchor_holds_the_head() -> None:
    torch.manual_seed(0)
    body = torch.randn(64, 12)
    head = (torch.randn(4, 12), torch.zeros(4))
    free = refit_head(body, head, 0.0, steps=150, lr=1e-2, tau=0.05, bank=64)
    held = refit_head(body, head, 100.0, steps=150, lr=1e-2, tau=0.05, bank=64)
    assert len(free) == 150
    assert _loss(body, free[-1]) < _loss(body, head) - 0.05
    start = F.normalize(body @ head[0].T + head[1], dim=-1)

    def moved(h: tuple[torch.Tensor, torch.Tensor]) -> float:
        return float((F.normalize(body @ h[0].T + h[1], dim=-1) - start).norm(dim=-1).mean())

    assert moved(held[-1]) < moved(free[-1]) / 2


def test_project_gives_unit_rows() -> None:
    head = (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0.0, 1.0]))
    out = project(np.array([[3.0, 0.0], [0.0, 1.0]], dtype=np.float32), head)
    expected = np.array([[1.0, 1 / 3], [0.0, 1.0]]) / np.array([[np.sqrt(1 + 1 / 9)], [1.0]])
    assert out == pytest.approx(expected)


def test_saved_refit_computes_with_the_new_head(tiny_dense_student: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from training.student import models  # sentence-transformers' modules, under either path

    source = tmp_path / "source"
    shutil.copytree(tiny_dense_student, source)
    (source / "manifest.json").write_text(json.dumps({"kind": "checkpoint", "config": {"dim": 8}}))
    model = SentenceTransformer(str(source), device="cpu")
    dense = next(m for m in model if isinstance(m, models.Dense))
    head = (torch.randn_like(dense.linear.weight), torch.randn_like(dense.linear.bias))
    settings = {"steps": 3, "lr": 0.1, "tau": 0.05, "bank": 8, "sentences": 10, "anchor": [0.0]}
    save_refit(str(source), str(tmp_path / "refit"), model, head, settings)
    saved = SentenceTransformer(str(tmp_path / "refit"), device="cpu")
    manifest = json.loads((tmp_path / "refit" / "manifest.json").read_text())
    assert manifest["config"] == {"dim": 8}
    assert manifest["head_refit"]["source"] == str(source) and manifest["head_refit"]["steps"] == 3
    assert not (tmp_path / "refit.partial").exists()
    sentences = tiny_sentences(3, seed=4)

    pooled = without_head(saved).encode(sentences, convert_to_numpy=True)
    assert saved.encode(sentences, convert_to_numpy=True) == pytest.approx(project(pooled, head), abs=1e-5)
