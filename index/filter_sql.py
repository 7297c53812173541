"""A parsed filter (index/filters.py) as a parameterised SQL condition on the ``docs`` table.

No key, path or value is ever part of the SQL text: every one is a bound parameter. A condition on
a field with a payload index (``field_values``, one row per value a document has at that path)
is a lookup in that index, so its cost follows its matches. A condition on any other field runs
``distilembed_matches(metadata, ?)``, the same Python evaluator the property tests check the index
against, row by row: correct on every field, fast on the indexed ones.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from index.filters import AllOf, Condition, Node, Not, field_rows, holds, kind, split_path

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
_SYMBOLS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


@lru_cache(maxsize=256)
def _condition(encoded: str) -> Condition:
    path, op, operand = json.loads(encoded)
    return Condition("", tuple(path), op, tuple(operand) if isinstance(operand, list) else operand)


# The last metadata text parsed, per thread: a filter with several unindexed conditions parses
# each row once.
_last = threading.local()


def _matches(metadata: str, encoded: str) -> int:
    if getattr(_last, "text", None) != metadata:
        _last.text, _last.value = metadata, json.loads(metadata)
    return int(holds(_condition(encoded), _last.value))


def install(db: sqlite3.Connection) -> None:
    """The payload index tables and the evaluator function, on one connection."""
    db.executescript(FIELDS_SCHEMA)
    db.create_function(MATCH_FUNCTION, 2, _matches, deterministic=True)


def _join(parts: list[str], op: str) -> str:
    """``a op b op c ...`` as a balanced tree: SQLite refuses expressions nested 1,000 deep."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    return f"({_join(parts[:mid], op)} {op} {_join(parts[mid:], op)})"


class _Compiler:
    def __init__(self, indexed: frozenset[str]) -> None:
        self.indexed = indexed
        self.params: list[Any] = []

    def node(self, node: Node) -> str:
        if isinstance(node, Condition):
            return self.indexed_condition(node) if node.field in self.indexed else self.scan(node)
        if isinstance(node, Not):
            return f"NOT {self.node(node.part)}"
        if not node.parts:
            return "1" if isinstance(node, AllOf) else "0"
        return _join([self.node(p) for p in node.parts], "AND" if isinstance(node, AllOf) else "OR")

    def scan(self, cond: Condition) -> str:
        operand = list(cond.operand) if isinstance(cond.operand, tuple) else cond.operand
        self.params.append(json.dumps([list(cond.path), cond.op, operand]))
        return f"{MATCH_FUNCTION}(metadata, ?)"

    def lookup(self, field: str, extra: str = "", *values: Any) -> str:
        self.params += [field, *values]
        return "(" + _IN_FIELD.format(extra) + ")"

    def indexed_condition(self, cond: Condition) -> str:
        op, operand, field = cond.op, cond.operand, cond.field
        if op == "$exists":
            present = self.lookup(field)
            return present if operand else f"NOT {present}"
        if op in _SYMBOLS:
            return self.lookup(field, f" AND kind = ? AND value {_SYMBOLS[op]} ?", kind(operand), operand)
        operands = (operand,) if op in ("$eq", "$ne") else operand
        terms = []
        if None in operands:  # a null value, or no value at all
            terms.append(f"({self.lookup(field, ' AND kind = 0')} OR NOT {self.lookup(field)})")
        by_kind: dict[int, list[Any]] = {}
        for value in operands:
            if value is not None:
                by_kind.setdefault(kind(value) or 0, []).append(int(value) if kind(value) == 1 else value)
        for k, values in by_kind.items():
            marks = ",".join("?" * len(values))
            terms.append(self.lookup(field, f" AND kind = ? AND value IN ({marks})", k, *values))
        expr = _join(terms, "OR") if terms else "0"
        return f"NOT {expr}" if op in ("$ne", "$nin") else expr


def compile_where(node: Node, indexed: Iterable[str]) -> tuple[str, list[Any]]:
    """A SQL condition on a ``docs`` row, with its parameters."""
    compiler = _Compiler(frozenset(indexed))
    return compiler.node(node), compiler.params


def index_rows(int_id: int, metadata: Any, fields: Iterable[str]) -> list[tuple[str, int, Any, int]]:
    """The ``field_values`` rows of one document for the indexed ``fields``."""
    return [
        (field, k, value, int_id) for field in fields for k, value in field_rows(metadata, split_path(field))
    ]
