"""The vLLM tier: the real vLLM engine on the CPU with a tiny random-weight HunyuanOCR built here.

Runs in its own venv (scripts/setup-vllm-tier.sh) with this checkout installed into it (``pip install
--no-deps -e .``: ``paperlane.models`` lives in ./models, so PYTHONPATH alone cannot import it) and this
folder on PYTHONPATH, for the sitecustomize fixes that spawned engine processes inherit; scripts/test
does both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.services import ServiceError, free_port

TIER = Path(__file__).resolve().parent
REPO = TIER.parents[1]
SERVED_NAME = "tiny-hunyuanocr"
# The tiny model's context: a page's prompt is ~30 tokens.
MAX_MODEL_LEN = 512
MAX_TOKENS = 16


def pytest_configure(config: pytest.Config) -> None:
    # The tier venv is shared by every clone on the machine: make sure it runs this one's code.
    fix = f"run {sys.executable} -m pip install --no-deps -e {REPO} (scripts/test does)"
    try:
        import paperlane.models
    except ImportError as exc:
        raise pytest.UsageError(f"paperlane is not installed in the vLLM tier venv ({exc}): {fix}") from exc
    installed = Path(paperlane.models.__file__).resolve().parent
    if not installed.is_relative_to(REPO):
        raise pytest.UsageError(f"the vLLM tier venv imports paperlane.models from {installed}, not {REPO}: {fix}")


def tier_env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(TIER), str(TIER.parents[1]), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "PYTHONPATH": path}


@pytest.fixture(scope="session", autouse=True)
def _offline() -> None:
    os.environ.update({k: v for k, v in tier_env().items() if k != "PYTHONPATH"})


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import build_tiny_hunyuan

    return build_tiny_hunyuan(tmp_path_factory.mktemp("models") / "tiny-hunyuanocr")


@dataclass
class VllmServer:
    url: str  # the OpenAI base URL, .../v1
    proc: subprocess.Popen
    log: Path


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The tier's server, scheduling by priority as docs/engines.md's ``vllm serve`` command does."""
    yield from _serve(tiny_model, tmp_path_factory.mktemp("vllm"), "--scheduling-policy", "priority")


@pytest.fixture(scope="module")
def paced_vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A server whose engine takes at least 10 ms a step (at most 100 tokens/s a sequence, a slow GPU's pace):
    on this CPU the tiny model otherwise decodes faster than its own API process streams, so an answer can be
    decoded to its end before the client that stops reading it has seen a third of it."""
    yield from _serve(tiny_model, tmp_path_factory.mktemp("vllm-paced"), "--scheduling-policy", "priority",
                      env={"PAPERLANE_VLLM_STEP_SECONDS": "0.01"})


def _serve(model: Path, root: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[VllmServer]:
    port = free_port()
    log = root / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN),
           "--max-num-seqs", "16", "--dtype", "float32", "--enforce-eager",
           "--limit-mm-per-prompt", '{"image":1}', "--served-model-name", SERVED_NAME,
           "--no-enable-prefix-caching", "--mm-processor-cache-gb", "0", *extra]
    proc = subprocess.Popen(cmd, env={**tier_env(), **(env or {})}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    server = VllmServer(f"http://127.0.0.1:{port}/v1", proc, log)
    try:
        _wait_healthy(server, timeout=300)
        yield server
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


@pytest.fixture(scope="module")
def fcfs_vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A second server with vLLM's default scheduling (fcfs): no ``--scheduling-policy priority``."""
    yield from _serve(tiny_model, tmp_path_factory.mktemp("vllm-fcfs"))


def _wait_healthy(server: VllmServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise ServiceError(f"vLLM server exited:\n{server.log.read_text()[-3000:]}")
        try:
            if httpx.get(server.url.removesuffix("/v1") + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ServiceError(f"vLLM server not healthy in {timeout}s:\n{server.log.read_text()[-3000:]}")
