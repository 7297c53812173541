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
from training.student import encoder_inputs, projected, tokenize
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


def stage_loop(cfg: TrainConfig, finetune: bool = False) -> LoopConfig:
    """Loop settings of stage 1 (the same for every method, so budgets compare) or, ``finetune``, of
    the NLI stage: its ``finetune_*`` fields, a snapshot at every evaluation and the next seed."""
    names = ("batch_size", "lr", "epochs", "max_steps", "eval_every", "patience")
    loop = {name: getattr(cfg, f"finetune_{name}" if finetune else name) for name in names}
    save_every = loop["eval_every"] if finetune else cfg.save_every
    seed = cfg.seed + 1 if finetune else cfg.seed
    return LoopConfig(**loop, save_every=save_every, warmup_ratio=cfg.warmup_ratio, seed=seed, amp=cfg.amp)


def distill_stage(
    inp: MethodInputs, batch_loss: BatchLoss, info: dict[str, Any], loss: nn.Module | None = None
) -> Stage:
    """Stage 1 over the training sentences; ``loss``'s parameters (training-only maps) train beside
    the student, and its state (queues) is snapshotted for ``--resume``."""
    extra = list(loss.parameters()) if loss is not None else []
    lengths = text_lengths(inp.texts)
    return Stage("train", batch_loss, lengths, stage_loop(inp.cfg), extra, extra_state=loss, info=info)


def text_lengths(texts: list[str]) -> np.ndarray:
    return np.array([len(t) for t in texts])


def encode_features(student: SentenceTransformer, texts: list[str]) -> tuple[dict[str, Any], torch.Tensor]:
    """(tokenised features, the d-dim output before Normalize) in one pass; the features keep
    ``input_ids`` / ``attention_mask`` for losses that need the inputs (IBKD's X)."""
    features = tokenize(student, texts)
    return encoder_inputs(features), projected(student, features)


def pick(value: float | None, default: float) -> float:
    return default if value is None else value
