"""Cut a corpus into splits of at most ``lines_per_split`` lines of one file, which both build
engines encode in one call (dynamic int8 depends on the texts encoded together) and checkpoint as
one shard (docs/decisions.md, 20). Planning records each split's byte offset, for Ray to seek to.
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import groupby, islice
from pathlib import Path
from typing import Any

import numpy as np

from distilembed.artifacts import sha256_file
from distilembed.errors import UserError
from index import corpus
from index.corpus import CorpusSpec, CorpusStats
from index.store import Document

LINES_PER_SPLIT = 8192
CHUNK = 1 << 22


@dataclass(frozen=True)
class CorpusFile:
    path: str
    format: str
    sha256: str
    lines: int  # physical lines (Parquet: rows), header included
    first: int  # first data line: 2 under a delimited file's header, else 1
    header: list[str] | None = None
    id_prefix: str = ""  # .txt ids in a multi-file corpus: "<relative path>:line-<n>"


@dataclass(frozen=True)
class Split:
    file: int
    first_line: int
    lines: int
    offset: int  # byte offset of first_line in the (decompressed) file; -1 for Parquet

    @property
    def key(self) -> str:
        return f"{self.file:05d}-{self.first_line:012d}"


@dataclass(frozen=True)
class CorpusPlan:
    files: tuple[CorpusFile, ...]
    splits: tuple[Split, ...]
    lines_per_split: int

    @property
    def lines(self) -> int:
        return sum(s.lines for s in self.splits)

    def identity(self) -> dict[str, Any]:
        """What a resumed build must share with the one it resumes."""
        return {
            "files": [{"path": f.path, "sha256": f.sha256} for f in self.files],
            "lines_per_split": self.lines_per_split,
        }

    def describe(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.files]


def plan_corpus(spec: CorpusSpec, lines_per_split: int = LINES_PER_SPLIT) -> CorpusPlan:
    if lines_per_split < 1:
        raise UserError(f"lines per split must be >= 1, not {lines_per_split}")
    paths = spec.files()
    root = spec.root()
    files, splits = [], []
    for index, path in enumerate(paths):
        relative = path.relative_to(root) if path.is_relative_to(root) else path
        prefix = "" if len(paths) == 1 else f"{relative}:"
        info, offsets = _scan(spec, path, lines_per_split, prefix)
        files.append(info)
        for first in range(info.first, info.lines + 1, lines_per_split):
            count = min(lines_per_split, info.lines - first + 1)
            splits.append(Split(index, first, count, offsets.get(first, -1)))
    return CorpusPlan(tuple(files), tuple(splits), lines_per_split)


def _scan(spec: CorpusSpec, path: Path, step: int, prefix: str) -> tuple[CorpusFile, dict[int, int]]:
    fmt = corpus.format_of(path)
    if fmt == ".parquet":
        parquet = _parquet_file(path)
        corpus.check_columns(spec, parquet.schema_arrow.names, str(path))
        return CorpusFile(str(path), fmt, sha256_file(path), parquet.metadata.num_rows, 1), {}
    header = None
    if fmt in (".csv", ".tsv"):
        with corpus.open_binary(path) as handle:
            first_line = handle.readline()
        if first_line:
            try:
                header = corpus.split_fields(first_line.decode("utf-8").rstrip("\r\n"), fmt)
            except UnicodeDecodeError:
                raise UserError(f"{path}: the header line is not UTF-8") from None
            corpus.check_columns(spec, header, str(path))
    elif fmt == ".jsonl" and (columns := corpus.first_json_columns(path)) is not None:
        corpus.check_columns(spec, columns, str(path))
    first = 2 if header is not None else 1
    lines, offsets = _line_offsets(path, first, step)
    return CorpusFile(str(path), fmt, sha256_file(path), lines, first, header, prefix), offsets


def _line_offsets(path: Path, first: int, step: int) -> tuple[int, dict[int, int]]:
    """(number of lines, {line number: byte offset}) for lines first, first + step, ..."""
    offsets = {1: 0} if first == 1 else {}
    target = first if first > 1 else first + step
    pos = newlines = 0
    last = 10
    with corpus.open_binary(path) as handle:
        while chunk := handle.read(CHUNK):
            at = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
            # line L begins one byte after newline number L - 1
            while target - 1 <= newlines + len(at):
                offsets[target] = pos + int(at[target - 2 - newlines]) + 1
                target += step
            newlines += len(at)
            pos += len(chunk)
            last = chunk[-1]
    return newlines + (last != 10), offsets


def _parquet_file(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading Parquet needs pyarrow: pip install 'distilembed[ray]'") from None
    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise UserError(f"{path}: not a readable Parquet file ({exc})") from None


def _parquet_rows(spec: CorpusSpec, info: CorpusFile, split: Split, stats: CorpusStats) -> Iterator[Document]:
    parquet = _parquet_file(Path(info.path))
    names = [c for c in spec.columns if c in parquet.schema_arrow.names]
    start, stop = split.first_line - 1, split.first_line - 1 + split.lines
    groups: list[int] = []
    group_start = base = 0
    for group in range(parquet.metadata.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        if group_start < stop and group_start + rows > start:
            base = base if groups else group_start
            groups.append(group)
        group_start += rows
    if not groups:
        return
    table = parquet.read_row_groups(groups, columns=names).slice(start - base, split.lines)
    for i, row in enumerate(table.to_pylist()):
        if doc := corpus.from_mapping(spec, row, split.first_line + i, info.path, stats):
            yield doc


def read_split(
    spec: CorpusSpec, plan: CorpusPlan, split: Split, stats: CorpusStats, source: Path | None = None
) -> list[Document]:
    """The documents of one split, read by seeking to it (``source``: a gzip file's decompressed copy)."""
    info = plan.files[split.file]
    if info.format == ".parquet":
        return list(_parquet_rows(spec, info, split, stats))
    path = source or Path(info.path)
    seekable = source is not None or not info.path.endswith(".gz")
    with open(path, "rb") if seekable else gzip.open(path, "rb") as handle:
        skip = 0 if seekable else split.first_line - 1  # a gzip file is read from its start
        if seekable:
            handle.seek(split.offset)
        return _parse(spec, info, split.first_line, list(islice(handle, skip, skip + split.lines)), stats)


def _parse(
    spec: CorpusSpec, info: CorpusFile, first_line: int, raw: list[bytes], stats: CorpusStats
) -> list[Document]:
    lines = corpus.decoded(raw, first_line, info.path, stats)
    return list(
        corpus.parse_lines(
            spec, info.format, lines, stats, where=info.path, header=info.header, id_prefix=info.id_prefix
        )
    )


def iter_split_documents(
    spec: CorpusSpec, plan: CorpusPlan, stats: CorpusStats | None = None
) -> Iterator[tuple[Split, list[Document]]]:
    """Every split's documents in plan order, reading each file once from its start."""
    stats = stats if stats is not None else CorpusStats()
    for number, splits in groupby(plan.splits, key=lambda split: split.file):  # in file order
        info = plan.files[number]
        if info.format == ".parquet":
            for split in splits:
                yield split, list(_parquet_rows(spec, info, split, stats))
            continue
        with corpus.open_binary(Path(info.path)) as handle:
            for _ in islice(handle, info.first - 1):  # the header
                pass
            for split in splits:
                yield split, _parse(spec, info, split.first_line, list(islice(handle, split.lines)), stats)


def stage_decompressed(plan: CorpusPlan, directory: Path) -> dict[int, Path]:
    """A decompressed copy of every gzip file, for read tasks that seek (kept across resumes)."""
    directory.mkdir(parents=True, exist_ok=True)
    staged = {}
    for index, info in enumerate(plan.files):
        if info.format == ".parquet" or not info.path.endswith(".gz"):
            continue
        dest = directory / f"{index:05d}-{info.sha256[:16]}{info.format}"
        if not dest.exists():
            tmp = dest.with_name(f".{dest.name}.tmp")
            with gzip.open(info.path, "rb") as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
            tmp.replace(dest)
        staged[index] = dest
    return staged


def iter_documents(spec: CorpusSpec, stats: CorpusStats | None = None) -> Iterator[Document]:
    """Every document of the corpus in file order (split by split, as ``index build`` reads it)."""
    stats = stats if stats is not None else CorpusStats()
    for _, docs in iter_split_documents(spec, plan_corpus(spec), stats):
        yield from docs
    corpus.warn_skipped_total(spec, stats)
