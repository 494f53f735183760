"""Shared by the benchmarks: realistic pages, the real services, a simulated GPU engine, worker processes.

The simulated engine lives here, not in the product: it stands in for a GPU running HunyuanOCR so a
2-core machine can measure everything AROUND the model (preprocessing, queueing, storing) at GPU
speed. It sleeps (no CPU) for a fixed time per micro-batch and answers with realistic lines.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import psycopg2  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

from paperlane.models.engine import Capacity, EngineOutput, EngineRequest, InputSpec, Outcome  # noqa: E402
from paperlane.models.profiles import get_profile  # noqa: E402
from paperlane.schemas import EngineInfo, Line  # noqa: E402
from tests import services  # noqa: E402
from tests.pages import WORDS  # noqa: E402

HUNYUAN_SPEC = get_profile("hunyuanocr-1.0").input_spec()


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


def with_comment(jpeg: bytes, n: int) -> bytes:
    """The same image with a JPEG comment segment holding ``n``: distinct bytes, so a distinct job."""
    payload = f"paperlane benchmark page {n}".encode()
    return jpeg[:2] + b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def small_page(i: int) -> bytes:
    img = Image.new("L", (620, 180), 250)
    ImageDraw.Draw(img).text((20, 60), f"Receipt {i} total {i % 97}.50", fill=0, font=ImageFont.load_default(size=36))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


class SimEngine:
    """A GPU stand-in: ``latency`` seconds per micro-batch, whatever its size, and no CPU use."""

    def __init__(self, *, latency: float, batch_size: int, batches_in_flight: int = 1, lines: int = 40) -> None:
        self.latency = latency
        self._capacity = Capacity(batch_size=batch_size, batches_in_flight=batches_in_flight)
        self._lines = lines

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name="sim-gpu", version="0", model=f"{self.latency * 1000:.0f} ms per batch")

    @property
    def input_spec(self) -> InputSpec:
        return HUNYUAN_SPEC

    @property
    def capacity(self) -> Capacity:
        return self._capacity

    def start(self) -> None:
        pass

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        time.sleep(self.latency)
        return [self._answer(r) for r in requests]

    def _answer(self, req: EngineRequest) -> EngineOutput:
        w, h = req.image.width, req.image.height
        step = h / (self._lines + 2)
        lines = [Line(text=f"line {i} of the page", quad=[(w * 0.1, step * (i + 1)), (w * 0.8, step * (i + 1)),
                                                        (w * 0.8, step * (i + 1.6)), (w * 0.1, step * (i + 1.6))])
                 for i in range(self._lines)]
        return EngineOutput(text="\n".join(ln.text for ln in lines), lines=lines)

    def close(self) -> None:
        pass


@dataclass
class Services:
    redis: services.Service
    postgres: services.Service
    s3: services.Service

    def stop(self) -> None:
        for svc in (self.redis, self.postgres, self.s3):
            svc.stop()


def start_services(root: Path) -> Services:
    return Services(services.start_redis(root / "redis"), services.start_postgres(root / "pg"),
                    services.start_seaweedfs(root / "s3"))


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


def start_sim_worker(config: Path, log: Path, **engine: float | int) -> subprocess.Popen:
    """A real paperlane worker process (Celery, Redis, Postgres, S3) whose engine is a ``SimEngine``."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__)), str(config), json.dumps(engine)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "ready." not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _worker_main(config: str, engine_json: str) -> None:
    import logging

    from paperlane.priority.broker import make_celery
    from paperlane.settings import load_settings
    from paperlane.workers.pipeline import Runtime
    from paperlane.workers.tasks import register_tasks

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("celery.worker.strategy", "celery.app.trace", "botocore", "kombu",
                  "celery.worker.consumer.consumer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = load_settings(Path(config))
    rt = Runtime.start(settings, engine=SimEngine(**json.loads(engine_json)))
    app = make_celery(settings)
    register_tasks(app, rt)
    try:
        app.worker_main(["worker", "--pool=threads", f"--concurrency={rt.slots}", "--without-gossip",
                         "--without-mingle", "--loglevel=INFO", "-Q", "paperlane.interactive,paperlane.batch"])
    finally:
        rt.close()


if __name__ == "__main__":
    _worker_main(sys.argv[1], sys.argv[2])
