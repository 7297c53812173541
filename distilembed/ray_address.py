"""A Ray cluster address checked before ``ray.init`` joins it.

``ray.init(address="host:port")`` with nothing listening there retries for minutes, printing
connection warnings, before it fails; a TCP connect with a short timeout says the same in seconds.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from distilembed.errors import UserError, first_line

CONNECT_TIMEOUT_S = 5.0
# Addresses Ray resolves itself: "auto" reads the cluster this machine started, "local" starts one.
SPECIAL = frozenset({"auto", "local"})


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of ``host:port`` or ``ray://host:port``; None for an address Ray resolves itself."""
    if address in SPECIAL:
        return None
    parsed = urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if not parsed.hostname or port is None:
        raise UserError(f"Ray address {address!r} is not host:port, ray://host:port, auto or local")
    return parsed.hostname, port


def require_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A one-line error unless something accepts TCP connections at ``address``."""
    target = host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:
        raise UserError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}): is `ray start --head` "
            "running there? (--ray-address / RAY_ADDRESS / DISTILEMBED_RAY_ADDRESS)"
        ) from None


def join(address: str, **init: Any) -> None:
    """``ray.init(address=address, **init)`` with an unreachable or unanswering cluster as a UserError
    (a TCP check first, then Ray's own ConnectionError, e.g. a Ray Client port that never answers)."""
    import ray

    require_reachable(address)
    try:
        ray.init(address=address, **init)
    except ConnectionError as exc:
        raise UserError(f"cannot join the Ray cluster at {address}: {first_line(exc)}") from None
