"""Open a built index directory: manifest, Faiss index (nprobe set at load) and document store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distilembed.artifacts import read_manifest
from distilembed.errors import UserError
from index.build import INDEX_FILE, STORE_FILE
from index.store import Document, DocumentStore
from index.vectors import load_index, search


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    text: str
    metadata: dict[str, Any]


class IndexReader:
    def __init__(self, directory: str | Path, nprobe: int | None = None) -> None:
        self.dir = Path(directory)
        if not (self.dir / "manifest.json").is_file():
            raise UserError(f"not an index directory (no manifest.json): {self.dir}")
        self.manifest = read_manifest(self.dir)
        if self.manifest.get("kind") != "index":
            raise UserError(f"{self.dir} is a {self.manifest.get('kind')!r}, not an index")
        self.nprobe = nprobe or int(self.manifest["nprobe"])
        self.index = load_index(self.dir / INDEX_FILE, self.nprobe)
        self.store = DocumentStore(self.dir / STORE_FILE)
        self.dim = int(self.manifest["dim"])

    def search(self, queries: np.ndarray, k: int = 10, nprobe: int | None = None) -> list[list[Hit]]:
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise UserError(f"query vectors have shape {queries.shape}, the index holds {self.dim}-d vectors")
        scores, ids = search(self.index, queries, k, nprobe or self.nprobe)
        docs = self.store.get_many([int(i) for i in ids.ravel() if i >= 0])
        return [
            [
                Hit(docs[i].id, float(s), docs[i].text, docs[i].metadata)
                for s, i in zip(row_s, row_i, strict=True)
                if i >= 0 and i in docs
            ]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]

    def get(self, ext_id: str) -> Document | None:
        return self.store.get(ext_id)
