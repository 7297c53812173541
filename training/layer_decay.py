"""Layer-wise learning-rate decay (LLRD) for a transformer student.

Howard & Ruder (2018, ULMFiT, "discriminative fine-tuning") and Clark et al. (2020, ELECTRA, the
"layer-wise learning rate decay" of their appendix): the top of a pre-trained encoder adapts at the
full learning rate and each layer below at ``decay`` times the one above it,

    lr(depth) = lr * decay ** (L + 1 - depth),

with the embeddings at depth 0, encoder layer i (0-based) at depth i + 1 and everything above the
encoder (pooling head, projection, loss parameters) at depth L + 1, the full rate. ``decay`` 1 is one
learning rate for all. The lower layers stay closer to the initial weights, which is what a student
initialised from a model trained for the target task (all-MiniLM-L6-v2 and Quora) should keep.
"""

from __future__ import annotations

from typing import Any

from sentence_transformers import SentenceTransformer
from torch import nn

from training.student import encoder_layers


def depth_lr_scales(n_layers: int, decay: float) -> list[float]:
    """The multiplier of every depth 0..L+1: ``decay ** (L + 1 - depth)``."""
    return [decay ** (n_layers + 1 - depth) for depth in range(n_layers + 2)]


def layerwise_param_groups(
    student: SentenceTransformer, extra: list[nn.Parameter], lr: float, decay: float
) -> list[dict[str, Any]]:
    """AdamW parameter groups for the trainable parameters of ``student`` and ``extra``, one per depth
    that holds any (a single group when ``decay`` is 1)."""
    trainable = [p for p in student.parameters() if p.requires_grad] + list(extra)
    if decay == 1.0:
        return [{"params": trainable, "lr": lr}]
    auto_model = student[0].auto_model  # a transformer student: TrainConfig.validate refuses SimTDE's
    layers = encoder_layers(auto_model)
    top = len(layers) + 1
    depth_of = {id(p): 0 for p in auto_model.parameters()}
    for i, layer in enumerate(layers):
        depth_of.update({id(p): i + 1 for p in layer.parameters()})
    scales = depth_lr_scales(len(layers), decay)
    by_depth: dict[int, list[nn.Parameter]] = {}
    for p in trainable:
        by_depth.setdefault(depth_of.get(id(p), top), []).append(p)
    return [{"params": by_depth[d], "lr": lr * scales[d]} for d in sorted(by_depth)]
