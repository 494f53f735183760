"""CPU of reading streamed answers in the process that feeds the engine: httpx on AnyIO (its default) beside httpx on
asyncio's own streams (``models/http_streams.py``, what the vLLM client uses), side by side in one run.

    python benchmarks/stream_client.py [--pages 200] [--rounds 3] [--concurrency 40]

The server is the simulated vLLM server (tests/sim_engine.py) at the h200-hunyuanocr shape (answers of every length,
streamed in chunks of 16 tokens, as the client asks). Each round sends the same --pages A4 scans (prepared before any
clock, as the pool prepares them for HunyuanOCR) as streamed chat completions, --concurrency at once, once through
each network layer in turn, and reads every answer to its end, splitting its events and parsing each as JSON as the
client does. CPU is this process's (user and system, all threads) over the round; the wall clock is the engine's.
Last line: ``asyncio_over_anyio=`` the ratio of the medians of CPU per page (below 1: the asyncio streams cost less).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from common import HUNYUAN_SPEC, stamped_scans

from paperlane.models.http_streams import transport
from paperlane.workers.preprocess import prepare_page
from tests.sim_engine import DEFAULT_MODEL, start_sim_engine

LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=64)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _body(data_url: str) -> bytes:
    return json.dumps({
        "model": DEFAULT_MODEL, "max_tokens": 4096, "stream": True, "stream_interval": 16,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}},
                                                  {"type": "text", "text": "Extract the text in the image."}]}],
    }).encode()


async def _read_all(client: httpx.AsyncClient, url: str, bodies: list[bytes], concurrency: int) -> int:
    """Every answer read to its end; the events read."""
    gate = asyncio.Semaphore(concurrency)
    events = 0

    async def one(body: bytes) -> None:
        nonlocal events
        async with gate, client.stream("POST", url, content=body,
                                       headers={"content-type": "application/json"}) as resp:
            resp.raise_for_status()
            pending = b""
            async for chunk in resp.aiter_bytes():
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.startswith(b"data:") and (data := line[5:].strip()) != b"[DONE]":
                        json.loads(data)
                        events += 1

    await asyncio.gather(*(one(body) for body in bodies))
    return events


def _round(name: str, url: str, bodies: list[bytes], concurrency: int) -> float:
    async def main() -> tuple[float, float, int]:
        made = {"anyio": lambda: httpx.AsyncClient(limits=LIMITS, timeout=300),
                "asyncio": lambda: httpx.AsyncClient(transport=transport(LIMITS), timeout=300)}[name]
        async with made() as client:
            await _read_all(client, url, bodies[:concurrency], concurrency)  # connections open, code warm
            c0, t0 = _cpu(), time.perf_counter()
            events = await _read_all(client, url, bodies, concurrency)
            return _cpu() - c0, time.perf_counter() - t0, events

    cpu, wall, events = asyncio.run(main())
    per_page = 1000 * cpu / len(bodies)
    print(f"{name:8s} {per_page:6.2f} ms CPU a page ({1e6 * cpu / events:5.1f} us an event, {events / len(bodies):.0f} "
          f"events a page), {len(bodies) / wall:5.1f} pages/s", flush=True)
    return per_page


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=40, help="answers streaming at once (the shape's sequences)")
    args = p.parse_args()
    spec = HUNYUAN_SPEC
    bodies = []
    for scan in stamped_scans(args.pages):
        image = prepare_page(scan, spec).image
        assert image.data is not None
        bodies.append(_body("data:image/jpeg;base64," + base64.b64encode(image.data).decode()))
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim_engine(Path(tmp), shape="h200-hunyuanocr")
        try:
            url = sim.url + "/chat/completions"
            figures: dict[str, list[float]] = {"anyio": [], "asyncio": []}
            for r in range(args.rounds):
                print(f"round {r + 1}")
                for name in (("anyio", "asyncio") if r % 2 == 0 else ("asyncio", "anyio")):
                    figures[name].append(_round(name, url, bodies, args.concurrency))
        finally:
            sim.stop()
    ratio = statistics.median(figures["asyncio"]) / statistics.median(figures["anyio"])
    print(f"median CPU a page: anyio {statistics.median(figures['anyio']):.2f} ms, asyncio "
          f"{statistics.median(figures['asyncio']):.2f} ms")
    print(f"asyncio_over_anyio={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
