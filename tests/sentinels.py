"""A Redis Sentinel group for the tests: one master, two replicas and three Sentinels on loopback, from the real
``redis-server`` binary (``--sentinel`` with a config file each), stopped by PID like ``tests.services``; and a
backlog of page messages for the lost-message sweep's cost (``message_like``, ``fill_backlog``)."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
from datetime import timedelta
from dataclasses import dataclass, field
from pathlib import Path

import redis

from paperlane.priority.fair import FairLanes, Share
from paperlane.priority.lanes import Lane
from paperlane.storage.db import Database, utcnow
from paperlane.storage.tables import JobRow
from tests.services import ServiceError, _binary, _wait, free_port

MASTER_NAME = "paperlane"
DOWN_AFTER_MS = 1000  # Sentinel calls the master down after this long unreachable (production: 5,000 or more)


@dataclass
class SentinelGroup:
    root: Path
    redis_ports: list[int]
    sentinel_ports: list[int]
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # port -> its process

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{p}" for p in self.sentinel_ports) + "/0"

    def master_port(self) -> int:
        """The port the Sentinels name as the master now."""
        for port in self.sentinel_ports:
            try:
                _, master = redis.Redis(port=port, socket_timeout=2).sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(master)
            except (redis.RedisError, TypeError):
                continue
        raise ServiceError("no Sentinel answers")

    def kill_master(self) -> int:
        """SIGKILL the master (no shutdown, no last write to its replicas); its port."""
        port = self.master_port()
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(timeout=10)
        return port

    def wait_failover(self, old: int, timeout: float = 60.0) -> int:
        """Wait until the Sentinels name a new master that answers as one; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.master_port()
                if port != old and redis.Redis(port=port, socket_timeout=2).role()[0] == b"master":
                    return port
            except (redis.RedisError, ServiceError):
                pass
            time.sleep(0.1)
        raise ServiceError(f"no failover within {timeout:.0f}s")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()


def start_sentinel_group(root: Path) -> SentinelGroup:
    exe = _binary("redis-server")
    root.mkdir(parents=True, exist_ok=True)
    group = SentinelGroup(root, [free_port() for _ in range(3)], [free_port() for _ in range(3)])
    master = group.redis_ports[0]
    try:
        for port in group.redis_ports:
            replica = [] if port == master else ["--replicaof", "127.0.0.1", str(master)]
            group.procs[port] = _start(exe, root, f"redis-{port}", ["--port", str(port), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no", "--dir", str(root), *replica])
            _wait(lambda p=port: redis.Redis(port=p).ping(), f"redis {port}")
        _wait(lambda: all(redis.Redis(port=p).info("replication")["master_link_status"] == "up"
                          for p in group.redis_ports[1:]), "replication")
        for port in group.sentinel_ports:
            conf = root / f"sentinel-{port}.conf"  # Sentinel rewrites its file with what it learns
            conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {root}\n"
                            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n"
                            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                            f"sentinel parallel-syncs {MASTER_NAME} 1\n")
            group.procs[port] = _start(exe, root, f"sentinel-{port}", [str(conf), "--sentinel"])
        # Each Sentinel knows the replicas and the other Sentinels (found through the master's hello channel).
        _wait(lambda: all(int(redis.Redis(port=p).sentinel_master(MASTER_NAME)["num-other-sentinels"]) == 2
                          and int(redis.Redis(port=p).sentinel_master(MASTER_NAME)["num-slaves"]) == 2
                          for p in group.sentinel_ports), "sentinels", timeout=60)
    except BaseException:
        group.stop()
        raise
    return group


def _start(exe: str, root: Path, name: str, args: list[str]) -> subprocess.Popen:
    log = root / f"{name}.log"
    return subprocess.Popen([exe, *args], stdout=log.open("ab"), stderr=subprocess.STDOUT)


def message_like(template: bytes, job_id: str) -> bytes:
    """A page message shaped like ``template`` (a real one, as the transport stored it) for ``job_id``."""
    envelope = json.loads(template)
    _, kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
    envelope["body"] = base64.b64encode(json.dumps([[job_id], kwargs, embed]).encode()).decode()
    envelope["headers"]["argsrepr"] = repr([job_id])
    return json.dumps(envelope).encode()


def fill_backlog(client: redis.Redis, template: bytes, n: int, *, prefix: str = "backlog") -> None:
    """``n`` more pages of the batch lane waiting by fair share, among 20 tenants, each marked present."""
    lanes = FairLanes(client)
    for i in range(n):
        job_id = f"{prefix}-{i:08d}"
        lanes.put(Lane.BATCH, message_like(template, job_id), 5, Share(f"t{i % 20}"), job_id=job_id)


def published_long_ago(db: Database, job_ids: list[str]) -> None:
    """Say the pages' messages went out ten minutes ago: past the sweep's wait for a lost message."""
    with db.session() as s:
        for row in s.query(JobRow).filter(JobRow.id.in_(job_ids)):
            row.enqueued_at = utcnow() - timedelta(minutes=10)
