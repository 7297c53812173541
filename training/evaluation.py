"""STS evaluation as SimCSE reports it: Spearman x100 of cosine similarity against gold scores."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from rich import box
from rich.table import Table
from scipy.stats import spearmanr

from training.data.sts import STS_SET_ORDER, STSPair, find_sts_sets

if TYPE_CHECKING:
    from pathlib import Path

    from sentence_transformers import SentenceTransformer

    from training.losses.matryoshka import Widths

EncodeFn = Callable[[list[str]], np.ndarray]
AVG = "Avg."


def cosine_rows(emb1: np.ndarray, emb2: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity; a zero vector scores 0 against anything."""
    a = np.asarray(emb1, dtype=np.float64)
    b = np.asarray(emb2, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"want two (n, d) arrays of one shape, got {a.shape} and {b.shape}")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def spearman_x100(predicted: Sequence[float] | np.ndarray, gold: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation x100 (NaN when either side is constant)."""
    pred = np.asarray(predicted, dtype=np.float64)
    ref = np.asarray(gold, dtype=np.float64)
    if pred.shape != ref.shape or pred.ndim != 1:
        raise ValueError(f"want two 1-d sequences of one length, got {pred.shape} and {ref.shape}")
    if len(pred) < 2 or np.all(pred == pred[0]) or np.all(ref == ref[0]):
        return math.nan
    return float(spearmanr(pred, ref).statistic) * 100


def pair_cosines(encode: EncodeFn, pairs: Sequence[STSPair]) -> np.ndarray:
    """Cosine per pair, encoding each distinct sentence once."""
    if not pairs:
        raise ValueError("no pairs to score")
    index: dict[str, int] = {}
    for pair in pairs:
        index.setdefault(pair.sentence1, len(index))
        index.setdefault(pair.sentence2, len(index))
    vectors = np.asarray(encode(list(index)))
    if vectors.ndim != 2 or len(vectors) != len(index):
        raise ValueError(f"encoder returned shape {vectors.shape} for {len(index)} sentences")
    left = vectors[[index[p.sentence1] for p in pairs]]
    right = vectors[[index[p.sentence2] for p in pairs]]
    return cosine_rows(left, right)


def truncated(encode: EncodeFn, width: int) -> EncodeFn:
    """``encode`` keeping the first ``width`` coordinates (a Matryoshka width; cosine is scale-free,
    so no re-normalising is needed to score it)."""
    return lambda sentences: np.asarray(encode(sentences))[:, :width]


def memoised(encode: EncodeFn) -> EncodeFn:
    """``encode`` that encodes each distinct sentence once across calls (scoring several widths)."""
    cache: dict[str, np.ndarray] = {}

    def cached(sentences: list[str]) -> np.ndarray:
        new = [s for s in dict.fromkeys(sentences) if s not in cache]
        if new:
            cache.update(zip(new, np.asarray(encode(new)), strict=True))
        return np.stack([cache[s] for s in sentences])

    return cached


def evaluate_pairs(encode: EncodeFn, pairs: Sequence[STSPair]) -> float:
    return spearman_x100(pair_cosines(encode, pairs), [p.score for p in pairs])


def vector_lookup(sentences: Sequence[str], vectors: np.ndarray) -> EncodeFn:
    """An encode function over precomputed ``vectors`` (row i is ``sentences[i]``'s)."""
    rows = dict(zip(sentences, np.asarray(vectors, dtype=np.float32), strict=True))
    return lambda texts: np.stack([rows[text] for text in texts])


def evaluate_sts(
    encode: EncodeFn,
    sets: Mapping[str, Sequence[STSPair] | Mapping[str, Sequence[STSPair]]],
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Score every set; ``progress(name)`` is called as each set finishes. A set given as subsets (STS12-16)
    scores SentEval's 'all' as SimCSE reports it: one Spearman over the concatenated predictions and gold of
    all subsets. Returns ``{"scores": {set: x, ..., "Avg.": mean}, "subsets": {set: {subset: x}}, "pairs":
    {set: n}}``."""
    scores: dict[str, float] = {}
    subsets: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for name, data in sets.items():
        groups = data if isinstance(data, Mapping) else {name: data}
        cosines = {subset: pair_cosines(encode, pairs) for subset, pairs in groups.items()}
        if isinstance(data, Mapping):
            subsets[name] = {s: spearman_x100(c, [p.score for p in groups[s]]) for s, c in cosines.items()}
        gold = [p.score for pairs in groups.values() for p in pairs]
        scores[name] = spearman_x100(np.concatenate(list(cosines.values())), gold)
        counts[name] = len(gold)
        if progress is not None:
            progress(name)
    if scores:
        scores[AVG] = float(np.mean(list(scores.values())))
    return {"scores": scores, "subsets": subsets, "pairs": counts}


def sentence_transformer_encoder(model: SentenceTransformer, batch_size: int = 64) -> EncodeFn:
    def encode(sentences: list[str]) -> np.ndarray:
        return np.asarray(
            model.encode(sentences, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        )

    return encode


def dev_scorer(dev_pairs: list[Any], widths: Widths) -> Any:
    """The selection score: STS-B dev; for a Matryoshka student its mean over the trained widths."""

    def dev_score(model: Any) -> float:
        encode = memoised(sentence_transformer_encoder(model, batch_size=128))
        return float(np.mean([evaluate_pairs(truncated(encode, m), dev_pairs) for m in widths.widths]))

    return dev_score


def matryoshka_scores(
    model: Any, sets: Mapping[str, Any], widths: Widths
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A student's STS scores at full width, and the Matryoshka report (the trained widths and
    weights, and the STS scores at each narrower width), every sentence encoded once."""
    encode = memoised(sentence_transformer_encoder(model, batch_size=128))
    sts = evaluate_sts(encode, sets)
    by_width = {m: evaluate_sts(truncated(encode, m), sets) for m in widths.widths[1:]}
    report = {
        "widths": list(widths.widths),
        "weights": list(widths.weights),
        "selection": "mean STS-B dev over the widths" if widths.nested else "STS-B dev",
        "scores": {str(m): rounded(r["scores"]) for m, r in by_width.items()},
    }
    return sts, report


def rounded(scores: Mapping[str, float]) -> dict[str, float]:
    return {name: round(value, 2) for name, value in scores.items()}


def final_scores(best_dir: Path, device: str, sts_dir: Path, widths: Widths) -> tuple[Any, dict[str, Any]]:
    """The best student, and its manifest's ``matryoshka`` report, ``scores`` and ``sts_subsets``."""
    from sentence_transformers import SentenceTransformer

    best = SentenceTransformer(str(best_dir), device=device)
    sts, report = matryoshka_scores(best, find_sts_sets(sts_dir), widths)
    return best, {"matryoshka": report, "scores": rounded(sts["scores"]), "sts_subsets": sts["subsets"]}


def format_params(params: int | None) -> str:
    if params is None:
        return "-"
    if params >= 1_000_000:
        return f"{params / 1e6:.1f}M"
    if params >= 1_000:
        return f"{params / 1e3:.1f}K"
    return str(params)


def format_table(results: Mapping[str, Any], model_name: str, dim: int | None, params: int | None) -> Table:
    """One row like the papers' Table 1: STS12..SICK-R and Avg. (those present), Dim, Params."""
    scores: Mapping[str, float] = results.get("scores", results)
    known = [name for name in STS_SET_ORDER if name in scores]
    extra = [name for name in scores if name not in STS_SET_ORDER and name != AVG]
    columns = [*known, *extra, *([AVG] if AVG in scores else [])]
    table = Table(title="STS (Spearman x100 of cosine)", box=box.SIMPLE_HEAD)
    # Numbers never get cut; a long model name folds instead.
    table.add_column("Model", overflow="fold", min_width=8)
    for name in [*columns, "Dim", "Params"]:
        table.add_column(name, justify="right", no_wrap=True, min_width=max(len(name), 5))
    cells = ["nan" if math.isnan(scores[c]) else f"{scores[c]:.2f}" for c in columns]
    table.add_row(model_name, *cells, "-" if dim is None else str(dim), format_params(params))
    return table
