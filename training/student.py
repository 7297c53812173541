"""Student construction: a pretrained encoder, optionally cut to K layers, mean pooling,
and a learnable linear projection to d, saved as a plain sentence-transformers pipeline
(Transformer -> Pooling -> Dense -> Normalize).

Warm start of the projection (``--init-projection ridge``): the papers initialise it at random, so
the first hundreds of steps spend their gradient on a head that maps pretrained features to nowhere,
and that noisy gradient also flows into the pretrained encoder. Fitting the head first, in closed
form, with the encoder frozen (linear probing, then fine-tuning: Kumar et al., *Fine-Tuning can
Distort Pretrained Features and Underperform Out-of-Distribution*, ICLR 2022) starts distillation
from the best linear map of the student's pooled features onto the teacher's PCA-d targets::

    W, b = argmin_{W, b} 1/n sum_i ||W x_i + b - t_i||^2 + l2 * ||W||_F^2

which costs one forward pass over a sample of the training sentences (``--projection-sample``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
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

log = logging.getLogger(__name__)


def _layer_list(auto_model: nn.Module) -> tuple[nn.Module, str]:
    """The module that holds the encoder layers, and the name of their ``ModuleList``."""
    for owner, attr in (
        ("encoder", "layer"),
        ("encoder", "layers"),
        ("transformer", "layer"),
        ("", "layers"),
    ):
        parent = getattr(auto_model, owner, None) if owner else auto_model
        if isinstance(getattr(parent, attr, None), nn.ModuleList):
            return parent, attr
    raise UserError(f"cannot find the encoder layers of {type(auto_model).__name__}")


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
    hidden = transformer.auto_model.config.hidden_size
    if dim > hidden:
        raise UserError(f"projection dim {dim} must be at most the student's hidden size {hidden}")
    if dim < 1:
        raise UserError(f"projection dim must be positive, got {dim}")
    if layers is not None:
        parent, attr = _layer_list(transformer.auto_model)
        every = getattr(parent, attr)
        if layers > len(every):
            raise UserError(f"--layers {layers}: the student {init!r} has {len(every)} layers")
        setattr(parent, attr, nn.ModuleList([every[i] for i in spread_layers(len(every), layers)]))
        transformer.auto_model.config.num_hidden_layers = len(getattr(parent, attr))
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


def ridge_projection(
    features: np.ndarray, targets: np.ndarray, l2: float = 1e-3
) -> tuple[np.ndarray, np.ndarray]:
    """(weight (d, h), bias (d,)) minimising the mean squared error of ``features @ weight.T + bias``
    against ``targets`` plus ``l2 * mean_diag(X^T X) * ||weight||^2`` (the penalty scales with the
    features, so ``l2`` is unit-free)."""
    x, t = np.asarray(features, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    if x.ndim != 2 or t.ndim != 2 or len(x) != len(t):
        raise ValueError(f"features {x.shape} and targets {t.shape} must be (n, h) and (n, d)")
    x_mean, t_mean = x.mean(axis=0), t.mean(axis=0)
    xc, tc = x - x_mean, t - t_mean
    gram = xc.T @ xc / len(x)
    penalty = l2 * float(np.trace(gram)) / gram.shape[0]
    weight = np.linalg.solve(gram + penalty * np.eye(gram.shape[0]), xc.T @ tc / len(x)).T
    bias = t_mean - x_mean @ weight.T
    return weight.astype(np.float32), bias.astype(np.float32)


def last_dense(model: Any) -> int:
    """Index of the pipeline's last Dense module, which must be affine and followed only by Normalize."""
    kinds = [type(module).__name__ for module in model]
    tail = [kind for kind in kinds if kind != "Normalize"]
    if not tail or tail[-1] != "Dense" or kinds[len(tail) :] not in ([], ["Normalize"]):
        raise UserError(f"whitening, rotation and --init-projection need a final Dense layer, not {kinds}")
    dense = model[len(tail) - 1]
    activation = type(dense.activation_function).__name__
    if activation != "Identity":
        raise UserError(f"the final Dense layer applies {activation}: it must be affine")
    return len(tail) - 1


@torch.no_grad()
def pooled_features(student: SentenceTransformer, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """The student's output just before its Dense projection (the pooled hidden states)."""
    stop = last_dense(student)
    was_training = student.training
    student.eval()
    order = np.argsort([len(t) for t in texts], kind="stable")  # length-sorted batches pad less
    out = np.empty((len(texts), list(student)[stop].linear.in_features), dtype=np.float32)
    for lo in range(0, len(texts), batch_size):
        rows = order[lo : lo + batch_size]
        features = tokenize(student, [texts[i] for i in rows])
        for module in list(student)[:stop]:
            features = module(features)
        out[rows] = features["sentence_embedding"].float().cpu().numpy()
    student.train(was_training)
    return out


def init_projection(
    student: SentenceTransformer, texts: list[str], targets: np.ndarray, l2: float = 1e-3
) -> dict[str, float]:
    """Set the student's Dense to the ridge fit of its pooled features of ``texts`` onto
    ``targets``; returns the fit's mean squared error per example before and after (summed over
    dimensions, the HPD loss's scale) and the explained fraction of the target variance."""
    features = pooled_features(student, texts)
    dense = list(student)[last_dense(student)].linear
    t = np.asarray(targets, dtype=np.float32)

    def mse(weight: np.ndarray, bias: np.ndarray) -> float:
        return float(np.mean(np.sum((features @ weight.T + bias - t) ** 2, axis=1)))

    before = mse(dense.weight.detach().cpu().numpy(), dense.bias.detach().cpu().numpy())
    weight, bias = ridge_projection(features, t, l2)
    with torch.no_grad():
        dense.weight.copy_(torch.from_numpy(weight))
        dense.bias.copy_(torch.from_numpy(bias))
    after = mse(weight, bias)
    total = float(np.mean(np.sum((t - t.mean(axis=0)) ** 2, axis=1)))
    report = {
        "sample": len(texts),
        "mse_random_init": round(before, 4),
        "mse_ridge": round(after, 4),
        "r2": round(1.0 - after / total, 4) if total > 0 else 0.0,
        "l2": l2,
    }
    log.info("projection warm start: %s", report)
    return report
