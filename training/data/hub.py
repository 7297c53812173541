"""Hugging Face Hub data sets via the ``datasets`` library, for users who are online."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from distilembed.errors import UserError
from training.data.records import Pair, Triplet

log = logging.getLogger(__name__)


def _load(dataset_id: str, subset: str | None, split: str, limit: int | None) -> Any:
    """One split as a ``datasets.Dataset``, cut to ``limit`` rows; any failure is a UserError."""
    try:
        import datasets
    except ImportError as exc:
        raise UserError(
            f"loading {dataset_id!r} needs the 'datasets' package (pip install 'distilembed[train]'); "
            "or pass a local file"
        ) from exc
    name = f"{dataset_id}" + (f" ({subset})" if subset else "")
    try:
        dataset = datasets.load_dataset(dataset_id, subset, split=split)
    except Exception as exc:  # offline, unknown id, bad subset or split: all one message
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise UserError(
            f"could not load {name} split {split!r} from the Hugging Face Hub: the hub is unreachable "
            f"or the id is unknown ({reason}); pass a local file instead"
        ) from exc
    if limit is not None and limit < dataset.num_rows:
        dataset = dataset.select(range(max(limit, 0)))
    return dataset


def _columns(dataset: Any, names: Sequence[str], dataset_id: str) -> list[list[Any]]:
    missing = [name for name in names if name not in dataset.column_names]
    if missing:
        raise UserError(
            f"{dataset_id} has no column {', '.join(missing)} (columns: {', '.join(dataset.column_names)})"
        )
    return [list(dataset[name]) for name in names]


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _finish(kept: int, skipped: int, dataset_id: str, what: str) -> None:
    if skipped:
        log.warning("%s: skipped %d malformed rows (empty text or bad label)", dataset_id, skipped)
    if not kept:
        raise UserError(f"no {what} in {dataset_id}")


def load_hf_triplets(
    dataset_id: str,
    subset: str | None = "triplet",
    split: str = "train",
    limit: int | None = None,
    *,
    columns: tuple[str, str, str] = ("anchor", "positive", "negative"),
) -> list[Triplet]:
    """(anchor, positive, negative) triplets, e.g. ``sentence-transformers/all-nli``."""
    dataset = _load(dataset_id, subset, split, limit)
    out: list[Triplet] = []
    skipped = 0
    for row in zip(*_columns(dataset, columns, dataset_id), strict=True):
        texts = [_text(value) for value in row]
        if all(texts):
            out.append(Triplet(*texts))
        else:
            skipped += 1
    _finish(len(out), skipped, dataset_id, "triplets")
    return out


def load_hf_sentences(
    dataset_id: str,
    column: str = "text",
    split: str = "train",
    limit: int | None = None,
    subset: str | None = None,
) -> list[str]:
    """Non-empty stripped texts of one column."""
    dataset = _load(dataset_id, subset, split, limit)
    (values,) = _columns(dataset, [column], dataset_id)
    out = [text for text in map(_text, values) if text]
    _finish(len(out), len(values) - len(out), dataset_id, "sentences")
    return out


def load_hf_pairs(
    dataset_id: str = "sentence-transformers/quora-duplicates",
    subset: str | None = "pair-class",
    split: str = "train",
    limit: int | None = None,
    *,
    columns: tuple[str, str, str] = ("sentence1", "sentence2", "label"),
    id_column: str | None = None,
) -> list[Pair]:
    """Labelled pairs (text1, text2, label), e.g. Quora duplicates; ids from ``id_column`` if given."""
    dataset = _load(dataset_id, subset, split, limit)
    names = [*columns, id_column] if id_column else list(columns)
    values = _columns(dataset, names, dataset_id)
    ids = values[3] if id_column else [""] * len(values[0])
    out: list[Pair] = []
    skipped = 0
    for text1, text2, label, pair_id in zip(*values[:3], ids, strict=True):
        first, second = _text(text1), _text(text2)
        try:
            score = float(label)
        except (TypeError, ValueError):
            score = None
        if first and second and score is not None:
            out.append(Pair(first, second, score, _text(pair_id)))
        else:
            skipped += 1
    _finish(len(out), skipped, dataset_id, "pairs")
    return out
