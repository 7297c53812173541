"""Sentence-pair and triplet corpora: SimCSE NLI csv, SentEval SNLI, Quora duplicate questions, and
NLI triplets from the Hugging Face Hub (``hf:ID``, through the ``datasets`` library)."""

from __future__ import annotations

import csv
import gzip
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import TextIO

from distilembed.errors import UserError
from distilembed.paths import resolve_data_path
from training.data.text import RowLog

log = logging.getLogger(__name__)
TRIPLET_HEADER = ("sent0", "sent1", "hard_neg")
HUB_COLUMNS = ("anchor", "positive", "negative")
NLI_LABELS = frozenset({"entailment", "neutral", "contradiction"})


@dataclass(frozen=True, slots=True)
class Triplet:
    """An anchor, a sentence that means the same, and a hard negative."""

    anchor: str
    positive: str
    negative: str

    def texts(self) -> tuple[str, str, str]:
        return self.anchor, self.positive, self.negative


@dataclass(frozen=True, slots=True)
class NLIPair:
    """A premise/hypothesis pair with its gold label (entailment, neutral or contradiction)."""

    premise: str
    hypothesis: str
    label: str


@dataclass(frozen=True, slots=True)
class Pair:
    """Two texts with a score or class label; ``id`` is the source's pair id, when it has one."""

    text1: str
    text2: str
    label: float
    id: str = ""


def _open(path: Path, newline: str) -> TextIO:
    # newline="" for the csv module (quoted fields may span lines); utf-8-sig drops a leading BOM.
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rt", encoding="utf-8-sig", errors="replace", newline=newline)


def _check_file(path: str | Path, what: str, suffix: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    if not (path.name.endswith(suffix) or path.name.endswith(suffix + ".gz")):
        raise UserError(f"unknown {what} format (want {suffix} or {suffix}.gz): {path}")
    return path


def _csv_rows(handle: TextIO, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """(first physical line number, fields) for each record; blank lines are dropped."""
    reader = csv.reader(handle, delimiter=delimiter)
    start = 1
    for fields in reader:
        if fields:
            yield start, fields
        start = reader.line_num + 1


def read_nli_triplets(path: str | Path) -> list[Triplet]:
    """Triplets from a SimCSE-style csv with the header ``sent0,sent1,hard_neg``."""
    path = _check_file(path, "triplet file", ".csv")
    rows = RowLog(path)
    out: list[Triplet] = []
    with _open(path, newline="") as handle:
        records = _csv_rows(handle, delimiter=",")
        first = next(records, None)
        if first is None:
            raise UserError(f"triplet file is empty: {path}")
        header = tuple(name.strip() for name in first[1])
        if header != TRIPLET_HEADER:
            raise UserError(
                f"{path}: expected the header {','.join(TRIPLET_HEADER)}, got {','.join(first[1])[:80]}"
            )
        for lineno, fields in records:
            if len(fields) != 3:
                rows.skip(lineno, f"expected 3 fields, got {len(fields)}")
                continue
            texts = [field.strip() for field in fields]
            if not all(texts):
                rows.skip(lineno, "empty text")
                continue
            rows.check_utf8(lineno, *texts)
            out.append(Triplet(*texts))
    rows.finish()
    if not out:
        raise UserError(f"no triplets in {path}")
    return out


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"SNLI file not found: {path}")
    with _open(path, newline="\n") as handle:
        return [line.strip() for line in handle]


def read_senteval_snli(directory: str | Path, split: str) -> list[NLIPair]:
    """Pairs of one split in SentEval's layout: line-aligned ``s1.SPLIT``, ``s2.SPLIT``, ``labels.SPLIT``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"SNLI directory not found: {directory}")
    files = [directory / f"{name}.{split}" for name in ("s1", "s2", "labels")]
    premises, hypotheses, labels = (_read_lines(file) for file in files)
    if not len(premises) == len(hypotheses) == len(labels):
        lengths = map(len, (premises, hypotheses, labels))
        counts = ", ".join(f"{file.name}: {n}" for file, n in zip(files, lengths, strict=True))
        raise UserError(f"SNLI files of split {split!r} in {directory} differ in line count ({counts})")
    rows = RowLog(files[2])
    out: list[NLIPair] = []
    for lineno, (premise, hypothesis, label) in enumerate(zip(premises, hypotheses, labels, strict=True), 1):
        if label not in NLI_LABELS:
            rows.skip(lineno, f"bad label {label[:40]!r}")
        elif not premise or not hypothesis:
            rows.skip(lineno, "empty text", files[0] if not premise else files[1])
        else:
            rows.check_utf8(lineno, premise, hypothesis)
            out.append(NLIPair(premise, hypothesis, label))
    rows.finish()
    if not out:
        raise UserError(f"no SNLI pairs for split {split!r} in {directory}")
    return out


def snli_to_triplets(pairs: Sequence[NLIPair]) -> list[Triplet]:
    """SimCSE's recipe: per run of one premise, the i-th entailment with the i-th contradiction."""
    out: list[Triplet] = []
    for premise, run in groupby(pairs, key=lambda pair: pair.premise):
        group = list(run)
        positives = [pair.hypothesis for pair in group if pair.label == "entailment"]
        negatives = [pair.hypothesis for pair in group if pair.label == "contradiction"]
        out.extend(Triplet(premise, pos, neg) for pos, neg in zip(positives, negatives, strict=False))
    return out


def read_quora_pairs(path: str | Path) -> list[Pair]:
    """Quora duplicate-question pairs: ``is_duplicate \\t question1 \\t question2 \\t id``, no header."""
    path = _check_file(path, "Quora file", ".tsv")
    rows = RowLog(path)
    out: list[Pair] = []
    with _open(path, newline="") as handle:
        for lineno, fields in _csv_rows(handle, delimiter="\t"):
            if len(fields) != 4:
                rows.skip(lineno, f"expected 4 fields, got {len(fields)}")
                continue
            label, text1, text2, pair_id = (field.strip() for field in fields)
            if label not in {"0", "1"}:
                rows.skip(lineno, f"bad label {label[:40]!r}")
            elif not text1 or not text2:
                rows.skip(lineno, "empty text")
            else:
                rows.check_utf8(lineno, text1, text2)
                out.append(Pair(text1, text2, float(label), pair_id))
    rows.finish()
    if not out:
        raise UserError(f"no Quora pairs in {path}")
    return out


def _snli_triplets(directory: Path, splits: Sequence[str]) -> list[Triplet]:
    # Per split, so a premise run never spans two splits.
    out = [t for split in splits for t in snli_to_triplets(read_senteval_snli(directory, split))]
    if not out:
        raise UserError(f"no entailment/contradiction triplets in {directory} ({'+'.join(splits)})")
    return out


def load_triplets(source: str, data_root: str | Path | None = None) -> list[Triplet]:
    """Triplets from a SimCSE csv, an SNLI dir (``DIR`` or ``DIR:SPLIT[+SPLIT]``) or ``hf:ID[:SPLIT]``."""
    if source.startswith("hf:"):
        dataset_id, _, split = source.removeprefix("hf:").partition(":")
        if not dataset_id:
            raise UserError(f"no dataset id in {source!r} (want hf:OWNER/NAME)")
        return load_hf_triplets(dataset_id, split=split or "train")
    path = resolve_data_path(source, data_root)
    if path.is_file():
        if not (path.name.endswith(".csv") or path.name.endswith(".csv.gz")):
            raise UserError(f"unknown triplet source format (want .csv, an SNLI directory or hf:ID): {path}")
        return read_nli_triplets(path)
    if path.is_dir():
        splits = [split for split in ("dev", "test") if (path / f"labels.{split}").is_file()]
        if not splits:
            raise UserError(f"no SNLI labels.dev or labels.test in {path}; name the split as {source}:SPLIT")
        return _snli_triplets(path, splits)
    head, sep, splits_text = source.rpartition(":")
    if sep and head and splits_text:
        directory = resolve_data_path(head, data_root)
        if directory.is_dir():
            return _snli_triplets(directory, splits_text.split("+"))
    raise UserError(f"triplet source not found: {path}")


def load_hf_triplets(dataset_id: str, subset: str | None = "triplet", split: str = "train") -> list[Triplet]:
    """(anchor, positive, negative) triplets of a hub dataset, e.g. ``sentence-transformers/all-nli``;
    a failure to load is a one-line UserError."""
    try:
        import datasets
    except ImportError as exc:
        raise UserError(
            f"loading {dataset_id!r} needs the 'datasets' package (pip install 'distilembed[train]'); "
            "or pass a local file"
        ) from exc
    try:
        dataset = datasets.load_dataset(dataset_id, subset, split=split)
    except Exception as exc:  # offline, unknown id, bad subset or split: all one message
        name = dataset_id + (f" ({subset})" if subset else "")
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise UserError(
            f"could not load {name} split {split!r} from the Hugging Face Hub: the hub is unreachable "
            f"or the id is unknown ({reason}); pass a local file instead"
        ) from exc
    missing = [name for name in HUB_COLUMNS if name not in dataset.column_names]
    if missing:
        raise UserError(
            f"{dataset_id} has no column {', '.join(missing)} (columns: {', '.join(dataset.column_names)})"
        )
    values = [dataset[column] for column in HUB_COLUMNS]
    rows = [["" if v is None else str(v).strip() for v in row] for row in zip(*values, strict=True)]
    out = [Triplet(*texts) for texts in rows if all(texts)]
    if len(out) < len(rows):
        log.warning("%s: skipped %d malformed rows (empty text)", dataset_id, len(rows) - len(out))
    if not out:
        raise UserError(f"no triplets in {dataset_id}")
    return out
