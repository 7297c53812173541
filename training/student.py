"""Student construction: a pretrained encoder, optionally cut to K layers, mean pooling,
and a learnable linear projection to d, saved as a plain sentence-transformers pipeline
(Transformer -> Pooling -> Dense -> Normalize)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from sentence_transformers import SentenceTransformer

try:
    from sentence_transformers.sentence_transformer import modules as models
except ImportError:  # sentence-transformers < 5.7
    from sentence_transformers import models  # type: ignore[no-redef]
from torch import nn

from distilembed.artifacts import require_checkpoint
from distilembed.errors import UserError, first_line
from training.teachers import resolve_model


def encoder_layers(auto_model: nn.Module) -> nn.ModuleList:
    for path in ("encoder.layer", "encoder.layers", "transformer.layer", "layers"):
        node: object = auto_model
        for part in path.split("."):
            node = getattr(node, part, None)
        if isinstance(node, nn.ModuleList):
            return node
    raise UserError(f"cannot find the encoder layers of {type(auto_model).__name__}")


def keep_layers(auto_model: nn.Module, keep: Sequence[int]) -> None:
    """Keep only the listed encoder layers (in order) and update the config to match."""
    layers = encoder_layers(auto_model)
    n = len(layers)
    if not keep or any(i < 0 or i >= n for i in keep):
        raise UserError(f"layers {list(keep)} out of range for a {n}-layer encoder")
    kept = nn.ModuleList([layers[i] for i in keep])
    parent_path = "encoder" if hasattr(auto_model, "encoder") else "transformer"
    parent = getattr(auto_model, parent_path, auto_model)
    attr = "layer" if hasattr(parent, "layer") else "layers"
    setattr(parent, attr, kept)
    auto_model.config.num_hidden_layers = len(kept)


def spread_layers(total: int, k: int) -> list[int]:
    """K of ``total`` layers evenly spread and always including the last one."""
    if k >= total:
        return list(range(total))
    step = total / k
    return sorted({min(total - 1, round((i + 1) * step) - 1) for i in range(k)})


def build_student(
    init: str = "all-MiniLM-L6-v2",
    dim: int = 128,
    layers: int | None = None,
    *,
    max_seq_len: int = 128,
    device: str = "cpu",
    freeze_embeddings: bool = False,
) -> SentenceTransformer:
    """Transformer(init, K evenly spread layers) -> mean Pooling -> Dense(hidden, dim) -> Normalize."""
    path = resolve_model(init)
    try:
        transformer = models.Transformer(path, max_seq_length=max_seq_len)
    except OSError as exc:
        raise UserError(f"cannot load student init {init!r}: {first_line(exc)}") from exc
    hidden = (
        transformer.get_embedding_dimension()
        if hasattr(transformer, "get_embedding_dimension")
        else transformer.get_word_embedding_dimension()
    )
    if dim > hidden:
        raise UserError(f"projection dim {dim} must be at most the student's hidden size {hidden}")
    if dim < 1:
        raise UserError(f"projection dim must be positive, got {dim}")
    if layers is not None:
        total = len(encoder_layers(transformer.auto_model))
        if layers > total:
            raise UserError(f"--layers {layers}: the student {init!r} has {total} layers")
        keep_layers(transformer.auto_model, spread_layers(total, layers))
    if freeze_embeddings:
        # The vocabulary x hidden matrix dominates a CPU step's optimiser work; keeping it fixed
        # trades a little flexibility for speed.
        transformer.auto_model.get_input_embeddings().weight.requires_grad_(False)
    pooling = models.Pooling(hidden, pooling_mode="mean")
    modules = [transformer, pooling, linear_head(hidden, dim), models.Normalize()]
    return SentenceTransformer(modules=modules, device=device)


def linear_head(n_in: int, dim: int) -> nn.Module:
    dense = models.Dense(n_in, dim, bias=True, activation_function=nn.Identity())
    nn.init.xavier_uniform_(dense.linear.weight)
    nn.init.zeros_(dense.linear.bias)
    return dense


def load_trained_weights(student: SentenceTransformer, checkpoint: str) -> None:
    """Copy every weight of a saved checkpoint of the same shape into ``student``: the start of an
    ``--init-from`` run, and the weights of a ``--resume`` snapshot."""
    path = require_checkpoint(checkpoint)
    trained = SentenceTransformer(str(path), device=str(student.device))
    mine, theirs = student.state_dict(), trained.state_dict()
    same = {k for k in mine.keys() & theirs.keys() if mine[k].shape == theirs[k].shape}
    mismatched = sorted((mine.keys() | theirs.keys()) - same)
    if mismatched:
        raise UserError(
            f"checkpoint {checkpoint} has another shape than the student ({len(mismatched)} tensors differ, "
            f"e.g. {mismatched[0]})"
        )
    student.load_state_dict(theirs)


def tokenize(student: SentenceTransformer, texts: list[str]) -> dict[str, Any]:
    """The student's tokenised batch, tensors on its device."""
    features = student.tokenize(texts)
    return {k: v.to(student.device) if torch.is_tensor(v) else v for k, v in features.items()}


def encoder_inputs(features: dict[str, Any]) -> dict[str, Any]:
    """What the Hugging Face encoder itself takes of a tokenised batch."""
    return {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in features}


def projected(student: SentenceTransformer, features: dict[str, Any]) -> torch.Tensor:
    """The student's d-dim output of a tokenised batch before normalisation (what the distillation
    losses see); ``features`` is left as it was."""
    out = dict(features)
    for module in list(student)[:-1]:  # everything but Normalize
        out = module(out)
    return out["sentence_embedding"]


def projected_embeddings(student: SentenceTransformer, texts: list[str]) -> torch.Tensor:
    """:func:`projected` of ``texts``."""
    return projected(student, tokenize(student, texts))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
