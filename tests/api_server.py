"""A real ``paperlane api`` process for tests, and a local webhook receiver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.conftest import PAPERLANE, Stack, cli
from tests.services import free_port


class ApiProcess:
    """``paperlane --config CONFIG api`` on a free loopback port (tests and benchmarks)."""

    def __init__(self, config: Path, log: Path, *, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen([*PAPERLANE, "--config", str(config), "api", "--host", "127.0.0.1",
                                      "--port", str(self.port)], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                     env=env, cwd=log.parent, start_new_session=True)

    @classmethod
    def of(cls, stack: Stack, *, name: str = "api") -> ApiProcess:
        return cls(stack.config, stack.root / f"{name}.log", env=stack.env())

    def wait_ready(self, timeout: float = 60, *, token: str | None = None) -> ApiProcess:
        """Wait for /readyz (``token``: api.metrics_token, when the stack sets one)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"api exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", headers=headers, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"api not ready in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def memory(self) -> tuple[float, float]:
        """(resident, peak resident since the last ``reset_peak``) of the API process, in MiB."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def reset_peak(self) -> float:
        """Start measuring the peak resident memory afresh (Linux: clear_refs 5); the resident memory now, MiB."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self.memory()[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def create_key(stack: Stack, tenant: str, *, interactive: bool = False) -> tuple[str, str | None]:
    """A new key (and the tenant's webhook secret, when the tenant is new)."""
    res = cli(stack, "keys", "create", "--tenant", tenant, *(["--interactive"] if interactive else []))
    assert res.returncode == 0, res.stderr
    secret = None
    if "webhook signing secret:" in res.stderr:
        secret = res.stderr.split("webhook signing secret:")[1].split()[0]
    return res.stdout.split()[-1], secret


HOOKS = "hooks.test"  # the receivers' name: resolved by the API through api.webhook_hosts, never DNS


class Receiver:
    """An HTTP server on loopback, called by the name ``HOOKS`` (the API resolves it through ``api.webhook_hosts``
    and connects to the address it checked: the pinning path), that records what is POSTed to it and answers with
    ``statuses`` in turn. ``answer``: "now"; "trickle", its status line one byte a second (never whole within a
    delivery's deadline); "endless", status and headers at once, then a body that never ends."""

    def __init__(self, statuses: list[int], *, answer: str = "now") -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self._statuses = list(statuses)
        self._closing = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = owner._statuses.pop(0) if owner._statuses else 200
                if answer == "trickle":
                    owner._slowly(self.wfile, f"HTTP/1.1 {status} OK\r\nContent-Length: 0\r\n\r\n".encode(), 1.0)
                    return
                self.send_response(status)
                if answer == "endless":
                    self.send_header("Content-Length", str(1 << 40))
                    self.end_headers()
                    owner._slowly(self.wfile, b"x" * (1 << 20), 0.5)
                    return
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{HOOKS}:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _slowly(self, out: object, data: bytes, every: float) -> None:
        for i in range(len(data)):
            if self._closing.wait(every):
                return
            try:
                out.write(data[i:i + 1])  # type: ignore[attr-defined]
                out.flush()  # type: ignore[attr-defined]
            except OSError:  # the API gave up and closed: as it should
                return

    def wait(self, n: int, timeout: float = 60) -> list[tuple[dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            assert time.monotonic() < deadline, f"{len(self.requests)} webhook requests, wanted {n}"
            time.sleep(0.1)
        return self.requests

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


def receiver_settings(*receivers: Receiver, private: bool = True) -> dict[str, str]:
    """API settings under which callbacks reach these receivers: their ports allowed, their name resolved to
    loopback through api.webhook_hosts, loopback allowed (``private``)."""
    return {"API__WEBHOOK_PORTS": json.dumps([r.port for r in receivers]),
            "API__WEBHOOK_HOSTS": json.dumps({HOOKS: "127.0.0.1"}),
            "API__WEBHOOK_PRIVATE": "true" if private else "false"}


def sse_events(text: str) -> list[tuple[str, dict]]:
    """Parse a Server-Sent Events body into (event, data) pairs."""
    events = []
    for frame in text.split("\n\n"):
        lines = [ln for ln in frame.splitlines() if ln and not ln.startswith(":")]
        if not lines:
            continue
        fields = dict(ln.split(": ", 1) for ln in lines)
        events.append((fields.get("event", "message"), json.loads(fields["data"])))
    return events


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
