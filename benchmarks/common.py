"""Shared by the benchmarks: realistic pages, the real services, real paperlane processes, their CPU time.

The GPU is simulated by ``tests/sim_engine.py``, a separate OpenAI-compatible server with vLLM's
shape, driven through the production ``--engine vllm`` client: everything paperlane does around the
model is real and measured. The engine has a real model's shape by default (``ENGINE_SHAPE``,
tests/sim_shape.py: per-page answer lengths, a decode ceiling of ~20 pages/s, 40 sequences at once);
``--fixed`` in the benchmarks that offer it keeps the older fixed-latency engine (slots x latency).
Workers and ``paperlane run`` are started in sessions of their own, so each one's process group is
that process and its CPU pool, and ``group_cpu_seconds`` reads what they all spent.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import psycopg2  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from paperlane.models.profiles import get_profile  # noqa: E402
from tests.sim_engine import SimEngine, start_sim_engine  # noqa: E402
from paperlane.priority.broker import PagePublisher, make_celery  # noqa: E402
from paperlane.settings import load_settings  # noqa: E402
from paperlane.storage.db import Database  # noqa: E402
from paperlane.storage.objects import ObjectStore, open_store  # noqa: E402
from paperlane.storage.tables import JobRow  # noqa: E402
from tests import services  # noqa: E402
from tests.pages import WORDS, prepare  # noqa: E402

HUNYUAN_SPEC = get_profile("hunyuanocr-1.0").input_spec()
ENGINE_SHAPE = "h200-hunyuanocr"  # tests/sim_shape.py: HunyuanOCR on one H200, about 20 pages/s
# Pages a worker keeps at the shaped engine: its 40 sequences busy and as many waiting, by priority.
MAX_IN_FLIGHT = 80


def a4_scan(seed: int, *, dpi: int = 300, lines: int = 45) -> bytes:
    """An A4 page of text at ``dpi`` as a scanner would save it: slightly grey paper, noise, JPEG q90."""
    rnd = random.Random(seed)
    w, h = round(8.27 * dpi), round(11.69 * dpi)
    img = Image.new("L", (w, h), 245)
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=round(dpi / 7))
    step = (h - dpi) // lines
    for i in range(lines):
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(5, 9)))
        draw.text((dpi // 2, dpi // 2 + i * step), text, fill=20, font=font)
    arr = np.asarray(img, dtype=np.int16) + np.random.default_rng(seed).normal(0, 2, (h, w)).astype(np.int16)
    ok, enc = cv2.imencode(".jpg", np.clip(arr, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 85])
    assert ok
    return enc.tobytes()


def stamped_scans(n: int, *, dpi: int = 300, bases: int = 8) -> Iterator[bytes]:
    """``n`` A4 scans, each with its number printed in a corner: distinct pixels, so the simulated engine
    (which draws an answer from the image) gives each its own answer length, loop or not. Cheap: ``bases``
    scans are drawn once, then each page is a copy with a stamp, encoded (~10 ms at 150 dpi)."""
    base = [np.asarray(Image.open(io.BytesIO(a4_scan(i, dpi=dpi)))) for i in range(bases)]
    for i in range(n):
        page = base[i % bases].copy()
        cv2.putText(page, f"No. {i}", (dpi // 2, dpi // 3), cv2.FONT_HERSHEY_SIMPLEX, dpi / 150, 30, max(1, dpi // 100))
        ok, enc = cv2.imencode(".jpg", page, [cv2.IMWRITE_JPEG_QUALITY, 85])
        assert ok
        yield enc.tobytes()


def engine_image_id(data: bytes) -> str:
    """The simulated engine's name for a page: the sha1 of the data URL the vLLM client sends for it (the page
    prepared as a worker prepares it for the HunyuanOCR profiles)."""
    image = prepare(data, HUNYUAN_SPEC)
    assert image.data is not None
    url = b"data:" + (image.mime or "image/jpeg").encode() + b";base64," + base64.b64encode(image.data)
    return hashlib.sha1(url).hexdigest()


def with_comment(jpeg: bytes, n: int) -> bytes:
    """The same image with a JPEG comment segment holding ``n``: distinct bytes, so a distinct job."""
    payload = f"paperlane benchmark page {n}".encode()
    return jpeg[:2] + b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def small_page(i: int) -> bytes:
    """A receipt-sized page (620x180 JPEG): cheap to queue by the ten thousand."""
    img = Image.new("L", (620, 180), 250)
    ImageDraw.Draw(img).text((20, 60), f"Receipt {i} total {i % 97}.50", fill=0, font=ImageFont.load_default(size=36))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@dataclass
class Services:
    redis: services.Service
    postgres: services.Service
    s3: services.Service

    def stop(self) -> None:
        for svc in (self.redis, self.postgres, self.s3):
            svc.stop()


def start_services(root: Path) -> Services:
    """Private Redis, PostgreSQL and SeaweedFS S3 on free loopback ports, as the tests start them."""
    return Services(services.start_redis(root / "redis"), services.start_postgres(root / "pg"),
                    services.start_seaweedfs(root / "s3"))


def start_sim(root: Path) -> SimEngine:
    """The simulated vLLM server the API's benchmarks run against (tests/sim_engine.py: 16 slots x 0.32 s)."""
    return start_sim_engine(root / "sim", slots=16, latency=0.32, scheduling_policy="priority", max_model_len=32768)


def write_config(svc: Services, root: Path, **overrides: str) -> Path:
    """A fresh database and bucket on the running services, as a paperlane config file."""
    name = f"b_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(svc.postgres.url.replace("postgresql+psycopg2", "postgresql"))
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {name}")
    admin.close()
    values = {
        "DATA_DIR": str(root / name), "REDIS__URL": svc.redis.url,
        "DATABASE__URL": svc.postgres.url.rsplit("/", 1)[0] + f"/{name}",
        "STORAGE__BACKEND": "s3", "STORAGE__ENDPOINT_URL": svc.s3.url, "STORAGE__BUCKET": name.replace("_", "-"),
        "STORAGE__ACCESS_KEY_ID": services.S3_KEY, "STORAGE__SECRET_ACCESS_KEY": services.S3_SECRET, **overrides,
    }
    path = root / f"{name}.env"
    path.write_text("".join(f"PAPERLANE_{k}={v}\n" for k, v in values.items()))
    return path


@dataclass
class Producer:
    """What submitting pages through the real producer needs: the database (migrated), the store, the broker."""

    db: Database
    store: ObjectStore
    publisher: PagePublisher

    @classmethod
    def open(cls, config: Path) -> Producer:
        settings = load_settings(config)
        db = Database(settings.database_url)
        db.upgrade()
        return cls(db, open_store(settings), PagePublisher(make_celery(settings)))


PAPERLANE = [sys.executable, "-m", "paperlane"]


def start_worker(config: Path, log: Path, engine_url: str, *, timeout: float = 120,
                 command: list[str] | None = None) -> subprocess.Popen[bytes]:
    """A real ``paperlane worker --engine vllm`` process, in a session of its own; returns once it is ready.
    ``command``: how to start paperlane (default: this checkout's, ``PAPERLANE``).

    Its process group (pgid = its pid) is the worker and its CPU pool: what ``group_cpu_seconds`` reads.
    """
    return start_paperlane(config, ["worker", "--engine", "vllm", "--engine-url", engine_url], log, ready="ready.",
                           timeout=timeout, command=command)


def start_paperlane(config: Path, args: list[str], log: Path, *, ready: str, timeout: float = 120,
                    command: list[str] | None = None) -> subprocess.Popen[bytes]:
    """``paperlane --config CONFIG ARGS`` in a session of its own (its process group: it and its processes),
    its output in ``log``; returns once ``ready`` is in that log. ``command``: how to start paperlane (default:
    this checkout's, ``PAPERLANE``)."""
    proc = subprocess.Popen([*(command or PAPERLANE), "--config", str(config), *args], cwd=REPO,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"paperlane {args[0]} did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.02)  # a benchmark's clock may start at ``ready``: notice it within a few ms
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group of ``proc`` (started in its own session), SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _proc_stats() -> Iterator[tuple[int, str, list[str]]]:
    """Each live process's pid, command name and the fields of ``/proc/<pid>/stat`` after the name (state, ppid,
    pgrp, ...: the name may hold spaces and parentheses)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        yield int(entry.name), stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def group_cpu(pgid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each live process in process group ``pgid``, by pid.

    Each process counts with the children it has already reaped (``cutime``/``cstime``), so a pool
    process that was replaced still counts once it was waited for. Read from ``/proc/<pid>/stat``.
    """
    tick = os.sysconf("SC_CLK_TCK")
    return {pid: sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
            for pid, _, fields in _proc_stats() if int(fields[2]) == pgid}


def process_table() -> dict[int, tuple[str, int, float]]:
    """Every live process's command name, process group and own CPU seconds (user + system, without reaped
    children), by pid, from ``/proc/<pid>/stat``."""
    tick = os.sysconf("SC_CLK_TCK")
    return {pid: (comm, int(fields[2]), (int(fields[11]) + int(fields[12])) / tick)
            for pid, comm, fields in _proc_stats()}


SERVICES = {"weed": "SeaweedFS", "postgres": "PostgreSQL", "redis-server": "Redis"}


def cpu_by_part(start: dict[int, tuple[str, int, float]], end: dict[int, tuple[str, int, float]], *,
                processes: dict[int, str], groups: dict[int, str]) -> dict[str, float]:
    """CPU seconds between two ``process_table`` readings by part of the machine: the processes named in
    ``processes`` (pid -> name), the process groups named in ``groups`` (pgid -> name), the services (``SERVICES``,
    by command name), and "other" (every other process). A process that started in between counts from zero; one
    that ended in between is missing (its CPU is in the machine's busy time, not here)."""
    parts: dict[str, float] = {}
    for pid, (comm, pgid, cpu) in end.items():
        before = start.get(pid)
        spent = cpu - (before[2] if before is not None and before[0] == comm else 0.0)
        part = processes.get(pid) or groups.get(pgid) or SERVICES.get(comm, "other")
        parts[part] = parts.get(part, 0.0) + spent
    return parts


def redis_calls(client: Any) -> Counter[str]:
    """Redis's counters now: commands run, by name (INFO commandstats: a Lua script's call counts, and so does every
    command it runs), and under ``reads`` the reads it served (INFO stats): one per round trip, a pipeline's
    included. Reading them is two INFO commands, two reads."""
    calls = Counter({name.removeprefix("cmdstat_"): int(v["calls"])
                     for name, v in client.info("commandstats").items()})
    calls["reads"] = int(client.info("stats")["total_reads_processed"])
    return calls


def machine_cpu() -> tuple[float, float]:
    """(busy, elapsed) CPU seconds of the whole machine, summed over cores, from ``/proc/stat``."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle, iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / tick, sum(values) / tick


def finished_jobs(db: Database, status: str | None = None) -> int:
    """Jobs in the database that are final (or in ``status``)."""
    with db.session() as s:
        q = select(func.count()).select_from(JobRow)
        q = q.where(JobRow.status == status) if status else q.where(JobRow.status.in_(("succeeded", "failed")))
        return int(s.scalar(q) or 0)


def last_finished(db: Database) -> float:
    """Epoch seconds the last job finished."""
    with db.session() as s:
        return float(s.scalar(select(func.max(JobRow.finished_at))).timestamp())
