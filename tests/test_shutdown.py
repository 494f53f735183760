"""Graceful shutdown: SIGTERM a real worker mid-work (simulated vLLM server with slots and latency), then
let a second worker finish: every page done exactly once, none left running or lost."""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from paperlane.priority import keys
from paperlane.priority.delayed import DelayedPages
from paperlane.priority.lanes import Lane
from paperlane.priority.messages import page_job_id
from tests.conftest import Stack, WorkerProcess, lane_messages, until
from tests.sim_engine import SimEngine, start_sim_engine
from tests.test_scheduling import Producer

pytestmark = pytest.mark.slow


def _lane_messages(stack: Stack, lane: Lane) -> list[str]:
    """The job ids of the messages waiting on ``lane``, sorted (a page twice would show twice)."""
    return sorted(page_job_id(m) for m in lane_messages(stack.broker(), lane))


def _unacked(stack: Stack) -> int:
    return int(stack.broker().hlen(keys.UNACKED))


def _delayed(stack: Stack) -> int:
    return DelayedPages(stack.broker()).pending()


def _terminate(worker: WorkerProcess, *, limit: float) -> float:
    """SIGTERM the worker's main process (as docker stop and Kubernetes do); the seconds it took to exit 0."""
    t0 = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    rc = worker.proc.wait(timeout=limit + 30)
    took = time.monotonic() - t0
    assert rc == 0, worker.output()[-3000:]
    return took


def test_sigterm_finishes_the_pages_in_the_engine_and_hands_back_the_rest(
        stack_factory: Callable[..., Stack], worker_factory, tmp_path: Path) -> None:
    grace = 20.0
    stack = stack_factory(ENGINE__MAX_IN_FLIGHT="4", WORKER__SHUTDOWN_GRACE=str(grace))
    engine = start_sim_engine(tmp_path / "engine", slots=2, latency=1.0, scheduling_policy="priority")
    try:
        _sigterm_then_an_heir(stack, engine, worker_factory, grace=grace)
    finally:
        engine.stop()


def _sigterm_then_an_heir(stack: Stack, engine: SimEngine, worker_factory: Callable[..., WorkerProcess], *,
                          grace: float) -> None:
    vllm = ("--engine", "vllm", "--engine-url", engine.url)
    producer = Producer(stack)
    ids = producer.submit(range(40), Lane.BATCH)
    first = worker_factory(stack, *vllm, name="stopping")

    def busy() -> bool:  # pages done, and more held than the engine takes (4): some wait for it
        statuses = Counter(r.status for r in producer.rows(ids).values())
        return statuses["succeeded"] >= 2 and statuses["running"] >= 6

    until(busy, what="the worker never held more pages than the engine takes", timeout=120, every=0.05)
    held = [i for i, r in producer.rows(ids).items() if r.status == "running"]
    took = _terminate(first, limit=grace)
    rows = producer.rows(ids)
    done = sorted(i for i, r in rows.items() if r.status == "succeeded")
    queued = sorted(i for i, r in rows.items() if r.status == "queued")
    assert took < grace, took
    assert len(done) + len(queued) == len(ids), Counter(r.status for r in rows.values())
    # It held more pages than the engine had: those not yet in it went back at once, their attempt not
    # counted; those in it finished and were stored (every answer the engine gave is a stored page).
    assert any(rows[i].status == "queued" for i in held) and any(rows[i].status == "succeeded" for i in held)
    assert re.search(r"stopping: \d+ page\(s\) waiting for the engine handed back; [1-9]\d* in it", first.output())
    assert len([c for c in engine.requests() if c["status"] == 200]) == len(done)
    assert all(rows[i].attempts == 0 for i in queued)
    # Nothing lost or doubled: exactly one message waits on the lane for each page not done.
    assert _lane_messages(stack, Lane.BATCH) == queued and _unacked(stack) == 0 and _delayed(stack) == 0

    worker_factory(stack, *vllm, name="heir")
    rows = producer.wait(ids)
    assert all(r.status == "succeeded" and r.attempts == 1 for r in rows.values()), \
        Counter((r.status, r.attempts) for r in rows.values())
    per_page = Counter(c["image"] for c in engine.requests() if c["status"] == 200)
    assert len(per_page) == len(ids) and max(per_page.values()) == 1


def test_pages_still_in_the_engine_when_the_grace_runs_out_are_handed_back(
        stack_factory: Callable[..., Stack], worker_factory, tmp_path: Path) -> None:
    grace = 3.0
    stack = stack_factory(ENGINE__MAX_IN_FLIGHT="2", WORKER__SHUTDOWN_GRACE=str(grace))
    stuck = start_sim_engine(tmp_path / "stuck", slots=2, latency=120.0)
    try:
        producer = Producer(stack)
        ids = sorted(producer.submit(range(6), Lane.INTERACTIVE, level=1))
        first = worker_factory(stack, "--engine", "vllm", "--engine-url", stuck.url, name="stuck")
        stuck.wait_for(lambda s: s["running"] == 2)
        took = _terminate(first, limit=grace)
    finally:
        stuck.stop()
    assert grace <= took < grace + 5, took
    rows = producer.rows(ids)
    assert all(r.status == "queued" and r.attempts == 0 for r in rows.values()), \
        [(r.status, r.attempts) for r in rows.values()]
    assert re.search(r"stopping: [1-9]\d* page\(s\) still in the engine handed back", first.output())
    # Back on their own lane at their own priority (interactive, level 1), once each.
    assert _lane_messages(stack, Lane.INTERACTIVE) == ids and not _lane_messages(stack, Lane.BATCH)
    client = stack.broker()
    # The lane's list for priority 1 holds as many as its buffer does; the rest wait by fair share, at priority 1.
    assert client.llen(f"{Lane.INTERACTIVE.queue}:1") == min(len(ids), stack.settings.fair_share.buffer)
    assert all(json.loads(m)["properties"]["priority"] == 1 for m in lane_messages(client, Lane.INTERACTIVE))
    assert _unacked(stack) == 0 and _delayed(stack) == 0

    engine = start_sim_engine(tmp_path / "engine", slots=4, latency=0.1)
    try:
        worker_factory(stack, "--engine", "vllm", "--engine-url", engine.url, name="heir")
        rows = producer.wait(ids)
    finally:
        engine.stop()
    assert all(r.status == "succeeded" and r.attempts == 1 and r.lane == "interactive" for r in rows.values())
