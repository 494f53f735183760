"""Webhook delivery: callback URLs checked when given, deliveries signed, sent and retried.

Deliveries come from the outbox in the database (``paperlane.storage.webhooks``), so every API replica runs a
dispatcher and any of them may send a given webhook; each try is recorded.

A receiver checks ``X-Paperlane-Signature: t=<unix time>,v1=<hex>`` where ``<hex>`` is
HMAC-SHA256(tenant webhook secret, ``"<unix time>." + raw body``) and refuses old times (replays).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
from urllib.parse import urlsplit

import httpx
from anyio import to_thread

from paperlane.errors import UsageError
from paperlane.metrics import WEBHOOKS
from paperlane.settings import ApiSettings
from paperlane.storage import tenants, webhooks
from paperlane.storage.db import Database, utcnow

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Paperlane-Signature"


def sign(secret: str, body: bytes, at: int) -> str:
    digest = hmac.new(secret.encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={digest}"


def verify(secret: str, body: bytes, header: str, *, tolerance: float = 300, now: float | None = None) -> bool:
    """For receivers (and tests): is ``header`` a valid, recent signature of ``body``?"""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        at = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - at) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, body, at), header)


def check_callback(url: str, *, allow_private: bool) -> str:
    """The callback URL if it may be called; UsageError saying why not. Private, loopback and link-local
    addresses (the metadata service, the database) are refused unless allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2000:
        raise UsageError("callback_url must be an http(s) URL")
    if allow_private:
        return url
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"callback_url host {parts.hostname} does not resolve") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise UsageError("callback_url points at a private or local address")
    return url


class Dispatcher:
    """Sends due webhooks until stopped; one per API process."""

    def __init__(self, db: Database, settings: ApiSettings, *, poll: float = 0.5) -> None:
        self.db, self.settings, self.poll = db, settings, poll
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self.settings.webhook_timeout, follow_redirects=False) as client:
            while not self._stop.is_set():
                try:
                    due = await to_thread.run_sync(self._claim)
                    await asyncio.gather(*(self._send(client, d) for d in due))
                except Exception:  # the database is down, say: try again later, never die
                    log.exception("webhook dispatcher")
                    due = []
                if not due:
                    try:
                        await asyncio.wait_for(self._stop.wait(), self.poll)
                    except TimeoutError:
                        pass

    def stop(self) -> None:
        self._stop.set()

    def _claim(self) -> list[webhooks.Delivery]:
        return webhooks.claim_due(self.db, now=utcnow(), lease=self.settings.webhook_timeout * 3)

    async def _send(self, client: httpx.AsyncClient, delivery: webhooks.Delivery) -> None:
        body, secret = await to_thread.run_sync(self._prepare, delivery)
        headers = {"Content-Type": "application/json", "User-Agent": "paperlane-webhooks",
                   SIGNATURE_HEADER: sign(secret, body, int(time.time())),
                   "X-Paperlane-Event": delivery.event, "X-Paperlane-Delivery": delivery.id}
        status: int | None = None
        error: str | None = None
        started = time.perf_counter()
        try:
            response = await client.post(delivery.url, content=body, headers=headers)
            status = response.status_code
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        seconds = time.perf_counter() - started
        outcome = await to_thread.run_sync(lambda: webhooks.record(
            self.db, delivery, status=status, error=error, seconds=seconds, now=utcnow(),
            max_attempts=self.settings.webhook_attempts, backoff=self.settings.webhook_backoff))
        WEBHOOKS.labels(outcome).inc()
        log.info("webhook %s try %d to %s: %s (%s)", delivery.id, delivery.attempt, delivery.url, outcome,
                 status or error)

    def _prepare(self, delivery: webhooks.Delivery) -> tuple[bytes, str]:
        """The body to send and the tenant's secret to sign it with."""
        body = json.dumps(webhooks.payload(self.db, delivery), separators=(",", ":")).encode()
        return body, tenants.webhook_secret(self.db, delivery.tenant_id)
