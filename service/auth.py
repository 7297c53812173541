"""Access control (docs/decisions.md, 25): read keys (embed, similarity, search, count, GET documents,
info, optionally metrics) and write keys (upsert, delete, retrain, snapshot, field indexes), which
read too. Lists, so a key rotates with no restart. ``/health`` and ``/ready`` stay open for probes.

The check runs twice: as pure ASGI (``AccessMiddleware``), before the body is read, and as the routes'
``Security`` dependencies, which put both schemes in the OpenAPI document and pass at once what the
first let through (alone, they would let an anonymous client make the server parse a body: FastAPI
parses it before it runs dependencies). Keys are compared as SHA-256 digests against every key, no
early exit, so timing shows neither length nor position; as ``SecretStr`` they stay out of logs.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Annotated, Literal

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ApiError
from service.middleware import error_json
from service.settings import Settings

Access = Literal["read", "write"]
GRANTED = "distilembed_access"  # in the scope's state: what AccessMiddleware let through
_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="An API key (alternative header).")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyRing:
    """The configured keys, as digests, and what each grants."""

    def __init__(self, read: Iterable[str], write: Iterable[str]) -> None:
        self.write = [_digest(k) for k in write]
        self.read = [_digest(k) for k in read] + self.write

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        write = [k.get_secret_value() for k in settings.write_keys]
        if settings.api_key is not None:  # the single key of earlier versions: read and write
            write.append(settings.api_key.get_secret_value())
        return cls([k.get_secret_value() for k in settings.read_keys], write)

    @property
    def enabled(self) -> bool:
        return bool(self.read)

    @staticmethod
    def _matches(given: bytes, keys: list[bytes]) -> bool:
        found = False
        for key in keys:  # every key, always: the time does not say which one matched
            found |= hmac.compare_digest(given, key)
        return found

    def check(self, given: str | None, access: Access) -> None:
        """401 for no key or an unknown one, 403 for a read key on a write route."""
        if not self.enabled:
            return
        digest = _digest(given or "")
        if not given or not self._matches(digest, self.read):
            raise ApiError(401, "missing or unknown API key", "unauthorized", {"WWW-Authenticate": "Bearer"})
        if access == "write" and not self._matches(digest, self.write):
            raise ApiError(403, "this API key may read but not write", "forbidden")


def presented(headers: Mapping[str, str]) -> list[str]:
    """Every credential the request carries. An ``Authorization`` header that is not ``Bearer <key>``
    counts as a wrong key, not as no key: a bad credential is never outvoted by a good one."""
    given = []
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, key = authorization.partition(" ")
        given.append(key.strip() if scheme.lower() == "bearer" else "")
    if (header := headers.get("x-api-key")) is not None:
        given.append(header)
    return given


def check_headers(keys: KeyRing, headers: Mapping[str, str], access: Access) -> None:
    given: list[str | None] = [*presented(headers)] or [None]  # None: no key
    for key in given:
        keys.check(key, access)


def check_request(request: Request, access: Access) -> None:
    if request.scope.get("state", {}).get(GRANTED) not in (access, "write"):
        check_headers(request.app.state.keys, request.headers, access)


class AccessTable:
    """The access each route needs: a dict lookup for fixed paths (every hot route), else a match."""

    def __init__(self, routes: Iterable[tuple[BaseRoute, Access]]) -> None:
        self.fixed: dict[tuple[str, str], Access] = {}
        self.templated: list[tuple[re.Pattern[str], frozenset[str], Access]] = []
        for route, access in routes:
            assert isinstance(route, Route), route  # the routers hold plain routes
            methods = frozenset(route.methods or ())
            if route.param_convertors:
                self.templated.append((route.path_regex, methods, access))
            else:
                self.fixed.update(dict.fromkeys(((m, route.path) for m in methods), access))

    def needs(self, method: str, path: str) -> Access | None:
        """None: an open route, or no route (its 404 or 405 comes from the router)."""
        access = self.fixed.get((method, path))
        if access is None:
            for pattern, methods, needed in self.templated:
                if method in methods and pattern.match(path):
                    return needed
        return access


class AccessMiddleware:
    """The key check of every route that needs one, answered before the app reads the body."""

    def __init__(self, app: ASGIApp, keys: KeyRing, table: AccessTable) -> None:
        self.app, self.keys, self.table = app, keys, table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (needed := self.table.needs(scope["method"], scope["path"])):
            try:
                check_headers(self.keys, Headers(scope=scope), needed)
            except ApiError as exc:
                await error_json(scope, exc.status, exc.message, exc.kind, exc.headers)(scope, receive, send)
                return
            scope.setdefault("state", {})[GRANTED] = needed
        await self.app(scope, receive, send)


def _requirement(access: Access) -> Callable[..., Awaitable[None]]:
    # The Security parameters put both schemes in the OpenAPI document; the headers are read whole.
    async def require(
        request: Request,
        _bearer_doc: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
        _header_doc: Annotated[str | None, Security(_header)],
    ) -> None:
        check_request(request, access)

    return require


require_read = _requirement("read")
require_write = _requirement("write")
