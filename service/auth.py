"""Access control: read keys (embed, similarity, search, GET documents, info, optionally metrics) and
write keys (upsert, delete, retrain, snapshot). A write key also reads. Each is a list, so a key is
rotated by adding the new one, moving clients over, then removing the old one, with no restart of
clients in between. ``/health`` and ``/ready`` stay open for probes.

Keys are compared as SHA-256 digests with ``hmac.compare_digest`` against every configured key (no
early exit), so neither a key's length nor its position in the list shows in the timing. Keys are
``SecretStr`` in the settings: they never appear in logs, reprs or error messages.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Annotated, Literal

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from service.errors import ApiError
from service.settings import Settings

Access = Literal["read", "write"]
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
        """Nothing if ``given`` grants ``access``; 401 for no key or an unknown one, 403 for a read
        key on a write route."""
        if not self.enabled:
            return
        digest = _digest(given or "")
        if not given or not self._matches(digest, self.read):
            raise ApiError(401, "missing or unknown API key", "unauthorized", {"WWW-Authenticate": "Bearer"})
        if access == "write" and not self._matches(digest, self.write):
            raise ApiError(403, "this API key may read but not write", "forbidden")


def presented(request: Request) -> list[str]:
    """Every credential the request carries. An ``Authorization`` header that is not ``Bearer <key>``
    counts as a wrong key, not as no key: a bad credential is never outvoted by a good one."""
    given = []
    authorization = request.headers.get("authorization")
    if authorization is not None:
        scheme, _, key = authorization.partition(" ")
        given.append(key.strip() if scheme.lower() == "bearer" else "")
    if (header := request.headers.get("x-api-key")) is not None:
        given.append(header)
    return given


def check_request(request: Request, access: Access) -> None:
    keys: KeyRing = request.app.state.keys
    given: Sequence[str | None] = presented(request) or [None]  # None: no key
    for key in given:
        keys.check(key, access)


# The Security parameters put both schemes in the OpenAPI document; the headers are read whole.
async def require_read(
    request: Request,
    _bearer_doc: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    _header_doc: Annotated[str | None, Security(_header)],
) -> None:
    check_request(request, "read")


async def require_write(
    request: Request,
    _bearer_doc: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    _header_doc: Annotated[str | None, Security(_header)],
) -> None:
    check_request(request, "write")
