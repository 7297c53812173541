"""``distilembed serve --engine ray``: the app of ``service.app.create_app`` on Ray Serve (docs/scaling.md).

``Api`` replicas, the ingress, each hold an encoder, a micro-batcher and a read-only copy of the index
(``ReplicaIndex``), which applies the changes of the one ``IndexWriter`` from the index directory (all
must see it on one filesystem); writes are forwarded to the writer. A sharded index has no writer: one
``IndexShard`` deployment per shard, searched in parallel and merged by ``ShardedIndex``. For ``serve
run``/``serve deploy``: ``service.ray_serve:app_builder``. Imports Ray: load it only for that engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.deployment import Deployment
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from distilembed.artifacts import read_manifest
from distilembed.errors import UserError
from distilembed.ray_address import join
from index.searcher import SEARCHES, WRITES, Searcher
from service.app import bundle_sha256, create_app, load_encoder, load_index
from service.batcher import EncoderLike
from service.errors import ApiError
from service.replica_index import Outcome, ReplicaIndex, run_call, unwrap
from service.settings import Settings, load_settings

if TYPE_CHECKING:
    from index.live import LiveIndex
    from index.shards import ShardedIndex

log = logging.getLogger("distilembed.service")
APP_NAME = "distilembed"
P = ParamSpec("P")
R = TypeVar("R")


def open_read_only(settings: Settings, directory: Path, dim: int) -> LiveIndex:
    """The index (or one shard) at ``directory``, read-only, refused if built with another bundle."""
    from index.live import open_for_bundle

    sha = bundle_sha256(settings.bundle)
    return open_for_bundle(directory, dim, sha, settings.nprobe, writable=False, rescore_k=settings.rescore_k)


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class IndexWriter:
    """The one process that writes the index directory (it holds the writer lock)."""

    def __init__(self, settings: Settings) -> None:
        dim = int(read_manifest(settings.bundle)["dim"])
        index = load_index(settings, dim, bundle_sha256(settings.bundle))  # creates it if asked to
        if index is None:
            raise UserError("IndexWriter needs settings.index_dir")
        self.index = index

    def ready(self) -> int:
        """Answers once the index is open: this replica's process id."""
        return os.getpid()

    async def write(self, method: str, args: tuple[Any, ...]) -> Outcome:
        # In a thread: a retrain runs for seconds while upserts and deletes go on (LiveIndex's locks).
        return await asyncio.to_thread(run_call, self.index, WRITES, method, *args)

    def __del__(self) -> None:
        if hasattr(self, "index"):  # not when __init__ failed
            self.index.close()  # checkpoints


@serve.deployment(ray_actor_options={"num_cpus": 0})
class IndexShard:
    """One shard of a sharded index, read-only, in its own process: 1/N of the lists in memory."""

    def __init__(self, settings: Settings, directory: Path) -> None:
        self.index = open_read_only(settings, directory, int(read_manifest(settings.bundle)["dim"]))

    def describe(self) -> dict[str, Any]:
        """The shard's manifest and effective nprobe (the ``Api`` reports the first shard's)."""
        index = self.index
        facts = {"nprobe": index.nprobe, "indexed_fields": index.indexed_fields, "lexical": index.lexical}
        return index.manifest | facts

    def read(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome:
        """A ``Searcher`` call (a bad filter's UserError comes back as a value: 422, not a crash)."""
        return run_call(self.index, SEARCHES, method, *args, **kwargs)

    def __del__(self) -> None:
        if hasattr(self, "index"):
            self.index.close(checkpoint=False)


def _on_shard(method: Callable[Concatenate[Searcher, P], R]) -> Callable[Concatenate[ShardHandle, P], R]:
    """``Searcher.<method>``, answered by the shard deployment (from worker threads, not the event loop)."""
    name = method.__name__

    def call(self: ShardHandle, *args: P.args, **kwargs: P.kwargs) -> R:
        return unwrap(_result(self.handle.read.remote(name, args, kwargs), "an index shard"))

    return call


class ShardHandle:
    """An ``IndexShard`` deployment as an API replica's ``ShardedIndex`` searches it."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    search = _on_shard(Searcher.search)
    search_lexical = _on_shard(Searcher.search_lexical)
    search_hybrid = _on_shard(Searcher.search_hybrid)
    get = _on_shard(Searcher.get)
    count = _on_shard(Searcher.count)
    vectors = _on_shard(Searcher.vectors)
    list_documents = _on_shard(Searcher.list_documents)


def _result(response: Any, what: str) -> Any:
    """A deployment call's value; one that is gone is a 503. No timeout: a retrain may take minutes."""
    try:
        return response.result()
    except (RayActorError, RayServeException) as exc:
        log.warning("%s is unavailable: %s", what, exc)
        raise ApiError(503, f"{what} is unavailable; retry", "unavailable", {"Retry-After": "1"}) from exc


def sharded_over(handles: list[DeploymentHandle], manifest: dict[str, Any]) -> ShardedIndex:
    """The index an ``Api`` replica searches: every shard deployment, top-k merged."""
    from index.shards import ShardedIndex

    first = handles[0].describe.remote().result()
    return ShardedIndex([ShardHandle(h) for h in handles], manifest | {"first_shard": first}, lambda: None)


@serve.deployment
@serve.ingress()
class Api:
    """One API replica: encoder, batcher and a read-only index copy, served by ``create_app``."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor; mypy wants None
        self,
        settings: Settings,
        writer: DeploymentHandle | None = None,
        shards: list[DeploymentHandle] | None = None,
    ) -> None:
        self.settings = settings
        self.encoder: EncoderLike = await asyncio.to_thread(load_encoder, settings)
        self.index: ReplicaIndex | ShardedIndex | None = None
        if writer is not None:
            await writer.ready.remote()  # it has created the index if it was asked to
            self.index = await asyncio.to_thread(self._open_index, writer)
        elif shards:
            assert settings.index_dir is not None
            manifest = read_manifest(settings.index_dir)
            self.index = await asyncio.to_thread(sharded_over, shards, manifest)

    def _open_index(self, writer: DeploymentHandle) -> ReplicaIndex:
        s = self.settings
        assert s.index_dir is not None
        local = open_read_only(s, s.index_dir, self.encoder.dim)

        def write(method: str, args: tuple[Any, ...]) -> Outcome:
            # Called from the route's thread pool, never the replica's event loop.
            return _result(writer.write.remote(method, args), "the index writer")

        return ReplicaIndex(local, write, s.refresh_ms, s.refresh_on_search)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self.settings, encoder=self.encoder, index=self.index)


def replica_settings(settings: Settings) -> Settings:
    """Paths made absolute (replicas need not share the driver's working directory) and the
    onnxruntime threads defaulting to the CPUs a replica reserves, not every core of its node."""
    threads = settings.threads if settings.threads else max(1, round(settings.replica_cpus))
    index_dir = settings.index_dir.resolve() if settings.index_dir is not None else None
    return settings.model_copy(
        update={"bundle": settings.bundle.resolve(), "index_dir": index_dir, "threads": threads}
    )


def api_options(settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": settings.replica_cpus},
        "max_ongoing_requests": settings.max_concurrency,
        "graceful_shutdown_timeout_s": settings.shutdown_timeout_s,
    }
    if settings.autoscale_max is not None:
        options["autoscaling_config"] = {
            "min_replicas": settings.replicas,
            "initial_replicas": settings.replicas,
            "max_replicas": settings.autoscale_max,
            "target_ongoing_requests": settings.target_ongoing_requests,
        }
    else:
        options["num_replicas"] = settings.replicas
    return options


def _as_deployment(decorated: object) -> Deployment:
    """What ``@serve.deployment`` made of a class (mypy ignores class decorators: it sees the class)."""
    assert isinstance(decorated, Deployment)
    return decorated


def build_app(settings: Settings) -> serve.Application:
    """``Api`` replicas and, with an index, the ``IndexWriter`` (sharded: one ``IndexShard`` per shard)."""
    from index.shards import is_sharded

    settings = replica_settings(settings)
    api = _as_deployment(Api).options(**api_options(settings))
    if settings.index_dir is None:
        return api.bind(settings)
    if is_sharded(settings.index_dir):
        names = read_manifest(settings.index_dir)["shards"]
        shard = _as_deployment(IndexShard)
        shards = [
            shard.options(name=f"IndexShard-{number}").bind(settings, settings.index_dir / name)
            for number, name in enumerate(names)
        ]
        return api.bind(settings, None, shards)
    writer = _as_deployment(IndexWriter).options(graceful_shutdown_timeout_s=settings.shutdown_timeout_s)
    return api.bind(settings, writer.bind(settings))


def app_builder(args: dict[str, Any]) -> serve.Application:
    """``serve run service.ray_serve:app_builder bundle=models/default index_dir=runs/index replicas=2``;
    args are settings (unset ones come from ``DISTILEMBED_*`` variables, then the defaults)."""
    return build_app(load_settings(dict(args)))


def check_locally(settings: Settings) -> None:
    """Fail in one line before any replica starts: the bundle loads and the index opens (read-only)."""
    encoder = load_encoder(settings)
    if settings.index_dir is None:
        return
    if not Path(settings.index_dir).is_dir():
        if not settings.create_index:
            load_index(settings, encoder.dim, None)  # raises the local service's message
        return
    from index.shards import open_index

    sha = bundle_sha256(settings.bundle)
    open_index(settings.index_dir, encoder.dim, sha, settings.nprobe, writable=False).close(checkpoint=False)


def local_cluster_env(settings: Settings) -> dict[str, str]:
    """Environment for a cluster started here (its processes read it when they start)."""
    if not settings.ray_haproxy:
        return {}
    # HAProxy straight to the replicas (Ray's Python proxy: 3x a local service's latency); a 1 s drain
    # (30 s by default); no per-request metrics log (CPU, for what /metrics has: docs/decisions.md, 33);
    # 30 s for a loaded small node's HAProxy manager to start (Serve's default: 3 checks of 5 s).
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
        "RAY_SERVE_HAPROXY_METRICS_ENABLED": "1" if settings.ray_haproxy_metrics else "0",
    }


def start(settings: Settings, **init: Any) -> str:
    """Join ``settings.ray_address`` or start a local cluster (``init``: ray.init args); start Serve."""
    import ray

    if settings.ray_address is not None:
        join(settings.ray_address, logging_level=logging.WARNING, **init)
    else:
        # The cluster's processes inherit this process's environment when ray.init starts them.
        added = {k: v for k, v in local_cluster_env(settings).items() if k not in os.environ}
        os.environ.update(added)
        try:
            ray.init(address="local", logging_level=logging.WARNING, **{"include_dashboard": False} | init)
        finally:
            for name in added:
                del os.environ[name]
    return start_serve(settings)


def start_serve(settings: Settings) -> str:
    """Start Serve's HTTP ingress on host:port, unless Serve already runs on the cluster: its HTTP
    options are the cluster's, fixed when it started. The URL the app answers at, either way."""
    from ray.serve.context import _get_global_client  # Serve's public API does not report them

    running = _get_global_client(raise_if_no_controller_running=False)
    if running is None:
        http = {"host": settings.host, "port": settings.port}
        serve.start(http_options=http, logging_config=_logging(settings))
        return f"http://{settings.host}:{settings.port}"
    host, port = running.http_config.host, running.http_config.port
    if (host, port) != (settings.host, settings.port):
        log.warning(
            "Ray Serve already runs on this cluster, on %s:%d: --host and --port apply only where the "
            "command starts Serve (`serve shutdown` on the cluster stops it, with all its apps)",
            host,
            port,
        )
    return f"http://{host}:{port}"


def _logging(settings: Settings) -> dict[str, Any]:
    return {"log_level": settings.log_level.upper(), "enable_access_log": settings.access_log}


def deploy(settings: Settings) -> DeploymentHandle:
    """Deploy (or update) the application on the connected cluster; returns once it is running."""
    try:
        return serve.run(
            build_app(settings), name=APP_NAME, route_prefix="/", logging_config=_logging(settings)
        )
    except RuntimeError as exc:
        raise UserError(f"the Ray Serve application did not start: {exc}") from exc


def stop(settings: Settings) -> None:
    """Remove the application; on a cluster started here, stop Serve and the cluster too."""
    import ray

    if not ray.is_initialized():
        return
    if settings.ray_address is not None:  # the cluster, and other Serve apps on it, stay up
        serve.delete(APP_NAME)
    else:
        serve.shutdown()
    ray.shutdown()


def run(settings: Settings) -> None:
    """``distilembed serve --engine ray``: deploy, then serve until SIGINT/SIGTERM."""
    if settings.ray_address is None:  # the paths are this machine's: check them before starting
        check_locally(settings)
    stop_event = threading.Event()

    def on_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop_event.set())

    on_signals()
    try:
        url = start(settings)
        on_signals()  # ray.init replaced the SIGTERM handler with its own (a stack dump, then abort)
        deploy(settings)
        scaling = f", autoscaling up to {settings.autoscale_max}" if settings.autoscale_max else ""
        log.info("Ray Serve: %s on %s, %d replica(s)%s", APP_NAME, url, settings.replicas, scaling)
        while not stop_event.wait(1.0):  # bounded waits keep the main thread answering signals
            pass
        log.info("stopping")
    finally:
        stop(settings)
