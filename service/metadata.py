"""Limits on document metadata, checked at the door, and a guard on the way out.

Metadata is free-form JSON, so its shape is bounded here rather than in the pydantic model: the
limits come from settings, and a structure nested a few hundred levels deep passes pydantic's
``Any`` untouched but fails its serializer later, on every read that returns the document (a 500
for every search that finds it). The walk is iterative and stops at the first problem, so a hostile
document costs at most one pass over what the body already holds.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from service.errors import ApiError, payload_too_large, validation
from service.settings import Settings

log = logging.getLogger("distilembed.service")

# No setting accepts deeper metadata (settings.py caps max_metadata_depth at it), and nothing deeper is
# returned: pydantic's serializer gives up at about 250 levels, the json module near 1000.
RETURNABLE_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
STRICT = "must be strict JSON text, and this holds"
PLACEHOLDER_KEY = "_unavailable"
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]{1,32}")
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
    """Where in a metadata tree a limit is broken (``path`` from its root), and how. ``total``: a
    limit on the whole tree (keys, values, bytes), which JSON Schema cannot state: like the body's
    size, it is a 413 (a schema-valid request may break it); the others are in the OpenAPI schema
    (service/openapi.py), and a 422."""

    def __init__(self, path: KeyPath, what: str, total: bool = False) -> None:
        super().__init__(what)
        self.path, self.what, self.total = path, what, total

    def answer(self, field: str) -> ApiError:
        """The HTTP error, its one line naming the place after ``field`` (``documents.3.metadata``)."""
        message = f"{field}{show_path(self.path)}: {self.what}"
        return payload_too_large(message) if self.total else validation(message)


def show_path(path: KeyPath) -> str:
    """``.a.0."odd key"`` for a path: keys that are not plain as JSON strings (a newline stays
    ``\\n``: one line), long keys and long paths cut. Every key on a path has passed its checks,
    so none holds a lone surrogate that could break the response."""
    segments = [str(s) if isinstance(s, int) or _PLAIN_KEY.fullmatch(s) else _quoted(s) for s in path]
    if len(segments) > _SHOWN_SEGMENTS:
        half = _SHOWN_SEGMENTS // 2
        segments = [*segments[:half], "…", *segments[-half:]]
    return "".join(f".{s}" for s in segments)


def _quoted(key: str) -> str:
    cut = "…" if len(key) > _SHOWN_KEY_CHARS else ""
    return json.dumps(key[:_SHOWN_KEY_CHARS], ensure_ascii=False) + cut


def _lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _scalar_problem(value: object, limits: MetadataLimits) -> str | None:
    if isinstance(value, str):
        if len(value) > limits.string_chars:
            return f"a string of {len(value)} characters; the limit is {limits.string_chars}"
        return f"{STRICT} a lone surrogate" if _lone_surrogate(value) else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{STRICT} NaN or Infinity"
    if isinstance(value, int | float) and not INT64_MIN <= value <= INT64_MAX:
        return "a number outside int64's range (-2**63 .. 2**63-1)"
    return None


def _key_problem(key: str, limits: MetadataLimits) -> str | None:
    if len(key) <= limits.key_chars and key.isascii():
        return None
    if len(key) > limits.key_chars:
        return f"a key of {len(key)} characters; the limit is {limits.key_chars}"
    return f"{STRICT} a lone surrogate (in a key)" if _lone_surrogate(key) else None


@dataclass
class _Totals:
    """What a walk has counted so far, against the limits on the whole tree."""

    limits: MetadataLimits
    values: int = 0
    keys: int = 0

    def entries(self, node: dict[str, Any] | list[Any], path: KeyPath) -> Iterable[tuple[str | int, Any]]:
        """The node's (key or index, value) pairs, once it is counted and its keys are checked."""
        limits = self.limits
        self.values += len(node)
        if self.values > limits.items:
            what = f"more than {limits.items} values (every key's value and list item)"
            raise MetadataError((), what, total=True)
        if isinstance(node, list):
            return enumerate(node)
        self.keys += len(node)
        if self.keys > limits.keys:
            raise MetadataError(
                (), f"more than {limits.keys} keys, counted over every nested object", total=True
            )
        for key in node:
            if problem := _key_problem(key, limits):
                raise MetadataError(path, problem)
        return node.items()


def check_metadata(metadata: dict[str, Any], limits: MetadataLimits) -> None:
    """Raise MetadataError at the first limit ``metadata`` breaks (level order: shallow problems
    first). The common values pass on a type test and a comparison, inline: the walk runs over
    every value of every document of an upsert."""
    totals = _Totals(limits)
    queue: deque[tuple[dict[str, Any] | list[Any], int, KeyPath]] = deque([(metadata, 1, ())])
    while queue:
        node, depth, path = queue.popleft()
        for key, value in totals.entries(node, path):
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
            raise exc.answer(f"documents.{i}.metadata") from None


def deeper_than(value: object, bound: int) -> bool:
    """Whether ``value`` nests containers more than ``bound`` levels (the value itself is level 1)."""
    level: list[Any] = [value]
    for _ in range(bound):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def returnable(doc_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata``, or a placeholder when it is too deep to serialize (stored before the limits):
    one such document must not turn every search that finds it into a 500."""
    if not deeper_than(metadata, RETURNABLE_DEPTH):
        return metadata
    log.warning(
        "document %r: metadata nested over %d levels deep, returned as a placeholder",
        doc_id,
        RETURNABLE_DEPTH,
    )
    note = f"nested over {RETURNABLE_DEPTH} levels deep, not returned; upsert the document again"
    return {PLACEHOLDER_KEY: note}
