"""Every error leaves as JSON ``{error, type, took_ms}`` with a meaningful status; 500 only for real bugs."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from distilembed.errors import BusyError, UserError

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
    start = getattr(request.state, "start", None)
    return round((time.perf_counter() - start) * 1000, 3) if start is not None else 0.0


def error_response(
    request: Request, status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": message, "type": kind, "took_ms": took_ms(request)}
    return JSONResponse(body, status_code=status, headers=headers)


def _describe(errors: list[Any]) -> str:
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(request, exc.status, exc.message, exc.kind, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    kind = "invalid_json" if any(e.get("type") == "json_invalid" for e in errors) else "validation_error"
    return error_response(request, 422, _describe(errors), kind)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kinds = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
    kind = kinds.get(exc.status_code, "http_error")
    return error_response(request, exc.status_code, str(exc.detail), kind, exc.headers)


async def _user_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, BusyError):
        return error_response(request, 409, str(exc), "conflict")
    return error_response(request, 422, str(exc), "validation_error")


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    service = getattr(request.app.state, "service", None)
    if service is not None:
        service.metrics.internal_errors.inc()
    return error_response(request, 500, "internal server error", "internal_error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(Exception, _internal_error)
