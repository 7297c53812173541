"""NLI triplets from the Hugging Face Hub (``hf:ID``) via the ``datasets`` library, for users online."""

from __future__ import annotations

import logging
from typing import Any

from distilembed.errors import UserError
from training.data.records import Triplet

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
    missing = [name for name in columns if name not in dataset.column_names]
    if missing:
        raise UserError(
            f"{dataset_id} has no column {', '.join(missing)} (columns: {', '.join(dataset.column_names)})"
        )
    values = [dataset[column] for column in columns]
    rows = [["" if v is None else str(v).strip() for v in row] for row in zip(*values, strict=True)]
    out = [Triplet(*texts) for texts in rows if all(texts)]
    if len(out) < len(rows):
        log.warning("%s: skipped %d malformed rows (empty text)", dataset_id, len(rows) - len(out))
    if not out:
        raise UserError(f"no triplets in {dataset_id}")
    return out
