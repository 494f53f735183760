"""The HTTP API's own cost: upload of a one-page interactive document until it is queued.

A real ``paperlane api`` process and a real ``paperlane worker --engine vllm`` in front of the simulated
vLLM server (tests/sim_engine.py: 16 slots x 0.32 s), with private Redis, PostgreSQL and SeaweedFS S3. One
client uploads a distinct receipt-sized JPEG at a time (keep-alive connection, interactive lane) and waits
for it to finish before the next, so the engine is idle at every upload. The POST answers once the page is
registered, its original stored and its message published, so its round trip on loopback is the API's
part of upload -> queued (multipart parsing, key check and rate limit, registration, the S3 PUT, the
message). The end to end time (upload -> result, through ``?wait`` long-polls) is printed beside it.

Last line: ``api_overhead_ms=<p50>`` (target <= 20).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from common import small_page, start_services, start_sim, start_worker, stop, with_comment, write_config

from paperlane.settings import load_settings
from paperlane.storage import tenants
from paperlane.storage.db import Database
from tests.api_server import ApiProcess


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        svc = start_services(root)
        sim = start_sim(root)
        procs: list[subprocess.Popen[bytes]] = []
        server: ApiProcess | None = None
        try:
            config = write_config(svc, root, API__RATE_PER_MINUTE="100000")
            db = Database(load_settings(config).database_url)
            db.upgrade()
            key = tenants.create_key(db, tenant="bench", interactive=True).key
            procs.append(start_worker(config, root / "worker.log", sim.url))
            server = ApiProcess(config, root / "api.log").wait_ready()
            api, e2e = run(server.url, key, args.samples, args.warmup)
        finally:
            if server is not None:
                server.stop()
            for proc in procs:
                stop(proc)
            sim.stop()
            svc.stop()
    print(f"upload -> queued (API round trip): p50 {statistics.median(api) * 1000:.1f} ms, "
          f"p90 {pct(api, 0.9) * 1000:.1f} ms, max {max(api) * 1000:.1f} ms over {len(api)} uploads")
    print(f"upload -> result (engine 0.32 s):  p50 {statistics.median(e2e) * 1000:.0f} ms, "
          f"p90 {pct(e2e, 0.9) * 1000:.0f} ms")
    print(f"api_overhead_ms={statistics.median(api) * 1000:.1f}")
    return 0


def run(url: str, key: str, samples: int, warmup: int) -> tuple[list[float], list[float]]:
    page = small_page(0)
    api: list[float] = []
    e2e: list[float] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        for i in range(warmup + samples):
            data = with_comment(page, i)
            t0 = time.perf_counter()
            resp = client.post("/v1/documents", files={"file": (f"r{i}.jpg", data, "image/jpeg")},
                               data={"lane": "interactive"})
            t1 = time.perf_counter()
            resp.raise_for_status()
            document_id = resp.json()["document_id"]
            while (view := client.get(f"/v1/documents/{document_id}", params={"wait": 10}).json())["status"] in (
                    "queued", "running"):
                pass
            t2 = time.perf_counter()
            assert view["status"] == "succeeded", view
            if i >= warmup:
                api.append(t1 - t0)
                e2e.append(t2 - t0)
    return api, e2e


if __name__ == "__main__":
    raise SystemExit(main())
