"""Joining a Ray cluster at an address, with a failure said in one line.

``ray.init(address="host:port")`` with nothing listening there retries for minutes before it fails;
a TCP connect with a short timeout says the same in seconds. A cluster that refuses this process's
token (``RAY_AUTH_MODE=token``) is asked 20 times, a C++ warning line a second, before ``ray.init``
raises "Failed to connect": ``join`` asks ``JOIN_ATTEMPTS`` times, holds those lines back and names
the likely causes instead.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from distilembed.errors import UserError, first_line

CONNECT_TIMEOUT_S = 5.0
# Attempts (about a second each) to reach a cluster's GCS that answers; Ray's own default is 20.
JOIN_ATTEMPTS = 5
ATTEMPTS_VARIABLE = "RAY_gcs_server_port_wait_time_s"  # Ray reads it as that number of attempts
# Addresses Ray resolves itself: "auto" reads the cluster this machine started, "local" starts one.
SPECIAL = frozenset({"auto", "local"})
CLIENT_SCHEME = "ray://"
TOKEN_HINT = "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (`ray get-auth-token` on the cluster's head)"
# What Ray says when the cluster refuses a missing or wrong token, and when this process has none.
REFUSED = ("InvalidAuthToken", "Unauthenticated", "UNAUTHENTICATED")
TOKEN_MISSING = "no authentication token was found"


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


def is_client(address: str) -> bool:
    """A Ray Client address (``ray://host:port``): this process drives the cluster from outside it."""
    return address.startswith(CLIENT_SCHEME)


def require_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A one-line error unless something accepts TCP connections at ``address``."""
    target = host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=timeout).close()
    except OSError as exc:
        raise UserError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}): is `ray start --head` "
            "running there? (--ray-address / RAY_ADDRESS / DISTILEMBED_RAY_ADDRESS)"
        ) from None


def join(address: str, **init: Any) -> None:
    """``ray.init(address=address, **init)``, or a UserError in one line: nothing listening (a TCP
    check first), the cluster refusing this process's token, or any other failure to join."""
    import ray
    from ray.exceptions import AuthenticationError

    require_reachable(address)
    failure: Exception | None = None
    with _attempts_at_most(JOIN_ATTEMPTS), _stderr_held() as held:
        try:
            ray.init(address=address, **init)
        except Exception as exc:  # sorted below, once stderr is back
            failure = exc
    if not isinstance(failure, ConnectionError | AuthenticationError):
        sys.stderr.write(held[0])  # Ray's own notices: of a join that worked, or of another error
        if failure is not None:
            raise failure
        return
    raise UserError(join_failure(address, failure, held[0])) from None


def join_failure(address: str, exc: BaseException, stderr: str = "") -> str:
    """One line for a failed ``ray.init(address=...)``: ``exc`` and what Ray printed meanwhile."""
    said = " ".join([stderr, *(f"{type(e).__name__} {e}" for e in _chain(exc))])
    if TOKEN_MISSING in said:
        return (
            "RAY_AUTH_MODE=token but this process has no Ray auth token: set RAY_AUTH_TOKEN "
            "(`ray get-auth-token` on the cluster's head) or RAY_AUTH_TOKEN_PATH"
        )
    if any(sign in said for sign in REFUSED):
        return f"the Ray cluster at {address} uses token auth and refused this process: set {TOKEN_HINT}"
    port = (
        "Ray Client port, 10001 unless `ray start --ray-client-server-port`"
        if is_client(address)
        else "GCS port, 6379 unless `ray start --head --port`"
    )
    return (
        f"cannot join the Ray cluster at {address} ({first_line(exc)}): check the address (the head's "
        f"{port} chose another) and, if the cluster uses token auth, set {TOKEN_HINT}"
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        yield current
        current = current.__cause__ or current.__context__


@contextmanager
def _attempts_at_most(attempts: int) -> Iterator[None]:
    """Ray's attempts to reach a cluster's GCS capped at ``attempts``, unless the user chose a number."""
    chosen = ATTEMPTS_VARIABLE in os.environ
    os.environ.setdefault(ATTEMPTS_VARIABLE, str(attempts))
    try:
        yield
    finally:
        if not chosen:
            os.environ.pop(ATTEMPTS_VARIABLE, None)


@contextmanager
def _stderr_held() -> Iterator[list[str]]:
    """File descriptor 2 points at a temporary file while the block runs: Ray's C++ client writes
    its connection warnings there, past Python's logging. The text is in the list afterwards."""
    held: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as file:
        os.dup2(file.fileno(), 2)
        try:
            yield held
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            file.seek(0)
            held.append(file.read().decode(errors="replace"))
