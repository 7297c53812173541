"""Matryoshka after training: a rotation of a student's output, fitted so that its first m coordinates make
good m-dim embeddings, folded into the last Dense layer.

Matryoshka-Adaptor (Yoon, Chen, Arik, Pfister. *Matryoshka-Adaptor: Unsupervised and Supervised Tuning for
Smaller Embedding Dimensions.* EMNLP 2024) learns a map of frozen embeddings after which their prefixes serve
at lower widths. We restrict the map to a rotation R (d x d, ``R R^T = I``): every cosine at the full width
stays what it was, so the student's d-dim scores, and the vectors of an index built at full width, do not
change; only what each prefix holds is learned. With labelled pairs (a, b, g) (STS-B train) and NLI triplets
(x, x+, x-)::

    L(R) = sum_{m in M, m < d} c_m [ -r(cos((a R)_{1:m}, (b R)_{1:m}), g) + lambda * L_CL((x R)_{1:m}) ]

r is Pearson's correlation over all the pairs (:func:`pearson_loss`), ``L_CL`` the fine-tuning stage's InfoNCE
with in-batch and hard negatives (DistilCSE eq. 7, in batches of triplets), c_m the Matryoshka weights; the
full width's term is constant and skipped. R is the matrix exponential of a skew-symmetric matrix
(``torch.nn.utils.parametrizations.orthogonal``), starts at the identity, and is trained on the Dense outputs,
computed once, so a step costs no encoder pass. The step kept is the one with the best mean STS-B dev over the
widths (step 0, the identity, included). The fold is whitening's with a zero mean: ``A' = R^T A, b' = R^T b``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm

from distilembed.artifacts import require_checkpoint, sha256_tree
from distilembed.errors import UserError
from training.checkpoint import save_checkpoint, source_manifest
from training.data.pairs import Triplet
from training.data.sts import STSPair
from training.evaluation import EncodeFn, evaluate_pairs, matryoshka_scores, rounded, truncated, vector_lookup
from training.losses.distilcse import ContrastiveFinetuneLoss
from training.losses.matryoshka import Widths, matryoshka_loss, prefix
from training.teachers import embedding_dimension
from training.whitening import apply_whitening, dense_outputs

ScoreWidths = Callable[[np.ndarray], dict[int, float]]
CARRIED = ("teacher", "student", "config", "method", "training", "seconds")


@dataclass(frozen=True)
class RotationSettings:
    steps: int = 800
    lr: float = 3e-4
    triplet_weight: float = 0.1
    batch_size: int = 512
    temperature: float = 0.05
    eval_every: int = 50
    seed: int = 42


@dataclass(frozen=True)
class LabelledVectors:
    """Dense outputs of the fitting data: pairs (left, right, gold) and triplets, either may be empty."""

    left: np.ndarray
    right: np.ndarray
    gold: np.ndarray
    anchor: np.ndarray
    positive: np.ndarray
    negative: np.ndarray


@dataclass
class RotationFit:
    rotation: np.ndarray  # (d, d), float64, orthogonal
    best_step: int
    dev: dict[int, float]
    start_dev: dict[int, float]
    curve: list[dict[str, float]]


def pearson_loss(predicted: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """The STS score itself, made differentiable: with predictions ``x`` (the pairs' cosines) and gold
    scores ``y`` over one batch (here the whole labelled pair set), both 1-d of one length >= 2::

        L = -r(x, y),    r = sum_i (x_i - mean(x)) (y_i - mean(y)) / (||x - mean(x)|| ||y - mean(y)||)

    Spearman's rank correlation, which the benchmarks report, has no gradient; Pearson's is its smooth
    stand-in (as fitting the cosines directly, like sentence-transformers' ``CosineSimilarityLoss``, but
    invariant to the cosines' scale and offset, which a rotation changes at every prefix width).
    """
    if predicted.ndim != 1 or predicted.shape != gold.shape or len(predicted) < 2:
        raise ValueError(
            f"want two 1-d tensors of one length >= 2, got {tuple(predicted.shape)}, {tuple(gold.shape)}"
        )
    x = predicted - predicted.mean()
    y = gold.to(predicted.dtype) - gold.to(predicted.dtype).mean()
    return -(x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-12)


def rotation_loss(
    pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    triplets: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    widths: Widths,
    triplet_weight: float,
    contrastive: ContrastiveFinetuneLoss,
) -> torch.Tensor:
    """The docstring's L on already rotated vectors: ``pairs`` (left, right, gold), ``triplets``
    (anchor, positive, negative); widths below d only (the full width's term is constant)."""

    def at(width: int) -> torch.Tensor:
        term = torch.zeros(())
        if pairs is not None:
            left, right, gold = pairs
            cos = (F.normalize(prefix(left, width), dim=1) * F.normalize(prefix(right, width), dim=1)).sum(1)
            term = term + pearson_loss(cos, gold)
        if triplets is not None and triplet_weight > 0:
            term = term + triplet_weight * contrastive(*(prefix(x, width) for x in triplets))
        return term

    return matryoshka_loss(at, Widths(widths.widths[1:], widths.weights[1:]))


def orthogonalise(matrix: np.ndarray) -> np.ndarray:
    """The nearest orthogonal matrix (the polar factor ``U V^T``), in float64: the trained R is
    orthogonal to float32's precision, and this makes the fold's full-width cosines exact."""
    u, _, vt = np.linalg.svd(np.asarray(matrix, dtype=np.float64))
    return u @ vt


def fit_rotation(
    data: LabelledVectors,
    widths: Widths,
    score: ScoreWidths,
    settings: RotationSettings,
    progress: bool = False,
) -> RotationFit:
    """Train R from the identity; ``score(R)`` gives STS-B dev at each width, every ``eval_every``."""
    torch.manual_seed(settings.seed)
    dim = widths.widths[0]
    layer = torch.nn.Linear(dim, dim, bias=False)
    torch.nn.utils.parametrizations.orthogonal(layer)
    with torch.no_grad():
        layer.weight = torch.eye(dim)
    optimiser = torch.optim.Adam(layer.parameters(), lr=settings.lr)
    contrastive = ContrastiveFinetuneLoss(tau=settings.temperature)
    tensors = [torch.as_tensor(array, dtype=torch.float32) for array in vars(data).values()]
    left, right, gold, anchor, positive, negative = tensors
    use_pairs, use_triplets = len(gold) > 1, len(anchor) > 0 and settings.triplet_weight > 0
    generator = torch.Generator().manual_seed(settings.seed)
    start = score(np.eye(dim))
    best = (float(np.mean(list(start.values()))), 0, np.eye(dim), start)
    curve: list[dict[str, float]] = [{"step": 0, "dev_spearman": round(best[0], 2)}]
    for step in tqdm(range(1, settings.steps + 1), desc="rotation", disable=not progress):
        pair_terms = (layer(left), layer(right), gold) if use_pairs else None
        triplet_terms = None
        if use_triplets:
            rows = torch.randint(len(anchor), (min(settings.batch_size, len(anchor)),), generator=generator)
            triplet_terms = (layer(anchor[rows]), layer(positive[rows]), layer(negative[rows]))
        loss = rotation_loss(pair_terms, triplet_terms, widths, settings.triplet_weight, contrastive)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        point: dict[str, float] = {"step": step, "loss": round(loss.item(), 5)}
        if step % settings.eval_every == 0 or step == settings.steps:
            rotation = orthogonalise(layer.weight.detach().double().numpy().T)
            dev = score(rotation)
            mean = float(np.mean(list(dev.values())))
            point["dev_spearman"] = round(mean, 2)
            if mean > best[0]:
                best = (mean, step, rotation, dev)
        curve.append(point)
    _, best_step, rotation, dev = best
    return RotationFit(rotation, best_step, dev, start, curve)


def width_scorer(
    sentences: Sequence[str], outputs: np.ndarray, pairs: Sequence[STSPair], widths: Widths
) -> ScoreWidths:
    """``score(R)``: Spearman x100 of ``pairs`` at each width, from the sentences' Dense outputs."""

    def score(rotation: np.ndarray) -> dict[int, float]:
        encode = vector_lookup(sentences, outputs @ rotation)
        return {m: evaluate_pairs(truncated(encode, m), pairs) for m in widths.widths}

    return score


def labelled_vectors(
    encode: EncodeFn, pairs: Sequence[STSPair], triplets: Sequence[Triplet]
) -> LabelledVectors:
    """Every distinct sentence of the fitting data through ``encode`` (the student's output), once."""
    columns = [[p.sentence1 for p in pairs], [p.sentence2 for p in pairs]]
    columns += [[t.anchor for t in triplets], [t.positive for t in triplets], [t.negative for t in triplets]]
    texts = sorted({text for column in columns for text in column})
    rows = dict(zip(texts, np.asarray(encode(texts)), strict=True)) if texts else {}
    dim = next(iter(rows.values())).shape[0] if rows else 0

    def stack(items: Sequence[str]) -> np.ndarray:
        return np.stack([rows[s] for s in items]) if items else np.zeros((0, dim), dtype=np.float32)

    left, right, anchor, positive, negative = map(stack, columns)
    return LabelledVectors(
        left, right, np.array([p.score for p in pairs], dtype=np.float32), anchor, positive, negative
    )


@dataclass(frozen=True)
class RotationRequest:
    """What to fit: the labelled data, the dev pairs that select the step, the widths and settings."""

    pairs: Sequence[STSPair]
    triplets: Sequence[Triplet]
    dev_pairs: Sequence[STSPair]
    widths: Sequence[int]
    weights: Sequence[float]
    settings: RotationSettings
    data_info: dict[str, Any]


def fit_output_rotation(encode: EncodeFn, dim: int, request: RotationRequest) -> tuple[RotationFit, Widths]:
    """Check the request against a ``dim``-wide output, then fit R on ``encode``'s vectors (a
    checkpoint's Dense outputs, or a bundle's embeddings: R commutes with normalising)."""
    settings = request.settings
    if len(request.pairs) < 2 and not (request.triplets and settings.triplet_weight > 0):
        raise UserError("rotate needs labelled pairs (--pairs) or triplets with --triplet-weight > 0")
    widths = Widths.parse(request.widths or [dim, dim // 2, dim // 4], request.weights, dim)
    if not widths.nested:
        raise UserError(f"--matryoshka needs a width below the student's {dim}")
    if not any(widths.weights[1:]):
        raise UserError("--matryoshka-weights: every width below the full one has weight 0, nothing to fit")
    dev = request.dev_pairs
    dev_sentences = sorted({p.sentence1 for p in dev} | {p.sentence2 for p in dev})
    dev_outputs = np.asarray(encode(dev_sentences))
    data = labelled_vectors(encode, request.pairs, request.triplets)
    score = width_scorer(dev_sentences, dev_outputs, dev, widths)
    return fit_rotation(data, widths, score, settings, progress=True), widths


def rotation_record(source: Path, fit: RotationFit, request: RotationRequest) -> dict[str, Any]:
    """The manifest's ``rotate`` entry: where from, on what, and what dev said at each width."""
    return {
        "source": {"path": str(source), "files": sha256_tree(source)},
        **request.data_info,
        "settings": asdict(request.settings),
        "best_step": fit.best_step,
        "source_dev_by_width": {str(m): round(v, 2) for m, v in fit.start_dev.items()},
        "dev_by_width": {str(m): round(v, 2) for m, v in fit.dev.items()},
    }


def rotate_checkpoint(
    source: Path, out: Path, request: RotationRequest, sts_sets: Mapping[str, Any], overwrite: bool = False
) -> dict[str, Any]:
    """Write ``out``: ``source`` with the fitted rotation folded into its last Dense layer."""
    require_checkpoint(source)
    model = SentenceTransformer(str(source), device="cpu")
    dim = embedding_dimension(model)
    fit, widths = fit_output_rotation(
        lambda texts: dense_outputs(model, texts, batch_size=128, progress=True), dim, request
    )
    apply_whitening(model, np.zeros(dim), fit.rotation)
    first = source_manifest(source)
    sts, matryoshka = matryoshka_scores(model, sts_sets, widths)
    manifest = {
        **{key: first[key] for key in CARRIED if key in first},
        "method": first.get("method", "unknown"),
        "scores": rounded(sts["scores"]),
        "matryoshka": {**matryoshka, "fitted_by": "rotate"},  # widths are nested: selection is the mean
        "rotate": rotation_record(source, fit, request),
    }
    return save_checkpoint(model, out, manifest, curve=fit.curve, overwrite=overwrite)
