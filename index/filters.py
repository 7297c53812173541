"""The metadata filter language (docs/serving.md, "Filters"; docs/decisions.md, 62): parsed and
checked here, evaluated in Python (``matches``) and compiled to parameterised SQL
(index/filter_sql.py); a property test holds the two to agreeing on every document. As in MongoDB,
``{"f": null}`` matches a null or missing ``f`` and ``$ne``/``$nin`` negate ``$eq``/``$in``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from distilembed.errors import TooLargeError, UserError

Scalar = str | int | float | bool | None
COMPARISONS = ("$gt", "$gte", "$lt", "$lte")
OPERATORS = ("$eq", "$ne", "$in", "$nin", *COMPARISONS, "$exists")
LOGICAL = ("$and", "$or", "$not")
INT64 = (-(1 << 63), (1 << 63) - 1)
MAX_NUMBER = 1.7e308  # what the OpenAPI schema states: finite, with room below float's limit
_ORDER = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}


class FilterError(UserError):
    """A filter that breaks the language: HTTP 422, naming the place."""


@dataclass(frozen=True)
class FilterLimits:
    """The shape a filter may take: all but ``total`` are in the OpenAPI schema (422), ``total``
    bounds the work of the whole filter (413)."""

    depth: int = 4  # the top object is level 1; each $and/$or/$not goes one level down
    clauses: int = 16  # keys of one object
    items: int = 16  # filters in one $and/$or
    values: int = 256  # values in one $in/$nin
    total: int = 1024  # conditions and values in the whole filter
    path_chars: int = 512
    string_chars: int = 8192


DEFAULT_LIMITS = FilterLimits()


@dataclass(frozen=True)
class Condition:
    """One operator on one field: ``path`` its keys, ``field`` the path as written canonically."""

    field: str
    path: tuple[str, ...]
    op: str
    operand: Any


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    part: Node


Node = Condition | AllOf | AnyOf | Not
MATCH_ALL = AllOf(())


def split_path(text: str) -> tuple[str, ...]:
    """``a.b\\.c`` -> ("a", "b.c"); empty segments and a dangling backslash are errors."""
    segments, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            escaped = next(chars, None)
            if escaped not in (".", "\\", "$"):
                raise ValueError("a backslash in a field path escapes only '.', '\\' or '$'")
            current.append(escaped)
        elif char == ".":
            segments.append("".join(current))
            current = []
        else:
            current.append(char)
    segments.append("".join(current))
    if any(not s for s in segments):
        raise ValueError("a field path has an empty segment")
    return tuple(segments)


def join_path(path: tuple[str, ...]) -> str:
    """The path as a filter writes it; a leading "$" is escaped (a bare one starts an operator)."""
    text = ".".join(s.replace("\\", "\\\\").replace(".", "\\.") for s in path)
    return "\\" + text if text.startswith("$") else text


@dataclass
class _Parser:
    limits: FilterLimits
    size: int = 0

    def count(self, n: int) -> None:
        self.size += n
        if self.size > self.limits.total:
            raise TooLargeError(f"the filter holds more than {self.limits.total} conditions and values")

    def node(self, raw: Any, where: str, level: int) -> Node:
        if not isinstance(raw, dict):
            raise FilterError(f"{where}: a filter is a JSON object")
        if level > self.limits.depth:
            raise FilterError(f"{where}: filters nest at most {self.limits.depth} levels deep")
        if len(raw) > self.limits.clauses:
            raise FilterError(
                f"{where}: {len(raw)} clauses in one object; the limit is {self.limits.clauses}"
            )
        parts: list[Node] = []
        for key, value in raw.items():
            here = f"{where}.{_printable(key)}"
            if key in ("$and", "$or"):
                if not isinstance(value, list) or not value:
                    raise FilterError(f"{here}: takes a non-empty list of filters")
                if len(value) > self.limits.items:
                    raise FilterError(f"{here}: {len(value)} filters; the limit is {self.limits.items}")
                items = tuple(self.node(v, f"{here}.{i}", level + 1) for i, v in enumerate(value))
                parts.append(AllOf(items) if key == "$and" else AnyOf(items))
            elif key == "$not":
                parts.append(Not(self.node(value, here, level + 1)))
            elif key.startswith("$"):
                raise FilterError(f"{here}: unknown operator (logic is {', '.join(LOGICAL)})")
            else:
                parts.extend(self.field(key, value, here))
        return parts[0] if len(parts) == 1 else AllOf(tuple(parts))

    def field(self, key: str, value: Any, where: str) -> Iterator[Condition]:
        if len(key) > self.limits.path_chars:
            raise FilterError(f"{where}: a field path is at most {self.limits.path_chars} characters")
        _utf8(key, where)
        try:
            path = split_path(key)
        except ValueError as exc:
            raise FilterError(f"{where}: {exc}") from None
        field = join_path(path)
        if isinstance(value, list):
            raise FilterError(f"{where}: a list is not a value to compare with; use {{'$in': [...]}}")
        if not isinstance(value, dict):
            self.count(1)
            yield _exact(Condition(field, path, "$eq", self.scalar(value, where)))
            return
        if not value:
            raise FilterError(f"{where}: give at least one operator ({', '.join(OPERATORS)})")
        for op, operand in value.items():
            yield _exact(Condition(field, path, op, self.operand(op, operand, f"{where}.{op}")))

    def operand(self, op: str, operand: Any, where: str) -> Any:
        self.count(1)
        if op in ("$eq", "$ne"):
            return self.scalar(operand, where)
        if op in ("$in", "$nin"):
            if not isinstance(operand, list):
                raise FilterError(f"{where}: takes a list of values")
            if len(operand) > self.limits.values:
                raise FilterError(f"{where}: {len(operand)} values; the limit is {self.limits.values}")
            return tuple(self.scalar(v, f"{where}.{i}") for i, v in enumerate(operand))
        if op in COMPARISONS:
            if operand is None or isinstance(operand, bool):
                raise FilterError(f"{where}: compares with a number or a string")
            return self.scalar(operand, where)
        if op == "$exists":
            if not isinstance(operand, bool):
                raise FilterError(f"{where}: takes true or false")
            return operand
        raise FilterError(f"{where}: unknown operator (operators are {', '.join(OPERATORS)})")

    def scalar(self, value: Any, where: str) -> Scalar | _Gap:
        self.count(1)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            if not abs(value) <= MAX_NUMBER:  # NaN fails this too
                raise FilterError(f"{where}: numbers are finite and at most {MAX_NUMBER:g} in size")
            if isinstance(value, float) or INT64[0] <= value <= INT64[1]:
                return value
            return float(value) if float(value) == value else _Gap.around(value)  # past 64 bits
        if isinstance(value, str):
            if len(value) > self.limits.string_chars:
                raise FilterError(f"{where}: strings are at most {self.limits.string_chars} characters")
            _utf8(value, where)
            return value
        raise FilterError(f"{where}: a value is a string, a number, true, false or null")


@dataclass(frozen=True)
class _Gap:
    """An integer past 64 bits that no float equals: conditions use the floats on either side."""

    below: float
    above: float

    @classmethod
    def around(cls, value: int) -> _Gap:
        near = float(value)
        if near > value:
            return cls(math.nextafter(near, -math.inf), near)
        return cls(near, math.nextafter(near, math.inf))


def _exact(cond: Condition) -> Condition:
    """``cond`` with each ``_Gap`` replaced by what it means for stored values (64-bit integers)."""
    op, operand = cond.op, cond.operand
    if isinstance(operand, _Gap):
        if op in ("$eq", "$ne"):
            return Condition(cond.field, cond.path, "$in" if op == "$eq" else "$nin", ())
        bound = operand.above if op in ("$gt", "$gte") else operand.below
        return Condition(cond.field, cond.path, "$gte" if op in ("$gt", "$gte") else "$lte", bound)
    if isinstance(operand, tuple) and any(isinstance(v, _Gap) for v in operand):
        return Condition(cond.field, cond.path, op, tuple(v for v in operand if not isinstance(v, _Gap)))
    return cond


def _printable(key: str) -> str:
    """A key as an error message can quote it: lone surrogates escaped, at most 80 characters."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")[:80]


def _utf8(text: str, where: str) -> None:
    """JSON lets a lone surrogate through (``"\\ud800"``); SQLite and the response cannot hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise FilterError(f"{where}: holds a lone surrogate, not text") from None


def parse(raw: Any, limits: FilterLimits = DEFAULT_LIMITS) -> Node:
    """The filter as a tree of conditions; FilterError (or TooLargeError) if it breaks the rules."""
    if raw is None:
        return MATCH_ALL
    return _Parser(limits).node(raw, "filter", 1)


def conditions(node: Node) -> Iterator[Condition]:
    if isinstance(node, Condition):
        yield node
    elif isinstance(node, Not):
        yield from conditions(node.part)
    else:
        for part in node.parts:
            yield from conditions(part)


def resolve(metadata: Any, path: tuple[str, ...]) -> tuple[bool, list[Any]]:
    """Whether ``path`` is present, and the values it reaches (list elements; objects in lists)."""
    current = [metadata]
    for segment in path:
        reached = []
        for item in current:
            if isinstance(item, dict):
                if segment in item:
                    reached.append(item[segment])
            elif isinstance(item, list):
                reached.extend(el[segment] for el in item if isinstance(el, dict) and segment in el)
        current = reached
    values: list[Any] = []
    for value in current:
        values.extend(value) if isinstance(value, list) else values.append(value)
    return bool(current), values


def kind(value: Any) -> int | None:
    """The type class a value compares within: 0 null, 1 boolean, 2 number, 3 string; else None."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 2 if INT64[0] <= value <= INT64[1] else None
    if isinstance(value, float):
        return 2
    return 3 if isinstance(value, str) else None


def _equal(value: Any, operand: Scalar) -> bool:
    k = kind(value)
    return k is not None and k == kind(operand) and value == operand


def _compare(value: Any, op: str, operand: Any) -> bool:
    k = kind(value)
    return k in (2, 3) and k == kind(operand) and _ORDER[op](value, operand)


def _in(present: bool, values: list[Any], operands: tuple[Scalar, ...]) -> bool:
    if None in operands and (not present or any(v is None for v in values)):
        return True
    return any(_equal(v, o) for v in values for o in operands if o is not None)


def holds(cond: Condition, metadata: Any) -> bool:
    present, values = resolve(metadata, cond.path)
    op, operand = cond.op, cond.operand
    if op == "$exists":
        return present == operand
    if op in ("$eq", "$ne"):
        return _in(present, values, (operand,)) == (op == "$eq")
    if op in ("$in", "$nin"):
        return _in(present, values, operand) == (op == "$in")
    return any(_compare(v, op, operand) for v in values)


def matches(node: Node, metadata: Any) -> bool:
    """Whether a document with this metadata passes the filter."""
    if isinstance(node, Condition):
        return holds(node, metadata)
    if isinstance(node, AllOf):
        return all(matches(p, metadata) for p in node.parts)
    if isinstance(node, AnyOf):
        return any(matches(p, metadata) for p in node.parts)
    return not matches(node.part, metadata)


def field_rows(metadata: Any, path: tuple[str, ...]) -> list[tuple[int, Any]]:
    """A payload index's (kind, value) rows of one document for one field: kind 4 (value None)
    for an object, a list, a number past 64 bits, or a present field with no values (``$exists``)."""
    present, values = resolve(metadata, path)
    rows: list[tuple[int, Any]] = []
    for value in values:
        k = kind(value)
        rows.append((4, None) if k is None else (k, int(value) if k == 1 else value))
    if present and not rows:
        rows.append((4, None))
    return list(dict.fromkeys(rows))
