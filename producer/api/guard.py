"""The API's door: who is calling and how much they may send, decided before a byte of a body is read.

A plain ASGI middleware, so that it runs before FastAPI reads and parses a body for a route's parameters:

- every request under ``/v1/`` needs a key. A client address with ``api.auth_failures_per_minute`` failed
  authentications in the last minute is refused (429) before its key is looked at; a missing, unknown or revoked
  key is 401 (and one more failure of its address); past the key's or its tenant's rate, 429. The caller goes
  into the request's scope (``service.CALLER``) for the routes.
- ``/metrics`` and ``/readyz`` need ``api.metrics_token`` when one is set (401 otherwise).
- a path or query that holds a control character (a NUL byte, say), a lone surrogate or a non-character XML cannot
  hold is answered before anything looks it up (a path: 404, no resource is called that; a query: 400): ids, path
  segments, cursors and names in the query never reach the database or a writer with those in them (bodies are
  checked by their models).
- every body is capped: an upload (``POST /v1/documents``) at ``api.max_upload_bytes``, any other at
  ``api.max_body_bytes``; past it, 413 at once (from its Content-Length) or the moment it passes (a chunked
  body), the connection closed, and the route sees a client that went away.
"""

from __future__ import annotations

import hmac
import re
from functools import partial
from urllib.parse import parse_qsl
from typing import Any

from anyio import to_thread
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from paperlane.producer.api.errors import error
from paperlane.producer.api.limits import retry_after
from paperlane.producer.api.service import CALLER, Service
from paperlane.storage.tenants import Caller, hash_key

MULTIPART_SLACK = 64 * 1024  # an upload's form around its file
_UPLOAD = ("POST", "/v1/documents")
_OPERATOR = ("/metrics", "/readyz")
_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}
_ODD = re.compile("[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")  # in a path or a query: never a valid one


class Guard:
    """Authenticate, rate limit and cap the body of every request before the app reads it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        svc: Service = scope["app"].state.service
        headers = Headers(scope=scope)
        limit, what = _body_limit(svc, scope)
        refusal = _odd(scope) or await _door(svc, scope, headers)
        if refusal is None and _declared(headers) > limit:
            refusal = _too_large(limit, what)
        if refusal is not None:
            if _declared(headers) or "transfer-encoding" in headers:  # a body we will not read: close after
                refusal.headers["Connection"] = "close"
            await refusal(scope, receive, send)
            return
        await _bounded(self.app, scope, receive, send, limit, what)


def _odd(scope: Scope) -> Response | None:
    """404 when the path, 400 when a query parameter, holds a character no id, cursor or name of this API holds."""
    query = scope.get("query_string", b"").decode("utf-8", "surrogateescape")
    try:
        values = [v for pair in parse_qsl(query, keep_blank_values=True, errors="surrogateescape") for v in pair]
    except ValueError:  # more fields than parse_qsl takes
        return error(400, "invalid_request", "the query string could not be read")
    if _ODD.search(scope["path"]):
        return error(404, "not_found", "no such resource: the path holds a control character or one no text may hold")
    if any(_ODD.search(v) for v in values):
        return error(400, "invalid_request", "a query parameter holds a control character or one no text may hold")
    return None


async def _door(svc: Service, scope: Scope, headers: Headers) -> Response | None:
    """Why the request may not go in (a response), or None; a key's caller goes into the scope."""
    path: str = scope["path"]
    if path == "/v1" or path.startswith("/v1/"):
        found = await _caller(svc, scope, headers)
        if isinstance(found, Response):
            return found
        scope[CALLER] = found
    elif path in _OPERATOR and svc.settings.api.metrics_token is not None:
        token = svc.settings.api.metrics_token.get_secret_value()
        if not hmac.compare_digest(_bearer(headers).encode(), token.encode()):
            return error(401, "unauthorized", f"{path} needs the operators' token: Authorization: Bearer TOKEN",
                         _UNAUTHORIZED)
    return None


async def _caller(svc: Service, scope: Scope, headers: Headers) -> Caller | Response:
    api, limits = svc.settings.api, svc.limits
    client = _client(scope)
    wait = await to_thread.run_sync(partial(limits.admit, {client: api.auth_failures_per_minute}, log=False))
    if wait:
        return error(429, "auth_throttled", f"more than {api.auth_failures_per_minute} requests without a valid key "
                     "from this address in a minute", {"Retry-After": retry_after(wait)})
    key = _bearer(headers)
    found = await to_thread.run_sync(svc.caller, key) if key else None
    if found is None:
        await to_thread.run_sync(limits.count, client)
        why = "unknown or revoked API key" if key else "an API key is needed: Authorization: Bearer KEY"
        return error(401, "unauthorized", why, _UNAUTHORIZED)
    wait = await to_thread.run_sync(limits.admit, {f"key.{found.key_id}": api.rate_per_minute,
                                                   f"tenant.{found.tenant_id}": api.tenant_rate_per_minute})
    if wait:
        return error(429, "rate_limited", f"more than {api.rate_per_minute} requests a minute with this key, or "
                     f"{api.tenant_rate_per_minute} with this tenant's keys", {"Retry-After": retry_after(wait)})
    return found


def turn_of(svc: Service, scope: Scope) -> str:
    """Whose turn the request takes (``producer.api.turns``), known without the database: its key's tenant when
    the key is in the cache, the key's own digest when it is not (an unknown key waits alone), the client's
    address when it has no key."""
    key = _bearer(Headers(scope=scope))
    if not key:
        return _client(scope)
    found = svc.cached_caller(key)
    return f"tenant.{found.tenant_id}" if found is not None else f"key.{hash_key(key)}"


def _client(scope: Scope) -> str:
    return f"client.{scope['client'][0] if scope.get('client') else 'unknown'}"


def _bearer(headers: Headers) -> str:
    scheme, _, key = headers.get("authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


def _body_limit(svc: Service, scope: Scope) -> tuple[int, str]:
    api = svc.settings.api
    if (scope["method"], scope["path"].rstrip("/")) == _UPLOAD:
        return api.max_upload_bytes + MULTIPART_SLACK, f"the upload is over {api.max_upload_bytes:,} bytes " \
                                                       "(api.max_upload_bytes)"
    return api.max_body_bytes, f"the request body is over {api.max_body_bytes:,} bytes (api.max_body_bytes)"


def _declared(headers: Headers) -> int:
    length = headers.get("content-length", "")
    return int(length) if length.isdigit() else 0


def _too_large(limit: int, what: str) -> Response:
    return error(413, "too_large", what)


async def _bounded(app: ASGIApp, scope: Scope, receive: Receive, send: Send, limit: int, what: str) -> None:
    """Run the app on a body cut off past ``limit``: then 413 goes out, the app reads a disconnect and whatever it
    answers is dropped."""
    state: dict[str, Any] = {"read": 0, "cut": False, "started": False}

    async def bounded_receive() -> Message:
        if state["cut"]:
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.request":
            state["read"] += len(message.get("body", b""))
            if state["read"] > limit:
                state["cut"] = True
                if not state["started"]:
                    refusal = _too_large(limit, what)
                    refusal.headers["Connection"] = "close"
                    await refusal(scope, receive, send)
                return {"type": "http.disconnect"}
        return message

    async def guarded_send(message: Message) -> None:
        if state["cut"]:
            return
        if message["type"] == "http.response.start":
            state["started"] = True
        await send(message)

    await app(scope, bounded_receive, guarded_send)
