"""Sentence-pair and triplet corpora: SimCSE NLI csv, SentEval SNLI, Quora duplicate questions."""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from distilembed.errors import UserError
from distilembed.paths import resolve_data_path
from training.data.records import NLIPair, Pair, Triplet
from training.data.text import RowLog

TRIPLET_HEADER = ("sent0", "sent1", "hard_neg")
NLI_LABELS = frozenset({"entailment", "neutral", "contradiction"})


def _open(path: Path, newline: str) -> TextIO:
    # newline="" for the csv module (quoted fields may span lines); utf-8-sig drops a leading BOM.
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="replace", newline=newline)
    return open(path, encoding="utf-8-sig", errors="replace", newline=newline)


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
        counts = ", ".join(
            f"{file.name}: {n}"
            for file, n in zip(files, map(len, (premises, hypotheses, labels)), strict=True)
        )
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
    start = 0
    while start < len(pairs):
        premise = pairs[start].premise
        end = start
        while end < len(pairs) and pairs[end].premise == premise:
            end += 1
        group = pairs[start:end]
        positives = [pair.hypothesis for pair in group if pair.label == "entailment"]
        negatives = [pair.hypothesis for pair in group if pair.label == "contradiction"]
        out.extend(Triplet(premise, pos, neg) for pos, neg in zip(positives, negatives, strict=False))
        start = end
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
    out: list[Triplet] = []
    for split in splits:
        out.extend(snli_to_triplets(read_senteval_snli(directory, split)))
    if not out:
        raise UserError(f"no entailment/contradiction triplets in {directory} ({'+'.join(splits)})")
    return out


def load_triplets(source: str, data_root: str | Path | None = None) -> list[Triplet]:
    """Triplets from a SimCSE csv, an SNLI dir (``DIR`` or ``DIR:SPLIT[+SPLIT]``) or ``hf:ID[:SPLIT]``."""
    if source.startswith("hf:"):
        from training.data.hub import load_hf_triplets

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
