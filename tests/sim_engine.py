"""A simulated GPU serving HunyuanOCR: a separate OpenAI-compatible HTTP server with vLLM's shape.

Tests and benchmarks run on 2 CPU cores without a GPU, yet must measure everything paperlane does
AROUND the model honestly: base64, JSON, HTTP, streaming, the production client and its answer
parsing and loop guard. So this server behaves like ``vllm serve`` where paperlane depends on it, and
like a GPU where the bottleneck is. Two engine models (tests/sim_decode.py):

- fixed (``--latency``): ``--slots`` sequences at once, each for exactly ``--latency`` seconds, every page
  alike (an asyncio sleep: no CPU);
- shaped (``--shape h200-hunyuanocr``, tests/sim_shape.py): a real model's shape. Each page's answer has
  its own length, drawn from the page (median ~500 tokens, a tail to ~2,000); prefill grows with the
  image's vision tokens; sequences decode at a rate that falls as more run (an aggregate tokens/s ceiling,
  ~20 pages/s); a ``--loop-share`` of pages loop until ``max_tokens`` unless the request asks for a
  repetition penalty above ``--loop-penalty`` (a ``--stubborn-share`` loops anyway); a ``--hard-share``
  are read with low confidence.

Either way more requests wait in a queue, ordered by the body's ``priority`` (lower first, then
arrival) with ``--scheduling-policy priority``, by arrival with ``fcfs``; no preemption. A client that
disconnects aborts its request: its queue place or its slot is freed at once, also mid-stream, as vLLM
aborts a request on disconnect.

- ``GET /health``, ``GET /version``, ``GET /v1/models`` (with ``max_model_len``), ``GET /metrics`` (vLLM's
  ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` gauges, Prometheus text) and
  ``POST /v1/chat/completions`` with vLLM's answers and its refusals: HTTP 400 for ``max_tokens``
  above ``max_model_len`` or a prompt that fills the context (vLLM 0.32's words), for a non-zero
  ``priority`` without priority scheduling (as releases before 0.32 did: 0.32 accepts and ignores
  it, so this is the stricter server a client must survive), 404 for an unknown model.
- ``stream: true``: server-sent events as vLLM sends them (``data: {chunk}`` with
  ``choices[0].delta.content``, a last chunk with ``finish_reason``, ``data: [DONE]``), the usage in a
  last chunk with ``stream_options.include_usage`` and in every chunk with ``continuous_usage_stats``;
  ``logprobs: true`` adds each token's log-probability (``choices[0].logprobs.content``).
- The answer is what HunyuanOCR would say for the prompt paperlane sent (tests/sim_model.py): the
  format each profile asks for, the text a function of the image. Answers longer than the token budget
  are cut and end with ``finish_reason: "length"``.

It is cheap on CPU because it shares the machine with what it measures: a small asyncio HTTP/1.1
server (no framework, no h11), the body JSON-decoded once, the image never decoded (only its size is
read from the JPEG/PNG header), decode progress advanced for all sequences at once every tick and
streamed in chunks of the tokens each request asks (``stream_interval``, a vLLM 0.32 request field; the server's own
``--stream-interval``, 1 unless given, is the least).

Observability for tests: ``GET /sim/stats`` (totals, tokens decoded by outcome, running, waiting, decode
capacity used, per-image request counts) and ``--log PATH``, one JSON line per finished request, written
before its answer's end is sent, so a test can count engine calls per page even after the server was killed.

    python -m tests.sim_engine --port 8000 --slots 16 --latency 0.32 --scheduling-policy priority
    python -m tests.sim_engine --port 8000 --shape h200-hunyuanocr --loop-share 0.08 --scheduling-policy priority

``start_sim_engine`` starts one on a free port for a test or benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import hashlib
import io
import itertools
import dataclasses
import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import IO, Any

import httpx
from PIL import Image

from tests.services import ServiceError, free_port
from tests.sim_decode import DecodeScheduler, Sequence, SlotScheduler
from tests.sim_model import CHARS_PER_TOKEN, Prompt, answer, answer_pieces, loop_answer, read_prompt
from tests.sim_shape import SHAPES, Behaviour, EngineShape, PageDraw

DEFAULT_MODEL = "tencent/HunyuanOCR"
DEFAULT_MAX_MODEL_LEN = 32768  # HunyuanOCR's own context: what vLLM serves without --max-model-len
_PATCH = 32  # one vision token per 32x32 pixels (HunyuanOCR: at most ~4096 tokens for 2048x2048)
_MAX_HEADER = 64 * 1024


# --- requests -------------------------------------------------------------------------------


class BadRequest(Exception):
    """An OpenAI-style error answer, worded as vLLM 0.32 words it: a validation error names the
    parameter and the value it refused at the end of its message, and in ``param``."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "BadRequestError",
                 param: str | None = None, value: object = None) -> None:
        super().__init__(f"{message} (parameter={param}, value={value})" if param and value is not None else message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class Chat:
    """What the server reads from one chat-completions body."""

    priority: int
    prompt: Prompt
    image: str | None  # sha1 of the image data URL: identifies the page
    width: int
    height: int
    prompt_tokens: int
    max_tokens: int | None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: the usage in every chunk
    logprobs: bool = False
    repetition_penalty: float = 1.0
    stream_interval: int = 1  # tokens a streamed chunk asked for (vLLM 0.32's request field)


def read_chat(body: dict[str, Any], *, model: str, max_model_len: int, priority_scheduling: bool,
              stream_interval_field: str = "honour") -> Chat:
    """Validate a chat request as vLLM's OpenAI server does; raises ``BadRequest``. ``stream_interval_field``: see
    ``Options``."""
    if body.get("model") not in (None, model):
        raise BadRequest(f"The model `{body.get('model')}` does not exist.", status=404, kind="NotFoundError")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens",
                             value=max_tokens)
        if max_tokens > max_model_len:
            raise BadRequest(f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                             f"Please request fewer output tokens.", param="max_tokens", value=max_tokens)
    priority = body.get("priority", 0)
    if not isinstance(priority, int):
        raise BadRequest(f"priority must be an integer, got {priority!r}", param="priority")
    if priority != 0 and not priority_scheduling:  # as vLLM releases before 0.32 did; 0.32 ignores it
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.")
    text, url = _user_parts(body.get("messages"))
    width = height = 0
    if url is not None:
        width, height = image_size(url)
    prompt_tokens = (-(-width // _PATCH)) * (-(-height // _PATCH)) + len(text) // 4 + 12
    if prompt_tokens >= max_model_len:
        raise BadRequest(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                         f"contains {prompt_tokens} input tokens, which exceeds this limit even without any output "
                         f"tokens. Please reduce the length of the input prompt.", param="input_tokens",
                         value=prompt_tokens)
    sha = hashlib.sha1(url.encode()).hexdigest() if url is not None else None
    options = body.get("stream_options") or {}
    penalty = body.get("repetition_penalty", 1.0)
    if not isinstance(penalty, int | float) or penalty <= 0:
        raise BadRequest(f"repetition_penalty must be greater than zero, got {penalty}.", param="repetition_penalty",
                         value=penalty)
    interval = body.get("stream_interval")
    if interval is not None and stream_interval_field == "refuse":
        raise BadRequest("Unrecognized request argument supplied: stream_interval", param="stream_interval")
    interval = 1 if interval is None or stream_interval_field == "ignore" else interval
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise BadRequest(f"stream_interval must be an integer of at least 1, got {interval!r}.",
                         param="stream_interval", value=interval)
    return Chat(priority, read_prompt(text), sha, width, height, prompt_tokens, max_tokens,
                stream=bool(body.get("stream")), include_usage=bool(options.get("include_usage")),
                continuous_usage=bool(options.get("continuous_usage_stats")), logprobs=bool(body.get("logprobs")),
                repetition_penalty=float(penalty), stream_interval=interval)


def _user_parts(messages: object) -> tuple[str, str | None]:
    """The text and the image URL of the last user message."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    user = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
    if user is None:
        raise BadRequest("no user message", param="messages")
    content = user.get("content")
    if isinstance(content, str):
        return content, None
    text, url = [], None
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and part.get("type") == "text":
            text.append(str(part.get("text", "")))
        elif isinstance(part, dict) and part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url")
    if url is not None and not isinstance(url, str):
        raise BadRequest("image_url.url must be a string", param="messages")
    return "\n".join(text), url


def image_size(url: str) -> tuple[int, int]:
    """Width and height of a base64 data-URL image from its header alone, never decoding pixels."""
    head, sep, data = url.partition(",")
    if not (url.startswith("data:") and sep and head.endswith(";base64")):
        raise BadRequest("Only base64 data URLs are supported for images in this simulation.")
    for chars in (8192, 131072, len(data)):  # JPEG markers before the first scan fit in the first few kB
        try:
            with Image.open(io.BytesIO(base64.b64decode(data[: chars - chars % 4]))) as img:
                return img.size
        except (OSError, SyntaxError, ValueError, binascii.Error):
            if chars >= len(data):
                break
    raise BadRequest("cannot identify image file")


# --- the server -----------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    chunks: AsyncIterator[bytes] | None = None  # a streamed body, sent as it is made

    @classmethod
    def json(cls, obj: object, status: int = 200) -> Response:
        return cls(status, json.dumps(obj, separators=(",", ":")).encode())

    @classmethod
    def events(cls, chunks: AsyncIterator[bytes]) -> Response:
        return cls(200, content_type="text/event-stream", chunks=chunks)


@dataclass
class Options:
    slots: int
    latency: float
    priority_scheduling: bool
    max_model_len: int
    model: str
    shape: EngineShape | None = None
    behaviour: Behaviour = field(default_factory=Behaviour)
    # A request's stream_interval: "honour" (vLLM 0.32), "ignore" (older vLLM: an unknown field, ignored) or
    # "refuse" (a stricter server: HTTP 400 naming it).
    stream_interval_field: str = "honour"


@dataclass
class Generation:
    """What the model will write for one request, decided before it decodes."""

    content: str
    tokens: int  # to decode
    finish: str  # "stop" or "length"
    draw: PageDraw | None = None  # shaped engine: what it decided about the page
    loop_token: int | None = None  # the token the loop starts at, when it loops


class SimServer:
    """The routes; ``handle`` never raises (a bug is a 500 with its text, this is a test server)."""

    def __init__(self, opts: Options, log: IO[str] | None) -> None:
        self.opts = opts
        self.decode = (DecodeScheduler(opts.shape, slots=opts.slots, priority=opts.priority_scheduling)
                       if opts.shape is not None else None)
        self.sched = self.decode or SlotScheduler(slots=opts.slots, latency=opts.latency,
                                                  priority=opts.priority_scheduling)
        self.log = log
        self.requests = self.completed = self.rejected = self.aborted = 0
        self.tokens = Counter({"completed": 0, "abandoned": 0})  # fixed mode; the decode scheduler counts its own
        self.per_image: Counter[str] = Counter()
        self.ideal: dict[tuple[str, str], int] = {}  # (image, task) -> tokens of its answer without a loop
        self.loop_pages: set[tuple[str, str]] = set()
        self.looped = 0  # requests whose answer looped
        self.chunks = 0  # streamed chunks that carried tokens
        self.last_arrival: float | None = None  # the last request that reached the queue, and the tokens
        self.decoded_at_last_arrival = 0.0  # decoded by then: the engine's work while it had requests coming
        self._n = itertools.count(1)

    async def handle(self, method: str, target: str, body: bytes) -> Response:
        path, _, query = target.partition("?")
        try:
            if method == "POST" and path == "/v1/chat/completions":
                return await self._chat(body)
            if method == "GET" and path == "/health":
                return Response(200, b"", "text/plain")
            if method == "GET" and path == "/version":
                return Response.json({"version": f"sim-{self._describe()}"})
            if method == "GET" and path == "/v1/models":
                return Response.json(self._models())
            if method == "GET" and path == "/metrics":
                return Response(200, self._metrics(), "text/plain; version=0.0.4; charset=utf-8")
            if method == "GET" and path == "/sim/stats":
                return Response.json(self.stats(per_image="per_image=0" not in query))
            return Response.json({"detail": "Not Found"}, 404)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a test server answers its own bugs instead of hanging the client
            return Response.json({"error": {"message": repr(exc), "type": "InternalServerError", "code": 500}}, 500)

    def _describe(self) -> str:
        shape = self.opts.shape
        return shape.name if shape is not None else f"{self.opts.slots}x{self.opts.latency:g}s"

    def _models(self) -> dict[str, Any]:
        model = self.opts.model
        return {"object": "list", "data": [{
            "id": model, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": model,
            "parent": None, "max_model_len": self.opts.max_model_len}]}

    def _metrics(self) -> bytes:
        """vLLM's two scheduler gauges in Prometheus text, as its ``/metrics`` words them (one engine)."""
        labels = f'{{engine="0",model_name="{self.opts.model}"}}'
        return "".join(
            f"# HELP {name} {doc}\n# TYPE {name} gauge\n{name}{labels} {float(value)}\n"
            for name, doc, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.", self.sched.running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.sched.waiting))
        ).encode()

    def stats(self, *, per_image: bool = True) -> dict[str, Any]:
        """Totals since start. ``requests`` counts every chat request, ``rejected`` the refused ones (4xx),
        ``aborted`` those whose client went away; ``busy_slot_seconds`` includes the running ones up to
        ``now``; times are epoch seconds. ``tokens``: tokens decoded by outcome (``completed``: answers sent
        to their end, ``abandoned``: answers whose client left mid-way); shaped engine: ``decoded_tokens`` (all,
        running ones up to the last tick), ``decode_tokens_per_s`` (its ceiling), ``capacity_used`` (decoded
        over the ceiling since the first request started), ``decoding`` (running sequences past prefill),
        ``last_arrival`` and ``decoded_at_last_arrival`` (when the last request came, and the tokens decoded
        by then: the engine's use while requests kept coming).
        ``ideal_tokens``: what the pages seen would cost without loops (each page and task once);
        ``loop_pages`` and ``looped``: pages that looped, requests that did; ``chunks``: streamed chunks that
        carried tokens (the last tokens come in the answer's last one, not counted). ``per_image``: requests that
        reached the queue by the sha1 of their image data URL, whatever became of them."""
        s = self.sched
        out: dict[str, Any] = {
            "engine": self._describe(), "slots": s.slots, "latency": self.opts.latency,
            "policy": "priority" if s.priority else "fcfs", "requests": self.requests, "completed": self.completed,
            "rejected": self.rejected, "aborted": self.aborted, "running": s.running, "waiting": s.waiting,
            "peak_running": s.peak_running, "peak_waiting": s.peak_waiting,
            "busy_slot_seconds": round(s.busy_now(), 4), "first_start": s.first_start, "last_end": s.last_end,
            "now": time.time(), "tokens": dict(self.decode.tokens if self.decode else self.tokens),
            "ideal_tokens": sum(self.ideal.values()), "pages": len(self.ideal), "loop_pages": len(self.loop_pages),
            "looped": self.looped, "chunks": self.chunks}
        if self.decode is not None:
            shape, decoded = self.decode.shape, self.decode.decoded
            window = out["now"] - s.first_start if s.first_start is not None else 0.0
            out.update(decoded_tokens=round(decoded), decode_tokens_per_s=shape.decode_tokens_per_s,
                       decoding=self.decode.decoding_now(), last_arrival=self.last_arrival,
                       decoded_at_last_arrival=round(self.decoded_at_last_arrival),
                       capacity_used=round(decoded / (shape.decode_tokens_per_s * window), 4) if window else 0.0)
        if per_image:
            out["per_image"] = dict(self.per_image)
        return out

    async def _chat(self, raw: bytes) -> Response:
        record: dict[str, Any] = {"n": next(self._n), "arrival": time.time(), "start": None, "end": None,
                                  "priority": None, "image": None, "status": 400, "task": None}
        self.requests += 1
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            record["priority"] = body.get("priority", 0)
            chat = read_chat(body, model=self.opts.model, max_model_len=self.opts.max_model_len,
                             priority_scheduling=self.opts.priority_scheduling,
                             stream_interval_field=self.opts.stream_interval_field)
        except (BadRequest, ValueError) as exc:
            err = exc if isinstance(exc, BadRequest) else BadRequest(f"invalid JSON body: {exc}")
            self.rejected += 1
            self._log({**record, "status": err.status, "end": time.time(), "error": str(err)})
            return Response.json(err.body(), err.status)
        record.update(priority=chat.priority, image=chat.image, task=chat.prompt.task.value, width=chat.width,
                      height=chat.height, stream=chat.stream, repetition_penalty=chat.repetition_penalty,
                      temperature=body.get("temperature"), top_k=body.get("top_k"))
        if chat.image is not None:
            self.per_image[chat.image] += 1
        self.last_arrival = record["arrival"]
        self.decoded_at_last_arrival = self.decode.decoded if self.decode is not None else 0.0
        gen = self._generation(chat)
        record["looped"] = gen.loop_token is not None
        if chat.stream:
            return Response.events(self._stream(chat, gen, record))
        try:
            async for _ in self._decoded(chat, gen, record):
                pass
        except asyncio.CancelledError:  # the client went away: vLLM aborts the request
            self._aborted(record)
            raise
        return self._completion(chat, gen, record)

    def _generation(self, chat: Chat) -> Generation:
        budget = self.opts.max_model_len - chat.prompt_tokens
        budget = min(budget, chat.max_tokens) if chat.max_tokens is not None else budget
        seed = chat.image or "no image"
        shape = self.opts.shape
        if shape is None:
            return _cut(answer(chat.prompt, seed), budget)
        draw = PageDraw.of(seed, chat.prompt.task, shape, self.opts.behaviour)
        pieces = answer_pieces(chat.prompt, seed, tokens=draw.tokens)
        normal = _cut("".join(pieces), budget)
        key = (seed, chat.prompt.task.value)
        self.ideal[key] = normal.tokens
        if not draw.looping(chat.repetition_penalty, self.opts.behaviour):
            return Generation(normal.content, normal.tokens, normal.finish, draw)
        self.looped += 1
        self.loop_pages.add(key)
        content, loop_at = loop_answer(chat.prompt, pieces, draw, chars=budget * CHARS_PER_TOKEN)
        return Generation(content, budget, "length", draw, loop_at // CHARS_PER_TOKEN)

    async def _decoded(self, chat: Chat, gen: Generation, record: dict[str, Any]) -> AsyncIterator[int]:
        """Run the request on the engine; the tokens decoded so far, each time a chunk's worth is ready."""
        if self.decode is None:
            assert isinstance(self.sched, SlotScheduler)
            record["start"], record["end"] = await self.sched.run(chat.priority)
            self.tokens["completed"] += gen.tokens
            yield gen.tokens
            return
        assert self.opts.shape is not None
        seq = Sequence(target=gen.tokens, prefill=self.opts.shape.prefill(chat.prompt_tokens),
                       interval=max(chat.stream_interval, self.opts.shape.stream_interval))
        await self.decode.admit(seq, chat.priority)
        record["start"] = seq.start
        try:
            while True:
                upto = await self.decode.next_chunk(seq)
                if seq.complete:
                    break
                yield upto
        finally:
            record["end"] = self.decode.finish(seq)
            record["tokens"] = int(seq.decoded)
        yield gen.tokens

    def _aborted(self, record: dict[str, Any]) -> None:
        self.aborted += 1
        self._log({**record, "status": 499, "end": record["end"] or time.time(), "outcome": "abandoned"})

    async def _stream(self, chat: Chat, gen: Generation, record: dict[str, Any]) -> AsyncIterator[bytes]:
        """The answer as vLLM streams it: server-sent events, a chunk each time tokens are ready."""
        chunk_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(record["arrival"])

        def event(delta: dict[str, Any], *, logprobs: Any = None, finish: str | None = None,
                  usage: dict[str, int] | None = None) -> bytes:
            obj: dict[str, Any] = {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                                   "model": self.opts.model, "choices": [{
                                       "index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                                       **({"stop_reason": None} if finish else {})}]}
            if usage is not None:
                obj["usage"] = usage
            return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

        sent = 0
        try:
            yield event({"role": "assistant", "content": ""})
            async for upto in self._decoded(chat, gen, record):
                if upto > sent:
                    usage = self._usage(chat, upto) if chat.continuous_usage else None
                    yield event({"content": gen.content[sent * CHARS_PER_TOKEN : upto * CHARS_PER_TOKEN]},
                                logprobs=self._logprobs(chat, gen, sent, upto), usage=usage)
                    sent = upto
                    self.chunks += 1
        except asyncio.CancelledError:
            self._aborted(record)
            raise
        self._finished(chat, gen, record)
        yield event({"content": ""}, finish=gen.finish,
                    usage=self._usage(chat, gen.tokens) if chat.continuous_usage else None)
        if chat.include_usage:
            yield (b"data: " + json.dumps({"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                                           "model": self.opts.model, "choices": [],
                                           "usage": self._usage(chat, gen.tokens)}).encode() + b"\n\n")
        yield b"data: [DONE]\n\n"

    def _usage(self, chat: Chat, tokens: int) -> dict[str, int]:
        return {"prompt_tokens": chat.prompt_tokens, "completion_tokens": tokens,
                "total_tokens": chat.prompt_tokens + tokens}

    def _logprobs(self, chat: Chat, gen: Generation, start: int, end: int) -> dict[str, Any] | None:
        """vLLM's ``logprobs.content`` for tokens ``start``..``end``: lower on looping text (shaped engine)."""
        if not chat.logprobs:
            return None
        draw, loop = gen.draw, gen.loop_token
        content = []
        for i in range(start, end):
            value = draw.logprob(i, looping=loop is not None and i >= loop) if draw is not None else -0.02
            content.append({"token": gen.content[i * CHARS_PER_TOKEN : (i + 1) * CHARS_PER_TOKEN], "logprob": value,
                            "top_logprobs": []})
        return {"content": content}

    def _finished(self, chat: Chat, gen: Generation, record: dict[str, Any]) -> None:
        self.completed += 1
        self._log({**record, "status": 200, "prompt_tokens": chat.prompt_tokens, "completion_tokens": gen.tokens,
                   "finish_reason": gen.finish, "outcome": "completed"})

    def _completion(self, chat: Chat, gen: Generation, record: dict[str, Any]) -> Response:
        self._finished(chat, gen, record)
        return Response.json({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(record["arrival"]),
            "model": self.opts.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.content, "tool_calls": []},
                         "logprobs": self._logprobs(chat, gen, 0, gen.tokens), "finish_reason": gen.finish,
                         "stop_reason": None}],
            "usage": self._usage(chat, gen.tokens)})

    def _log(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(json.dumps(record, separators=(",", ":")) + "\n")
            self.log.flush()  # a killed server keeps every line it wrote


def _cut(content: str, budget: int) -> Generation:
    """``content`` as an answer within ``budget`` tokens: cut, and finishing on "length", when longer."""
    tokens = len(content) // CHARS_PER_TOKEN + 1
    if tokens > budget:
        return Generation(content[: budget * CHARS_PER_TOKEN], budget, "length")
    return Generation(content, tokens, "stop")


class HttpConnection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies, one request at a time per connection.

    Losing the connection cancels the request in progress, or the streaming of its answer, which is how a
    request is aborted. A streamed answer goes out with chunked transfer encoding, each chunk as it is made.
    """

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: tuple[str, str, int, bool] | None = None  # method, target, body length, close after
        self.task: asyncio.Task[Response] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._next()

    def _next(self) -> None:
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > _MAX_HEADER:
                    self._write(Response.json({"detail": "header too large"}, 431), close=True)
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            del self.buf[: end + 4]
            method, target, version = (head[0].split(" ", 2) + ["", ""])[:3]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
            if "chunked" in headers.get("transfer-encoding", ""):
                self._write(Response.json({"detail": "chunked bodies are not supported"}, 501), close=True)
                return
            close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
            self.head = (method, target, int(headers.get("content-length") or 0), close)
        method, target, length, close = self.head
        if len(self.buf) < length:
            return
        body = bytes(self.buf[:length])
        del self.buf[:length]
        self.head = None
        self.task = asyncio.get_running_loop().create_task(self.server.handle(method, target, body))
        self.task.add_done_callback(lambda task: self._done(task, close))

    def _done(self, task: asyncio.Task[Response], close: bool) -> None:
        self.task = None
        if task.cancelled() or self.transport is None:
            return
        resp = task.result()
        if resp.chunks is not None:  # a streamed answer: the head now, then each chunk as it is made
            self._write_head(resp, close=close, chunked=True)
            self.task = asyncio.get_running_loop().create_task(self._pump(resp.chunks))  # type: ignore[arg-type]
            self.task.add_done_callback(lambda pumped: self._pumped(pumped, close))
            return
        self._write(resp, close=close)
        if not close:
            self._next()

    async def _pump(self, chunks: AsyncIterator[bytes]) -> Response:
        async for data in chunks:
            if self.transport is None:
                break
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        if self.transport is not None:
            self.transport.write(b"0\r\n\r\n")
        return Response(200)

    def _pumped(self, task: asyncio.Task[Response], close: bool) -> None:
        self.task = None
        if task.cancelled() or self.transport is None:
            return
        if close:
            self.transport.close()
        else:
            self._next()

    def _write(self, resp: Response, *, close: bool) -> None:
        if self.transport is None:
            return
        self._write_head(resp, close=close, chunked=False)
        self.transport.write(resp.body)
        if close:
            self.transport.close()

    def _write_head(self, resp: Response, *, close: bool, chunked: bool) -> None:
        assert self.transport is not None
        length = "transfer-encoding: chunked" if chunked else f"content-length: {len(resp.body)}"
        head = [f"HTTP/1.1 {resp.status} {HTTPStatus(resp.status).phrase}", f"content-type: {resp.content_type}",
                length, *(["connection: close"] if close else []), "", ""]
        self.transport.write("\r\n".join(head).encode())


async def serve(opts: Options, *, host: str, port: int, log_path: Path | None) -> None:
    """Serve until SIGTERM or SIGINT."""
    log = log_path.open("a", encoding="utf-8") if log_path else None
    server = SimServer(opts, log)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: HttpConnection(server), host, port, backlog=256)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    b = opts.behaviour
    engine = (f"{opts.shape.name} ({opts.slots} sequences, {opts.shape.decode_tokens_per_s:g} tokens/s), loops "
              f"{b.loop_share:g} (stubborn {b.stubborn_share:g}) up to penalty {b.loop_penalty:g}"
              if opts.shape else f"{opts.slots} slots x {opts.latency}s")
    print(f"sim engine: {opts.model} on http://{host}:{port}/v1, {engine}, "
          f"{'priority' if opts.priority_scheduling else 'fcfs'} scheduling", flush=True)
    try:
        await stop.wait()
    finally:
        listener.close()
        if log is not None:
            log.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.sim_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), help="a real model's shape (tests/sim_shape.py) instead of "
                   "a fixed latency")
    p.add_argument("--slots", type=int, help="sequences at once (vLLM --max-num-seqs); default 16, or the shape's")
    p.add_argument("--latency", type=float, default=0.32, help="fixed mode: seconds each request holds its slot")
    p.add_argument("--loop-share", type=float, default=0.0, help="shaped: share of pages that loop to max_tokens")
    p.add_argument("--stubborn-share", type=float, default=0.0, help="shaped: share of pages that loop whatever "
                   "the repetition penalty")
    p.add_argument("--loop-penalty", type=float, default=1.1, help="shaped: a repetition_penalty above this "
                   "breaks a loop")
    p.add_argument("--hard-share", type=float, default=0.0, help="shaped: share of pages read with low confidence")
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    p.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    p.add_argument("--served-model-name", default=DEFAULT_MODEL)
    p.add_argument("--stream-interval", type=int, help="shaped: tokens a streamed chunk at least, whatever a "
                   "request asks (vLLM's --stream-interval); default: the shape's (1, as vLLM's)")
    p.add_argument("--stream-interval-field", choices=("honour", "ignore", "refuse"), default="honour",
                   help="what a request's stream_interval gets: honoured (vLLM 0.32), ignored (older vLLM) or refused")
    p.add_argument("--log", type=Path, help="append one JSON line per finished request")
    args = p.parse_args(argv)
    shape = SHAPES[args.shape] if args.shape else None
    if shape is not None and args.stream_interval:
        shape = dataclasses.replace(shape, stream_interval=args.stream_interval)
    slots = args.slots or (shape.max_num_seqs if shape else 16)
    behaviour = Behaviour(loop_share=args.loop_share, stubborn_share=args.stubborn_share,
                          loop_penalty=args.loop_penalty, hard_share=args.hard_share)
    opts = Options(slots=slots, latency=args.latency, priority_scheduling=args.scheduling_policy == "priority",
                   max_model_len=args.max_model_len, model=args.served_model_name, shape=shape, behaviour=behaviour,
                   stream_interval_field=args.stream_interval_field)
    asyncio.run(serve(opts, host=args.host, port=args.port, log_path=args.log))


# --- the launcher for tests and benchmarks ----------------------------------------------------


@dataclass
class SimEngine:
    """A running simulated engine process; ``url`` is what ``--engine-url`` takes."""

    url: str  # the OpenAI base URL, http://127.0.0.1:PORT/v1
    proc: subprocess.Popen[bytes]
    log_path: Path  # one JSON line per finished request
    slots: int
    latency: float
    shape: EngineShape | None = None
    _http: httpx.Client | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def http(self) -> httpx.Client:
        """A kept-alive client for this server (a new httpx client costs ~50 ms: its SSL context)."""
        if self._http is None:
            self._http = httpx.Client(timeout=30)
        return self._http

    @property
    def rate(self) -> float:
        """Pages per second the engine itself does when kept full (shaped: at its decode ceiling)."""
        return self.shape.pages_per_s if self.shape is not None else self.slots / self.latency

    def stats(self, *, per_image: bool = True) -> dict[str, Any]:
        """The server's totals (see ``SimServer.stats``); ``per_image``: request counts by image sha1."""
        resp = self.http.get(f"{self.url.removesuffix('/v1')}/sim/stats", params={"per_image": int(per_image)})
        resp.raise_for_status()
        return dict(resp.json())

    def requests(self) -> list[dict[str, Any]]:
        """Every finished request in the log, in the order they finished (readable after a kill too)."""
        text = self.log_path.read_text(encoding="utf-8") if self.log_path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def wait_for(self, condition: Callable[[dict[str, Any]], bool], *, timeout: float = 60) -> dict[str, Any]:
        """Poll the stats (without per-image counts) until ``condition`` holds; those stats."""
        deadline = time.monotonic() + timeout
        while not condition(stats := self.stats(per_image=False)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"sim engine condition not met in {timeout:.0f}s: {stats}")
            time.sleep(0.05)
        return stats

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (``signal.SIGKILL`` to kill it the hard way); safe to call twice."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._http is not None:
            self._http.close()
            self._http = None


def start_sim_engine(root: Path, *, slots: int | None = None, latency: float = 0.32, shape: str | None = None,
                     behaviour: Behaviour | None = None, scheduling_policy: str = "fcfs",
                     max_model_len: int = DEFAULT_MAX_MODEL_LEN, served_model_name: str = DEFAULT_MODEL,
                     stream_interval: int | None = None, stream_interval_field: str = "honour",
                     timeout: float = 30) -> SimEngine:
    """Start a simulated engine on a free loopback port; its output and request log go under ``root``.

    Fixed mode (``slots`` x ``latency``, 16 slots by default) unless ``shape`` names one of ``SHAPES``
    (``slots`` then defaults to its ``max_num_seqs``); ``behaviour``: the shaped engine's loops and hard pages;
    ``stream_interval``: the server's --stream-interval, the shape's (1) unless given; ``stream_interval_field``:
    what a request's own gets (``Options``).
    """
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = root / f"sim-engine-{port}.jsonl"
    out = root / f"sim-engine-{port}.out"
    repo = Path(__file__).resolve().parents[1]
    engine_shape = SHAPES[shape] if shape else None
    if engine_shape is not None and stream_interval:
        engine_shape = dataclasses.replace(engine_shape, stream_interval=stream_interval)
    slots = slots or (engine_shape.max_num_seqs if engine_shape else 16)
    b = behaviour or Behaviour()
    shaped = ["--shape", shape, "--loop-share", str(b.loop_share), "--stubborn-share", str(b.stubborn_share),
              "--loop-penalty", str(b.loop_penalty), "--hard-share", str(b.hard_share),
              *(["--stream-interval", str(stream_interval)] if stream_interval else [])] if shape else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.sim_engine", "--port", str(port), "--slots", str(slots), "--latency",
         str(latency), *shaped, "--scheduling-policy", scheduling_policy, "--max-model-len", str(max_model_len),
         "--served-model-name", served_model_name, "--stream-interval-field", stream_interval_field,
         "--log", str(log_path)],
        cwd=repo, stdout=out.open("wb"), stderr=subprocess.STDOUT)
    engine = SimEngine(f"http://127.0.0.1:{port}/v1", proc, log_path, slots, latency, engine_shape)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return engine
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            engine.stop()
            raise ServiceError(f"sim engine did not come up:\n{out.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
