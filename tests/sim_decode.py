"""The simulated engine's scheduling: sequence slots, the waiting queue, and how sequences decode.

``Admission`` is vLLM's shape at the door: ``slots`` sequences at once (``--max-num-seqs``), the rest
waiting, ordered by ``priority`` (lower first, then arrival) under priority scheduling, by arrival under
fcfs, no preemption. A request cancelled while it waits leaves the queue; one cancelled while it runs
frees its slot at once (vLLM aborts a request whose client went away).

Two ways of running an admitted request: ``SlotScheduler`` holds the slot a fixed ``latency`` (every page
alike); ``DecodeScheduler`` decodes each sequence's tokens, all sequences sharing the engine's decode rate
(``tests/sim_shape.EngineShape``). Its progress is computed for all sequences together every tick, never
per token: cheap, because the simulation shares the CPU with what it measures.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from tests.sim_shape import EngineShape


@dataclass(order=True)
class _Waiter:
    key: tuple[int, int]  # (priority, arrival sequence); (0, sequence) under fcfs
    future: asyncio.Future[None] = field(compare=False)


class Admission:
    """``slots`` sequences at once; the rest wait in priority (or arrival) order."""

    def __init__(self, *, slots: int, priority: bool) -> None:
        self.slots = slots
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
        self._started: dict[int, float] = {}  # running requests -> start time (epoch)
        self._ids = itertools.count()

    def busy_now(self) -> float:
        """Slot-seconds so far, counting the running sequences up to now."""
        now = time.time()
        return self.busy_s + sum(now - start for start in self._started.values())

    async def enter(self, priority: int) -> tuple[int, float]:
        """Wait for a slot; (run id, start time). Cancelled while waiting: leaves the queue and re-raises."""
        await self._admit(priority)
        start = time.time()
        run_id = next(self._ids)
        self._started[run_id] = start
        self.first_start = self.first_start if self.first_start is not None else start
        return run_id, start

    def leave(self, run_id: int) -> float:
        """Free the slot of ``run_id``; the end time."""
        end = time.time()
        self.busy_s += end - self._started.pop(run_id)
        self.last_end = end
        self._release()
        return end

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


class SlotScheduler(Admission):
    """Every request holds its slot for exactly ``latency`` seconds (an asyncio sleep: no CPU)."""

    def __init__(self, *, slots: int, latency: float, priority: bool) -> None:
        super().__init__(slots=slots, priority=priority)
        self.latency = latency

    async def run(self, priority: int) -> tuple[float, float]:
        """Wait for a slot, hold it ``latency`` seconds; (start, end) as epoch seconds.

        Cancelled (the client went away): leaves the queue, or frees the slot, and re-raises.
        """
        run_id, start = await self.enter(priority)
        try:
            await asyncio.sleep(self.latency)
        finally:
            end = self.leave(run_id)
        return start, end


class Sequence:
    """One request decoding: ``target`` tokens after a prefill of ``prefill`` seconds."""

    __slots__ = ("target", "prefill", "interval", "decoded", "emitted", "ready_at", "progress", "run_id", "start")

    def __init__(self, *, target: int, prefill: float, interval: int = 1) -> None:
        self.target = target
        self.prefill = prefill
        self.interval = interval  # tokens a streamed chunk
        self.decoded = 0.0  # tokens decoded so far (fractional between ticks)
        self.emitted = 0  # tokens handed to the client so far
        self.ready_at = 0.0  # monotonic time its prefill ends
        self.progress = asyncio.Event()  # set when a chunk's worth is ready, or the answer is complete
        self.run_id = -1
        self.start = 0.0

    @property
    def complete(self) -> bool:
        return self.decoded >= self.target


class DecodeScheduler(Admission):
    """Continuous batching: every running sequence decodes at min(stream rate, ceiling / sequences decoding).

    Tokens are counted by outcome: ``completed`` (the answer ran to its end) and ``abandoned`` (the client
    left mid-answer, as a client stopping a degenerate answer does); ``decoded`` also counts the
    sequences still running, up to the last tick.
    """

    def __init__(self, shape: EngineShape, *, slots: int, priority: bool) -> None:
        super().__init__(slots=slots, priority=priority)
        self.shape = shape
        self.active: set[Sequence] = set()
        self.tokens = {"completed": 0, "abandoned": 0}
        self.decoded = 0.0
        self._ticker: asyncio.Task[None] | None = None

    async def admit(self, seq: Sequence, priority: int) -> None:
        """Wait for a slot and start ``seq``'s prefill. Cancelled while waiting: leaves the queue."""
        seq.run_id, seq.start = await self.enter(priority)
        seq.ready_at = time.monotonic() + seq.prefill
        self.active.add(seq)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def next_chunk(self, seq: Sequence) -> int:
        """Wait for ``seq``'s next chunk; the number of tokens decoded by then (all of them once complete)."""
        while not seq.complete and seq.decoded - seq.emitted < seq.interval:
            seq.progress.clear()
            await seq.progress.wait()
        seq.emitted = seq.target if seq.complete else int(seq.decoded)
        return seq.emitted

    def finish(self, seq: Sequence) -> float:
        """``seq`` is over (its answer complete, or its client gone): free its slot; the end time."""
        self.active.discard(seq)
        self.tokens["completed" if seq.complete else "abandoned"] += int(seq.decoded)
        return self.leave(seq.run_id)

    def decoding_now(self) -> int:
        now = time.monotonic()
        return sum(1 for s in self.active if s.ready_at <= now and not s.complete)

    async def _tick(self) -> None:
        last = time.monotonic()
        try:
            while self.active:
                # Short intervals need short ticks: a chunk per token is a tick per token's time.
                shortest = min(seq.interval for seq in self.active)
                await asyncio.sleep(min(self.shape.tick_s, shortest / self.shape.stream_tokens_per_s))
                now = time.monotonic()
                self._advance(last, now)
                last = now
        finally:
            self._ticker = None

    def _advance(self, last: float, now: float) -> None:
        decoding = [s for s in self.active if s.ready_at < now and not s.complete]
        if not decoding:
            return
        rate = min(self.shape.stream_tokens_per_s, self.shape.decode_tokens_per_s / len(decoding))
        for seq in decoding:
            step = min(seq.target - seq.decoded, rate * (now - max(last, seq.ready_at)))
            seq.decoded += step
            self.decoded += step
            if seq.complete or seq.decoded - seq.emitted >= seq.interval:
                seq.progress.set()
