"""A simulated GPU serving HunyuanOCR: a separate OpenAI-compatible HTTP server with vLLM's shape.

Tests and benchmarks run on 2 CPU cores without a GPU, yet must measure everything paperlane does
AROUND the model honestly: base64, JSON, HTTP, the production client and its answer parsing. So
this server behaves like ``vllm serve`` where paperlane depends on it, and like a GPU where the
bottleneck is:

- ``--slots`` sequences run at once (vLLM's ``--max-num-seqs``), each for exactly ``--latency``
  seconds (an asyncio sleep: no CPU). More requests wait in a queue, ordered by the body's
  ``priority`` (lower first, then arrival) with ``--scheduling-policy priority``, by arrival with
  ``fcfs``. No preemption: a waiting urgent request takes the next free slot, as in vLLM.
- A client that disconnects aborts its request (its slot or queue place is freed), as in vLLM.
- ``GET /health``, ``GET /version``, ``GET /v1/models`` (with ``max_model_len``) and
  ``POST /v1/chat/completions`` with vLLM's answers and its refusals: HTTP 400 for ``max_tokens``
  above ``max_model_len`` or a prompt that fills the context (vLLM 0.32's words), for a non-zero
  ``priority`` without priority scheduling (as releases before 0.32 did: 0.32 accepts and ignores
  it, so this is the stricter server a client must survive), 404 for an unknown model.
- The answer is what HunyuanOCR 1.0 would say for the prompt paperlane sent (its prompts are
  recognised from ``paperlane.models.profiles``): ~40 lines in the ``text(x1,y1),(x2,y2)`` spotting
  format with boxes normalised to 0..1000, markdown for parse, JSON for fields, plain text
  otherwise. The text is a function of the image, so the same page always reads the same.
  Answers longer than the token budget are cut and end with ``finish_reason: "length"``.

It is cheap on CPU because it shares the machine with what it measures: a small asyncio HTTP/1.1
server (no framework, no h11), the body JSON-decoded once, the image never decoded: only its size
is read from the JPEG/PNG header.

Observability for tests: ``GET /sim/stats`` (totals and per-image request counts) and
``--log PATH``, one JSON line per finished request, written before its answer is sent, so a test
can count engine calls per page even after the server was killed.

    python -m tests.sim_engine --port 8000 --slots 16 --latency 0.32 --scheduling-policy priority

``start_sim_engine`` starts one on a free port for a test or benchmark.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import base64
import binascii
import hashlib
import heapq
import io
import itertools
import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import IO, Any

import httpx
from PIL import Image

from paperlane.models.profiles import PROFILES
from paperlane.schemas import Task
from tests.pages import WORDS
from tests.services import ServiceError, free_port

DEFAULT_MODEL = "tencent/HunyuanOCR"
DEFAULT_MAX_MODEL_LEN = 32768  # HunyuanOCR's own context: what vLLM serves without --max-model-len
_NORM = 1000  # spotting boxes are normalised to 0..1000 of the image
_PATCH = 32  # one vision token per 32x32 pixels (HunyuanOCR: at most ~4096 tokens for 2048x2048)
_CHARS_PER_TOKEN = 3  # coordinates and short English words: about 3 characters per token
_MAX_HEADER = 64 * 1024


# --- scheduling: slots and the waiting queue ------------------------------------------------


@dataclass(order=True)
class _Waiter:
    key: tuple[int, int]  # (priority, arrival sequence); (0, sequence) under fcfs
    future: asyncio.Future[None] = field(compare=False)


class SlotScheduler:
    """``slots`` sequences at once for ``latency`` seconds each; the rest wait in priority order."""

    def __init__(self, *, slots: int, latency: float, priority: bool) -> None:
        self.slots = slots
        self.latency = latency
        self.priority = priority
        self.running = 0
        self.waiting = 0
        self.peak_running = 0
        self.peak_waiting = 0
        self.busy_s = 0.0  # slot-seconds of finished and aborted runs
        self.first_start: float | None = None
        self.last_end: float | None = None
        self._heap: list[_Waiter] = []
        self._seq = itertools.count()
        self._started: dict[int, float] = {}  # running sequence numbers -> start time
        self._ids = itertools.count()

    async def run(self, priority: int) -> tuple[float, float]:
        """Wait for a slot, hold it for ``latency`` seconds; (start, end) as epoch seconds.

        Cancelled (the client went away): leaves the queue, or frees the slot, and re-raises.
        """
        await self._admit(priority)
        start = time.time()
        run_id = next(self._ids)
        self._started[run_id] = start
        self.first_start = self.first_start if self.first_start is not None else start
        try:
            await asyncio.sleep(self.latency)
        finally:
            end = time.time()
            del self._started[run_id]
            self.busy_s += end - start
            self.last_end = end
            self._release()
        return start, end

    def busy_now(self) -> float:
        """Slot-seconds so far, counting the running sequences up to now."""
        now = time.time()
        return self.busy_s + sum(now - start for start in self._started.values())

    async def _admit(self, priority: int) -> None:
        if self.running < self.slots and not self.waiting:
            self._take_slot()
            return
        key = (priority if self.priority else 0, next(self._seq))
        waiter = _Waiter(key, asyncio.get_running_loop().create_future())
        heapq.heappush(self._heap, waiter)
        self.waiting += 1
        self.peak_waiting = max(self.peak_waiting, self.waiting)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release()  # admitted and cancelled in the same tick: hand the slot on
            else:
                waiter.future.cancel()  # skipped when popped
                self.waiting -= 1
            raise

    def _take_slot(self) -> None:
        self.running += 1
        self.peak_running = max(self.peak_running, self.running)

    def _release(self) -> None:
        self.running -= 1
        while self.running < self.slots and self._heap:
            waiter = heapq.heappop(self._heap)
            if waiter.future.cancelled():
                continue
            self.waiting -= 1
            self._take_slot()
            waiter.future.set_result(None)


# --- what the model says ----------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    task: Task
    json_spotting: bool = False  # the generic profile asks for a JSON array of boxes
    fields: tuple[str, ...] = ()


def _known_prompts() -> list[tuple[str, bool, Prompt]]:
    """(text, whole prompt or prefix, what it asks) for every profile's prompts."""
    known = []
    for profile in PROFILES.values():
        p = profile.prompts
        json_spotting = "JSON" in p.spotting
        known += [(p.spotting, True, Prompt(Task.SPOTTING, json_spotting)), (p.parse, True, Prompt(Task.PARSE)),
                  (p.text, True, Prompt(Task.TEXT)), (p.fields.split("{")[0], False, Prompt(Task.FIELDS)),
                  (p.translate.split("{")[0], False, Prompt(Task.TRANSLATE))]
    return known


_PROMPTS = _known_prompts()


def read_prompt(text: str) -> Prompt:
    """The task a prompt asks for (plain text when the prompt is not one of paperlane's)."""
    for known, whole, prompt in _PROMPTS:
        if (text == known) if whole else text.startswith(known):
            if prompt.task is Task.FIELDS:
                return Prompt(Task.FIELDS, fields=_field_keys(text))
            return prompt
    return Prompt(Task.TEXT)


def _field_keys(prompt: str) -> tuple[str, ...]:
    start, end = prompt.find("["), prompt.find("]")
    try:
        keys = ast.literal_eval(prompt[start : end + 1])
    except (ValueError, SyntaxError):
        return ()
    return tuple(str(k) for k in keys) if isinstance(keys, list) else ()


def page_lines(seed: str, n: int) -> list[str]:
    """``n`` lines of invoice-like English, always the same for the same ``seed``."""
    rnd = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(4, 9))]
        number = f" {rnd.randint(1, 9999)}" if rnd.random() < 0.4 else ""
        lines.append(" ".join([words[0].capitalize(), *words[1:]]) + number)
    return lines


def answer(prompt: Prompt, seed: str) -> str:
    """HunyuanOCR's answer to ``prompt`` on the page identified by ``seed``."""
    rnd = random.Random(seed)
    lines = page_lines(seed, rnd.randint(36, 44))
    if prompt.task is Task.SPOTTING:
        return _spotting(lines, rnd, json_format=prompt.json_spotting)
    if prompt.task is Task.PARSE:
        table = "".join(f"<tr><td>{ln.split()[0]}</td><td>{rnd.randint(1, 999)}.{rnd.randint(0, 99):02d}</td></tr>"
                        for ln in lines[:5])
        body = "\n\n".join(" ".join(lines[i : i + 4]) for i in range(5, len(lines), 4))
        return f"# {lines[0]}\n\n{body}\n\n<table>{table}</table>"
    if prompt.task is Task.FIELDS:
        values = {key: lines[i % len(lines)].split(" ", 2)[-1] for i, key in enumerate(prompt.fields)}
        return "```json\n" + json.dumps(values, ensure_ascii=False) + "\n```"
    return "\n".join(lines)


def _spotting(lines: list[str], rnd: random.Random, *, json_format: bool) -> str:
    step = (_NORM - 80) // len(lines)
    items = []
    for i, text in enumerate(lines):
        x1, y1 = 55 + rnd.randint(0, 15), 40 + i * step
        box = (x1, y1, min(_NORM - 30, x1 + 14 * len(text) + rnd.randint(0, 20)), y1 + step * 2 // 3)
        items.append((text, box))
    if json_format:
        return json.dumps([{"box": list(box), "text": text} for text, box in items], ensure_ascii=False)
    return "".join(f"{text}({x1},{y1}),({x2},{y2})" for text, (x1, y1, x2, y2) in items)


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


def read_chat(body: dict[str, Any], *, model: str, max_model_len: int, priority_scheduling: bool) -> Chat:
    """Validate a chat request as vLLM's OpenAI server does; raises ``BadRequest``."""
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
    return Chat(priority, read_prompt(text), sha, width, height, prompt_tokens, max_tokens)


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

    @classmethod
    def json(cls, obj: object, status: int = 200) -> Response:
        return cls(status, json.dumps(obj, separators=(",", ":")).encode())


@dataclass
class Options:
    slots: int
    latency: float
    priority_scheduling: bool
    max_model_len: int
    model: str


class SimServer:
    """The routes; ``handle`` never raises (a bug is a 500 with its text, this is a test server)."""

    def __init__(self, opts: Options, log: IO[str] | None) -> None:
        self.opts = opts
        self.sched = SlotScheduler(slots=opts.slots, latency=opts.latency, priority=opts.priority_scheduling)
        self.log = log
        self.requests = self.completed = self.rejected = self.aborted = 0
        self.per_image: Counter[str] = Counter()
        self._n = itertools.count(1)

    async def handle(self, method: str, target: str, body: bytes) -> Response:
        path, _, query = target.partition("?")
        try:
            if method == "POST" and path == "/v1/chat/completions":
                return await self._chat(body)
            if method == "GET" and path == "/health":
                return Response(200, b"", "text/plain")
            if method == "GET" and path == "/version":
                return Response.json({"version": f"sim-{self.opts.slots}x{self.opts.latency:g}s"})
            if method == "GET" and path == "/v1/models":
                return Response.json(self._models())
            if method == "GET" and path == "/sim/stats":
                return Response.json(self.stats(per_image="per_image=0" not in query))
            return Response.json({"detail": "Not Found"}, 404)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a test server answers its own bugs instead of hanging the client
            return Response.json({"error": {"message": repr(exc), "type": "InternalServerError", "code": 500}}, 500)

    def _models(self) -> dict[str, Any]:
        model = self.opts.model
        return {"object": "list", "data": [{
            "id": model, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": model,
            "parent": None, "max_model_len": self.opts.max_model_len}]}

    def stats(self, *, per_image: bool = True) -> dict[str, Any]:
        """Totals since start. ``requests`` counts every chat request, ``rejected`` the refused ones (4xx),
        ``aborted`` those whose client went away; ``busy_slot_seconds`` includes the running ones up to
        ``now``; times are epoch seconds. ``per_image``: requests that reached the queue (not refused) by
        the sha1 of their image data URL, whatever became of them: the log says which completed."""
        s = self.sched
        out: dict[str, Any] = {
            "slots": s.slots, "latency": s.latency, "policy": "priority" if s.priority else "fcfs",
            "requests": self.requests, "completed": self.completed, "rejected": self.rejected,
            "aborted": self.aborted, "running": s.running, "waiting": s.waiting, "peak_running": s.peak_running,
            "peak_waiting": s.peak_waiting, "busy_slot_seconds": round(s.busy_now(), 4),
            "first_start": s.first_start, "last_end": s.last_end, "now": time.time()}
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
                             priority_scheduling=self.opts.priority_scheduling)
        except (BadRequest, ValueError) as exc:
            err = exc if isinstance(exc, BadRequest) else BadRequest(f"invalid JSON body: {exc}")
            self.rejected += 1
            self._log({**record, "status": err.status, "end": time.time(), "error": str(err)})
            return Response.json(err.body(), err.status)
        record.update(priority=chat.priority, image=chat.image, task=chat.prompt.task.value, width=chat.width,
                      height=chat.height)
        if chat.image is not None:
            self.per_image[chat.image] += 1
        try:
            record["start"], record["end"] = await self.sched.run(chat.priority)
        except asyncio.CancelledError:  # the client went away: vLLM aborts the request
            self.aborted += 1
            self._log({**record, "status": 499, "end": time.time()})
            raise
        self.completed += 1
        return self._completion(chat, record)

    def _completion(self, chat: Chat, record: dict[str, Any]) -> Response:
        content = answer(chat.prompt, chat.image or "no image")
        budget = self.opts.max_model_len - chat.prompt_tokens
        budget = min(budget, chat.max_tokens) if chat.max_tokens is not None else budget
        tokens = len(content) // _CHARS_PER_TOKEN + 1
        finish = "stop"
        if tokens > budget:
            content, tokens, finish = content[: budget * _CHARS_PER_TOKEN], budget, "length"
        self._log({**record, "status": 200, "prompt_tokens": chat.prompt_tokens, "completion_tokens": tokens,
                   "finish_reason": finish})
        return Response.json({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(record["arrival"]),
            "model": self.opts.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": []},
                         "logprobs": None, "finish_reason": finish, "stop_reason": None}],
            "usage": {"prompt_tokens": chat.prompt_tokens, "completion_tokens": tokens,
                      "total_tokens": chat.prompt_tokens + tokens}})

    def _log(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(json.dumps(record, separators=(",", ":")) + "\n")
            self.log.flush()  # a killed server keeps every line it wrote


class HttpConnection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies, one request at a time per connection.

    Losing the connection cancels the request in progress, which is how a request is aborted.
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
        self._write(task.result(), close=close)
        if not close:
            self._next()

    def _write(self, resp: Response, *, close: bool) -> None:
        if self.transport is None:
            return
        head = [f"HTTP/1.1 {resp.status} {HTTPStatus(resp.status).phrase}", f"content-type: {resp.content_type}",
                f"content-length: {len(resp.body)}", *(["connection: close"] if close else []), "", ""]
        self.transport.write("\r\n".join(head).encode() + resp.body)
        if close:
            self.transport.close()


async def serve(opts: Options, *, host: str, port: int, log_path: Path | None) -> None:
    """Serve until SIGTERM or SIGINT."""
    log = log_path.open("a", encoding="utf-8") if log_path else None
    server = SimServer(opts, log)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: HttpConnection(server), host, port, backlog=256)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sim engine: {opts.model} on http://{host}:{port}/v1, {opts.slots} slots x {opts.latency}s, "
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
    p.add_argument("--slots", type=int, default=16, help="sequences at once (vLLM --max-num-seqs)")
    p.add_argument("--latency", type=float, default=0.32, help="seconds each request holds its slot")
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    p.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    p.add_argument("--served-model-name", default=DEFAULT_MODEL)
    p.add_argument("--log", type=Path, help="append one JSON line per finished request")
    args = p.parse_args(argv)
    opts = Options(slots=args.slots, latency=args.latency, priority_scheduling=args.scheduling_policy == "priority",
                   max_model_len=args.max_model_len, model=args.served_model_name)
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
        """Pages per second the engine itself does when kept full."""
        return self.slots / self.latency

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


def start_sim_engine(root: Path, *, slots: int, latency: float, scheduling_policy: str = "fcfs",
                     max_model_len: int = DEFAULT_MAX_MODEL_LEN, served_model_name: str = DEFAULT_MODEL,
                     timeout: float = 30) -> SimEngine:
    """Start a simulated engine on a free loopback port; its output and request log go under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = root / f"sim-engine-{port}.jsonl"
    out = root / f"sim-engine-{port}.out"
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.sim_engine", "--port", str(port), "--slots", str(slots), "--latency",
         str(latency), "--scheduling-policy", scheduling_policy, "--max-model-len", str(max_model_len),
         "--served-model-name", served_model_name, "--log", str(log_path)],
        cwd=repo, stdout=out.open("wb"), stderr=subprocess.STDOUT)
    engine = SimEngine(f"http://127.0.0.1:{port}/v1", proc, log_path, slots, latency)
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
