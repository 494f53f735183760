"""Pages/s through paperlane's vLLM server engine at concurrency 1 vs 16, and our client overhead.

Starts a real vLLM OpenAI-compatible server on this machine with the tiny random-weight HunyuanOCR
built by tests/vllm_tier/tiny_model.py (nothing downloaded), prepares N pages as the worker would,
then sends them through ``VllmServerEngine`` twice against the same server: one request in flight
at a time, then up to 16 (one micro-batch at once). Client overhead per page = the latency our
client saw minus the server's own end-to-end latency for the same requests (vLLM's
``vllm:e2e_request_latency_seconds`` histogram). The server is started as docs/engines.md's ``vllm serve``
command says (``--scheduling-policy priority``). Run it with the vLLM tier's Python, with this checkout
installed there (scripts/test does that too):

    ~/.cache/paperlane/venv-vllm/bin/python -m pip install -q --no-deps -e .
    PYTHONPATH=tests/vllm_tier:. ~/.cache/paperlane/venv-vllm/bin/python benchmarks/vllm_concurrency.py

Last line: ``concurrency_speedup=<pages/s at 16 / pages/s at 1>``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "vllm_tier")]

from paperlane.models.engine import EngineOutput, EngineRequest  # noqa: E402
from paperlane.models.vllm_server import VllmServerEngine  # noqa: E402
from paperlane.settings import EngineSettings  # noqa: E402
from tests.pages import (  # noqa: E402
    prepare,  # noqa: E402
    render_page,
    sample_lines,
)
from tests.services import free_port  # noqa: E402


def start_server(model: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "vllm_tier"), str(REPO)])}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "512", "--max-num-seqs", "16", "--dtype", "float32",
           "--enforce-eager", "--limit-mm-per-prompt", '{"image":1}', "--served-model-name", "tiny",
           "--no-enable-prefix-caching", "--mm-processor-cache-gb", "0", "--scheduling-policy", "priority"]
    return subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def server_latency(base: str) -> tuple[float, float]:
    """(sum of seconds, count) of vLLM's end-to-end request latency histogram."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    total = sum(float(m) for m in re.findall(r"^vllm:e2e_request_latency_seconds_sum\{[^}]*\} (\S+)", text, re.M))
    count = sum(float(m) for m in re.findall(r"^vllm:e2e_request_latency_seconds_count\{[^}]*\} (\S+)", text, re.M))
    return total, count


def run(engine: VllmServerEngine, base: str, requests: list[EngineRequest], batch: int) -> tuple[float, float]:
    """(pages/s, mean client overhead per page in ms) for micro-batches of ``batch`` pages."""
    s0, c0 = server_latency(base)
    t0 = time.perf_counter()
    client_s = 0.0
    for i in range(0, len(requests), batch):
        outs = engine.infer(requests[i:i + batch])
        assert all(isinstance(o, EngineOutput) for o in outs), outs
        client_s += sum(o.seconds or 0.0 for o in outs if isinstance(o, EngineOutput))
    wall = time.perf_counter() - t0
    s1, c1 = server_latency(base)
    assert c1 - c0 == len(requests), (c1 - c0, len(requests))
    return len(requests) / wall, (client_s - (s1 - s0)) / len(requests) * 1000


def client_cpu_ms(engine: VllmServerEngine, requests: list[EngineRequest]) -> float:
    """Our own CPU work per page around a request: data URL, JSON body, parsing the answer."""
    import base64
    import json

    profile = engine._profile  # noqa: SLF001 - the benchmark times the engine's own steps
    answer = "Invoice(12,30),(400,60)Total 12.50(10,80),(300,110)" * 4
    t0 = time.perf_counter()
    for req in requests:
        url = f"data:image/jpeg;base64,{base64.b64encode(req.image.data or b'').decode()}"
        json.dumps({"messages": profile.messages(req.spec, url), **profile.sampling(req.spec, max_tokens=32)})
        profile.parse(answer, req.spec, image_width=req.image.width, image_height=req.image.height,
                      finish_reason="stop")
    return (time.perf_counter() - t0) / len(requests) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=48, help="pages per measurement")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens generated per page")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (1, 16)")
    args = p.parse_args()
    from tiny_model import build_tiny_hunyuan

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_hunyuan(Path(tmp) / "tiny")
        port = free_port()
        proc = start_server(model, port, Path(tmp) / "server.log")
        base = f"http://127.0.0.1:{port}"
        try:
            engine = VllmServerEngine(EngineSettings(kind="vllm", url=f"{base}/v1", max_tokens=args.max_tokens,
                                                     max_in_flight=16, startup_timeout=600))
            engine.start()
            reqs = [EngineRequest(image=prepare(render_page(sample_lines(i)), engine.input_spec))
                    for i in range(args.pages)]
            run(engine, base, reqs[:8], 8)  # warm-up
            results: dict[int, list[tuple[float, float]]] = {1: [], 16: []}
            for _ in range(args.rounds):
                for conc in (1, 16):
                    results[conc].append(run(engine, base, reqs, conc))
            own_ms = client_cpu_ms(engine, reqs)
            engine.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    best = {c: max(r[0] for r in v) for c, v in results.items()}
    overhead = {c: min(r[1] for r in v) for c, v in results.items()}
    for c in (1, 16):
        print(f"concurrency {c:>2}: {best[c]:6.1f} pages/s   client overhead {overhead[c]:6.1f} ms/page")
    print(f"our client's own CPU per page (data URL, JSON, parse): {own_ms:.2f} ms; the rest of the overhead is "
          "the vLLM API server (image decode, HF processor, queueing) sharing this machine's 2 cores")
    print(f"tiny model, {args.pages} pages, {args.max_tokens} tokens each, best of {args.rounds} rounds")
    print(f"concurrency_speedup={best[16] / best[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
