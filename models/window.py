"""The window: how many requests a process keeps at a vLLM server, following what the server says of itself.

A server needs enough answers streaming at once to reach its decode ceiling (its ``--max-num-seqs``, whatever
the model's per-stream speed), and a short queue of waiting requests so that a finished sequence is replaced
at once; a longer queue only makes an interactive page wait behind it. So the window is steered by the
server's own gauges (vLLM's ``/metrics``, Prometheus text: ``vllm:num_requests_running`` and
``vllm:num_requests_waiting``), read about once a second on the engine's event loop:

- the server's queue over ``queue_target``: the window shrinks by this process's share of the excess (its
  requests over all the server's), so several processes sharing one server take the excess off together,
  once, instead of each taking all of it; no second cut while requests of the last one are still out. A share
  is rarely a whole request: it is rounded up with the probability of its fraction (1.3 is 2 three times in
  ten), so over many readings each process sheds in proportion to its window. Rounded the same way for all
  (up: one each), a process holding 80 and one holding 3 would shed alike and stay 80 and 3 for ever;
- the queue empty at two readings in a row (the server has sequences free) and this process held pages back
  (window-bound): the window grows by a quarter, so a server needing 80 answers where the window started at 32
  is full in a few seconds; by a twentieth only while some of this process's requests are not at the server (on
  their way, or their answers still being read: a loaded client's lag, which a leap would turn into a long
  queue there once it catches up). One empty reading is not enough: a full server whose queue is held near
  the target empties it for an instant whenever several sequences end in one step, and a leap of 5% on that
  instant left 9 or 10 requests queued there for a second;
- the queue short but not empty, and window-bound: one more, at the target too (additive increase, and the
  proportional cut above: several processes sharing one server converge to equal windows, whatever windows
  they started from, with the server's queue a few requests either side of the target; a queue held exactly
  at the target would freeze whatever split the processes had).

A process that is not window-bound (it has fewer pages than the window) never grows its window. The window
stays within 1 and ``engine.max_in_flight``; interactive pages go past it at once (``PriorityLimiter``).
A server without ``/metrics`` (or gauges it cannot read) keeps the window where it started, with one warning.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from paperlane.models.aio import PriorityLimiter
from paperlane.settings import EngineSettings

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
_GROWTH = 0.25  # share the window grows by while the server has sequences free
_CREEP = 0.05  # ... while some of this process's requests are not at the server
_HISTORY = 3600  # window sizes kept (one per poll): an hour at the default interval


@dataclass(frozen=True)
class ServerLoad:
    """The server's requests now, all clients' together."""

    running: int
    waiting: int


def parse_load(text: str) -> ServerLoad:
    """The running and waiting requests in a Prometheus text exposition (summed over label sets: a server with
    several engines reports one line each); raises ValueError when either gauge is missing."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        rest = line[line.rindex("}") + 1 :] if line[len(name) :].startswith("{") else line[len(name) :]
        value = rest.split()  # the value, then maybe a timestamp
        if name in (RUNNING, WAITING) and value:
            totals[name] = totals.get(name, 0.0) + float(value[0])
    if RUNNING not in totals or WAITING not in totals:
        raise ValueError(f"no {RUNNING} and {WAITING} in the server's metrics")
    return ServerLoad(running=round(totals[RUNNING]), waiting=round(totals[WAITING]))


def next_window(window: int, *, load: ServerLoad, mine: int, bound: bool, empty_before: bool, target: int,
                cap: int, chance: Callable[[], float] = random.random) -> int:
    """The window after one reading of the server's ``load``: ``mine`` of its requests are this process's,
    ``bound`` says whether the window held pages back since the last reading, ``empty_before`` whether the
    server's queue was empty at the reading before (see the module's rules); ``chance`` draws in [0, 1) for
    rounding a cut."""
    if load.waiting > target:
        if mine > window:  # the last cut is still draining: cut again only on what it did
            return window
        share = min(1.0, mine / max(1, load.running + load.waiting))
        cut = (load.waiting - target) * share
        whole = math.floor(cut)
        return max(1, min(window, mine) - whole - (chance() < cut - whole))
    if not bound or window >= cap:
        return min(window, cap)
    if load.waiting == 0 and empty_before:
        # Some of this process's requests not at the server (on their way there, or their answers still being
        # read): the server's free sequences are partly that lag, so the window creeps instead of leaping.
        growth = _GROWTH if load.running + load.waiting >= mine else _CREEP
        return min(cap, window + max(1, math.ceil(window * growth)))
    return min(cap, window + 1)


class WindowController:
    """Keeps ``limiter``'s limit at the window, reading ``metrics_url`` every ``engine.window.poll_interval``."""

    def __init__(self, cfg: EngineSettings, limiter: PriorityLimiter, *, metrics_url: str,
                 client: httpx.AsyncClient, in_flight: Callable[[], int]) -> None:
        self._cfg = cfg.window
        self._cap = cfg.max_in_flight
        self._limiter = limiter
        self._url = metrics_url
        self._client = client
        self._in_flight = in_flight
        self._task: asyncio.Task[None] | None = None
        self.history: deque[int] = deque([limiter.limit], maxlen=_HISTORY)  # the window after each reading
        self.last_load: ServerLoad | None = None

    @property
    def window(self) -> int:
        return self._limiter.limit

    def start(self) -> None:
        """Start polling on the running loop (call from it)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="vllm-window")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        warned = False
        while True:
            await asyncio.sleep(self._cfg.poll_interval)
            try:
                load = await self._read()
            except (httpx.HTTPError, ValueError) as exc:
                if not warned:
                    log.warning("vllm server metrics at %s unreadable (%s): the window stays at %d requests",
                                self._url, str(exc)[:160] or type(exc).__name__, self.window)
                    warned = True
                continue
            warned = False
            self.step(load)

    async def _read(self) -> ServerLoad:
        resp = await self._client.get(self._url, timeout=max(1.0, self._cfg.poll_interval))
        resp.raise_for_status()
        return parse_load(resp.text)

    def step(self, load: ServerLoad) -> int:
        """Apply one reading of the server; the window after it."""
        old = self.window
        empty_before = self.last_load is not None and self.last_load.waiting == 0
        new = next_window(old, load=load, mine=self._in_flight(), bound=self._limiter.take_blocked(),
                          empty_before=empty_before, target=self._cfg.queue_target, cap=self._cap)
        if new != old:
            self._limiter.set_limit(new)
            log.info("vllm window %d -> %d (server: %d running, %d waiting)", old, new, load.running, load.waiting)
        self.last_load = load
        self.history.append(new)
        return new
