"""HunyuanOCR (or another OCR VLM) served by a resident vLLM OpenAI-compatible server.

The normal deployment: one ``vllm serve`` per GPU, shared by every worker process on the
machine. A micro-batch's pages are all sent at once (bounded by ``max_in_flight`` for the whole
process), so the server's continuous batching keeps the GPU full. Transport failures and 5xx/429
answers are ``EngineUnavailable`` (retryable); other 4xx answers are ``EngineError`` on that page.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx

from paperlane.errors import EngineError, EngineUnavailable, PaperlaneError, UsageError
from paperlane.models.aio import LoopThread
from paperlane.models.engine import EngineRequest, Outcome
from paperlane.models.vlm import VlmEngineBase
from paperlane.schemas import EngineInfo
from paperlane.settings import EngineSettings

log = logging.getLogger(__name__)

_STAGE = "inference"


class VllmServerEngine(VlmEngineBase):
    def __init__(self, cfg: EngineSettings) -> None:
        if not cfg.url:
            raise UsageError("the vllm engine needs engine.url (--engine-url http://HOST:PORT/v1)")
        super().__init__(cfg)
        self._base = cfg.url.rstrip("/")
        self._model = cfg.model
        self._version = "unknown"
        self._loop: LoopThread | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self.in_flight = 0
        self.peak_in_flight = 0  # the most requests this engine has had at the server at once

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name="vllm", version=self._version, model=f"{self._model} ({self._profile.name})")

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop is None:
            self._loop = LoopThread("vllm-client")
        self._loop.run(self._start())

    async def _start(self) -> None:
        headers = {"Authorization": f"Bearer {self._cfg.api_key.get_secret_value()}"} if self._cfg.api_key else {}
        timeout = httpx.Timeout(self._cfg.request_timeout, connect=10.0)
        n = self._cfg.max_in_flight
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits)
        self._slots = asyncio.Semaphore(self._cfg.max_in_flight)
        await self._wait_ready()
        served = await self._served_models()
        if self._model is None:
            self._model = served[0]
        elif self._model not in served:
            raise UsageError(f"model {self._model!r} is not served at {self._base} (served: {', '.join(served)})")
        self._version = await self._server_version()
        log.info("vllm server %s ready: model %s, profile %s", self._base, self._model, self._profile.name)

    async def _wait_ready(self) -> None:
        assert self._client is not None
        root = self._base.removesuffix("/v1")
        deadline = time.monotonic() + self._cfg.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                resp = await self._client.get(f"{root}/health", timeout=5.0)
                if resp.status_code == 200:
                    return
                last = f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            await asyncio.sleep(0.5)
        waited = self._cfg.startup_timeout
        raise EngineUnavailable(f"vllm server at {self._base} not ready after {waited:.0f}s ({last})", stage=_STAGE)

    async def _served_models(self) -> list[str]:
        assert self._client is not None
        try:
            resp = await self._client.get(f"{self._base}/models")
            resp.raise_for_status()
            served = [m["id"] for m in resp.json().get("data", [])]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise EngineUnavailable(f"cannot list models at {self._base}: {type(exc).__name__}", stage=_STAGE) from exc
        if not served:
            raise EngineUnavailable(f"vllm server at {self._base} serves no model", stage=_STAGE)
        return served

    async def _server_version(self) -> str:
        assert self._client is not None
        try:
            resp = await self._client.get(f"{self._base.removesuffix('/v1')}/version", timeout=5.0)
            return str(resp.json().get("version", "unknown"))
        except (httpx.HTTPError, ValueError):
            return "unknown"

    def close(self) -> None:
        if self._loop is None:
            return
        if self._client is not None:
            self._loop.run(self._client.aclose())
            self._client = None
        self._loop.stop()
        self._loop = None

    # -- inference ---------------------------------------------------------------------------

    def infer(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        if self._client is None or self._loop is None:
            raise UsageError("engine not started")
        return self._loop.run(self._infer_all(requests))

    async def _infer_all(self, requests: Sequence[EngineRequest]) -> list[Outcome]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, req: EngineRequest) -> Outcome:
        assert self._slots is not None
        async with self._slots:
            t0 = time.perf_counter()
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                answer = await self._complete(req)
            except PaperlaneError as exc:
                return exc
            finally:
                self.in_flight -= 1
            seconds = time.perf_counter() - t0
        return self._parse(req, answer, seconds)

    async def _complete(self, req: EngineRequest) -> dict[str, Any]:
        assert self._client is not None
        image = req.image
        if image.data is None:
            raise EngineError("the vllm engine needs an encoded image", stage=_STAGE)
        url = f"data:{image.mime or 'image/jpeg'};base64,{base64.b64encode(image.data).decode()}"
        body = {"model": self._model, "messages": self._profile.messages(req.spec, url),
                **self._profile.sampling(req.spec, max_tokens=self._cfg.max_tokens)}
        try:
            resp = await self._client.post(f"{self._base}/chat/completions", json=body)
        except httpx.TimeoutException as exc:
            raise EngineUnavailable(f"vllm server timed out after {self._cfg.request_timeout:.0f}s",
                                    stage=_STAGE) from exc
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"vllm server unreachable ({type(exc).__name__})", stage=_STAGE) from exc
        if resp.status_code >= 500 or resp.status_code == 429:
            raise EngineUnavailable(f"vllm server busy or failing (HTTP {resp.status_code})", stage=_STAGE)
        if resp.status_code >= 400:
            raise EngineError(f"vllm server refused the page (HTTP {resp.status_code}: {_error_message(resp)})",
                              stage=_STAGE)
        try:
            return dict(resp.json())
        except ValueError as exc:
            raise EngineUnavailable("vllm server sent a malformed answer", stage=_STAGE) from exc

    def _parse(self, req: EngineRequest, answer: dict[str, Any], seconds: float) -> Outcome:
        try:
            choice = answer["choices"][0]
            raw = choice["message"].get("content") or ""
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            return EngineError("vllm server answer has no choices", stage=_STAGE)
        usage = answer.get("usage") or {}
        return self._read(req, raw, finish_reason=finish, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or 0), seconds=seconds)


def _error_message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
        msg = data.get("error", {}).get("message") if isinstance(data.get("error"), dict) else data.get("message")
    except ValueError:
        msg = None
    text = " ".join(str(msg or resp.reason_phrase or "").split())
    return text[:160]
