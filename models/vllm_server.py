"""HunyuanOCR (or another OCR VLM) served by a resident vLLM OpenAI-compatible server.

The normal deployment: one ``vllm serve`` per GPU, shared by every worker process on the
machine. A micro-batch's pages are all sent at once (bounded by the window for the whole process: it follows
the server's running and waiting requests, read from its ``/metrics``, within ``max_in_flight``: models/window.py),
so the server's continuous batching keeps the GPU full. Transport failures and 5xx/429
answers are ``EngineUnavailable`` (retryable); other 4xx answers are ``EngineError`` on that page.

Each request carries its page's priority (vLLM's ``priority``, lower first; it takes effect with
``vllm serve --scheduling-policy priority``), so an interactive page overtakes the batch backlog
queued inside the server too. vLLM 0.32 accepts and ignores a priority under its default ``fcfs``
policy; a server that refuses it instead (HTTP 400 naming ``priority``) gets one warning and no
priority for the life of the engine, and the page is sent again without it.

``max_tokens`` is kept within the served model's ``max_model_len`` (read from ``/v1/models`` at
start): vLLM refuses ``max_tokens > max_model_len`` with HTTP 400 and itself lowers a smaller
``max_tokens`` to the context the prompt leaves, so an answer cut there is flagged ``truncated``.

Every answer is streamed (``stream: true``, the usage in every chunk, each token's log-probability when
``engine.logprobs``; ``engine.stream_interval`` tokens a chunk, asked with each request, where vLLM's own default is
a chunk per token: each chunk is an event this process reads) through the loop guard (models/loop_guard.py): a
degenerate answer is stopped by closing its response, which makes vLLM abort the request and free its sequence,
then tried again or replaced by the embedded engine's reading.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx

from paperlane.errors import EngineError, EngineUnavailable, PaperlaneError, UsageError
from paperlane.models import http_streams
from paperlane.models.aio import LoopThread, PriorityLimiter
from paperlane.models.engine import Capacity, EngineRequest, InputSpec, Outcome
from paperlane.models.loop_guard import Delta, LoopGuard
from paperlane.models.vlm import VlmEngineBase
from paperlane.models.window import WindowController
from paperlane.schemas import EngineInfo
from paperlane.settings import EngineSettings

log = logging.getLogger(__name__)

_STAGE = "inference"
# Stands in for the image's data URL while the request body is JSON-encoded (see ``_post``).
_IMAGE_SLOT = "\u0000paperlane-image\u0000"
_IMAGE_SLOT_JSON = json.dumps(_IMAGE_SLOT).encode()
# httpx's connection pool walks all its connections (polling each idle socket) on every request and every
# release (encode/httpcore#1035, pydantic/httpx2#1169): with 80 pages at the server that was ~8 ms of a
# worker's CPU per page. Pages are spread over pools of at most this many connections instead.
_POOL_CONNECTIONS = 16
_URGENT_CONNECTIONS = 4  # per pool, for interactive pages over the window


class VllmServerEngine(VlmEngineBase):
    def __init__(self, cfg: EngineSettings) -> None:
        if not cfg.url:
            raise UsageError("the vllm engine needs engine.url (--engine-url http://HOST:PORT/v1)")
        super().__init__(cfg)
        self._base = cfg.url.rstrip("/")
        self._model = cfg.model
        self._version = "unknown"
        self._loop: LoopThread | None = None
        self._client: httpx.AsyncClient | None = None  # health, models, version; and the first pool for pages
        self._pools: list[httpx.AsyncClient] = []
        self._pool_load: list[int] = []  # answers streaming through each pool now
        self._slots: PriorityLimiter | None = None
        self._window: WindowController | None = None
        self._metrics: httpx.AsyncClient | None = None
        self._max_model_len: int | None = None
        self._max_tokens = cfg.max_tokens
        self._sends_priority = True
        # Tokens a streamed chunk, asked of the server with each request (None: a chunk per token, its default).
        self._stream_interval: int | None = cfg.stream_interval if cfg.stream_interval > 1 else None
        self._chunks_checked = False  # whether an answer has shown the server honours it
        self._guard = LoopGuard(cfg, self._profile, engine_name="vllm")
        self.in_flight = 0
        self.peak_in_flight = 0  # the most requests this engine has had at the server at once

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name="vllm", version=self._version, model=f"{self._model} ({self._profile.name})")

    @property
    def input_spec(self) -> InputSpec:
        # Base64 as well: the request's data URL is then made in the pool, off the process feeding the server.
        return dataclasses.replace(super().input_spec, base64=True)

    @property
    def capacity(self) -> Capacity:
        """Up to ``max_in_flight`` requests at the server: the window's cap, which worker slots are planned from."""
        return Capacity.continuous(self._cfg.max_in_flight)

    @property
    def window(self) -> int:
        """The requests this process may have at the server now (interactive pages go past it)."""
        return self._slots.limit if self._slots is not None else self._first_window()

    @property
    def window_history(self) -> list[int]:
        """The window after each reading of the server's /metrics, oldest first (empty when it is fixed)."""
        return list(self._window.history) if self._window is not None else []

    def _first_window(self) -> int:
        cfg = self._cfg
        return min(cfg.max_in_flight, cfg.window.start) if cfg.window.adaptive else cfg.max_in_flight

    @property
    def max_model_len(self) -> int | None:
        """The served model's context length as ``/v1/models`` gave it at start; None when not advertised."""
        return self._max_model_len

    @property
    def max_tokens(self) -> int:
        """The ``max_tokens`` sent with each page: the configured one, within the served ``max_model_len``."""
        return self._max_tokens

    @property
    def sends_priority(self) -> bool:
        """Whether requests carry the page's priority (False once the server has refused one)."""
        return self._sends_priority

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop is None:
            self._loop = LoopThread("vllm-client")
        self._loop.run(self._start())

    async def _start(self) -> None:
        headers = {"Authorization": f"Bearer {self._cfg.api_key.get_secret_value()}"} if self._cfg.api_key else {}
        timeout = httpx.Timeout(self._cfg.request_timeout, connect=10.0)
        n = self._cfg.max_in_flight
        pools = -(-n // _POOL_CONNECTIONS)
        # Beyond its share of max_in_flight, each pool keeps room for interactive pages, which go past the bound
        # at once (``PriorityLimiter``): without it they would wait in httpx's queue for a batch page's connection.
        per_pool = -(-n // pools)
        limits = httpx.Limits(max_connections=per_pool + _URGENT_CONNECTIONS, max_keepalive_connections=per_pool)
        self._pools = [httpx.AsyncClient(headers=headers, timeout=timeout, transport=http_streams.transport(limits))
                       for _ in range(pools)]
        self._pool_load = [0] * pools
        self._client = self._pools[0]
        self._slots = PriorityLimiter(self._first_window())
        await self._wait_ready()
        served = await self._served_models()
        if self._model is None:
            self._model = next(iter(served))
        elif self._model not in served:
            raise UsageError(f"model {self._model!r} is not served at {self._base} (served: {', '.join(served)})")
        self._max_model_len = _max_model_len(served[self._model])
        if self._max_model_len is not None:
            self._max_tokens = min(self._cfg.max_tokens, self._max_model_len)
        self._version = await self._server_version()
        if self._cfg.window.adaptive:
            self._metrics = httpx.AsyncClient(headers=headers, limits=httpx.Limits(max_connections=1))
            self._window = WindowController(self._cfg, self._slots, client=self._metrics,
                                            metrics_url=f"{self._base.removesuffix('/v1')}/metrics",
                                            in_flight=lambda: self.in_flight)
            self._window.start()
        context = f"max_model_len {self._max_model_len}" if self._max_model_len else "max_model_len not advertised"
        log.info("vllm server %s ready: model %s (%s), profile %s, max_tokens %d (configured %d)", self._base,
                 self._model, context, self._profile.name, self._max_tokens, self._cfg.max_tokens)

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

    async def _served_models(self) -> dict[str, dict[str, Any]]:
        """The model cards at ``/v1/models`` by model id, in the server's order."""
        assert self._client is not None
        try:
            resp = await self._client.get(f"{self._base}/models")
            resp.raise_for_status()
            served = {str(m["id"]): dict(m) for m in resp.json().get("data", [])}
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
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
        self._guard.close()
        if self._loop is None:
            return
        if self._window is not None:
            self._loop.run(self._window.stop())
            self._window = None
        for pool in [*self._pools, *([self._metrics] if self._metrics else [])]:
            self._loop.run(pool.aclose())
        self._pools, self._client, self._metrics = [], None, None
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
        async with self._slots.slot(req.priority, urgent=req.urgent):
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                return await self._guard.answer(req, self._stream, max_tokens=self._max_tokens)
            except PaperlaneError as exc:
                return exc
            finally:
                self.in_flight -= 1

    async def _stream(self, req: EngineRequest, sampling: dict[str, Any]) -> AsyncGenerator[Delta, None]:
        """The answer to ``req`` as it streams; closing this generator closes the response (vLLM aborts)."""
        image = req.image
        b64 = image.data_b64 or (base64.b64encode(image.data) if image.data is not None else None)
        if b64 is None:
            raise EngineError("the vllm engine needs an encoded image", stage=_STAGE)
        url = (b'"data:', (image.mime or "image/jpeg").encode(), b";base64,", b64, b'"')
        body: dict[str, Any] = {"model": self._model, "messages": self._profile.messages(req.spec, _IMAGE_SLOT),
                                **sampling, "stream": True,
                                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        if self._cfg.logprobs:
            body["logprobs"] = True
        for _ in range(3):  # again without a field the server refused (priority, stream_interval)
            _put(body, "priority", req.priority if self._sends_priority else None)
            _put(body, "stream_interval", self._stream_interval)
            pool = self._pool_load.index(min(self._pool_load))  # the least busy pool
            self._pool_load[pool] += 1
            try:
                async with self._client_stream(self._pools[pool], body, url) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        if "stream_interval" in body and _refuses(resp, "stream_interval"):
                            self._stop_asking_interval(resp)
                            continue
                        if "priority" in body and _refuses(resp, "priority"):
                            self._stop_sending_priority(resp)
                            continue
                        raise _refusal(resp)
                    chunks, tokens = 0, 0
                    async for delta in _deltas(resp):
                        chunks, tokens = chunks + 1, delta.completion_tokens or tokens
                        yield delta
                    self._check_chunks(chunks, tokens)
                    return
            except httpx.TimeoutException as exc:
                raise EngineUnavailable(f"vllm server timed out after {self._cfg.request_timeout:.0f}s",
                                        stage=_STAGE) from exc
            except httpx.HTTPError as exc:
                raise EngineUnavailable(f"vllm server unreachable ({type(exc).__name__})", stage=_STAGE) from exc
            finally:
                self._pool_load[pool] -= 1

    def _client_stream(self, client: httpx.AsyncClient, body: dict[str, Any], image_url: tuple[bytes, ...]) -> Any:
        # The data URL (hundreds of kB of base64, which needs no JSON escaping), quoted, is spliced into the
        # encoded body instead of being run through the JSON encoder (that scan was a tenth of a worker's busy
        # time at 50 pages/s), its parts joined once: the process feeding the engine copies it once a request.
        head, slot, tail = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode().partition(
            _IMAGE_SLOT_JSON)
        raw = b"".join((head, *image_url, tail)) if slot else head
        return client.stream("POST", f"{self._base}/chat/completions", content=raw,
                             headers={"content-type": "application/json"})

    def _stop_asking_interval(self, resp: httpx.Response) -> None:
        if self._stream_interval is None:  # pages in flight together all hear the refusal: warn once
            return
        log.warning("vllm server %s refuses stream_interval (%s): answers come a chunk per token unless it is started "
                    "with --stream-interval %d", self._base, _error_message(resp), self._stream_interval)
        self._stream_interval = None
        self._chunks_checked = True

    def _check_chunks(self, chunks: int, tokens: int) -> None:
        """Judge the first answer of at least four intervals: when it came in chunks of less than a quarter of the
        ``stream_interval`` asked, the server ignores the field (a vLLM older than 0.32 does) and the process
        feeding it pays for every token: warn, once."""
        asked = self._stream_interval
        if self._chunks_checked or asked is None or asked < 8 or tokens < 4 * asked:
            return
        self._chunks_checked = True
        if 4 * tokens < asked * chunks:  # a quarter of what was asked: the first and last chunks are short
            log.warning("vllm server %s streamed %d tokens in %d chunks although each request asks for %d a chunk "
                        "(stream_interval, vLLM 0.32): the process feeding it spends more per page than it needs to; "
                        "start the server with --stream-interval %d", self._base, tokens, chunks, asked, asked)

    def _stop_sending_priority(self, resp: httpx.Response) -> None:
        if not self._sends_priority:  # pages in flight together all hear the refusal: warn once
            return
        self._sends_priority = False
        log.warning("vllm server %s refuses request priorities (%s): sending pages without priority, so "
                    "interactive pages queue behind batch pages inside the server; start it with "
                    "--scheduling-policy priority", self._base, _error_message(resp))

def _max_model_len(card: dict[str, Any]) -> int | None:
    value = card.get("max_model_len")  # vLLM's own field of a model card; other servers may lack it
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _refusal(resp: httpx.Response) -> PaperlaneError:
    """The error an HTTP error status means: the server busy or failing (retryable) or the page refused."""
    if resp.status_code >= 500 or resp.status_code == 429:
        return EngineUnavailable(f"vllm server busy or failing (HTTP {resp.status_code})", stage=_STAGE)
    return EngineError(f"vllm server refused the page (HTTP {resp.status_code}: {_error_message(resp)})",
                       stage=_STAGE)


async def _deltas(resp: httpx.Response) -> AsyncGenerator[Delta, None]:
    """The server-sent events of a streamed chat completion as ``Delta``s, until ``data: [DONE]``."""
    done, pending = False, b""
    # Read on past [DONE] to the body's end (the server ends it there): httpx's reader then ends on its own
    # instead of being left to the event loop's finaliser. Lines are split here, in bytes (json reads bytes):
    # an answer is hundreds of events, and httpx's text and line decoders cost more than the split.
    async for chunk in resp.aiter_bytes():
        if done:
            continue
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            yield _event(data)
    if not done and pending.startswith(b"data:") and (data := pending[5:].strip()) != b"[DONE]":
        yield _event(data)  # a last line the body ended without ending


def _event(data: bytes) -> Delta:
    try:
        return _delta(json.loads(data))
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise EngineUnavailable("vllm server sent a malformed answer", stage=_STAGE) from exc


def _delta(chunk: dict[str, Any]) -> Delta:
    if "error" in chunk:  # vLLM reports an error met mid-stream as a chunk of its own
        raise EngineUnavailable(f"vllm server failed mid-answer: {str(chunk['error'])[:160]}", stage=_STAGE)
    usage = chunk.get("usage") or {}
    delta = Delta(prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
    choices = chunk.get("choices") or []
    if choices:
        choice = choices[0]
        delta.text = (choice.get("delta") or {}).get("content") or ""
        delta.finish_reason = choice.get("finish_reason")
        logprobs = (choice.get("logprobs") or {}).get("content") or ()
        delta.logprobs = [float(item["logprob"]) for item in logprobs]
    return delta


def _refuses(resp: httpx.Response, field: str) -> bool:
    """Whether ``resp`` is the server refusing the request's ``field``: a 400 that names it. vLLM 0.32 ignores a
    priority under --scheduling-policy fcfs, but documents "Any priority other than 0 will raise an error if the
    served model does not use priority scheduling", and its V0 engine did ("Got priority 5 but Priority scheduling is
    not enabled.", HTTP 400); a server that knows no stream_interval may refuse it instead of ignoring it."""
    return resp.status_code == 400 and field in _error_text(resp).lower()


def _put(body: dict[str, Any], field: str, value: object) -> None:
    """``body[field] = value``, or no ``field`` when ``value`` is None."""
    if value is None:
        body.pop(field, None)
    else:
        body[field] = value


def _error_text(resp: httpx.Response) -> str:
    """The error message of an OpenAI-style error answer (``{"error": {"message": ...}}``), whole."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    msg = None
    if isinstance(data, dict):
        error = data.get("error")
        msg = error.get("message") if isinstance(error, dict) else data.get("message")
    return " ".join(str(msg or resp.reason_phrase or "").split())


def _error_message(resp: httpx.Response) -> str:
    return _error_text(resp)[:160]
