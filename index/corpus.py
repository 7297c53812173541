"""Stream a corpus to index: .txt (one text per line) or .jsonl / .csv / .tsv with id, text and
optional metadata columns. Bad rows (non-UTF-8 bytes, missing fields) are skipped and counted.

Delimited files are read one physical line per row (so a bad line costs one row and keeps its line
number); quoted fields must not contain newlines."""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from distilembed.errors import UserError
from index.store import Document

log = logging.getLogger(__name__)
FORMATS = (".txt", ".jsonl", ".csv", ".tsv")
MAX_WARNINGS = 5


@dataclass
class CorpusStats:
    rows: int = 0
    skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)

    def skip(self, path: Path, lineno: int, why: str) -> None:
        self.skipped += 1
        if len(self.skipped_lines) < 1000:
            self.skipped_lines.append(lineno)
        if self.skipped <= MAX_WARNINGS:
            log.warning("%s:%d: skipped: %s", path, lineno, why)


@dataclass(frozen=True)
class CorpusSpec:
    path: Path
    id_column: str = "id"
    text_column: str = "text"
    metadata_columns: tuple[str, ...] = ()

    @property
    def format(self) -> str:
        name = self.path.name.removesuffix(".gz")
        suffix = Path(name).suffix
        if suffix not in FORMATS:
            raise UserError(
                f"unknown corpus format {suffix or name!r} (want {', '.join(FORMATS)}, optionally .gz)"
            )
        return suffix


def _binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _decoded_lines(spec: CorpusSpec, stats: CorpusStats) -> Iterator[tuple[int, str]]:
    """(line number, text) for every line that is valid UTF-8; the others are skipped."""
    with _binary(spec.path) as handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                yield lineno, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                stats.skip(spec.path, lineno, "invalid UTF-8")


def _from_mapping(
    spec: CorpusSpec, row: dict[str, object], lineno: int, stats: CorpusStats
) -> Document | None:
    doc_id, text = row.get(spec.id_column), row.get(spec.text_column)
    if doc_id is None or text is None or not str(text).strip() or not str(doc_id).strip():
        stats.skip(spec.path, lineno, f"missing {spec.id_column!r} or {spec.text_column!r}")
        return None
    metadata = {c: row[c] for c in spec.metadata_columns if c in row}
    return Document(str(doc_id), str(text), metadata)


def _check_columns(spec: CorpusSpec, header: list[str]) -> None:
    missing = [c for c in (spec.id_column, spec.text_column, *spec.metadata_columns) if c not in header]
    if missing:
        raise UserError(
            f"{spec.path}: no column {', '.join(map(repr, missing))} (header: {', '.join(header)})"
        )


def iter_documents(spec: CorpusSpec, stats: CorpusStats | None = None) -> Iterator[Document]:
    """Documents in file order; .txt lines get ids ``line-<n>`` (1-based, stable across rebuilds)."""
    stats = stats if stats is not None else CorpusStats()
    fmt = spec.format
    if not spec.path.is_file():
        raise UserError(f"corpus not found: {spec.path}")
    lines = _decoded_lines(spec, stats)
    if fmt == ".txt":
        for lineno, text in lines:
            if text.strip():
                stats.rows += 1
                yield Document(f"line-{lineno}", text.strip())
    elif fmt == ".jsonl":
        yield from _jsonl(spec, lines, stats)
    else:
        yield from _delimited(spec, lines, stats, "\t" if fmt == ".tsv" else ",")
    if stats.skipped > MAX_WARNINGS:
        log.warning(
            "%s: %d rows skipped in all (lines %s...)", spec.path, stats.skipped, stats.skipped_lines[:10]
        )


def _jsonl(spec: CorpusSpec, lines: Iterator[tuple[int, str]], stats: CorpusStats) -> Iterator[Document]:
    checked = False
    for lineno, text in lines:
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            stats.skip(spec.path, lineno, f"invalid JSON ({exc.msg})")
            continue
        if not isinstance(row, dict):
            stats.skip(spec.path, lineno, "not a JSON object")
            continue
        if not checked:
            _check_columns(spec, list(row))
            checked = True
        if doc := _from_mapping(spec, row, lineno, stats):
            stats.rows += 1
            yield doc


def _delimited(
    spec: CorpusSpec, lines: Iterator[tuple[int, str]], stats: CorpusStats, delimiter: str
) -> Iterator[Document]:
    header: list[str] | None = None
    for lineno, text in lines:
        fields = next(csv.reader(io.StringIO(text), delimiter=delimiter), [])
        if header is None:
            header = fields
            _check_columns(spec, header)
            continue
        if not fields:
            continue
        if len(fields) != len(header):
            stats.skip(spec.path, lineno, f"{len(fields)} fields, header has {len(header)}")
            continue
        if doc := _from_mapping(spec, dict(zip(header, fields, strict=True)), lineno, stats):
            stats.rows += 1
            yield doc
