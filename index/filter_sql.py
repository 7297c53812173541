"""A parsed filter (index/filters.py) as a parameterised SQL condition on ``docs``: a condition on a
field with a payload index (``field_values``) is a lookup there; one on any other field runs the
Python evaluator per row.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from index.filters import AllOf, Condition, Node, Not, conditions, field_rows, holds, kind, split_path

FIELDS_SCHEMA = """
CREATE TABLE IF NOT EXISTS indexed_fields (field TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS field_values (
    field  TEXT    NOT NULL,
    kind   INTEGER NOT NULL,  -- 0 null, 1 boolean (value 0/1), 2 number, 3 string, 4 anything else
    value,
    int_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS field_values_lookup ON field_values (field, kind, value, int_id);
CREATE INDEX IF NOT EXISTS field_values_doc ON field_values (int_id);
"""
MATCH_FUNCTION = "distilembed_matches"
_IN_FIELD = "int_id IN (SELECT int_id FROM field_values WHERE field = ?{})"
# Per row: a seek in the payload index per candidate, where the IN form collects every match first.
_ROW_HAS_FIELD = "EXISTS (SELECT 1 FROM field_values f WHERE f.field = ?{} AND f.int_id = docs.int_id)"
_SYMBOLS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


@lru_cache(maxsize=256)
def _condition(encoded: str) -> Condition:
    path, op, operand = json.loads(encoded)
    return Condition("", tuple(path), op, tuple(operand) if isinstance(operand, list) else operand)


# The last metadata parsed, per thread: several unindexed conditions parse each row once.
_last = threading.local()


def _matches(metadata: str, encoded: str) -> int:
    if getattr(_last, "text", None) != metadata:
        _last.text, _last.value = metadata, json.loads(metadata)
    return int(holds(_condition(encoded), _last.value))


def install(db: sqlite3.Connection) -> None:
    """The payload index tables and the evaluator function, on one connection."""
    db.executescript(FIELDS_SCHEMA)
    db.create_function(MATCH_FUNCTION, 2, _matches, deterministic=True)


def _balanced(parts: list[str], pair: Callable[[str, str], str]) -> str:
    """``parts`` paired as a balanced tree: SQLite refuses expressions nested 1,000 deep."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    return pair(_balanced(parts[:mid], pair), _balanced(parts[mid:], pair))


def _join(parts: list[str], op: str) -> str:
    return _balanced(parts, lambda left, right: f"({left} {op} {right})")


def _by_kind(operands: tuple[Any, ...]) -> dict[int, list[Any]]:
    """The non-null values of an equality or ``$in``, grouped by their type class, as stored."""
    grouped: dict[int, list[Any]] = {}
    for value in operands:
        if value is not None:
            grouped.setdefault(kind(value) or 0, []).append(int(value) if kind(value) == 1 else value)
    return grouped


class _IndexedConditions(ABC):
    """A filter as SQL; the two forms below supply ``lookup``, ``any_of``, ``negate`` and ``all_of``."""

    params: list[Any]

    @abstractmethod
    def lookup(self, field: str, extra: str = "", *values: Any) -> str: ...
    @abstractmethod
    def any_of(self, terms: list[str]) -> str: ...
    @abstractmethod
    def negate(self, expr: str) -> str: ...
    @abstractmethod
    def all_of(self, node: AllOf) -> str: ...

    def node(self, node: Node) -> str:
        if isinstance(node, Condition):
            return self.condition(node)
        if isinstance(node, Not):
            return self.negate(self.node(node.part))
        if isinstance(node, AllOf):
            return self.all_of(node)
        return self.any_of([self.node(p) for p in node.parts])

    def condition(self, cond: Condition) -> str:
        """A condition on an indexed field."""
        op, operand, field = cond.op, cond.operand, cond.field
        if op == "$exists":
            present = self.lookup(field)
            return present if operand else self.negate(present)
        if op in _SYMBOLS:
            return self.lookup(field, f" AND kind = ? AND value {_SYMBOLS[op]} ?", kind(operand), operand)
        operands = (operand,) if op in ("$eq", "$ne") else operand
        terms = []
        if None in operands:  # a null value, or no value at all
            terms += [self.lookup(field, " AND kind = 0"), self.negate(self.lookup(field))]
        for k, values in _by_kind(operands).items():
            marks = ",".join("?" * len(values))
            terms.append(self.lookup(field, f" AND kind = ? AND value IN ({marks})", k, *values))
        matched = self.any_of(terms)
        return self.negate(matched) if op in ("$ne", "$nin") else matched


class _Compiler(_IndexedConditions):
    def __init__(self, indexed: frozenset[str], per_row: bool) -> None:
        self.indexed = indexed
        self.params = []
        self.template = _ROW_HAS_FIELD if per_row else _IN_FIELD

    def condition(self, cond: Condition) -> str:
        if cond.field in self.indexed:
            return super().condition(cond)
        operand = list(cond.operand) if isinstance(cond.operand, tuple) else cond.operand
        self.params.append(json.dumps([list(cond.path), cond.op, operand]))
        return f"{MATCH_FUNCTION}(metadata, ?)"

    def all_of(self, node: AllOf) -> str:
        return _join([self.node(p) for p in node.parts], "AND") if node.parts else "1"

    def lookup(self, field: str, extra: str = "", *values: Any) -> str:
        self.params += [field, *values]
        return "(" + self.template.format(extra) + ")"

    def any_of(self, terms: list[str]) -> str:
        return _join(terms, "OR") if terms else "0"

    def negate(self, expr: str) -> str:
        return f"NOT {expr}"


def compile_where(node: Node, indexed: Iterable[str], per_row: bool = False) -> tuple[str, list[Any]]:
    """A SQL condition on a ``docs`` row and its parameters; ``per_row``: for a few given rows."""
    compiler = _Compiler(frozenset(indexed), per_row)
    return compiler.node(node), compiler.params


_VALUES = "SELECT int_id FROM field_values WHERE field = ?{}"
_ALL = "SELECT int_id FROM docs"


class _SetCompiler(_IndexedConditions):
    """A filter on indexed fields only, as a SELECT of int ids that never reads a ``docs`` row."""

    def __init__(self) -> None:
        self.params = []

    def all_of(self, node: AllOf) -> str:
        """One part's ids, the others checked per id (an INTERSECT would collect every match of each)."""
        if not node.parts:
            return _ALL
        driver = next((p for p in node.parts if _is_lookup(p)), node.parts[0])
        rest = [p for p in node.parts if p is not driver]
        ids = self.node(driver)
        per_id = _Compiler(frozenset(c.field for c in conditions(node)), per_row=True)
        check = per_id.node(rest[0] if len(rest) == 1 else AllOf(tuple(rest)))
        self.params += per_id.params
        # named "docs": the per-row conditions refer to docs.int_id
        return f"SELECT int_id FROM ({ids}) AS docs WHERE {check}"

    @staticmethod
    def combine(parts: list[str], op: str) -> str:
        """Each side a subquery: compound SELECTs chain left to right, with no parentheses."""
        return _balanced(
            parts, lambda left, right: f"SELECT int_id FROM ({left}) {op} SELECT int_id FROM ({right})"
        )

    def lookup(self, field: str, extra: str = "", *values: Any) -> str:
        self.params += [field, *values]
        return _VALUES.format(extra)

    def any_of(self, terms: list[str]) -> str:
        return self.combine(terms, "UNION") if terms else _ALL + " WHERE 0"

    def negate(self, expr: str) -> str:
        return self.combine([_ALL, expr], "EXCEPT")


def _is_lookup(node: Node) -> bool:
    """An equality or ``$in`` on values: usually the most selective part of a conjunction."""
    return (
        isinstance(node, Condition)
        and node.op in ("$eq", "$in")
        and None not in (node.operand if isinstance(node.operand, tuple) else (node.operand,))
    )


def compile_ids(node: Node, indexed: Iterable[str]) -> tuple[str, list[Any]] | None:
    """A SELECT of the matching int ids from the payload index alone, if it covers the filter; else None."""
    fields = frozenset(indexed)
    if any(c.field not in fields for c in conditions(node)):
        return None
    compiler = _SetCompiler()
    return compiler.node(node), compiler.params


def index_rows(int_id: int, metadata: Any, fields: Iterable[str]) -> list[tuple[str, int, Any, int]]:
    """The ``field_values`` rows of one document for the indexed ``fields``."""
    return [
        (field, k, value, int_id) for field in fields for k, value in field_rows(metadata, split_path(field))
    ]
