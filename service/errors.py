"""Every error leaves as JSON ``{error, type, took_ms}`` with a meaningful status; 500 only for real bugs."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from distilembed.errors import BusyError, TooLargeError, UserError
from service.middleware import elapsed_ms, error_json

log = logging.getLogger("distilembed.service")


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers


def payload_too_large(message: str) -> ApiError:
    return ApiError(413, message, "payload_too_large")


def validation(message: str) -> ApiError:
    return ApiError(422, message, "validation_error")


def took_ms(request: Request) -> float:
    return elapsed_ms(request.scope)


def describe_errors(errors: Sequence[Any], whole: str = "body", most: int = 5) -> str:
    """Pydantic's errors as one line: ``where: what`` for the first ``most`` (``whole`` where the
    error is about the input as a whole), for HTTP 422 bodies and the CLI's bad settings alike."""
    # An omittable field is a union with None: its "Input should be None" branch is noise beside the
    # real error, and so are pydantic's validator names in the location and its "Value error, ".
    errors = [e for e in errors if e.get("type") != "none_required"] or errors
    parts = []
    for err in errors[:most]:
        loc = (str(p) for p in err.get("loc", ()))
        where = ".".join(p for p in loc if p != "body" and not p.startswith("function-")) or whole
        parts.append(f"{where}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}")
    more = f" (+{len(errors) - most} more)" if len(errors) > most else ""
    return "; ".join(parts) + more


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_json(request.scope, exc.status, exc.message, exc.kind, exc.headers)


NOT_JSON = "the request body is not valid JSON"
TOO_DEEP = "body: JSON nested too deeply to parse"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_json(request.scope, 400, NOT_JSON, "invalid_json")
    return error_json(request.scope, 422, describe_errors(errors), "validation_error")


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette's 405 names only the first route's).
    FastAPI >= 0.165 keeps an included router's routes behind one entry with no ``methods``."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if getattr(route, "methods", None):
            if route.matches(request.scope)[0] != Match.NONE:
                methods |= set(route.methods)
            continue
        contexts = getattr(route, "effective_route_contexts", ())
        for context in contexts() if callable(contexts) else contexts:
            if context.path_regex.match(request.scope["path"]):
                methods |= set(context.methods or ())
    return ", ".join(sorted(methods))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI's answer to a body it could not decode
        if isinstance(exc.__cause__, RecursionError):  # valid JSON, but past the parser's depth
            return error_json(request.scope, 422, TOO_DEEP, "validation_error")
        return error_json(request.scope, 400, NOT_JSON, "invalid_json")
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    kinds = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
    kind = kinds.get(exc.status_code, "http_error")
    return error_json(request.scope, exc.status_code, str(exc.detail), kind, headers)


ERROR_DESCRIPTIONS = {
    400: "The body is not valid JSON.",
    401: "No API key, or an unknown one.",
    403: "The API key may read but not write.",
    404: "No such document, or no index configured.",
    409: "The index is read-only here, or busy (a retrain or snapshot is running).",
    413: "The body, the number of texts or documents, or a metadata's keys, values or bytes is over the "
    "limit.",
    415: "The body is not `Content-Type: application/json`.",
    422: "The request breaks the schema or a limit of this server (the message says which).",
    429: "Too many texts are waiting for the encoder; retry after `Retry-After` seconds.",
    503: "Not ready yet, shutting down, or a part of the cluster is unavailable; retry after "
    "`Retry-After` seconds.",
}


def retry_after() -> dict[str, Any]:
    """The ``headers`` of a documented 429 or 503 (a new dict each time: FastAPI keeps what it is given)."""
    return {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


def documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each error status it can return, its body and ``Retry-After``."""
    from service.schemas import ErrorBody

    return {
        code: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[code]}
        | ({"headers": retry_after()} if code in (429, 503) else {})
        for code in codes
    }


async def require_json(request: Request) -> None:
    """415 for a body route called with another content type (TEI does the same)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        message = f"send the body as Content-Type: application/json, not {media or 'no type'}"
        raise ApiError(415, message, "unsupported_media_type")


def shown(directory: Path) -> str:
    """A server directory as a response names it: its name alone, as configured (links not followed)."""
    return Path(os.path.normpath(directory.absolute())).name or directory.anchor


class PathScrubber:
    """Names the server's directories by their names alone in the index layer's error messages (which
    name them whole, as the CLI should; over HTTP that tells the server's file layout). Each is matched
    as configured, absolute and resolved, the longest first, at path boundaries only."""

    def __init__(self, directories: Iterable[Path]) -> None:
        names: dict[str, str] = {}
        for directory in directories:
            for form in {str(directory), str(directory.absolute()), str(directory.resolve())}:
                names.setdefault(form, shown(directory))
        self._names = names = {form: name for form, name in names.items() if form != name}
        forms = "|".join(re.escape(form) for form in sorted(names, key=len, reverse=True))
        self._pattern = re.compile(rf"(?<![\w.~/-])(?:{forms})(?![\w-])") if names else None

    def __call__(self, message: str) -> str:
        return self._pattern.sub(lambda m: self._names[m.group(0)], message) if self._pattern else message


def user_error_json(scope: Scope, exc: UserError) -> JSONResponse:
    """A UserError from the index layer as its 409 (busy), 413 (too large) or 422, paths scrubbed."""
    message = scope["app"].state.scrub(str(exc))
    if isinstance(exc, BusyError):
        return error_json(scope, 409, message, "conflict")
    if isinstance(exc, TooLargeError):
        return error_json(scope, 413, message, "payload_too_large")
    return error_json(scope, 422, message, "validation_error")


async def _user_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UserError)
    return user_error_json(request.scope, exc)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """For a bug outside InternalErrorMiddleware or after a response began: the connection closes."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    service = getattr(request.app.state, "service", None)
    if service is not None:
        service.metrics.internal_errors.inc()
    return error_json(request.scope, 500, "internal server error", "internal_error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(Exception, _internal_error)
