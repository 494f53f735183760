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
        return error(exc.status_code, code, "no such resource" if exc.status_code == 404 else code.replace("_", " "))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, "internal", "internal error")
