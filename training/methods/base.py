"""What a distillation method hands the training pipeline: one or two :class:`Stage` s.

The pipeline prepares everything the methods share (training sentences, the teacher's cached
full-dim targets, the fitted PCA and the PCA-d targets) in a :class:`MethodInputs`; a method turns
it into stages, each a ``batch_loss(indices)`` over its own examples plus the loop settings, the
loss module's trainable parameters and the state to snapshot for ``--resume``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from torch import nn

from training.config import TrainConfig
from training.losses.hpd import PCATargets
from training.teacher_ensemble import AnyTeacher
from training.trainer import BatchLoss, LoopConfig


@dataclass
class MethodInputs:
    """The shared inputs. ``texts[i]`` has the full-dim teacher target ``row i`` of
    ``np.concatenate(full_parts)`` and the PCA-d target ``pca_targets[i]``."""

    cfg: TrainConfig
    student: SentenceTransformer
    teacher: AnyTeacher
    texts: list[str]
    full_parts: list[np.ndarray]
    pca: PCATargets
    pca_targets: torch.Tensor
    device: str
    data_dir: str | None

    def full_targets(self) -> torch.Tensor:
        """(len(texts), D) float16 teacher targets, kept on the CPU; rows are moved per batch."""
        parts = [np.asarray(p, dtype=np.float16) for p in self.full_parts]
        return torch.from_numpy(np.concatenate(parts) if len(parts) > 1 else parts[0].copy())


@dataclass
class Stage:
    """One training loop. ``name`` is the stage's key in the manifest's wall-clock table."""

    name: str
    batch_loss: BatchLoss
    lengths: np.ndarray
    loop: LoopConfig
    extra_params: list[nn.Parameter] = field(default_factory=list)
    extra_state: nn.Module | None = None
    info: dict[str, Any] = field(default_factory=dict)


def distill_loop(cfg: TrainConfig) -> LoopConfig:
    """Stage-1 loop settings (the same for every method, so budgets compare)."""
    return LoopConfig(
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        layer_lr_decay=cfg.layer_lr_decay,
        warmup_ratio=cfg.warmup_ratio,
        epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        eval_every=cfg.eval_every,
        save_every=cfg.save_every,
        seed=cfg.seed,
        patience=cfg.patience,
        amp=cfg.amp,
    )


def finetune_loop(cfg: TrainConfig) -> LoopConfig:
    """Stage-2 loop settings (NLI fine-tuning)."""
    return LoopConfig(
        batch_size=cfg.finetune_batch_size,
        lr=cfg.finetune_lr,
        warmup_ratio=cfg.warmup_ratio,
        epochs=cfg.finetune_epochs,
        max_steps=cfg.finetune_max_steps,
        eval_every=cfg.finetune_eval_every,
        save_every=cfg.finetune_eval_every,
        seed=cfg.seed + 1,
        patience=cfg.finetune_patience,
        amp=cfg.amp,
    )


def text_lengths(texts: list[str]) -> np.ndarray:
    return np.array([len(t) for t in texts])


def tokenize(student: SentenceTransformer, texts: list[str]) -> dict[str, Any]:
    """The student's tokenised batch, tensors on its device."""
    features = student.tokenize(texts)
    return {k: v.to(student.device) if torch.is_tensor(v) else v for k, v in features.items()}


def encode_features(student: SentenceTransformer, texts: list[str]) -> tuple[dict[str, Any], torch.Tensor]:
    """(tokenised features, the d-dim output before Normalize) in one pass; the features keep
    ``input_ids`` / ``attention_mask`` for losses that need the inputs (IBKD's X)."""
    features = tokenize(student, texts)
    inputs = {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in features}
    out = dict(features)
    for module in list(student)[:-1]:  # everything but Normalize
        out = module(out)
    return inputs, out["sentence_embedding"]


def pick(value: float | None, default: float) -> float:
    return default if value is None else value
