"""Webhook delivery: callback URLs checked when given and again when sent, deliveries signed, sent and retried.

Deliveries come from the outbox in the database (``paperlane.storage.webhooks``), so every API replica runs a
dispatcher and any of them may send a given webhook; each try is recorded.

A callback URL is parsed once, by the parser httpx connects with, and only an ASCII one is taken (an IDNA name in
its ``xn--`` form): there is no second reading of its host. Its host is resolved (``api.webhook_hosts`` first,
then DNS) when it is given and again at every delivery, and the delivery connects to the address that was checked
(pinned: the name goes in the Host header and TLS's SNI, the certificate is checked against it). An address is
private when it, or the IPv4 address it embeds (IPv4-mapped and -compatible, NAT64, 6to4, Teredo), is not
globally routable. Each delivery has one deadline for all of it; the receiver's body is never read.

A receiver checks ``X-Paperlane-Signature: t=<unix time>,v1=<hex>`` where ``<hex>`` is
HMAC-SHA256(tenant webhook secret, ``"<unix time>." + raw body``) and refuses old times (replays).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from anyio import to_thread

from paperlane.errors import UsageError
from paperlane.metrics import WEBHOOKS
from paperlane.retry import RetryPolicy
from paperlane.settings import ApiSettings
from paperlane.storage import tenants, webhooks
from paperlane.storage.db import Database, utcnow

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Paperlane-Signature"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_NAME = re.compile(rf"(?=.{{1,253}}\.?$)(?:{_LABEL}\.)*(?=[a-z0-9-]*[a-z])({_LABEL})\.?")  # the last label not numeric
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: where the IPv4 address sits is the operator's


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


@dataclass(frozen=True)
class Callback:
    """A callback URL as it is called: parsed once."""

    url: httpx.URL
    host: str  # lower case, ASCII; an IPv6 address without brackets
    port: int

    @property
    def netloc(self) -> str:
        """The Host header's value."""
        return self.url.netloc.decode("ascii")


def parse_callback(url: str, api: ApiSettings) -> Callback:
    """``url`` as a callback may be: an ASCII http(s) URL without credentials, whose host is a DNS name or an IP
    address and whose port is one of ``api.webhook_ports``. Raises UsageError saying what is wrong."""
    if len(url) > 2000 or not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise UsageError("callback_url must be an http(s) URL of at most 2,000 ASCII characters, without spaces or "
                         "control characters (an international domain name in its xn-- form)")
    try:
        parsed = httpx.URL(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise UsageError("callback_url is not a valid URL") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError("callback_url must be an http(s) URL")
    if parsed.userinfo:
        raise UsageError("callback_url may not hold a user name or password")
    host = parsed.host.lower()
    if _address(host) is None and not _NAME.fullmatch(host):
        raise UsageError("callback_url's host must be a DNS name or an IP address")
    if port not in api.webhook_ports:
        allowed = ", ".join(str(p) for p in api.webhook_ports)
        raise UsageError(f"callback_url's port must be one of {allowed} (api.webhook_ports)")
    return Callback(parsed, host, port)


def resolve(callback: Callback, api: ApiSettings) -> list[Address]:
    """The addresses a callback connects to, each checked: its IP address, ``api.webhook_hosts``'s address for its
    name, or what DNS answers. Raises UsageError for a name that does not resolve, or when any address is private
    and ``api.webhook_private`` is off (a name that also answers a private address is refused whole)."""
    literal = _address(callback.host)
    if literal is not None:
        found = [literal]
    elif (pinned := api.webhook_hosts.get(callback.host.rstrip("."))) is not None:
        found = [ipaddress.ip_address(pinned)]
    else:
        try:
            infos = socket.getaddrinfo(callback.host, callback.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise UsageError(f"callback_url's host {callback.host} does not resolve") from exc
        found = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    if not found:
        raise UsageError(f"callback_url's host {callback.host} does not resolve")
    if not api.webhook_private and not all(public(a) for a in found):
        raise UsageError("callback_url points at a private or local address")
    return found


def check_callback(url: str, api: ApiSettings) -> str:
    """The callback URL if it may be called; UsageError saying why not. Resolves its host: call it off the event
    loop."""
    resolve(parse_callback(url, api), api)
    return url


def public(address: Address) -> bool:
    """Whether ``address`` is globally routable; an IPv6 address that carries an IPv4 one is judged by that."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64_LOCAL:
            return False
        embedded = _embedded(address)
        if embedded is not None:
            address = embedded
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_unspecified)


def _embedded(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for: IPv4-mapped, IPv4-compatible (::a.b.c.d), NAT64, 6to4, Teredo."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    low = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _NAT64 or (int(address) >> 32 == 0 and int(address) > 1):
        return low
    return None


def _address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class Dispatcher:
    """Sends due webhooks until stopped; one per API process. Each delivery runs on its own, with one deadline
    (``api.webhook_timeout``) for resolving, connecting, sending and reading the answer's status; at most
    ``api.webhook_concurrency`` at once."""

    def __init__(self, db: Database, settings: ApiSettings, *, poll: float = 0.5) -> None:
        self.db, self.settings, self.poll = db, settings, poll
        self.retry = RetryPolicy(max_attempts=settings.webhook_attempts, backoff=settings.webhook_backoff)
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        # Name lookups block a thread until the system's resolver gives up: one per delivery in progress.
        self._resolver = ThreadPoolExecutor(settings.webhook_concurrency, thread_name_prefix="webhook-dns")

    async def run(self) -> None:
        # No proxy from the environment (it would connect instead of the pinned address); no connection kept for
        # another delivery (it was checked against another name).
        limits = httpx.Limits(max_connections=self.settings.webhook_concurrency, max_keepalive_connections=0)
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False, limits=limits,
                                     timeout=self.settings.webhook_timeout) as client:
            try:
                while not self._stop.is_set():
                    await self._round(client)
            finally:
                if self._running:
                    await asyncio.wait(self._running)
                self._resolver.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()

    async def _round(self, client: httpx.AsyncClient) -> None:
        """Start the due deliveries there is room for, then wait for room, a stop or the next poll."""
        free = self.settings.webhook_concurrency - len(self._running)
        due: list[webhooks.Delivery] = []
        if free > 0:
            try:
                due = await to_thread.run_sync(self._claim, free)
            except Exception:  # the database is down, say: try again later, never die
                log.exception("webhook dispatcher")
        for delivery in due:
            task = asyncio.create_task(self._deliver(client, delivery))
            self._running.add(task)
            task.add_done_callback(self._finished)
        if free > 0 and len(due) == free:
            return  # more may be due: claim again at once
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), self.poll)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._changed.set()

    def _claim(self, limit: int) -> list[webhooks.Delivery]:
        return webhooks.claim_due(self.db, now=utcnow(), lease=self.settings.webhook_timeout * 3, limit=limit)

    async def _deliver(self, client: httpx.AsyncClient, delivery: webhooks.Delivery) -> None:
        """One try: sent within its deadline, and recorded whatever happened (a lapsed lease retries it if even
        the record fails)."""
        try:
            body, secret = await to_thread.run_sync(self._prepare, delivery)
            status: int | None = None
            error: str | None = None
            started = time.perf_counter()
            try:
                async with asyncio.timeout(self.settings.webhook_timeout):
                    status = await self._post(client, delivery, body, secret)
            except TimeoutError:
                error = f"no answer within {self.settings.webhook_timeout:g} s (api.webhook_timeout)"
            except Exception as exc:  # a refused address, an unreadable URL, a reset: all a failed try
                error = f"{type(exc).__name__}: {exc}"[:500]
            seconds = time.perf_counter() - started
            outcome = await to_thread.run_sync(lambda: webhooks.record(
                self.db, delivery, status=status, error=error, seconds=seconds, now=utcnow(), policy=self.retry))
        except Exception:
            log.exception("webhook %s try %d: not recorded", delivery.id, delivery.attempt)
            return
        WEBHOOKS.labels(outcome).inc()
        log.info("webhook %s try %d to %s: %s (%s)", delivery.id, delivery.attempt, delivery.url, outcome,
                 status or error)

    async def _post(self, client: httpx.AsyncClient, delivery: webhooks.Delivery, body: bytes, secret: str) -> int:
        """POST to the address the callback's host was checked at; the answer's status (its body is not read)."""
        callback = parse_callback(delivery.url, self.settings)
        loop = asyncio.get_running_loop()
        addresses = await loop.run_in_executor(self._resolver, resolve, callback, self.settings)
        headers = {"Host": callback.netloc, "Content-Type": "application/json", "User-Agent": "paperlane-webhooks",
                   SIGNATURE_HEADER: sign(secret, body, int(time.time())),
                   "X-Paperlane-Event": delivery.event, "X-Paperlane-Delivery": delivery.id}
        extensions = {"sni_hostname": callback.host} if callback.url.scheme == "https" else {}
        url = callback.url.copy_with(host=str(addresses[0]))
        async with client.stream("POST", url, content=body, headers=headers, extensions=extensions) as response:
            return response.status_code

    def _prepare(self, delivery: webhooks.Delivery) -> tuple[bytes, str]:
        """The body to send and the tenant's secret to sign it with."""
        body = json.dumps(webhooks.payload(self.db, delivery), separators=(",", ":")).encode()
        return body, tenants.webhook_secret(self.db, delivery.tenant_id)
