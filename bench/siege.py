"""Held connections for bench/hostile.py: ``idle`` ones connect and send nothing, ``slow`` ones
(slowloris) send a request line and Host, then one header line every ``pace_s``, never finishing.
Each records the seconds from its opening to the server's close and what the server sent."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

SLOW_HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
SLOW_LINE = b"X-a: b\r\n"


@dataclass
class Held:
    kind: str  # "idle" or "slow"
    # time.monotonic() as the connect began (so close times are upper bounds); None: failed to open
    opened: float | None = None
    closed_after_s: float | None = None  # from its opening to the server's close; None: not seen
    received: bytes = b""
    error: str | None = None  # why it failed to open, or the reset that closed it


async def open_held(held: Held, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    held.opened = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as error:
        held.opened, held.error = None, f"open: {type(error).__name__}"
        return None
    if held.kind == "slow":
        writer.write(SLOW_HEAD)
    return reader, writer


async def watch(
    held: Held, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pace_s: float, give_up_s: float
) -> None:
    """Read until the server closes (a slow one sends a header line each ``pace_s`` meanwhile), for at
    most ``give_up_s`` from the opening."""
    assert held.opened is not None
    try:
        while (left := held.opened + give_up_s - time.monotonic()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), min(pace_s, left))
            except TimeoutError:
                if held.kind == "slow":
                    writer.write(SLOW_LINE)
                continue
            if not chunk:
                held.closed_after_s = time.monotonic() - held.opened
                return
            held.received += chunk
    except ConnectionError as error:  # a reset is a close too
        held.closed_after_s = time.monotonic() - held.opened
        held.error = type(error).__name__
    finally:
        writer.close()


async def siege(
    helds: list[Held], port: int, pace_s: float, give_up_s: float, opened: threading.Event
) -> None:
    """Open every connection, set ``opened``, then hold them all until closed or given up."""
    connections = await asyncio.gather(*(open_held(h, port) for h in helds))
    opened.set()
    pairs = [(h, c) for h, c in zip(helds, connections, strict=True) if c is not None]
    await asyncio.gather(*(watch(h, *c, pace_s, give_up_s) for h, c in pairs))


def start(helds: list[Held], port: int, pace_s: float, give_up_s: float) -> threading.Thread:
    """The siege on its own event loop in a daemon thread, returned once every connection is open
    (or has failed to), so that a client in this thread measures while they are held."""
    opened = threading.Event()
    thread = threading.Thread(
        target=asyncio.run, args=(siege(helds, port, pace_s, give_up_s, opened),), daemon=True
    )
    thread.start()
    opened.wait(60)
    return thread


def closes(helds: list[Held], limit_s: float) -> dict[str, Any]:
    """How many were closed, their close times' min/median/max, and whether all came within ``limit_s``."""
    times = [h.closed_after_s for h in helds if h.closed_after_s is not None]
    stats: dict[str, Any] = {"n": len(helds), "closed": len(times)}
    if times:
        stats |= {"min_s": min(times), "median_s": float(np.median(times)), "max_s": max(times)}
    stats = {k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()}
    return stats | {"within_limit": len(times) == len(helds) and max(times, default=0.0) <= limit_s}
