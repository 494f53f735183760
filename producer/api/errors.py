"""The API's one error shape, ``{"error": {"code": ..., "message": ...}}``, with a public message only: nothing
internal (a traceback, a SQL statement, a host name) reaches a client. Another tenant's ids answer 404, as
unknown ids do. Reasons recorded on rows (a page's error, an ingest's failures) go out through ``public``, which
strips internal addresses and SQL from them."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from paperlane.errors import NotFound, StorageUnavailable, UsageError, first_error, public_reason, redact

log = logging.getLogger(__name__)

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    """Every error's body."""

    error: ErrorDetail


def _documented(what: str, **headers: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": what,
            **({"headers": {h: {"description": d, "schema": {"type": "string"}} for h, d in headers.items()}}
               if headers else {})}


# The answers any route may give, in the one shape: the OpenAPI document lists them on every operation.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: _documented("a malformed request: a control character in the path or query, a bad multipart body, a "
                     "callback URL that may not be called"),
    401: _documented("no key, or an unknown or revoked one", **{"WWW-Authenticate": "Bearer"}),
    403: _documented("the key may not do this (the interactive lane, a bucket not granted)"),
    404: _documented("no such resource, or another tenant's"),
    405: _documented("the path does not take this method", Allow="the methods it takes"),
    409: _documented("not ready yet: its pages are being processed or its outputs written",
                    **{"Retry-After": "seconds"}),
    413: _documented("a body, an upload or its pages over a limit"),
    415: _documented("not a format paperlane reads"),
    422: _documented("a parameter or body field out of its range or type"),
    429: _documented("over a rate, budget or stream limit, or (busy) too many of the tenant's requests waiting for "
                     "their turn", **{"Retry-After": "seconds"}),
    503: _documented("a service paperlane needs is unreachable, or an archive format's build did not finish "
                     "(build_failed: past its limits; build_busy: queued too long)", **{"Retry-After": "seconds"}),
}

_REASONS = frozenset({"error", "reason"})


def public(view: T) -> T:
    """``view`` (a status view, a page's result) with every reason in it (``error``, ``reason``) redacted."""
    return _redacted(view)


def _redacted(view: Any) -> Any:
    if isinstance(view, dict):
        return {k: redact(v) if k in _REASONS and isinstance(v, str) else _redacted(v) for k, v in view.items()}
    if isinstance(view, list):
        return [_redacted(v) for v in view]
    return view


def install(app: FastAPI) -> None:
    """Answer every error in the one shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return error(404, "not_found", "no such resource")

    @app.exception_handler(UsageError)
    async def usage(request: Request, exc: UsageError) -> JSONResponse:
        return error(400, "invalid_request", redact(public_reason(exc)))

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # The client went away, or the guard cut a body off past its limit (and answered 413 itself).
        return error(400, "client_disconnected", "the request body did not arrive whole")

    @app.exception_handler(StorageUnavailable)
    async def unavailable(request: Request, exc: StorageUnavailable) -> JSONResponse:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return error(503, "unavailable", "a service paperlane needs is unreachable; try again", {"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "invalid_request", first_error(exc, unnamed=("body",)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, code, "no such resource" if exc.status_code == 404 else code.replace("_", " "),
                     dict(exc.headers or {}))  # 405's Allow

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, "internal", "internal error")
