"""Prometheus metrics, named in text-embeddings-inference style, in one registry per app.

prometheus-client exposes counters with a ``_total`` suffix (``distilembed_request_count_total``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_memory_bytes() -> float:
    """RSS of this process from /proc/self/statm (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as handle:
            return float(int(handle.read().split()[1]) * PAGE_SIZE)
    except (OSError, IndexError, ValueError):
        return 0.0


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_count = Counter(
            "distilembed_request_count", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.request_duration = self._latency(
            "request_duration", "HTTP request duration by route and status", ["route", "status"]
        )
        self.queue_duration = self._latency("queue_duration", "Time a text waits before the encoder takes it")
        self.tokenization_duration = self._latency("tokenization_duration", "Tokenization time per batch")
        self.inference_duration = self._latency("inference_duration", "Encoder (onnxruntime) time per batch")
        self.batch_size = Histogram(
            "distilembed_batch_size", "Texts per encoder call", buckets=BATCH_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("distilembed_queue_depth", "Texts waiting for the encoder", registry=r)
        self.queue_rejected = Counter(
            "distilembed_queue_rejected", "Requests refused with 429 because the queue was full", registry=r
        )
        self.search_duration = self._latency("search_duration", "Index search time per request")
        self.index_vectors = Gauge("distilembed_index_vectors", "Vectors in the live index", registry=r)
        self.rss = Gauge("distilembed_process_resident_memory_bytes", "Resident memory (RSS)", registry=r)
        self.rss.set_function(resident_memory_bytes)
        self.bundle_size = Gauge("distilembed_bundle_size_bytes", "Bundle size on disk", registry=r)
        self.ready = Gauge("distilembed_ready", "1 when the service is ready", registry=r)
        self.internal_errors = Counter(
            "distilembed_internal_errors", "Unhandled exceptions answered with 500", registry=r
        )

    def _latency(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Histogram:
        return Histogram(
            f"distilembed_{name}_seconds",
            documentation,
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def track_index(self, ntotal: Callable[[], int]) -> None:
        self.index_vectors.set_function(lambda: float(ntotal()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
