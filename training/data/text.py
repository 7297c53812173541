"""Plain-text corpora: one sentence per line, ``.txt`` or ``.txt.gz``."""

from __future__ import annotations

import gzip
import hashlib
import logging
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from distilembed.errors import UserError

log = logging.getLogger(__name__)
MAX_WARNINGS = 5  # per file and kind: the rest are counted in one closing line


class RowLog:
    """Counts a file's skipped rows and its lines with replaced bytes, warning for the first few."""

    def __init__(self, path: Path) -> None:
        self.path, self.skipped, self.replaced = path, 0, 0

    def skip(self, lineno: int, reason: str, path: Path | None = None) -> None:
        self.skipped += 1
        if self.skipped <= MAX_WARNINGS:
            log.warning("%s:%d: skipped malformed row: %s", path or self.path, lineno, reason)

    def check_utf8(self, lineno: int, *fields: str) -> None:
        if any("\ufffd" in field for field in fields):
            self.replaced += 1
            if self.replaced <= MAX_WARNINGS:
                log.warning("%s:%d: invalid UTF-8 replaced", self.path, lineno)

    def finish(self) -> None:
        if self.skipped:
            log.warning("%s: skipped %d malformed rows", self.path, self.skipped)
        if self.replaced:
            log.warning("%s: %d lines had invalid UTF-8", self.path, self.replaced)


def iter_sentences(path: str | Path) -> Iterator[str]:
    """Yield stripped non-empty lines; undecodable bytes become U+FFFD and are counted."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"corpus not found: {path}")
    if path.suffix not in {".txt", ".gz"} or (path.suffix == ".gz" and not path.stem.endswith(".txt")):
        raise UserError(f"unknown corpus format (want .txt or .txt.gz): {path}")
    rows = RowLog(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="\n") as handle:
        for lineno, line in enumerate(handle, 1):
            text = line.strip()
            if text:
                rows.check_utf8(lineno, text)
                yield text
    rows.finish()


def read_sentences(path: str | Path, limit: int | None = None, skip: int = 0) -> list[str]:
    """``limit`` sentences of a corpus after its first ``skip``; nothing to return is an error. ``skip``
    selects a later slice of a big corpus, e.g. fresh sentences for more training on top of a run whose first
    slice (and its cached teacher targets) is already used."""
    if skip < 0:
        raise UserError(f"--skip-sentences must not be negative, got {skip}")
    out = list(islice(iter_sentences(path), skip, None if limit is None else skip + limit))
    if not out:
        if skip:
            raise UserError(f"corpus has no sentences after skipping the first {skip}: {path}")
        raise UserError(f"corpus is empty: {path}")
    return out


def content_hash(texts: list[str]) -> str:
    """Order-sensitive sha256 of a list of texts: the identity of a corpus sample."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\n")
    return digest.hexdigest()
