"""httpx on asyncio's streams (models/http_streams.py), the vLLM client's network layer, against real sockets: answers
streamed in many small chunks, kept-alive connections the server closed, and every failure as httpx's own error."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from paperlane.models.http_streams import AsyncioStream, transport
from tests.services import free_port

LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=4)
Handler = Callable[[socket.socket, int], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], str]]:
    """A loopback TCP server running ``handler(connection, n)`` for its n-th connection on a thread; its base URL."""
    stops: list[Callable[[], None]] = []

    def start(handler: Handler) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        done = threading.Event()

        def accept() -> None:
            n = 0
            while not done.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=handler, args=(conn, n), daemon=True).start()
                n += 1

        threading.Thread(target=accept, daemon=True).start()

        def stop() -> None:
            done.set()
            listener.close()

        stops.append(stop)
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for stop in stops:
        stop()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            break
        data += got
    return data


EVENTS = [f"data: {{\"n\": {i}}}\n\n".encode() for i in range(300)]


def _stream_events(conn: socket.socket, n: int) -> None:
    """An answer of server-sent events, each in its own chunk and its own send, as vLLM streams them."""
    with conn:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in EVENTS:
            conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
        conn.sendall(b"0\r\n\r\n")


def _answer_then_close(conn: socket.socket, n: int) -> None:
    """Answers one request, kept alive as far as its headers say, then closes the connection."""
    with conn:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\nconnection %d" % (len(b"connection 0"), n))


def _silent(conn: socket.socket, n: int) -> None:
    with conn:
        _read_request(conn)
        threading.Event().wait(2)


def _get(url: str, *, timeout: float = 5.0, times: int = 1, pause: float = 0.0) -> list[tuple[bytes, object]]:
    async def main() -> list[tuple[bytes, object]]:
        got = []
        async with httpx.AsyncClient(transport=transport(LIMITS), timeout=timeout) as client:
            for _ in range(times):
                async with client.stream("GET", url) as resp:
                    body = b"".join([chunk async for chunk in resp.aiter_bytes()])
                    got.append((body, resp.extensions.get("network_stream")))
                await asyncio.sleep(pause)
        return got

    return asyncio.run(main())


def test_an_answer_in_many_small_chunks_arrives_whole_through_asyncio_streams(serve: Callable[[Handler], str]) -> None:
    [(body, stream)] = _get(serve(_stream_events) + "/v1/chat/completions")
    assert body == b"".join(EVENTS)
    assert isinstance(stream, AsyncioStream)


def test_a_kept_alive_connection_the_server_closed_is_not_used_again(serve: Callable[[Handler], str]) -> None:
    got = _get(serve(_answer_then_close), times=3, pause=0.2)
    assert [body for body, _ in got] == [b"connection 0", b"connection 1", b"connection 2"]


def test_a_server_that_never_answers_is_httpx_s_read_timeout(serve: Callable[[Handler], str]) -> None:
    with pytest.raises(httpx.ReadTimeout):
        _get(serve(_silent), timeout=0.3)


def test_a_port_nobody_listens_on_is_httpx_s_connect_error() -> None:
    with pytest.raises(httpx.ConnectError):
        _get(f"http://127.0.0.1:{free_port()}/")


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (cryptography comes with ocrmypdf's pdfminer, a test dependency)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_an_https_server_is_read_over_tls_verified_as_httpx_verifies_it(
        serve: Callable[[Handler], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _self_signed(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)

    def tls_events(conn: socket.socket, n: int) -> None:
        try:
            wrapped = server_side.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()  # a client that did not trust the certificate
            return
        _stream_events(wrapped, n)

    url = serve(tls_events).replace("http://", "https://") + "/v1/chat/completions"
    with pytest.raises(httpx.ConnectError):  # the machine's own authorities do not know this certificate
        _get(url)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # as httpx's own default transport reads it (trust_env)
    [(body, stream)] = _get(url)
    assert body == b"".join(EVENTS)
    assert isinstance(stream, AsyncioStream) and stream.get_extra_info("ssl_object") is not None
