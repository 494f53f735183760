"""Fixtures: real services for the session, a fresh stack per test, worker processes, the CLI."""

from __future__ import annotations

import _posixsubprocess
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psycopg2
import pytest
import redis

from paperlane.priority.connection import open_redis
from paperlane.priority.fair import FairLanes
from paperlane.priority.keyspace import with_prefix
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.schemas import JobStatus
from paperlane.settings import Settings, load_settings
from paperlane.storage import jobs as jobstore
from paperlane.storage.db import Database
from paperlane.storage.tables import JobRow
from tests import services
from tests.services import S3_KEY, S3_SECRET, Service

# ``python -m paperlane``: the same in the main venv and in the vLLM tier (which has no console script).
PAPERLANE = [sys.executable, "-m", "paperlane"]


# A test that uses one of these fixtures talks to a service or starts processes (the simulated vLLM server:
# ``sim``, ``sim_factory``): not a unit test.
SERVICE_FIXTURES = frozenset({"redis_service", "postgres_service", "s3_service", "pg_template", "stack",
                              "stack_factory", "embedded", "worker_factory", "api_factory", "redis_client", "sim",
                              "sim_factory"})
NOT_UNIT_MARKS = frozenset({"slow", "vllm", "gpu", "corpus", "browser", "processes"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="the unit tests only (no services, no processes; one that starts a process fails)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``unit`` every test that needs no service and starts no process (``scripts/test --fast`` runs them):
    decided from the fixtures it uses (``db`` only with SQLite) and its markers, never from a list of names.
    Under ``--fast`` the others are deselected, and a unit test that starts a process anyway fails
    (``_no_processes``): mark it ``processes``."""
    unit, rest = [], []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (fixtures & SERVICE_FIXTURES or params.get("db") == "postgresql"
                or any(item.get_closest_marker(m) for m in NOT_UNIT_MARKS)):
            rest.append(item)
            continue
        item.add_marker(pytest.mark.unit)
        unit.append(item)
    if config.getoption("--fast"):
        config.hook.pytest_deselected(items=rest)
        items[:] = unit


@pytest.fixture(autouse=True)
def _no_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``--fast``: starting a process (subprocess, multiprocessing, fork) fails the test."""
    if not request.config.getoption("--fast"):
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it 'processes' (not a unit test)")

    # subprocess keeps its own reference to fork_exec; multiprocessing forks or calls _posixsubprocess's.
    for module, name in ((subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec"), (os, "fork"),
                         (os, "posix_spawn"), (os, "posix_spawnp")):
        monkeypatch.setattr(module, name, refuse)


@pytest.fixture(scope="session")
def service_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


def _service(starter: Callable[[Path], Service], root: Path) -> Iterator[Service]:
    svc = starter(root)
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def redis_service(service_root: Path) -> Iterator[Service]:
    yield from _service(services.start_redis, service_root / "redis")


@pytest.fixture(scope="session")
def postgres_service(service_root: Path) -> Iterator[Service]:
    yield from _service(services.start_postgres, service_root / "postgres")


@pytest.fixture(scope="session")
def s3_service(service_root: Path) -> Iterator[Service]:
    yield from _service(services.start_seaweedfs, service_root / "seaweedfs")


@pytest.fixture(scope="session")
def pg_template(postgres_service: Service) -> str:
    """A database migrated once per session; each test's is a copy (CREATE DATABASE ... TEMPLATE, milliseconds)
    instead of running every migration again."""
    name = "paperlane_template"
    admin = _admin(postgres_service)
    admin.cursor().execute(f"CREATE DATABASE {name}")
    admin.close()
    template = Database(_database_url(postgres_service, name))
    template.upgrade()
    template.dispose()  # a template must have no connections while it is copied
    return name


def _admin(postgres_service: Service) -> Any:
    admin = psycopg2.connect(postgres_service.url.replace("postgresql+psycopg2", "postgresql"))
    admin.autocommit = True
    return admin


def _database_url(postgres_service: Service, name: str) -> str:
    return postgres_service.url.rsplit("/", 1)[0] + f"/{name}"


@dataclass
class Stack:
    """One test's slice of the real services, and the config file that points paperlane at it."""

    config: Path
    settings: Settings
    bucket: str
    root: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def s3(self) -> object:
        return boto3.client("s3", endpoint_url=self.settings.storage.endpoint_url, aws_access_key_id=S3_KEY,
                            aws_secret_access_key=S3_SECRET, region_name="us-east-1")

    def broker(self) -> redis.Redis:
        """A client of this stack's Redis keys (under its ``redis.key_prefix``), as paperlane opens one."""
        return open_redis(self.settings.redis)

    def keys(self, prefix: str) -> list[str]:
        resp = self.s3().list_objects_v2(Bucket=self.bucket, Prefix=prefix)  # type: ignore[attr-defined]
        return sorted(o["Key"] for o in resp.get("Contents", []))


def _write_config(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"PAPERLANE_{k}={v}\n" for k, v in values.items()))
    return path


@pytest.fixture
def stack_factory(tmp_path: Path, redis_service: Service, postgres_service: Service, pg_template: str,
                  s3_service: Service) -> Iterator[Callable[..., Stack]]:
    """Fresh database, Redis keys under a prefix of its own, new bucket: the distributed stack for one test.

    Keyword arguments override settings, named as in the environment without the prefix
    (``WORKER__BATCH_SIZE="4"``); ``s3_url`` points the stack at another S3 server.
    """
    admin = _admin(postgres_service)
    databases: list[str] = []

    def make(*, s3_url: str | None = None, **overrides: str) -> Stack:
        name = f"t_{uuid.uuid4().hex[:12]}"
        admin.cursor().execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
        databases.append(name)
        bucket = name.replace("_", "-")
        root = tmp_path / name
        root.mkdir()
        config = _write_config(root / "paperlane.env", {
            "DATA_DIR": str(root / "data"),
            "REDIS__URL": redis_service.url,
            "REDIS__KEY_PREFIX": f"{name}:",  # no FLUSHALL: tests running side by side share one Redis
            "DATABASE__URL": _database_url(postgres_service, name),
            "STORAGE__BACKEND": "s3",
            "STORAGE__ENDPOINT_URL": s3_url or s3_service.url,
            "STORAGE__BUCKET": bucket,
            "STORAGE__ACCESS_KEY_ID": S3_KEY,
            "STORAGE__SECRET_ACCESS_KEY": S3_SECRET,
            "WORKER__RETRY_BACKOFF": "0.2",
            **overrides,
        })
        return Stack(config, load_settings(config), bucket, root)

    yield make
    _drop_keys(redis_service, [f"{name}:" for name in databases])
    for name in databases:
        admin.cursor().execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
    admin.close()


@pytest.fixture
def redis_client(redis_service: Service) -> Iterator[redis.Redis]:
    """A client of the test Redis whose keys live under a prefix of this test's own; they are deleted after."""
    prefix = f"r_{uuid.uuid4().hex[:12]}:"
    client = with_prefix(redis.Redis.from_url(redis_service.url), prefix)
    yield client
    client.close()
    _drop_keys(redis_service, [prefix])


def _drop_keys(redis_service: Service, prefixes: list[str]) -> None:
    plain = redis.Redis.from_url(redis_service.url)
    for prefix in prefixes:
        for key in plain.scan_iter(match=f"{prefix}*", count=1000):
            plain.delete(key)
    plain.close()


@pytest.fixture
def stack(stack_factory: Callable[..., Stack]) -> Stack:
    return stack_factory()


@pytest.fixture
def embedded(tmp_path: Path) -> Stack:
    """The embedded stack (SQLite + local folder) in a temporary folder."""
    config = _write_config(tmp_path / "paperlane.env", {"DATA_DIR": str(tmp_path / "data")})
    return Stack(config, load_settings(config), "", tmp_path)


def wait_terminal(db: Database, job_ids: list[str], timeout: float = 180) -> dict[str, JobRow]:
    """Poll until every job has finished (succeeded or failed); their rows by id."""
    deadline = time.monotonic() + timeout
    rows: dict[str, JobRow] = {}
    while time.monotonic() < deadline:
        rows = {r.id: r for r in jobstore.get_jobs(db, job_ids)}
        if len(rows) == len(set(job_ids)) and all(JobStatus(r.status).terminal for r in rows.values()):
            return rows
        time.sleep(0.3)
    raise AssertionError(f"jobs not finished in {timeout}s: {[(r.id, r.status) for r in rows.values()]}")


def lane_messages(client: redis.Redis, lane: Lane) -> list[bytes]:
    """Every message waiting in ``lane``: on its lists (the buffer workers pop) and by fair share behind them."""
    return [m for key in broker_keys(lane) for m in client.lrange(key, 0, -1)] + FairLanes(client).waiting(lane)


def until(check: Callable[[], object], *, what: str = "condition", timeout: float = 60.0,
          every: float = 0.1) -> object:
    """Poll ``check`` until it returns something true (returned), failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} not met in {timeout:g}s"
        time.sleep(every)
    return found


def cli(stack: Stack, *args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``paperlane`` command against ``stack``."""
    return subprocess.run([*PAPERLANE, "--config", str(stack.config), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or stack.root, env=stack.env())


class WorkerProcess:
    def __init__(self, stack: Stack, *args: str, name: str = "w1") -> None:
        self.log = stack.root / f"worker-{name}.log"
        self.proc = subprocess.Popen([*PAPERLANE, "--config", str(stack.config), "worker", "-n", f"{name}@test", *args],
                                     stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=stack.env(),
                                     cwd=stack.root, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready." in self.output():
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"worker not ready in {timeout}s:\n{self.output()[-3000:]}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def worker_factory() -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(stack: Stack, *args: str, name: str = "w1", ready: bool = True) -> WorkerProcess:
        w = WorkerProcess(stack, *args, name=name)
        started.append(w)
        return w.wait_ready() if ready else w

    yield start
    for w in started:
        w.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        pg: Service = request.getfixturevalue("postgres_service")
        name = f"j_{uuid.uuid4().hex[:12]}"
        admin = _admin(pg)
        admin.cursor().execute(f"CREATE DATABASE {name} TEMPLATE {request.getfixturevalue('pg_template')}")
        admin.close()
        url = _database_url(pg, name)
    database = Database(url)
    database.upgrade()
    yield database
    database.dispose()


@pytest.fixture
def api_factory() -> Iterator[Callable[[Stack], object]]:
    """Start ``paperlane api`` processes on a stack (tests.api_server.ApiProcess), ready; stopped afterwards."""
    from tests.api_server import ApiProcess

    started: list[ApiProcess] = []

    def start(stack: Stack) -> ApiProcess:
        started.append(ApiProcess.of(stack, name=f"api{len(started)}"))
        return started[-1].wait_ready()

    yield start
    for api in started:
        api.stop()
