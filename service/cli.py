"""``distilembed serve``: uvicorn, one worker, graceful shutdown; or ``--engine ray``: the same app on
Ray Serve (service/ray_serve.py). Flags override ``DISTILEMBED_*``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

Opt = typer.Option
# escaped: the help is rich markup, where a bare [ray] is a style tag and vanishes
ENGINE_HELP = f"local (uvicorn here) | ray (Ray Serve, the {escape('[ray]')} extra) (env DISTILEMBED_ENGINE)."


def serve_command(
    bundle: Annotated[
        Path | None, Opt(help="Bundle directory (env DISTILEMBED_BUNDLE; default models/default).")
    ] = None,
    variant: Annotated[str | None, Opt(help="int8 | fp32 (env DISTILEMBED_VARIANT).")] = None,
    index_dir: Annotated[Path | None, Opt("--index", help="Live index (env DISTILEMBED_INDEX_DIR).")] = None,
    create_index: Annotated[
        bool | None,
        Opt("--create-index/--no-create-index", help="Create an empty --index if it does not exist."),
    ] = None,
    host: Annotated[str | None, Opt(help="Bind address (env DISTILEMBED_HOST; default 127.0.0.1).")] = None,
    port: Annotated[int | None, Opt(help="Port (env DISTILEMBED_PORT; default 8080).")] = None,
    threads: Annotated[int | None, Opt(help="Cores the encoder uses (env DISTILEMBED_THREADS).")] = None,
    workers: Annotated[
        int | None, Opt(help="Model calls at once, threads / workers each (env DISTILEMBED_WORKERS).")
    ] = None,
    max_batch: Annotated[
        int | None, Opt(help="Texts per encoder call (env DISTILEMBED_MAX_BATCH; default 128).")
    ] = None,
    run_batch: Annotated[
        int | None, Opt(help="Rows per model run (env DISTILEMBED_RUN_BATCH; default 32).")
    ] = None,
    max_wait_ms: Annotated[
        float | None, Opt(help="Batch fill wait under load (env DISTILEMBED_MAX_WAIT_MS).")
    ] = None,
    max_queue: Annotated[int | None, Opt(help="Queued texts before 429 (env DISTILEMBED_MAX_QUEUE).")] = None,
    max_items: Annotated[int | None, Opt(help="Texts per request (env DISTILEMBED_MAX_ITEMS).")] = None,
    model_name: Annotated[str | None, Opt(help="Reported model name (env DISTILEMBED_MODEL_NAME).")] = None,
    nprobe: Annotated[int | None, Opt(help="Default IVF nprobe (env DISTILEMBED_NPROBE).")] = None,
    log_level: Annotated[str | None, Opt(help="critical|error|warning|info|debug.")] = None,
    access_log: Annotated[bool | None, Opt("--access-log/--no-access-log", help="Log every request.")] = None,
    engine: Annotated[str | None, Opt(help=ENGINE_HELP)] = None,
    replicas: Annotated[int | None, Opt(help="Ray: replicas (env DISTILEMBED_REPLICAS; default 1).")] = None,
    autoscale_max: Annotated[
        int | None, Opt(help="Ray: autoscale from --replicas up to this many on requests in flight.")
    ] = None,
    replica_cpus: Annotated[
        float | None, Opt(help="Ray: CPUs per replica, its default --threads (default 1).")
    ] = None,
    ray_address: Annotated[
        str | None,
        Opt(help="Ray: cluster, host:port, auto or ray://host:10001 (env RAY_ADDRESS); unset: a local one."),
    ] = None,
) -> None:
    """Serve embed / similarity / search over HTTP (FastAPI + uvicorn, no torch; or Ray Serve)."""
    # first: locals() holds the parameters alone, each named as its setting
    flags = {name: value for name, value in locals().items() if value is not None}
    from distilembed.errors import UserError
    from service.settings import load_settings

    settings = load_settings(flags)
    if settings.engine == "ray":
        try:
            from service import ray_serve
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != "ray":
                raise
            raise UserError("--engine ray needs Ray Serve: pip install 'distilembed[ray]'") from None
        ray_serve.run(settings)
        return
    from service.server import run

    run(settings)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
