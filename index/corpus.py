"""Read a corpus to index: .txt (a text per line), .jsonl, .csv or .tsv (id, text, metadata
columns; optionally .gz) or .parquet files. Bad rows are skipped and counted; delimited files are
read a physical line per row (quoted fields must not hold newlines). Splits: index/splits.py.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import gzip
import io
import json
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distilembed.errors import UserError
from index.store import Document

log = logging.getLogger(__name__)
LINE_FORMATS = (".txt", ".jsonl", ".csv", ".tsv")
FORMATS = (*LINE_FORMATS, ".parquet")
MAX_WARNINGS = 5
GLOB_CHARS = frozenset("*?[")


@dataclass
class CorpusStats:
    rows: int = 0
    skipped: int = 0
    skipped_lines: list[int | str] = field(default_factory=list)
    quiet: bool = False  # Ray read tasks count skips; the driver's pass over the corpus warns

    def skip(self, where: str, lineno: int | str, why: str) -> None:
        self.skipped += 1
        if len(self.skipped_lines) < 1000:
            self.skipped_lines.append(lineno)
        if self.skipped <= MAX_WARNINGS and not self.quiet:
            log.warning("%s:%s: skipped: %s", where, lineno, why)


def format_of(path: Path) -> str:
    name = path.name.removesuffix(".gz")
    suffix = Path(name).suffix
    if suffix not in FORMATS or (suffix == ".parquet" and path.suffix == ".gz"):
        raise UserError(
            f"unknown corpus format {suffix or name!r} in {path} "
            f"(want {', '.join(LINE_FORMATS)}, optionally .gz, or .parquet)"
        )
    return suffix


@dataclass(frozen=True)
class CorpusSpec:
    """``path``: a file, a directory (its corpus files, recursively, by name) or a glob."""

    path: Path
    id_column: str = "id"
    text_column: str = "text"
    metadata_columns: tuple[str, ...] = ()

    def files(self) -> list[Path]:
        """The corpus files in the order their rows are read (sorted by path)."""
        text = str(self.path)
        if self.path.is_dir():
            found = sorted(p for p in self.path.rglob("*") if p.is_file() and not p.name.startswith("."))
            files = [p for p in found if _known(p)]
        elif GLOB_CHARS & set(text):
            matches = glob.glob(text, recursive=True)  # noqa: PTH207 (absolute and relative patterns alike)
            files = sorted(Path(p) for p in matches if Path(p).is_file())
        elif self.path.is_file():
            files = [self.path]
        else:
            raise UserError(f"corpus not found: {self.path}")
        if not files:
            raise UserError(f"no corpus files ({', '.join(FORMATS)}) in {self.path}")
        for path in files:
            format_of(path)  # refuse an unknown format before anything is read
        return files

    def root(self) -> Path:
        """What row ids of .txt files in a multi-file corpus are relative to."""
        if self.path.is_dir():
            return self.path
        parts = self.path.parts
        magic = next((i for i, part in enumerate(parts) if GLOB_CHARS & set(part)), len(parts))
        return Path(*parts[:magic]) if magic else Path()

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.id_column, self.text_column, *self.metadata_columns)


def _known(path: Path) -> bool:
    with contextlib.suppress(UserError):
        return bool(format_of(path))
    return False


def open_binary(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def decoded(
    raw: Iterable[bytes], first_line: int, where: str, stats: CorpusStats
) -> Iterator[tuple[int, str]]:
    """(line number, text) for every line that is valid UTF-8; the others are skipped."""
    for lineno, line in enumerate(raw, first_line):
        try:
            yield lineno, line.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            stats.skip(where, lineno, "invalid UTF-8")


def check_columns(spec: CorpusSpec, header: list[str], where: str) -> None:
    if missing := [c for c in spec.columns if c not in header]:
        raise UserError(f"{where}: no column {', '.join(map(repr, missing))} (header: {', '.join(header)})")


def from_mapping(
    spec: CorpusSpec, row: dict[str, Any], lineno: int, where: str, stats: CorpusStats
) -> Document | None:
    doc_id, text = row.get(spec.id_column), row.get(spec.text_column)
    if doc_id is None or text is None or not str(text).strip() or not str(doc_id).strip():
        stats.skip(where, lineno, f"missing {spec.id_column!r} or {spec.text_column!r}")
        return None
    metadata = {c: _json_value(row[c]) for c in spec.metadata_columns if c in row}
    doc = Document(str(doc_id), str(text), metadata)
    if not _encodable(doc):  # a JSON escape like "\ud800": the tokenizer and SQLite refuse it
        stats.skip(where, lineno, "a lone surrogate, not valid UTF-8")
        return None
    stats.rows += 1
    return doc


def _json_value(value: Any) -> Any:
    """NaN and Infinity become null: JSON has neither, and the service could not send them back."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _encodable(doc: Document) -> bool:
    metadata = json.dumps(doc.metadata, ensure_ascii=False, default=str) if doc.metadata else ""
    try:
        (doc.id + doc.text + metadata).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_lines(
    spec: CorpusSpec,
    fmt: str,
    lines: Iterator[tuple[int, str]],
    stats: CorpusStats,
    *,
    where: str,
    header: list[str] | None = None,
    id_prefix: str = "",
) -> Iterator[Document]:
    """Documents from decoded lines of one line-format file (``header``: a delimited file's columns);
    .txt lines get ids ``<id_prefix>line-<n>``, 1-based, stable across rebuilds."""
    columns = header or []
    for lineno, text in lines:
        row = None
        if fmt == ".txt" and text.strip():
            stats.rows += 1
            yield Document(f"{id_prefix}line-{lineno}", text.strip())
        elif fmt == ".jsonl" and text.strip():
            row = _json_object(text, lineno, where, stats)
        elif fmt in (".csv", ".tsv") and (fields := split_fields(text, fmt)):
            if len(fields) == len(columns):
                row = dict(zip(columns, fields, strict=True))
            else:
                stats.skip(where, lineno, f"{len(fields)} fields, header has {len(columns)}")
        if row is not None and (doc := from_mapping(spec, row, lineno, where, stats)):
            yield doc


def _json_object(text: str, lineno: int, where: str, stats: CorpusStats) -> dict[str, Any] | None:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        stats.skip(where, lineno, f"invalid JSON ({exc.msg})")
        return None
    if not isinstance(row, dict):
        stats.skip(where, lineno, "not a JSON object")
        return None
    return row


def first_json_columns(path: Path) -> list[str] | None:
    """The keys of a .jsonl file's first JSON object (None if it has none)."""
    quiet = CorpusStats(quiet=True)
    with open_binary(path) as handle:
        for lineno, text in decoded(handle, 1, str(path), quiet):
            if text.strip() and (row := _json_object(text, lineno, str(path), quiet)) is not None:
                return list(row)
    return None


def split_fields(text: str, fmt: str) -> list[str]:
    return next(csv.reader(io.StringIO(text), delimiter="\t" if fmt == ".tsv" else ","), [])


def warn_skipped_total(spec: CorpusSpec, stats: CorpusStats) -> None:
    """After a whole corpus: one line for the skipped rows beyond the first few warned of."""
    if stats.skipped > MAX_WARNINGS:
        log.warning(
            "%s: %d rows skipped in all (lines %s...)", spec.path, stats.skipped, stats.skipped_lines[:10]
        )
