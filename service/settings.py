"""Service settings: every field is also an environment variable ``DISTILEMBED_<FIELD>``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, get_origin

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core.core_schema import ValidationInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from distilembed.errors import UserError
from distilembed.ray_address import host_port
from service.errors import describe_errors


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DISTILEMBED_", extra="ignore", validate_default=True)

    bundle: Path = Field(Path("models/default"), description="Exported bundle directory.")
    variant: Literal["int8", "fp32"] = Field("int8", description="Which graph of the bundle to run.")
    model_name: str | None = Field(None, description="Name reported as `model` (default: bundle dir name).")
    index_dir: Path | None = Field(None, description="Live index directory; unset = no search/documents.")
    snapshot_dir: Path | None = Field(
        None, description="Where POST /index/snapshot writes (default: <index_dir>-snapshots beside it)."
    )
    create_index: bool = Field(
        False, description="Create an empty index at index_dir when there is none (documents come by upsert)."
    )
    host: str = Field("127.0.0.1", description="Bind address (0.0.0.0: every interface).")
    port: int = Field(8080, ge=0, le=65535, description="TCP port.")
    threads: int | None = Field(None, ge=0, description="Cores the encoder uses (0 or unset: all).")
    workers: int | None = Field(
        None,
        ge=0,
        description="Model calls at once, each on threads / workers onnxruntime threads (0 or unset: one "
        "per thread, fastest for many small requests; 1: every thread on each call).",
    )
    max_items: int = Field(256, ge=1, description="Most texts (or documents) in one request; more = 413.")
    max_chars: int = Field(8192, ge=1, description="Longest text in characters; more = 413 (truncate: cut).")
    max_queue: int = Field(2048, ge=1, description="Most texts waiting for the encoder; more = 429.")
    max_batch: int = Field(128, ge=1, description="Most texts in one encoder call.")
    run_batch: int = Field(
        32, ge=1, description="Rows per model run: an encoder call is sorted by length and cut into runs."
    )
    spin_wait: bool = Field(
        True, description="onnxruntime threads busy-wait between calls (lower latency; costs idle CPU)."
    )
    max_wait_ms: float = Field(2.0, ge=0, description="Longest a batch waits to fill under concurrent load.")
    inline_search: bool = Field(
        True,
        description="Search unfiltered dense /search queries without a thread hand-off when the in-memory "
        "index is free: by the encoder thread that encoded them, or a lone query vector on the event loop; "
        "turn it off when the document store is on slow or network storage.",
    )
    max_payload_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="Largest request body; more = 413.")
    # A document's metadata (service/metadata.py); each limit broken is a 422 naming the place.
    max_metadata_depth: int = Field(
        8,
        ge=1,
        le=64,  # service/metadata.py RETURNABLE_DEPTH: deeper metadata is never returned
        description="Deepest nesting of a document's metadata: the object is level 1, each object or "
        "list inside it one more.",
    )
    max_metadata_keys: int = Field(256, ge=1, description="Most keys in a metadata, over all its objects.")
    max_metadata_key_chars: int = Field(256, ge=1, description="Longest metadata key, in characters.")
    max_metadata_string_chars: int = Field(8192, ge=1, description="Longest metadata string, in characters.")
    max_metadata_items: int = Field(
        4096, ge=1, description="Most values in a metadata: every key's value and list item, nested too."
    )
    max_metadata_bytes: int = Field(65536, ge=2, description="Largest metadata: UTF-8 bytes of compact JSON.")
    api_key: SecretStr | None = Field(
        None, description="One key that reads and writes (as `Authorization: Bearer` or X-API-Key)."
    )
    read_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated keys for embed, similarity, search, GET documents and info.",
    )
    write_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated keys for upsert, delete, retrain and snapshot (they read too).",
    )
    metrics_require_key: bool = Field(False, description="/metrics needs a read key (when keys are set).")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated origins that browsers may call from (CORS)."
    )
    nprobe: int | None = Field(None, ge=1, description="Default IVF nprobe (default: the index manifest's).")
    rescore_k: int | None = Field(
        None, ge=1, description="pq/binary indexes: candidates rescored per query (default: the manifest's)."
    )
    default_top_k: int = Field(10, ge=1, description="top_k of a search that sets none.")
    max_top_k: int = Field(100, ge=1, description="Largest top_k a search may ask for.")
    max_concurrency: int = Field(
        256,
        ge=1,
        description="Requests in flight at once; beyond, a JSON 503 with Retry-After and the connection "
        "stays open. Bounds the request bodies held in memory (idle connections do not count).",
    )
    keep_alive_s: float = Field(
        75.0,
        gt=0,
        description="Seconds an idle keep-alive connection stays open. Longer than the idle timeout of "
        "the clients and load balancers in front (60 s is common), so that they close idle connections "
        "first: a server that closes first races a request sent at that instant (a dropped request).",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a client has to send a request line and headers, from the connection's "
        "opening (or a later request's first byte); then it is closed (a JSON 408 first if it began).",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="Seconds a client has to send a body once its headers are in (then 408)."
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="Open connections; a new one beyond closes the one idle longest (none idle: it gets a "
        "JSON 503 and is closed). The service raises its open-file limit to fit them.",
    )
    access_log: bool = Field(False, description="uvicorn's per-request access log.")
    shutdown_timeout_s: float = Field(10.0, ge=0, description="Graceful shutdown: time to drain requests.")
    warmup: bool = Field(True, description="Run the encoder on warm-up batches before /ready turns true.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Logging."
    )
    # --engine ray (service/ray_serve.py): the same app on Ray Serve.
    engine: Literal["local", "ray"] = Field("local", description="local: uvicorn here; ray: Ray Serve.")
    ray_address: str | None = Field(
        None,
        validation_alias=AliasChoices("DISTILEMBED_RAY_ADDRESS", "RAY_ADDRESS", "ray_address"),
        description="Ray cluster to deploy on (env RAY_ADDRESS too); unset: start a local one.",
    )
    replicas: int = Field(1, ge=1, description="Ray: API replicas (encoder + read-only index each).")
    autoscale_max: int | None = Field(
        None, ge=1, description="Ray: autoscale between `replicas` and this many on requests in flight."
    )
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Ray autoscaling: requests in flight per replica to aim for."
    )
    replica_cpus: float = Field(1.0, gt=0, description="Ray: CPUs per API replica (its default `threads`).")
    refresh_ms: float = Field(
        250.0, ge=0, description="Ray: how often search replicas apply the writer's changes (0: never)."
    )
    ray_haproxy: bool = Field(
        True,
        description="Ray: HAProxy ingress straight to the replicas' HTTP servers "
        "(RAY_SERVE_ENABLE_HA_PROXY) on a cluster started here; false: Ray's Python proxy.",
    )
    ray_haproxy_metrics: bool = Field(
        False,
        description="Ray: HAProxy's per-request log to Ray's metrics (RAY_SERVE_HAPROXY_METRICS_ENABLED) "
        "on a cluster started here; off, the app's own /metrics still counts every request.",
    )
    refresh_on_search: bool = Field(
        True, description="Ray: apply the writer's committed changes before each search (read-your-writes)."
    )

    @field_validator("*", mode="before")
    @classmethod
    def _from_env(cls, value: object, info: ValidationInfo) -> object:
        """An empty variable means unset for a setting whose default is unset (``DISTILEMBED_INDEX_DIR=``
        in compose); a list is comma-separated."""
        field = cls.model_fields[str(info.field_name)]
        if value == "" and field.default is None:
            return None
        if isinstance(value, str) and get_origin(field.annotation) is list:
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("ray_address")
    @classmethod
    def _ray_address_form(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                host_port(value)
            except UserError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.max_items > self.max_queue:
            raise ValueError(f"max_items ({self.max_items}) must not exceed max_queue ({self.max_queue})")
        if self.default_top_k > self.max_top_k:
            raise ValueError(f"default_top_k ({self.default_top_k}) exceeds max_top_k ({self.max_top_k})")
        if self.autoscale_max is not None and self.autoscale_max < self.replicas:
            raise ValueError(f"autoscale_max ({self.autoscale_max}) is below replicas ({self.replicas})")
        return self

    def encoder_threads(self) -> tuple[int, int]:
        """(workers, onnxruntime threads per worker) from ``threads`` and ``workers``."""
        total = self.threads or os.cpu_count() or 1
        workers = min(self.workers or total, total)
        return workers, max(1, total // workers)

    @property
    def snapshots(self) -> Path | None:
        """The directory snapshots go to, beside the index (never inside it)."""
        if self.snapshot_dir is not None or self.index_dir is None:
            return self.snapshot_dir
        return self.index_dir.parent / f"{self.index_dir.name}-snapshots"


def load_settings(overrides: dict[str, Any]) -> Settings:
    """``Settings(**overrides)`` over ``DISTILEMBED_*`` and the defaults, or one line naming every bad one."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        errors = exc.errors()
        raise UserError(f"bad settings: {describe_errors(errors, 'settings', len(errors))}") from exc
