"""The runtime encoder that ``index/`` and ``service/`` embed with: onnxruntime + tokenizers, no torch.

A bundle is checked (manifest, file hashes) before anything is loaded; a corrupt or mismatched
bundle is refused with one clear error.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from distilembed.artifacts import read_manifest, sha256_file
from distilembed.errors import UserError

Variant = Literal["fp32", "int8"]
MODEL_FILES: dict[Variant, str] = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
TOKENIZER_FILE = "tokenizer.json"
BUNDLE_KIND = "bundle"
# The fixed cost of one onnxruntime call, in padded tokens of MiniLM-L6 int8 (measured on 2 cores:
# about 1.5 ms per call against 0.053 ms per padded token; docs/decisions.md).
RUN_COST_TOKENS = 16.0
# Keeps onnxruntime from fusing Add + LayerNormalization back into its contrib
# SkipLayerNormalization kernel, six times slower on AVX2 here (export/unfuse.py, decision 16).
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two equally shaped arrays of vectors."""
    return (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


class BundleError(UserError):
    """A bundle that is missing, corrupt, or not what its manifest says."""


def bundle_identity(bundle: Path) -> str | None:
    """What an index records as the bundle it was built with: the sha256 of manifest.json as written
    without its ``quantization`` entry (``export calibrate`` adds int8 ranges later, which change no
    vector), so calibrating a bundle keeps the indexes built with it; None without a manifest."""
    path = Path(bundle) / "manifest.json"
    if not path.is_file():
        return None
    manifest = read_manifest(bundle)
    if "quantization" not in manifest:
        return sha256_file(path)
    del manifest["quantization"]  # re-serialised as atomic_write_json wrote it before calibration
    return hashlib.sha256((json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode()).hexdigest()


def verify_bundle(bundle: Path, files: Sequence[str]) -> dict[str, Any]:
    """Read the manifest and check the sha256 of the named files against it."""
    if not (bundle / "manifest.json").is_file():
        raise BundleError(f"not a bundle (no manifest.json): {bundle}")
    manifest = read_manifest(bundle)
    if manifest.get("kind") != BUNDLE_KIND:
        raise BundleError(f"{bundle} is not a bundle: its manifest says kind {manifest.get('kind')!r}")
    for name in files:
        expected = manifest.get("files", {}).get(name)
        path = bundle / name
        if expected is None or not path.is_file():
            raise BundleError(f"bundle {bundle} lacks {name}")
        if sha256_file(path) != expected:
            raise BundleError(f"bundle file {path} does not match its manifest hash (corrupt or tampered)")
    return manifest


def split_runs(sorted_lengths: np.ndarray, max_rows: int, run_cost_tokens: float) -> list[tuple[int, int]]:
    """Cut ascending row lengths into contiguous runs of at most ``max_rows`` rows, minimising the
    modelled cost: per run ``run_cost_tokens`` (the fixed cost of one model call, in padded-token
    units) plus rows x width. A small merged batch of mixed lengths is mostly padding (8 random
    STS-B sentences: 44% pad tokens); this finds the cheapest split exactly (dynamic programming)."""
    n = len(sorted_lengths)
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):
        j = np.arange(max(0, i - max_rows), i)
        costs = best[j] + run_cost_tokens + (i - j) * float(sorted_lengths[i - 1])
        k = int(np.argmin(costs))
        best[i], cut[i] = costs[k], j[k]
    runs = []
    i = n
    while i > 0:
        runs.append((int(cut[i]), i))
        i = int(cut[i])
    return runs[::-1]


@dataclass(frozen=True)
class Batch:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    order: np.ndarray


class Encoder:
    """Embed texts with an exported bundle: float32, L2-normalised rows, in input order."""

    def __init__(
        self,
        bundle: str | Path,
        variant: Variant = "int8",
        threads: int | None = None,
        batch_size: int = 32,
        verify: bool = True,
        *,
        spin_wait: bool = True,
        run_cost_tokens: float = RUN_COST_TOKENS,
    ) -> None:
        """``spin_wait``: onnxruntime's intra-op threads busy-wait between runs (fastest for batch
        jobs; a server sharing its cores with the event loop is better off without it)."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.bundle = Path(bundle)
        if variant not in MODEL_FILES:
            raise BundleError(f"unknown variant {variant!r} (fp32 or int8)")
        files = [MODEL_FILES[variant], TOKENIZER_FILE]
        self.manifest = verify_bundle(self.bundle, files) if verify else read_manifest(self.bundle)
        self.variant, self.batch_size, self.run_cost_tokens = variant, batch_size, run_cost_tokens
        self.dim, self.max_seq_len = int(self.manifest["dim"]), int(self.manifest["max_seq_len"])
        self.tokenizer = Tokenizer.from_file(str(self.bundle / TOKENIZER_FILE))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_seq_len)
        self.pad_id = int(self.manifest.get("pad_token_id", 0))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or int(os.environ.get("DISTILEMBED_THREADS") or 0)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin_wait else "0")
        self.session = ort.InferenceSession(
            str(self.bundle / MODEL_FILES[variant]),
            options,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=list(DISABLED_OPTIMIZERS),
        )
        self.input_names = [i.name for i in self.session.get_inputs()]

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, truncated to max_seq_len (special tokens included)."""
        return [enc.ids for enc in self.tokenizer.encode_batch(list(texts))]

    def _batches(self, ids: list[list[int]], batch_size: int) -> list[Batch]:
        """Length-sorted batches of at most ``batch_size`` rows, padded only to their own longest row,
        cut where the padding saved outweighs the cost of one more model run (``split_runs``)."""
        lengths = np.array([len(row) for row in ids])
        order = np.argsort(lengths, kind="stable")
        out = []
        for lo, hi in split_runs(lengths[order], batch_size, self.run_cost_tokens):
            idx = order[lo:hi]
            width = int(lengths[idx].max())
            input_ids = np.full((len(idx), width), self.pad_id, dtype=np.int64)
            mask = (np.arange(width) < lengths[idx][:, None]).astype(np.int64)
            for row, i in enumerate(idx):
                input_ids[row, : len(ids[i])] = ids[i]
            out.append(Batch(input_ids, mask, idx))
        return out

    def feeds(self, batch: Batch) -> dict[str, np.ndarray]:
        """The graph's inputs for one batch."""
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(batch.input_ids)
        return {k: v for k, v in feeds.items() if k in self.input_names}

    def feed_batches(
        self, texts: Sequence[str], batch_size: int | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """The graph's feeds for ``texts``, batch by batch (a calibration pass over the graph)."""
        for batch in self._batches(self.tokenize(texts), batch_size or self.batch_size):
            yield self.feeds(batch)

    def encode_ids(
        self, ids: list[list[int]], batch_size: int | None = None, progress: str | None = None
    ) -> np.ndarray:
        """``progress``: a bar with this label over the rows (long offline passes), none if None.
        The service calls this per request, so without ``progress`` no bar object is made at all."""
        result = np.zeros((len(ids), self.dim), dtype=np.float32)
        bar = None
        if progress is not None:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc=progress, unit="text")
        for batch in self._batches(ids, batch_size or self.batch_size):
            result[batch.order] = self.session.run(None, self.feeds(batch))[0]
            if bar is not None:
                bar.update(len(batch.order))
        if bar is not None:
            bar.close()
        return result / np.maximum(np.linalg.norm(result, axis=1, keepdims=True), 1e-12)

    def encode(
        self, texts: Sequence[str], batch_size: int | None = None, progress: str | None = None
    ) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised; an empty list gives a (0, dim) array."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, not a single string")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.encode_ids(self.tokenize(texts), batch_size, progress)
