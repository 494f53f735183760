"""httpx on plain asyncio streams: the network layer under the vLLM client's connection pools.

httpx reaches the network through httpcore, and httpcore through AnyIO by default. For a streamed answer that is one
socket read per server-sent event, and AnyIO makes each read costly in the process that feeds the engine: a cancel
scope for the read's timeout, and the transport's reading resumed and paused around every wait (two ``epoll_ctl``
calls). At 40 answers streaming at once that was a tenth of that process's busy time. httpcore takes any network
backend that implements its ``AsyncNetworkBackend`` interface; this one is asyncio's own ``StreamReader`` and
``StreamWriter`` (the transport keeps reading into the reader's buffer, paused only when it is full), with
``asyncio.timeout`` for the read, write and connect timeouts, and httpcore's own exceptions for what goes wrong, as
its AnyIO backend raises them.

``transport(limits)`` is an ``httpx.AsyncHTTPTransport`` whose connection pool uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections.abc import Coroutine, Iterable
from typing import Any

import httpcore
import httpx

# As httpcore's own backends name them: (level, option, value) or (level, option, None, length).
SocketOption = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]

_READ_ERRORS = (OSError, asyncio.IncompleteReadError)


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except _READ_ERRORS as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except (OSError, ssl.SSLError) as exc:
            await self.aclose()
            raise httpcore.ConnectError(str(exc)) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info == "is_readable":
            # An idle pooled connection the server closed, or sent something on: not to be used again.
            return self._reader.at_eof() or _readable(self._writer.get_extra_info("socket"))
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[SocketOption] | None = None) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        return await _connected(asyncio.open_connection(host, port, local_addr=local), timeout, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[SocketOption] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        return await _connected(asyncio.open_unix_connection(path), timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """An HTTP/1.1 transport within ``limits`` whose connections are ``AsyncioStream``s.

    httpx's transport takes no network backend, so its connection pool is made here as httpx makes it, with one.
    """
    made = httpx.AsyncHTTPTransport(limits=limits)
    made._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
        http1=True, http2=False, network_backend=AsyncioBackend())
    return made


async def _connected(opening: Coroutine[Any, Any, tuple[asyncio.StreamReader, asyncio.StreamWriter]],
                     timeout: float | None, options: Iterable[SocketOption] | None) -> AsyncioStream:
    """The stream ``opening`` opens within ``timeout``, its socket given ``options``; httpcore's errors if not."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await opening
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(str(exc)) from exc
    except OSError as exc:
        raise httpcore.ConnectError(str(exc)) from exc
    sock = writer.get_extra_info("socket")
    for option in options or ():
        sock.setsockopt(*option)
    return AsyncioStream(reader, writer)


def _readable(sock: socket.socket | None) -> bool:
    """Whether the socket has something to read (or is gone): on an idle connection, the server closing it."""
    if sock is None or sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))
