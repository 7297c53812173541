"""The index as one of several API replicas sees it (``--engine ray``): searches and lookups on a
local read-only ``LiveIndex``, writes forwarded to the one writer, whose changes the local copy
picks up with ``LiveIndex.refresh``. Imports no Ray: the writer is any ``WriteCall``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, cast

import numpy as np

from distilembed.errors import BusyError, UserError
from index.live import LiveIndex

if TYPE_CHECKING:
    from index.store import Document

log = logging.getLogger("distilembed.service")
# A call's result crosses the process boundary as a value: ("ok", result), or ("busy" | "user",
# message) for the errors the API maps to 409 and 422; anything else is a bug and raises.
Outcome = tuple[str, Any]
WriteCall = Callable[[str, tuple[Any, ...]], Outcome]
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def run_call(index: Any, allowed: frozenset[str], method: str, *args: Any, **kwargs: Any) -> Outcome:
    """A forwarded call's far side (writer, shard): ``index.<method>``, its user errors as values."""
    if method not in allowed:
        raise ValueError(f"{method!r} is not one of {', '.join(sorted(allowed))}")
    try:
        return "ok", getattr(index, method)(*args, **kwargs)
    except BusyError as exc:
        return "busy", str(exc)
    except UserError as exc:
        return "user", str(exc)


def unwrap(outcome: Outcome) -> Any:
    """Reader side: the result, or the same exception type and message the writer raised."""
    kind, value = outcome
    if kind == "busy":
        raise BusyError(value)
    if kind == "user":
        raise UserError(value)
    return value


def _after_refresh(
    read: Callable[Concatenate[LiveIndex, P], R], refresh: bool = True
) -> Callable[Concatenate[ReplicaIndex, P], R]:
    """``read`` on the local copy, once it applied the writer's committed changes (``refresh_on_search``;
    ``refresh`` False: a read of SQLite alone, current without it)."""

    def call(self: ReplicaIndex, *args: P.args, **kwargs: P.kwargs) -> R:
        if refresh and self.refresh_on_search:
            self.local.refresh()
        return read(self.local, *args, **kwargs)

    return call


class _Local(Generic[T]):
    """A read-only attribute of a replica's local copy."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, replica: ReplicaIndex, owner: type | None = None) -> T:
        return cast(T, getattr(replica.local, self.name))


class ReplicaIndex:
    """``IndexLike`` over a read-only local index and a writer elsewhere. A search first applies the
    writer's committed changes (``refresh_on_search``): it sees every write acknowledged before it
    began. A thread refreshes every ``refresh_ms`` too: that keeps the step short, and /info fresh."""

    def __init__(
        self, local: LiveIndex, write: WriteCall, refresh_ms: float = 250.0, refresh_on_search: bool = True
    ) -> None:
        self.local, self._write, self.refresh_on_search = local, write, refresh_on_search
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if refresh_ms > 0:
            self._thread = threading.Thread(
                target=self._refresh_every, args=(refresh_ms / 1000,), name="index-refresh", daemon=True
            )
            self._thread.start()

    def _refresh_every(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.local.refresh()
            except Exception:  # a bad moment must not end the loop; the next tick retries
                log.exception("refreshing %s failed", self.local.dir)

    # -- what the routes read: the local copy
    dim = _Local[int]()
    nprobe = _Local[int]()
    kind = _Local[str]()
    nlist = _Local[int]()
    manifest = _Local[dict[str, Any]]()
    ntotal = _Local[int]()
    indexed_fields = _Local[tuple[str, ...]]()
    lexical = _Local[bool]()
    search = _after_refresh(LiveIndex.search)
    search_hybrid = _after_refresh(LiveIndex.search_hybrid)
    vectors = _after_refresh(LiveIndex.vectors)  # the Faiss index's: refreshed
    search_lexical = _after_refresh(LiveIndex.search_lexical, refresh=False)
    list_documents = _after_refresh(LiveIndex.list_documents, refresh=False)

    def get(self, ext_id: str) -> Document | None:
        return self.local.get(ext_id)  # SQLite: current without a refresh

    def count(self, where: dict[str, Any] | None = None) -> int:
        return self.local.count(where)  # SQLite: current without a refresh

    def add_field_index(self, field: str) -> bool:
        return bool(self._forwarded("add_field_index", field))

    # -- writes: to the writer; then this replica catches up, so it reads its own writes
    def _forwarded(self, method: str, *args: Any) -> Any:
        result = unwrap(self._write(method, args))
        self.local.refresh()
        return result

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray) -> tuple[int, int]:
        vectors = self.local.check_vectors(vectors, rows=len(docs))  # refused here, not after a hop
        added, replaced = self._forwarded("upsert", list(docs), vectors)
        return int(added), int(replaced)

    def delete(self, ext_ids: Sequence[str]) -> list[str]:
        return list(self._forwarded("delete", list(ext_ids)))

    def checkpoint(self) -> None:
        self._forwarded("checkpoint")

    def retrain(
        self, nlist: int = 1024, storage: str | None = None, flat_below: int = 10_000, seed: int = 0
    ) -> dict[str, Any]:
        return self._forwarded("retrain", nlist, storage, flat_below, seed)

    def snapshot(self, out: Path) -> dict[str, Any]:
        """Taken by the writer: its lock pins the instant (every write acknowledged before is in)."""
        return dict(unwrap(self._write("snapshot", (out,))))

    def close(self) -> None:
        """Stop refreshing and close the local copy (the writer checkpoints, not a replica)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.local.close(checkpoint=False)
