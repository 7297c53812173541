"""Limits on document metadata, checked at the door (from settings, not in the pydantic model), and
a guard on the way out: metadata nested a few hundred levels deep passes pydantic's ``Any`` but fails
its serializer, on every read that returns the document. The walk is iterative and stops at the
first problem: a hostile document costs at most one pass over what the body already holds.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from service.errors import payload_too_large, validation
from service.settings import Settings

log = logging.getLogger("distilembed.service")

# No setting accepts deeper metadata (settings.py caps max_metadata_depth at it), and nothing deeper is
# returned: pydantic's serializer gives up at about 250 levels, the json module near 1000.
RETURNABLE_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
STRICT = "must be strict JSON text, and this holds"
PLACEHOLDER_KEY = "_unavailable"
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]{1,32}")
_SURROGATE = re.compile("[\ud800-\udfff]")  # what UTF-8 cannot encode
_SHOWN_KEY_CHARS = 32
_SHOWN_SEGMENTS = 12

KeyPath = tuple[str | int, ...]  # keys and list indexes from the metadata's root


class _Document(Protocol):
    @property
    def metadata(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class MetadataLimits:
    depth: int
    keys: int
    key_chars: int
    string_chars: int
    items: int
    bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> MetadataLimits:
        return cls(**{f.name: getattr(settings, f"max_metadata_{f.name}") for f in fields(cls)})

    def describe(self) -> str:
        """The limits in one sentence (the OpenAPI document's description of the field)."""
        return (
            f"At most {self.depth} levels deep (the object itself is level 1; each object or list "
            f"inside adds one), {self.keys} keys over all its objects, keys of {self.key_chars} "
            f"characters, strings of {self.string_chars} characters, {self.items} values in all "
            f"(every key's value and list item) and {self.bytes} bytes as compact JSON; numbers "
            "within int64's range, no NaN or Infinity. More is a 422 (a 413 for the three totals) that "
            "names the place."
        )


class MetadataError(ValueError):
    """Where in a metadata tree (``path`` from its root) a limit is broken, and how. ``total``: a limit
    on the whole tree (keys, values, bytes), beyond JSON Schema: a 413 (the others are a 422)."""

    def __init__(self, path: KeyPath, what: str, total: bool = False) -> None:
        super().__init__(what)
        self.path, self.what, self.total = path, what, total


def show_path(path: KeyPath) -> str:
    """``.a.0."odd key"``: keys that are not plain as JSON strings (``\\n``: one line), long keys and
    paths cut. Every key on a path has passed its checks: none holds a lone surrogate."""
    segments = [str(s) if isinstance(s, int) or _PLAIN_KEY.fullmatch(s) else _quoted(s) for s in path]
    if len(segments) > _SHOWN_SEGMENTS:
        half = _SHOWN_SEGMENTS // 2
        segments = [*segments[:half], "…", *segments[-half:]]
    return "".join(f".{s}" for s in segments)


def _quoted(key: str) -> str:
    cut = "…" if len(key) > _SHOWN_KEY_CHARS else ""
    return json.dumps(key[:_SHOWN_KEY_CHARS], ensure_ascii=False) + cut


def _scalar_problem(value: object, limits: MetadataLimits) -> str | None:
    if isinstance(value, str):
        if len(value) > limits.string_chars:
            return f"a string of {len(value)} characters; the limit is {limits.string_chars}"
        return f"{STRICT} a lone surrogate" if _SURROGATE.search(value) else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{STRICT} NaN or Infinity"
    if isinstance(value, int | float) and not INT64_MIN <= value <= INT64_MAX:
        return "a number outside int64's range (-2**63 .. 2**63-1)"
    return None


def _key_problem(key: str, limits: MetadataLimits) -> str | None:
    if len(key) > limits.key_chars:
        return f"a key of {len(key)} characters; the limit is {limits.key_chars}"
    return None if key.isascii() or not _SURROGATE.search(key) else f"{STRICT} a lone surrogate (in a key)"


def _check_keys(node: dict[str, Any], path: KeyPath, keys: int, limits: MetadataLimits) -> None:
    """``node``'s keys; ``keys``: counted so far over every object of the tree."""
    if keys > limits.keys:
        raise MetadataError((), f"more than {limits.keys} keys, counted over every nested object", total=True)
    for key in node:
        if problem := _key_problem(key, limits):
            raise MetadataError(path, problem)


def check_metadata(metadata: dict[str, Any], limits: MetadataLimits) -> None:
    """Raise MetadataError at the first limit broken (level order: shallow problems first). Common
    values pass inline, on a type test and a comparison: the walk covers every value of an upsert."""
    values = keys = 0
    queue: deque[tuple[dict[str, Any] | list[Any], int, KeyPath]] = deque([(metadata, 1, ())])
    while queue:
        node, depth, path = queue.popleft()
        values += len(node)
        if values > limits.items:
            what = f"more than {limits.items} values (every key's value and list item)"
            raise MetadataError((), what, total=True)
        if isinstance(node, dict):
            keys += len(node)
            _check_keys(node, path, keys, limits)
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            kind = type(value)
            if kind is int:
                if INT64_MIN <= value <= INT64_MAX:
                    continue
            elif kind is str:
                if len(value) <= limits.string_chars and value.isascii():
                    continue
            elif kind is dict or kind is list:
                if depth == limits.depth:
                    what = f"nested {depth + 1} levels deep; the limit is {limits.depth}"
                    raise MetadataError((*path, key), what)
                queue.append((value, depth + 1, (*path, key)))
                continue
            if problem := _scalar_problem(value, limits):
                raise MetadataError((*path, key), problem)
    size = len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > limits.bytes:
        raise MetadataError((), f"{size} bytes as compact JSON; the limit is {limits.bytes}", total=True)


def check_documents(documents: Sequence[_Document], limits: MetadataLimits) -> None:
    """A 422 (or 413) naming the document, the field and the place for the first metadata over a limit."""
    for i, doc in enumerate(documents):
        try:
            check_metadata(doc.metadata, limits)
        except MetadataError as exc:
            message = f"documents.{i}.metadata{show_path(exc.path)}: {exc.what}"
            raise (payload_too_large(message) if exc.total else validation(message)) from None


def returnable(doc_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata``, or a placeholder when it nests over ``RETURNABLE_DEPTH`` levels (stored before
    the limits): one such document must not turn every search that finds it into a 500."""
    level: list[Any] = [metadata]
    for _ in range(RETURNABLE_DEPTH):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return metadata
    nested = f"nested over {RETURNABLE_DEPTH} levels deep"
    log.warning("document %r: metadata %s, returned as a placeholder", doc_id, nested)
    return {PLACEHOLDER_KEY: f"{nested}, not returned; upsert the document again"}
